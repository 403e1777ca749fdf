"""``@fence.once(intent=..., domain=...)``: run a function at most once per intent, and learn the
recorded result on every later call.

- Replay: the function is not called; the recorded result is returned (as JSON gave it back:
  tuples come back as lists).
- Fresh: the function runs while a heartbeat keeps the lease alive (a daemon thread for a plain
  function, a task for a coroutine function), every ``heartbeat_s`` -- by default a third of the
  lease, bounded to [0.01 s, 10 s]. Its return value is committed and returned.
- The function raises: an exception that is an instance of ``failed_on`` is a definite failure
  (the intent is freed for a retry); any other exception, a KeyboardInterrupt or a cancellation
  is an unknown outcome (the intent is fenced until reconciled) -- the function may have done its
  effect before failing. The exception is raised again either way.
- ``wait_s`` > 0: while another holder has the intent in flight, poll (with backoff) until it is
  done, then return its result; after ``wait_s`` the ``intent_in_flight`` refusal is raised.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import Agent2PCError, FenceRefusal, UsageError
from ._canon import CanonicalError, canonical
from ._types import EffectRequest, Fresh, Replay, Ticket

if TYPE_CHECKING:
    from ._fence import Fence

HEARTBEAT_S_MIN = 0.01
HEARTBEAT_S_MAX = 10.0
WAIT_POLL_S_MAX = 0.5
JOIN_S_MAX = 30.0  # how long stopping a heartbeat may wait for a beat in progress


def default_agent() -> str:
    return os.environ.get("AGENT2PC_AGENT") or f"{socket.gethostname()}:{os.getpid()}"


def heartbeat_interval(lease_ttl: float, heartbeat_s: float | None) -> float:
    wanted = lease_ttl / 3 if heartbeat_s is None else heartbeat_s
    return min(max(wanted, HEARTBEAT_S_MIN), HEARTBEAT_S_MAX, lease_ttl / 2)


class _Heartbeat:
    """Renews a lease from a daemon thread until stopped, or until the lease is lost."""

    def __init__(self, fence: "Fence", ticket: Ticket, interval_s: float) -> None:
        self.fence, self.ticket, self.interval_s = fence, ticket, interval_s
        self.lost: FenceRefusal | None = None
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"fence-heartbeat:{ticket.intent}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.fence.heartbeat(self.ticket)
                self.beats += 1
            except FenceRefusal as exc:  # taken over or ended: stop beating
                self.lost = exc
                return
            except Agent2PCError:
                continue  # the store hiccuped: try again at the next beat

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(JOIN_S_MAX)


def _admit(fence: "Fence", req: EffectRequest, takeover: bool, wait_s: float
           ) -> Fresh | Replay:
    deadline = time.monotonic() + wait_s
    delay = 0.005
    while True:
        try:
            return fence.prepare(req, takeover=takeover)
        except FenceRefusal as exc:
            if exc.code != "intent_in_flight" or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, WAIT_POLL_S_MAX)


async def _admit_async(fence: "Fence", req: EffectRequest, takeover: bool, wait_s: float
                       ) -> Fresh | Replay:
    deadline = time.monotonic() + wait_s
    delay = 0.005
    while True:
        try:
            return await asyncio.to_thread(fence.prepare, req, takeover=takeover)
        except FenceRefusal as exc:
            if exc.code != "intent_in_flight" or time.monotonic() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, WAIT_POLL_S_MAX)


def _outcome_of(exc: BaseException, failed_on: tuple[type[BaseException], ...]) -> str:
    return "failed" if failed_on and isinstance(exc, failed_on) else "unknown"


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _check_result(fence: "Fence", ticket: Ticket, result: Any) -> None:
    try:
        canonical(result)
    except CanonicalError as exc:
        # The effect happened but its result cannot be recorded: hold the fence.
        fence.abort(ticket, f"the result is not canonical JSON: {exc}", outcome="unknown")
        raise UsageError(f"the fenced function returned a value that is not canonical JSON "
                         f"({exc}); the intent is fenced until reconciled",
                         code="usage", intent=ticket.intent) from None


def once(fence: "Fence", intent: str | Callable[..., str],
         domain: str | Callable[..., str] = "default", *, tool: str | None = None,
         agent: str | None = None, args: Callable[..., Any] | None = None,
         read_set: Sequence[Any] | Callable[..., Any] = (), parent: str | None = None,
         takeover: bool = False, failed_on: tuple[type[BaseException], ...] = (),
         wait_s: float = 0.0, heartbeat_s: float | None = None) -> Callable[..., Any]:
    if not (isinstance(intent, str) or callable(intent)):
        raise UsageError("intent must be a string (str.format over the arguments) or a callable")
    if not isinstance(failed_on, tuple):
        raise UsageError("failed_on must be a tuple of exception classes")
    interval = heartbeat_interval(fence.lease_ttl, heartbeat_s)

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        tool_name = tool or f"{fn.__module__}.{fn.__qualname__}"

        def request(*a: Any, **kw: Any) -> EffectRequest:
            bound = sig.bind(*a, **kw)
            bound.apply_defaults()
            if callable(intent):
                name = intent(*a, **kw)
            else:
                try:
                    name = intent.format(**bound.arguments)
                except (KeyError, IndexError, ValueError, AttributeError) as exc:
                    raise UsageError(f"cannot format intent {intent!r}: {exc}") from None
            payload = args(*a, **kw) if args is not None else dict(bound.arguments)
            return EffectRequest(
                intent=name, domain=domain(*a, **kw) if callable(domain) else domain,
                tool=tool_name, args=payload, agent=agent or default_agent(),
                read_set=read_set(*a, **kw) if callable(read_set) else read_set, parent=parent)

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def awrapper(*a: Any, **kw: Any) -> Any:
                adm = await _admit_async(fence, request(*a, **kw), takeover, wait_s)
                if isinstance(adm, Replay):
                    return adm.result
                ticket = adm.ticket
                lost: list[FenceRefusal] = []

                async def beat() -> None:
                    while True:
                        await asyncio.sleep(interval)
                        try:
                            await asyncio.to_thread(fence.heartbeat, ticket)
                        except FenceRefusal as exc:
                            lost.append(exc)
                            return
                        except Agent2PCError:
                            continue

                task = asyncio.create_task(beat())
                try:
                    result = await fn(*a, **kw)
                except BaseException as exc:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    try:
                        await asyncio.to_thread(fence.abort, ticket, _reason(exc),
                                                _outcome_of(exc, failed_on))
                    except Agent2PCError:
                        pass  # lost lease or store trouble: the ledger keeps its own answer
                    raise
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await asyncio.to_thread(_check_result, fence, ticket, result)
                await asyncio.to_thread(fence.commit, ticket, result)
                return result

            awrapper.fence = fence  # type: ignore[attr-defined]
            awrapper.request = request  # type: ignore[attr-defined]
            return awrapper

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            adm = _admit(fence, request(*a, **kw), takeover, wait_s)
            if isinstance(adm, Replay):
                return adm.result
            ticket = adm.ticket
            hb = _Heartbeat(fence, ticket, interval)
            try:
                result = fn(*a, **kw)
            except BaseException as exc:
                hb.stop()
                try:
                    fence.abort(ticket, _reason(exc), _outcome_of(exc, failed_on))
                except Agent2PCError:
                    pass  # lost lease or store trouble: the ledger keeps its own answer
                raise
            hb.stop()
            _check_result(fence, ticket, result)
            fence.commit(ticket, result)
            return result

        wrapper.fence = fence  # type: ignore[attr-defined]
        wrapper.request = request  # type: ignore[attr-defined]
        return wrapper

    return deco
