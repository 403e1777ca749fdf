"""``agent-2pc mcp wrap -- CMD ARGS...``: the effect fence in front of any MCP server's tools.

The proxy serves the downstream server's tools unchanged (names, schemas, annotations: the
listing is forwarded page by page) and forwards every call. A tool whose annotations say
``readOnlyHint: true`` is forwarded as it is; every other call goes through the fence
(docs/fence.md) first:

- **Intent.** With an idempotency key from the client -- an ``idempotencyKey`` argument or a
  ``_meta.idempotencyKey`` field, neither passed downstream -- the intent is the key, and the
  recorded result is replayed for the store's result TTL (``--result-ttl``, default 24 h).
  Without one the intent is ``mcp:`` + the request's fingerprint (SHA-256 of the RFC 8785
  canonical JSON of tool, domain and arguments), and a duplicate is answered from the first
  call only while that call finished less than ``--window`` ago (default 10 min): a guard
  against retries and re-dispatch, not a ban on repeating an action later. Past the window
  the next intent of a chain (``...#2``, ``#3``) is used, which every proxy on the store
  derives alike. The domain is ``mcp:<server name>``.
- **Fresh.** The call is forwarded while a heartbeat renews the lease (every third of the lease
  TTL), however long the call takes. A result is committed (it is what duplicates get); a
  tool-level ``isError`` result is a definite failure that frees the intent for a retry; a
  JSON-RPC error that rejects the request (parse, invalid request, unknown method, invalid
  params) frees it too and is passed on as it is.
- **Unknown outcome.** A dead transport, a timeout (``--call-timeout``), a cancellation by the
  client, any other JSON-RPC error or an answer that cannot be read: the call may have had its
  effect, so the intent is fenced (``abort(outcome="unknown")``) until ``agent-2pc fence
  reconcile --intent I --action clear|done``. The client gets an isError result saying so, with
  code ``unknown_outcome`` and the intent.
- **Duplicates.** A concurrent duplicate waits for the first call (on an in-process event, or
  by polling the store when the first runs in another process) and gets its result; a later one
  gets the recorded result at once. Replayed results carry ``_meta["agent-2pc/fence"] =
  {"replayed": true, "intent": ...}``.
- Refusals of the fence (``intent_fenced``, ``intent_conflict``, ...) and bad input are isError
  results with ``{ok: false, error: {code, message, intent}}`` as structured content.

The downstream server runs as a child process with the proxy's environment and working directory;
a supervisor task owns its transport and starts it again when it dies (at most RESTARTS_MAX times
in a row without a successful call in between). Only tools are proxied (not resources or prompts).

Protocol revisions: each side negotiates its own, as the SDK's client and server do by default
(the downstream: ``server/discover`` first, else the ``initialize`` handshake). A result reaches
the client in the shape of the client's revision, whatever the downstream's (_forwarded.py).

The hot path (docs/mcp.md, "Figures"): the SDK's client does the handshake and the listing, but
``tools/call`` goes out as raw JSON-RPC on the same transport (with the per-request envelope of
a 2026-07-28 connection), with ids of our own that the relay takes off before the SDK's session
sees them (``_Raw``); the result is read once into the SDK's version-free form
(``_forwarded.neutral``), recorded as such, and handed to the SDK's server, which shapes it for
the client's protocol revision. A local store's decisions run on the event loop's thread. The
commit is made before the answer but not fsynced (``commit(durable=False)``, docs/fence.md
"Deferred commits"); ``Proxy.syncer`` fsyncs it a few milliseconds later, off the call's path,
unless a later durable decision (the next prepare) already did.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import traceback
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .. import __version__
from ..errors import Agent2PCError, FenceRefusal, UsageError, WorkspaceError
from ..fence import EffectRequest, Fresh, Replay
from . import _results
from ._forwarded import NotAToolResult, neutral
from ._stdio import server_streams

KEY_FIELD = "idempotencyKey"
META_KEY = "agent-2pc/fence"
KEY_CHARS_MAX = 255
CHAIN_MAX = 10_000            # window periods of one call walked at most
WAIT_POLL_S_MIN = 0.005       # polling a holder in another process: backoff from ...
WAIT_POLL_S_MAX = 0.25        # ... to this
WAIT_S_MAX = 7 * 86400.0      # a duplicate waits for the first call at most this long
START_TIMEOUT_S = 60.0        # the downstream server must answer initialize within this
RESTARTS_MAX = 5              # restarts in a row (no successful call between) before giving up
RESTART_BACKOFF_S = 0.2
LIST_PAGES_MAX = 100          # tools/list pages walked to find a tool's annotations
RAW_ID_PREFIX = "agent-2pc-wrap-"  # ids of the calls forwarded past the SDK's client session
CANCEL_WRITE_S_MAX = 2.0      # the courtesy cancel of an abandoned call is written within this
SYNC_DELAY_S = 0.005          # a deferred commit is fsynced this long after it is made, at most
# JSON-RPC errors that say the request was refused before the tool ran.
REJECTED_CODES = frozenset({types.PARSE_ERROR, types.INVALID_REQUEST, types.METHOD_NOT_FOUND,
                            types.INVALID_PARAMS})
# Who the proxy is to the downstream server. It offers no client capabilities (no sampling,
# elicitation or roots), which is what its SDK client advertises.
CLIENT_INFO = types.Implementation(name="agent-2pc-wrap", version=__version__)


def log(message: str) -> None:
    sys.stderr.write(f"agent-2pc mcp wrap: {message}\n")
    sys.stderr.flush()


class DownstreamUnavailable(Exception):
    """The downstream server is not running and could not be started."""


class _Raw:
    """``tools/call`` forwarded as raw JSON-RPC on the downstream transport, past the SDK's client
    session (its dispatcher, its memory streams and its result models cost about as much as the
    rest of the proxy). Our requests carry string ids with RAW_ID_PREFIX, which the SDK's own
    integer ids never collide with; the relay hands their answers here (``take``). Like the
    SDK's ``send_request``: a timeout or a cancellation by the caller sends the server a
    ``notifications/cancelled`` for the request, and the end of the transport fails every call
    in flight with CONNECTION_CLOSED."""

    def __init__(self, on_eof: Any) -> None:
        self.write: Any = None  # the transport's write stream, once it is up
        self.envelope: dict[str, Any] | None = None  # a 2026-07-28 connection's, once it is up
        self.closed = False
        self._pending: dict[str, Any] = {}
        self._n = 0
        self._on_eof = on_eof

    def take(self, item: Any) -> bool:
        """Deliver an answer to one of our calls; False for anything else (the SDK's)."""
        msg = item.message if isinstance(item, SessionMessage) else None
        if isinstance(msg, (types.JSONRPCResponse, types.JSONRPCError)) \
                and isinstance(msg.id, str):
            send = self._pending.pop(msg.id, None)
            if send is not None:
                send.send_nowait(msg)  # buffer 1, one answer per id: never blocks
                return True
        return False

    def close(self) -> None:
        self.closed = True
        for send in self._pending.values():
            send.close()  # the waiting call gets EndOfStream: CONNECTION_CLOSED
        self._pending.clear()
        self._on_eof()

    async def call(self, params: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        """The result of ``tools/call`` with ``params``, as the server sent it; raises MCPError
        for a JSON-RPC error, a timeout (REQUEST_TIMEOUT) or a dead transport."""
        if self.closed or self.write is None:
            raise MCPError(code=types.CONNECTION_CLOSED, message="Connection closed")
        if self.envelope is not None:
            params = {**params, "_meta": {**params.get("_meta", {}), **self.envelope}}
        self._n += 1
        rid = f"{RAW_ID_PREFIX}{self._n}"
        send, receive = anyio.create_memory_object_stream[Any](1)
        self._pending[rid] = send
        request = SessionMessage(types.JSONRPCRequest(jsonrpc="2.0", id=rid, method="tools/call",
                                                      params=params))
        started = False
        try:
            with receive:
                await anyio.lowlevel.checkpoint_if_cancelled()
                started = True  # a write cut short by a cancellation may still have gone out
                try:
                    await self.write.send(request)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    raise MCPError(code=types.CONNECTION_CLOSED,
                                   message="Connection closed") from None
                msg: Any = None
                with anyio.move_on_after(math.inf if timeout_s is None else timeout_s):
                    try:
                        msg = await receive.receive()
                    except anyio.EndOfStream:
                        raise MCPError(code=types.CONNECTION_CLOSED,
                                       message="Connection closed") from None
                if msg is None:
                    await self._cancel(rid, f"timed out after {timeout_s:g} s")
                    raise MCPError(code=types.REQUEST_TIMEOUT,
                                   message="Request 'tools/call' timed out")
        except anyio.get_cancelled_exc_class():
            if started:
                with anyio.CancelScope(shield=True):
                    await self._cancel(rid, "caller cancelled")
            raise
        finally:
            self._pending.pop(rid, None)
            send.close()
        if isinstance(msg, types.JSONRPCError):
            raise MCPError(code=msg.error.code, message=msg.error.message, data=msg.error.data)
        result: dict[str, Any] = msg.result
        return result

    def negotiated(self, version: str) -> None:
        """The handshake (or discovery) settled on ``version``: a 2026-07-28 connection carries
        the per-request envelope on every request, as the SDK's session stamps its own."""
        self.envelope = None if version not in MODERN_PROTOCOL_VERSIONS else {
            types.PROTOCOL_VERSION_META_KEY: version,
            types.CLIENT_INFO_META_KEY: CLIENT_INFO.model_dump(by_alias=True, mode="json",
                                                               exclude_none=True),
            types.CLIENT_CAPABILITIES_META_KEY: {}}

    async def _cancel(self, rid: str, reason: str) -> None:
        """Tell the server we stopped waiting for ``rid`` (best effort, bounded)."""
        note = SessionMessage(types.JSONRPCNotification(
            jsonrpc="2.0", method="notifications/cancelled",
            params={"requestId": rid, "reason": reason}))
        with anyio.move_on_after(CANCEL_WRITE_S_MAX):
            try:
                await self.write.send(note)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass


@asynccontextmanager
async def _watched(params: StdioServerParameters, raw: _Raw) -> AsyncIterator[Any]:
    """stdio_client, plus a relay that takes the answers to raw calls off the stream and tells
    us when the server's stdout ends (it died), so that a call made after a death is not sent
    into a closed pipe and taken for unknown."""
    async with stdio_client(params) as (read_stream, write_stream):
        send, receive = anyio.create_memory_object_stream[Any](0)
        raw.write = write_stream

        async def relay() -> None:
            try:
                async with send:
                    async for item in read_stream:
                        if not raw.take(item):
                            await send.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            finally:
                raw.close()

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            try:
                async with receive:
                    yield receive, write_stream
            finally:
                tg.cancel_scope.cancel()


class Downstream:
    """The downstream server: started, watched and started again by ``supervise``."""

    def __init__(self, argv: list[str], call_timeout_s: float | None) -> None:
        self.params = StdioServerParameters(command=argv[0], args=argv[1:],
                                            env=dict(os.environ), cwd=os.getcwd())
        self.argv = argv
        self.call_timeout_s = call_timeout_s
        self.client: Client | None = None
        self.raw: _Raw | None = None  # the running transport's raw calls (with ``client``)
        self.info: types.Implementation | None = None
        self.instructions: str | None = None
        self.error: BaseException | None = None
        self.failures = 0
        self._changed = anyio.Event()
        self._dead = anyio.Event()
        self._closing = False

    def _announce(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def mark_dead(self) -> None:
        self.client = None
        self._dead.set()

    async def supervise(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Run the downstream server; start it again when it dies. The first start must work
        (else DownstreamUnavailable is raised before ``task_status.started``)."""
        started = False
        while not self._closing:
            self._dead = anyio.Event()
            up = False
            # The deadline bounds the start only; it is lifted once the handshake is done.
            with anyio.CancelScope(deadline=anyio.current_time() + START_TIMEOUT_S) as scope:
                try:
                    raw = _Raw(self.mark_dead)
                    async with Client(_watched(self.params, raw), cache=None,
                                      client_info=CLIENT_INFO) as client:
                        scope.deadline = math.inf
                        up = True
                        raw.negotiated(client.protocol_version)
                        self.client, self.raw, self.error = client, raw, None
                        self.info, self.instructions = client.server_info, client.instructions
                        self._announce()
                        if not started:
                            started = True
                            task_status.started()
                        await self._dead.wait()
                        self.client = None
                        log(f"the downstream server {self.argv!r} stopped")
                except Exception as exc:
                    self.error = exc
                    log(f"the downstream server {self.argv!r} "
                        f"{'failed' if up else 'did not start'}: {type(exc).__name__}: {exc}")
            self.client = None
            if scope.cancelled_caught and not up:
                self.error = DownstreamUnavailable(
                    f"it did not answer initialize within {START_TIMEOUT_S:g} s")
            self.failures += 1
            if not started or self.failures > RESTARTS_MAX:
                self._closing = True
                self._announce()
                if not started:
                    raise DownstreamUnavailable(
                        f"the downstream server {self.argv!r} did not start: {self.error}")
                log(f"giving up on the downstream server after {self.failures} failures")
                return
            self._announce()
            await anyio.sleep(RESTART_BACKOFF_S * self.failures)

    async def get(self) -> tuple[Client, _Raw]:
        """The running client and its raw calls, waiting for a restart in progress."""
        with anyio.move_on_after(START_TIMEOUT_S + RESTART_BACKOFF_S * (RESTARTS_MAX + 1)):
            while True:
                client, raw = self.client, self.raw
                if client is not None and raw is not None and not self._dead.is_set():
                    return client, raw
                if self._closing:
                    break
                await self._changed.wait()
        raise DownstreamUnavailable(f"the downstream server {self.argv!r} is not running"
                                    + (f" ({self.error})" if self.error else ""))

    async def list_tools(self, cursor: str | None) -> types.ListToolsResult:
        client, _ = await self.get()
        return await client.session.list_tools(
            params=types.PaginatedRequestParams(cursor=cursor))

    async def call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None
                   ) -> dict[str, Any]:
        """Forward one call; its result, revision-neutral (_forwarded.py; NotAToolResult when it
        is not a tool result). It is not checked against the tool's output schema (the effect
        happened either way, and the upstream client checks it)."""
        _, raw = await self.get()
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        try:
            result = await raw.call(params, self.call_timeout_s)
        except MCPError as exc:
            if exc.error.code == types.CONNECTION_CLOSED:
                self.mark_dead()
            raise
        self.failures = 0
        return neutral(result)


def _declares(tool: types.Tool | None, field: str) -> bool:
    props = tool.input_schema.get("properties") if tool is not None else None
    return isinstance(props, dict) and field in props


def _read_only(tool: types.Tool | None) -> bool:
    return bool(tool is not None and tool.annotations is not None
                and tool.annotations.read_only_hint)


class Proxy:
    def __init__(self, downstream: Downstream, fence: Any, window_s: float,
                 lease_ttl_s: float) -> None:
        self.ds = downstream
        self.fence = fence
        self.window_s = window_s
        self.heartbeat_s = max(0.01, min(lease_ttl_s / 3.0, 10.0))
        self.agent = f"mcp-wrap:{socket.gethostname()}:{os.getpid()}"
        self.tools: dict[str, types.Tool] = {}
        self._waiters: dict[str, anyio.Event] = {}
        self._leases: dict[str, Any] = {}  # intent -> ticket of the calls running downstream
        self._sync_wanted = anyio.Event()
        # A local store's decision (SQLite: ~0.2 ms, its lock waits bounded by a 10 s busy
        # timeout) costs about what a hop to a worker thread costs, so it runs on the event
        # loop; a remote store's (Postgres: network round trips) runs in a worker thread.
        self._inline = str(getattr(fence, "url", "")).startswith(("sqlite:", "memory:"))

    async def _store(self, fn: Any, *args: Any) -> Any:
        if self._inline:
            return fn(*args)
        return await anyio.to_thread.run_sync(fn, *args)

    @property
    def domain(self) -> str:
        name = self.ds.info.name if self.ds.info is not None else ""
        return "mcp:" + (name or self.ds.argv[0])[:400]

    # -- listing -----------------------------------------------------------------------------

    async def list_tools(self, cursor: str | None) -> types.ListToolsResult:
        page = await self.ds.list_tools(cursor)
        for tool in page.tools:
            self.tools[tool.name] = tool
        return types.ListToolsResult(tools=page.tools, next_cursor=page.next_cursor)

    async def _tool(self, name: str) -> types.Tool | None:
        """The tool's listing (its annotations decide whether it is fenced)."""
        if name not in self.tools:
            cursor: str | None = None
            for _ in range(LIST_PAGES_MAX):
                page = await self.list_tools(cursor)
                cursor = page.next_cursor
                if name in self.tools or not cursor:
                    break
        return self.tools.get(name)

    # -- calls -------------------------------------------------------------------------------

    async def call(self, params: types.CallToolRequestParams
                   ) -> types.CallToolResult | dict[str, Any]:
        """The answer to one ``tools/call``: the downstream's result as it came (a dict), or a
        coded result of the proxy's own."""
        name = params.name
        args = dict(params.arguments or {})
        meta = dict(params.meta or {})
        try:
            tool = await self._tool(name)
        except DownstreamUnavailable as exc:
            return _results.coded("downstream_unavailable", str(exc))
        key = None
        if KEY_FIELD in args:  # the tool's own parameter, if it declares one: then kept
            key = args[KEY_FIELD] if _declares(tool, KEY_FIELD) else args.pop(KEY_FIELD)
        meta_key = meta.pop(KEY_FIELD, None)
        key = key if key is not None else meta_key
        forward = {k: v for k, v in meta.items() if not k.startswith("io.modelcontextprotocol/")
                   and k != "progressToken"}
        if key is not None and not (isinstance(key, str) and 0 < len(key) <= KEY_CHARS_MAX):
            return _results.coded("usage", f"{KEY_FIELD} must be a string of 1 to "
                                           f"{KEY_CHARS_MAX} characters")
        if _read_only(tool):
            return await self._forward(name, args, forward)
        try:
            return await self._fenced(name, args, forward, key)
        except DownstreamUnavailable as exc:
            return _results.coded("downstream_unavailable", str(exc))

    async def _forward(self, name: str, args: dict[str, Any], meta: dict[str, Any]
                       ) -> types.CallToolResult | dict[str, Any]:
        try:
            return await self.ds.call(name, args, meta)
        except DownstreamUnavailable as exc:
            return _results.coded("downstream_unavailable", str(exc))
        except NotAToolResult as exc:
            return _results.coded("bad_downstream_result", f"the downstream server answered "
                                                           f"something that is not a tool "
                                                           f"result: {exc}")

    async def _fenced(self, name: str, args: dict[str, Any], meta: dict[str, Any],
                      key: str | None) -> types.CallToolResult | dict[str, Any]:
        intent = key or ""
        try:
            # The request's fingerprint is SHA-256 of the canonical (tool, domain, args): the
            # name of a call without a key (bad args -- NaN, huge integers -- are usage errors).
            req = EffectRequest(intent=key or "mcp", domain=self.domain, tool=name, args=args,
                                agent=self.agent)
            base = "mcp:" + req.fingerprint
            for k in range(1 if key is not None else CHAIN_MAX):
                if key is None:
                    intent = base if k == 0 else f"{base}#{k + 1}"
                    req = req.replace(intent=intent)
                adm = await self._admit(req)
                if isinstance(adm, Replay):
                    if key is None and await self._past_window(intent):
                        continue
                    return self._replay(adm)
                assert isinstance(adm, Fresh)
                return await self._run(adm, name, args, meta)
            return _results.coded("limit_exceeded", "this call was repeated in more than "
                                                    f"{CHAIN_MAX} windows", intent=intent)
        except FenceRefusal as exc:
            return _results.coded(exc.code, _refusal_message(exc, intent), intent=intent)
        except Agent2PCError as exc:
            return _results.coded(exc.code, exc.message, intent=intent or None)

    async def _admit(self, req: EffectRequest) -> Fresh | Replay:
        """prepare; while another holder runs the intent, wait for it to finish."""
        delay = WAIT_POLL_S_MIN
        with anyio.fail_after(WAIT_S_MAX):
            while True:
                try:
                    answer: Fresh | Replay = await self._store(self.fence.prepare, req)
                    return answer
                except FenceRefusal as exc:
                    if exc.code != "intent_in_flight":
                        raise
                local = self._waiters.get(req.intent)
                if local is not None:
                    await local.wait()
                else:
                    await anyio.sleep(delay)
                    delay = min(delay * 2, WAIT_POLL_S_MAX)

    async def _past_window(self, intent: str) -> bool:
        """Did the done entry of ``intent`` finish more than the window ago (store clock)?"""
        now, entry = await self._store(self.fence.store.snapshot, intent)
        return bool(entry is not None and entry.state == "done"
                    and now - entry.updated_at > self.window_s)

    def _replay(self, adm: Replay) -> types.CallToolResult | dict[str, Any]:
        try:  # recorded by this version (neutral), an older one, or `fence reconcile`
            result = neutral(adm.cert.result)
        except NotAToolResult:
            return _results.coded("bad_downstream_result", "the recorded result of this call "
                                                           "is not a tool result",
                                  intent=adm.cert.intent)
        meta = result.get("_meta")
        meta = dict(meta) if isinstance(meta, dict) else {}
        meta[META_KEY] = {"replayed": True, "intent": adm.cert.intent}
        result["_meta"] = meta
        return result

    async def syncer(self) -> None:
        """Makes the deferred commits durable, SYNC_DELAY_S after one is made (the client has
        its answer by then), in a worker thread: an fsync can take milliseconds. Nothing to
        do when a durable decision (the next prepare, a heartbeat) came first. An fsync
        failure ends the proxy (FsyncFailed), as everywhere in agent-2pc."""
        while True:
            await self._sync_wanted.wait()
            self._sync_wanted = anyio.Event()
            await anyio.sleep(SYNC_DELAY_S)
            if self.fence.needs_sync:
                await anyio.to_thread.run_sync(self.fence.sync)

    async def heartbeat(self) -> None:
        """One task renews the leases of every call running downstream, every third of the
        lease TTL, however long the calls take. A lease taken over (someone reconciled or took
        over the intent) is dropped: the call's own commit will then be refused and logged."""
        while True:
            await anyio.sleep(self.heartbeat_s)
            for intent, ticket in list(self._leases.items()):
                try:
                    await self._store(self.fence.heartbeat, ticket)
                except FenceRefusal as exc:
                    log(f"lost the lease of {intent}: {exc.message}")
                    self._leases.pop(intent, None)
                except Agent2PCError as exc:
                    log(f"heartbeat of {intent} failed ({exc.message}); trying again")

    async def _end(self, call: Any, *args: Any) -> None:
        """commit or abort, shielded from cancellation; a refusal is logged (the call is over)."""
        with anyio.CancelScope(shield=True):
            try:
                await self._store(call, *args)
            except Agent2PCError as exc:
                log(f"recording the outcome of {args[0].intent} failed: {exc.code}: "
                    f"{exc.message}")

    async def _run(self, adm: Fresh, name: str, args: dict[str, Any], meta: dict[str, Any]
                   ) -> types.CallToolResult | dict[str, Any]:
        ticket = adm.ticket
        done = self._waiters[ticket.intent] = anyio.Event()
        self._leases[ticket.intent] = ticket
        result: dict[str, Any] | None = None
        failure: BaseException | None = None
        try:
            try:
                result = await self.ds.call(name, args, meta)
            except Exception as exc:
                failure = exc
            except BaseException:  # cancelled by the client: the call may have happened
                self._leases.pop(ticket.intent, None)
                await self._end(self.fence.abort, ticket, "the client cancelled the call while "
                                "it ran downstream; outcome unknown", "unknown")
                raise
            self._leases.pop(ticket.intent, None)
            if result is not None:
                if result.get("isError"):
                    await self._end(self.fence.abort, ticket, "the tool answered isError",
                                    "failed")
                else:
                    await self._end(self._commit, ticket, result)
                return result
            assert failure is not None
            return await self._failed(ticket, failure)
        finally:
            self._leases.pop(ticket.intent, None)
            del self._waiters[ticket.intent]
            done.set()

    def _commit(self, ticket: Any, result: dict[str, Any]) -> None:
        """Record the result before it is answered, without waiting for its fsync.

        Why that is safe: prepare was durable before the call went downstream, so whatever a
        crash loses, the intent is at least *running*, and a running intent whose lease ends
        is fenced, never free. A killed proxy loses nothing (the commit is in the WAL, in the
        OS's hands); a power cut within SYNC_DELAY_S of the commit may lose it, and then a
        duplicate gets ``intent_fenced`` instead of the replay, until ``fence reconcile``. The
        call is never run twice. The WAL keeps commits in order, so every later durable
        decision (the next prepare) makes this one durable too; ``syncer`` does it otherwise.
        """
        try:
            self.fence.commit(ticket, result, durable=False)
        except UsageError:  # too big (or not canonical) to keep: keep that it was done
            stub = {"content": [{"type": "text", "text": "(the call was made once already; its "
                                 "result was too large to record)"}], "isError": False}
            self.fence.commit(ticket, stub, durable=False)
        self._sync_wanted.set()

    async def _failed(self, ticket: Any, exc: BaseException) -> types.CallToolResult:
        """The call raised: a rejection frees the intent, anything else fences it."""
        intent = ticket.intent
        if isinstance(exc, MCPError) and exc.error.code in REJECTED_CODES:
            await self._end(self.fence.abort, ticket, f"rejected: {exc.error.message}", "failed")
            raise exc
        if isinstance(exc, DownstreamUnavailable):  # it was never sent
            await self._end(self.fence.abort, ticket, str(exc), "failed")
            return _results.coded("downstream_unavailable", str(exc), intent=intent)
        if isinstance(exc, MCPError) and exc.error.code == types.CONNECTION_CLOSED:
            why = "the downstream server's transport closed during the call"
        elif isinstance(exc, MCPError) and exc.error.code == types.REQUEST_TIMEOUT:
            why = f"the call did not finish within {self.ds.call_timeout_s:g} s"
        elif isinstance(exc, MCPError):
            why = f"the downstream server answered JSON-RPC error {exc.error.code}: " \
                  f"{exc.error.message}"
        elif isinstance(exc, NotAToolResult):
            why = "the downstream server answered something that is not a tool result"
        else:
            log(f"the call of {intent} failed:\n" + "".join(traceback.format_exception(exc)))
            why = f"the call failed ({type(exc).__name__}: {exc})"
        await self._end(self.fence.abort, ticket, why, "unknown")
        return _results.coded(
            "unknown_outcome", f"{why}; it may or may not have had its effect, so this call is "
            f"fenced: find out, then run `agent-2pc fence reconcile --intent {intent} --action "
            "clear` (it did not happen) or `--action done` (it did)", intent=intent)


def _refusal_message(exc: FenceRefusal, intent: str) -> str:
    if exc.code == "intent_fenced":
        return (f"{exc.message}: an earlier identical call may or may not have had its effect; "
                f"find out, then run `agent-2pc fence reconcile --intent {intent} --action "
                "clear` (it did not happen) or `--action done` (it did)")
    if exc.code == "intent_conflict":
        return (f"{exc.message}. The idempotency key was used before for another call: use a "
                "new key for a new action")
    return exc.message


async def _serve(argv: list[str], fence: Any, window_s: float, lease_ttl_s: float,
                 call_timeout_s: float | None) -> None:
    downstream = Downstream(argv, call_timeout_s)
    async with anyio.create_task_group() as tg:
        await tg.start(downstream.supervise)
        proxy = Proxy(downstream, fence, window_s, lease_ttl_s)
        tg.start_soon(proxy.heartbeat)
        tg.start_soon(proxy.syncer)

        async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None
                             ) -> types.ListToolsResult:
            try:
                return await proxy.list_tools(params.cursor if params else None)
            except DownstreamUnavailable as exc:
                raise MCPError(code=types.INTERNAL_ERROR, message=str(exc)) from None

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
            # A dict result is the downstream's in the SDK's version-free form (_forwarded.py):
            # the SDK's server shapes it for the client's protocol revision and writes it.
            try:
                return await proxy.call(params)
            except MCPError:
                raise
            except Exception as exc:
                log(f"{params.name} failed:\n{traceback.format_exc()}")
                return _results.internal(exc)

        info = downstream.info
        server: Server[Any] = Server(
            info.name if info is not None and info.name else "agent-2pc-wrap",
            version=info.version if info is not None else "",
            instructions=downstream.instructions, on_list_tools=list_tools,
            on_call_tool=call_tool)
        server.middleware.clear()  # the SDK's OpenTelemetry middleware: a no-op that costs
        async with server_streams() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        tg.cancel_scope.cancel()


def wrap(argv: list[str], *, store: str, window_s: float = 600.0, lease_ttl_s: float = 60.0,
         result_ttl_s: float = 86400.0, call_timeout_s: float | None = None) -> None:
    from ..fence import open_fence

    fence = open_fence(store, lease_ttl=lease_ttl_s, result_ttl=result_ttl_s)
    try:
        try:
            anyio.run(_serve, argv, fence, window_s, lease_ttl_s, call_timeout_s)
        except* DownstreamUnavailable as group:
            raise WorkspaceError(str(group.exceptions[0]), code="downstream_unavailable"
                                 ) from None
    finally:
        fence.close()
