"""The Fence: the library's face of the ledger. It drives one store and counts every attempt."""

from __future__ import annotations

from ..errors import Agent2PCError, Busy, FenceRefusal, UsageError
from ._cert import Certificate, env_key
from ._ledger import DONE, Decision, Entry
from ._ledger import abort as _abort
from ._ledger import classify as _classify
from ._ledger import commit as _commit
from ._ledger import describe as _describe
from ._ledger import heartbeat as _heartbeat
from ._ledger import prepare as _prepare
from ._ledger import reconcile as _reconcile
from ._store import REFUSED_PREFIX, CounterBuffer, Store
from ._types import AbortResult, EffectRequest, Fresh, Replay, Ticket, canonical_json, check_intent

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from ._ledger import Txn

LEASE_TTL_S_MAX = 7 * 86400.0
RESULT_TTL_S_MAX = 3650 * 86400.0
SWEEP_EVERY_WRITES = 128   # a bounded sweep after the 1st and every 128th write of an instance
SWEEP_BATCH_MAX = 256      # rows one automatic sweep deletes at most
CHAIN_LENGTH_MAX = 10_000  # certificates fence.chain() follows at most
STATUS_LIST_MAX = 100


def _ttl(name: str, value: Any, top: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= top:
        raise UsageError(f"{name} must be a number of seconds in (0, {top:g}]")
    return float(value)


def redact(url: str) -> str:
    """The store URL without its password (``postgresql://user:***@host/db``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    userinfo, at, host = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}{slash}{tail}"


def format_counters(raw: dict[str, int]) -> dict[str, Any]:
    """Store counters as they are shown: attempts = admitted + replayed + refused."""
    refused_by = {k[len(REFUSED_PREFIX):]: v for k, v in sorted(raw.items())
                  if k.startswith(REFUSED_PREFIX) and v}
    admitted, replayed = raw.get("admitted", 0), raw.get("replayed", 0)
    refused = sum(refused_by.values())
    out: dict[str, Any] = {"attempts": admitted + replayed + refused, "admitted": admitted,
                           "replayed": replayed, "refused": refused, "refused_by": refused_by}
    for name in ("takeovers", "committed", "aborted_failed", "aborted_unknown",
                 "reconciled_clear", "reconciled_done"):
        out[name] = raw.get(name, 0)
    return out


class Fence:
    """Exactly-once admission of effects over one store (see docs/fence.md).

    Thread-safe: one Fence may serve every thread of a process. Open it with ``open_fence``.
    """

    def __init__(self, store: Store, *, lease_ttl: float = 60.0, result_ttl: float = 86400.0,
                 hmac_key: bytes | str | None = None) -> None:
        self._store = store
        self.lease_ttl = _ttl("lease_ttl", lease_ttl, LEASE_TTL_S_MAX)
        self.result_ttl = _ttl("result_ttl", result_ttl, RESULT_TTL_S_MAX)
        if isinstance(hmac_key, str):
            hmac_key = hmac_key.encode("utf-8")
        self._key: bytes | None = hmac_key or env_key()
        self._pending = CounterBuffer()
        self._writes = 0

    @property
    def url(self) -> str:
        return self._store.url

    @property
    def clock(self) -> str:
        """Which clock decides: ``"host"`` (memory, SQLite) or ``"database"`` (Postgres)."""
        return self._store.clock

    @property
    def store(self) -> Store:
        return self._store

    # -- deciding -------------------------------------------------------------------------------

    def _decide(self, intent: str, fn: Callable[[Txn], Decision],
                durable: bool = True) -> Decision:
        dec = self._store.decide(intent, fn, self._pending, durable)
        if dec.writes:
            self._writes += 1
            if self._writes % SWEEP_EVERY_WRITES == 1:
                try:
                    self._store.sweep(self.result_ttl, SWEEP_BATCH_MAX)
                except Busy:
                    pass  # best effort: the next sweep will do it
        return dec

    def _count(self, outcome: Any) -> None:
        if isinstance(outcome, Fresh):
            self._pending.add("admitted")
        elif isinstance(outcome, Replay):
            self._pending.add("replayed")
        else:
            assert isinstance(outcome, FenceRefusal), outcome
            self._pending.add(REFUSED_PREFIX + outcome.code)

    def prepare(self, request: EffectRequest, *, takeover: bool = False) -> Fresh | Replay:
        """Decide one attempt: Fresh (run it), Replay (done before), or raise FenceRefusal.

        ``takeover=True`` lets this attempt take over an intent whose lease expired or whose
        outcome is unknown -- only for an effect that is safe to repeat (see docs/fence.md).
        """
        if not isinstance(request, EffectRequest):
            raise UsageError("prepare takes an EffectRequest")
        now, entry = self._store.snapshot(request.intent)
        answer: Any = _classify(now, entry, request, bool(takeover))
        if answer is None:
            dec = self._decide(request.intent, lambda txn: _prepare(
                txn, request, takeover=bool(takeover), lease_ttl_s=self.lease_ttl))
            answer = dec.outcome
        self._count(answer)
        if isinstance(answer, FenceRefusal):
            raise answer
        return answer  # type: ignore[no-any-return]

    def commit(self, ticket: Ticket | dict[str, Any] | str, result: Any = None, *,
               durable: bool = True) -> Certificate:
        """Record the effect's result; returns its certificate. Idempotent for the same result.

        ``durable=False``: the record is committed (every reader sees it, a killed process keeps
        it) but its fsync may wait for the next durable decision or ``sync()``; a power cut
        before then leaves the intent as it was at prepare -- running, then fenced when the
        lease expires -- never free. Only for a caller that may lose the replay, not the fence
        (docs/fence.md, "Deferred commits").
        """
        t = Ticket.parse(ticket)
        canonical_json("result", result)
        dec = self._decide(t.intent, lambda txn: _commit(
            txn, t, result, result_ttl_s=self.result_ttl, key=self._key), durable)
        if isinstance(dec.outcome, FenceRefusal):
            raise dec.outcome
        return dec.outcome  # type: ignore[no-any-return]

    def abort(self, ticket: Ticket | dict[str, Any] | str, reason: str = "",
              outcome: str = "failed") -> AbortResult:
        """End the lease without a result: ``failed`` frees the intent, ``unknown`` fences it."""
        if outcome not in ("failed", "unknown"):
            raise UsageError("outcome must be 'failed' or 'unknown'")
        if not isinstance(reason, str):
            raise UsageError("reason must be a string")
        t = Ticket.parse(ticket)
        dec = self._decide(t.intent, lambda txn: _abort(
            txn, t, reason, outcome, result_ttl_s=self.result_ttl))
        if isinstance(dec.outcome, FenceRefusal):
            raise dec.outcome
        return dec.outcome  # type: ignore[no-any-return]

    def heartbeat(self, ticket: Ticket | dict[str, Any] | str) -> float:
        """Extend the lease by lease_ttl from now; returns the new expiry (store clock)."""
        t = Ticket.parse(ticket)
        dec = self._decide(t.intent, lambda txn: _heartbeat(txn, t, lease_ttl_s=self.lease_ttl))
        if isinstance(dec.outcome, FenceRefusal):
            raise dec.outcome
        return float(dec.outcome)

    def reconcile(self, intent: str, action: str = "clear", result: Any = None,
                  reason: str = "") -> Certificate | None:
        """Settle an unknown outcome: ``clear`` (it did not happen: free the intent) or ``done``
        (it happened with ``result``: returns the certificate)."""
        if action not in ("clear", "done"):
            raise UsageError("action must be 'clear' or 'done'")
        check_intent(intent)
        canonical_json("result", result)
        dec = self._decide(intent, lambda txn: _reconcile(
            txn, intent, action, result, reason, result_ttl_s=self.result_ttl, key=self._key))
        if isinstance(dec.outcome, FenceRefusal):
            raise dec.outcome
        return dec.outcome  # type: ignore[no-any-return]

    # -- reading --------------------------------------------------------------------------------

    def _entry(self, intent: str) -> tuple[float, Entry | None]:
        check_intent(intent)
        now, e = self._store.snapshot(intent)
        return now, (None if e is None or e.forgotten(now) else e)

    def certificate(self, intent: str) -> Certificate | None:
        """The certificate of a done intent (None when it is not done, or forgotten)."""
        _, e = self._entry(intent)
        return e.cert if e is not None and e.state == DONE else None

    def chain(self, intent: str) -> list[Certificate]:
        """The certificates from the root to ``intent``'s, following parents (root first).

        Stops early at a parent that retention has forgotten, so the first certificate of the
        list may name a parent that is not in it.
        """
        certs: list[Certificate] = []
        seen: set[str] = set()
        name: str | None = intent
        while name is not None and len(certs) < CHAIN_LENGTH_MAX and name not in seen:
            seen.add(name)
            _, e = self._entry(name)
            if e is None or e.state != DONE or e.cert is None:
                break
            certs.append(e.cert)
            name = e.request.get("parent")
        certs.reverse()
        return certs

    def status(self, intent: str | None = None, *, limit: int = STATUS_LIST_MAX
               ) -> dict[str, Any]:
        """One intent's entry, or the whole ledger: counts by state, counters, fenced intents."""
        if intent is not None:
            now, e = self._entry(intent)
            if e is None:
                return {"intent": intent, "state": "absent"}
            return _describe(e, now)
        summary = self._store.summary(limit)
        return {"store": redact(self.url), "clock": self.clock, "lease_ttl": self.lease_ttl,
                "result_ttl": self.result_ttl, **summary, "counters": self.counters()}

    @property
    def needs_sync(self) -> bool:
        """True while a ``commit(durable=False)`` may still be unsynced."""
        return self._store.needs_sync

    def sync(self) -> None:
        """Make every decision committed so far durable (after ``commit(durable=False)``)."""
        self._store.sync()

    def flush(self) -> None:
        """Write this instance's pending counts to the store."""
        pending = self._pending.take()
        try:
            self._store.add_counters(pending)
        except BaseException:
            self._pending.add_all(pending)
            raise

    def counters(self) -> dict[str, Any]:
        """The store's counters (after flushing this instance's): they add up per attempt."""
        self.flush()
        return format_counters(self._store.counters())

    def sweep(self, limit: int = 1000) -> int:
        """Forget finished outcomes past result_ttl and idle domains; returns rows deleted."""
        if type(limit) is not int or limit < 1:
            raise UsageError("limit must be a positive whole number")
        return self._store.sweep(self.result_ttl, limit)

    # -- the decorator --------------------------------------------------------------------------

    def once(self, intent: str | Callable[..., str], domain: str | Callable[..., str] = "default",
             *, tool: str | None = None, agent: str | None = None,
             args: Callable[..., Any] | None = None,
             read_set: Sequence[Any] | Callable[..., Any] = (), parent: str | None = None,
             takeover: bool = False, failed_on: tuple[type[BaseException], ...] = (),
             wait_s: float = 0.0, heartbeat_s: float | None = None) -> Callable[..., Any]:
        """Fence a function (sync or async) so that it runs once per intent; see _once.py."""
        from ._once import once

        return once(self, intent, domain, tool=tool, agent=agent, args=args, read_set=read_set,
                    parent=parent, takeover=takeover, failed_on=failed_on, wait_s=wait_s,
                    heartbeat_s=heartbeat_s)

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Write the pending counts (best effort: counters never fail a decision) and release
        the store's connections."""
        try:
            self.flush()
        except Agent2PCError:
            pass  # the counts of this process are lost, as with a killed process
        finally:
            self._store.close()

    def __enter__(self) -> "Fence":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
