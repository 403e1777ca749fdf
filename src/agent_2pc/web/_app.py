"""The Starlette app of ``agent-2pc web``: the guard, the hub, the routes.

    GET  /                                  the page (token and CSRF token in its meta tags)
    GET  /static/NAME                       the page's script, style and icon (a fixed list)
    GET  /api/transactions                  the monitor object (``agent-2pc monitor --json``)
    GET  /api/transactions/TID              one transaction: steps, savepoints, checks, effects
    GET  /api/transactions/TID/diff         its staged diff
    GET  /api/transactions/TID/checks/N/log the tail of its N-th check's log
    GET  /api/history?offset=&limit=&state= finished transactions, newest first, paginated
    GET  /api/ledger?offset=&limit=         the fence's entries, certificates verified
    GET  /api/events                        server-sent events: ``snapshot`` on every change
    POST /api/transactions/TID/commit|abort only with --allow-actions (CSRF header, same origin)
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import secrets
import threading
import time
from urllib.parse import parse_qs

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..coordinator.monitor import Monitor
from ..errors import Agent2PCError, InputError, Refusal, UnknownTid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, AsyncIterator, Callable

POLL_S = 0.1            # how often the hub looks at the log (a change reaches pages within this)
TICK_S = 1.0            # a snapshot at least this often anyway (ages, deadlines move)
HEARTBEAT_S = 15.0      # a comment on idle event streams, so proxies and browsers keep them
STREAM_WAIT_S = 1.0     # an event stream checks for its client's departure this often
STATIC = os.path.join(os.path.dirname(__file__), "static")
# The only files ever served from disk by name: the page's own.
STATIC_FILES = {"app.js": "text/javascript", "graph.js": "text/javascript",
                "highlight.js": "text/javascript", "style.css": "text/css",
                "favicon.svg": "image/svg+xml"}
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the token is in the URL: never send it elsewhere
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
}
UNAUTHORIZED = json.dumps({"ok": False, "error": {
    "code": "unauthorized", "message": "a valid token is required: open the URL that "
    "'agent-2pc web' printed"}}).encode()


class Hub:
    """One monitor for the whole server, used by one thread at a time; a pump that looks for
    changes and hands the newest snapshot to every open event stream."""

    def __init__(self, root: str) -> None:
        self.monitor = Monitor(root)
        self._lock = threading.Lock()
        self.version = -1
        self.snapshot: bytes = b""
        self._seen = -1
        self._made = 0.0
        self._waiters: set[asyncio.Event] = set()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            return fn(*args)

    def _refresh(self, force: bool) -> bool:
        with self._lock:
            seen = self.monitor.poll()
            if not force and seen == self._seen and time.monotonic() - self._made < TICK_S:
                return False
            snap = self.monitor.snapshot()
            self._seen = seen
            self._made = time.monotonic()
        self.snapshot = json.dumps({"ok": True, **snap}, ensure_ascii=False).encode()
        self.version += 1
        return True

    async def pump(self) -> None:
        while True:
            try:
                changed = await anyio.to_thread.run_sync(self._refresh, self.version < 0)
            except Exception as exc:  # noqa: BLE001 -- the dashboard keeps running, and says so
                self.snapshot = json.dumps({"ok": False, "error": {
                    "code": getattr(exc, "code", "internal"), "message": str(exc)}}).encode()
                self.version += 1
                changed = True
            if changed:
                for ev in list(self._waiters):
                    ev.set()
            await asyncio.sleep(POLL_S)

    async def wait(self, after: int, timeout: float) -> None:
        if self.version != after:
            return
        ev = asyncio.Event()
        self._waiters.add(ev)
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self._waiters.discard(ev)


class Guard:
    """ASGI middleware: a known Host header, then the token; security headers on every
    answer. A request without the token gets 401 and this one fixed body, whatever it asked."""

    def __init__(self, app: Any, token: str, hosts: set[str]) -> None:
        self.app, self.token, self.hosts = app, token.encode(), hosts

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if host not in self.hosts:
            await _raw(send, 421, b'{"ok":false,"error":{"code":"unknown_host","message":'
                                  b'"this server answers to its own address only"}}')
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        given = (query.get("token") or [""])[0].encode() or headers.get(b"x-agent2pc-token", b"")
        if not hmac.compare_digest(given, self.token):
            await _raw(send, 401, UNAUTHORIZED)
            return

        async def secured(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()
                         if k.lower().encode() not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, secured)


async def _raw(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _error(exc: Agent2PCError) -> JSONResponse:
    status = 404 if isinstance(exc, UnknownTid) else 400 if isinstance(exc, InputError) else \
        409 if isinstance(exc, Refusal) else 500
    return JSONResponse({"ok": False, "error": exc.to_json()}, status_code=status)


def _int(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        return -1  # refused by the monitor's bounds check, with its message


def make_app(root: str, *, token: str, allow_actions: bool, hosts: set[str]) -> Any:
    hub = Hub(root)
    csrf = secrets.token_urlsafe(24)

    async def call(fn: Callable[..., Any], *args: Any) -> Response:
        try:
            out = await anyio.to_thread.run_sync(hub.call, fn, *args)
        except Agent2PCError as exc:
            return _error(exc)
        return JSONResponse({"ok": True, **out})

    async def index(request: Request) -> Response:
        with open(os.path.join(STATIC, "index.html"), encoding="utf-8") as f:
            page = f.read()
        page = (page.replace("{{TOKEN}}", token).replace("{{CSRF}}", csrf)
                .replace("{{ACTIONS}}", "1" if allow_actions else "0"))
        return Response(page, media_type="text/html; charset=utf-8")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        kind = STATIC_FILES.get(name)
        if kind is None:
            return JSONResponse({"ok": False, "error": {"code": "not_found",
                                                        "message": "no such file"}}, 404)
        with open(os.path.join(STATIC, name), "rb") as f:
            return Response(f.read(), media_type=kind)

    async def transactions(request: Request) -> Response:
        if hub.version < 0:
            await anyio.to_thread.run_sync(hub._refresh, True)
        return Response(hub.snapshot, media_type="application/json")

    async def transaction(request: Request) -> Response:
        return await call(hub.monitor.transaction, request.path_params["tid"])

    async def diff(request: Request) -> Response:
        return await call(hub.monitor.diff, request.path_params["tid"])

    async def check_log(request: Request) -> Response:
        return await call(hub.monitor.check_log, request.path_params["tid"],
                          request.path_params["n"])

    async def history(request: Request) -> Response:
        return await call(hub.monitor.page, _int(request, "offset", 0),
                          _int(request, "limit", 50), request.query_params.get("state") or None)

    async def ledger(request: Request) -> Response:
        return await call(hub.monitor.ledger, _int(request, "offset", 0),
                          _int(request, "limit", 50))

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[bytes]:
            yield b"retry: 1000\n\n"
            sent = -2
            idle = 0.0
            while True:
                if hub.version >= 0 and hub.version != sent:
                    sent = hub.version
                    idle = 0.0
                    yield b"id: %d\nevent: snapshot\ndata: %s\n\n" % (sent, hub.snapshot)
                    continue
                await hub.wait(sent, STREAM_WAIT_S)
                if hub.version == sent:
                    idle += STREAM_WAIT_S
                    if await request.is_disconnected():
                        return
                    if idle >= HEARTBEAT_S:
                        idle = 0.0
                        yield b": ping\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"X-Accel-Buffering": "no"})

    async def act(request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ("commit", "abort"):
            return JSONResponse({"ok": False, "error": {"code": "not_found",
                                                        "message": "no such action"}}, 404)
        if not allow_actions:
            return JSONResponse({"ok": False, "error": {
                "code": "read_only", "message": "this dashboard is read-only: start it with "
                "'agent-2pc web --allow-actions' to commit or abort from the page"}}, 403)
        host = request.headers.get("host", "")
        origin = request.headers.get("origin")
        site = request.headers.get("sec-fetch-site")
        given = request.headers.get("x-csrf-token", "")
        if (not hmac.compare_digest(given.encode(), csrf.encode())
                or (origin is not None and origin != f"http://{host}")
                or (site is not None and site != "same-origin")):
            return JSONResponse({"ok": False, "error": {
                "code": "csrf", "message": "refused: not sent by this dashboard's page"}}, 403)
        tid = request.path_params["tid"]

        def run() -> dict[str, Any]:
            from ..coordinator.client import Agent2PC

            client = Agent2PC(root)
            try:
                tx = client.get(tid)
                if action == "abort":
                    return tx.abort(reason="aborted from the web dashboard")
                return tx.commit()
            finally:
                client.close()

        try:
            out = await anyio.to_thread.run_sync(run)
        except Agent2PCError as exc:
            return _error(exc)
        hub._seen = -1  # show it at once
        return JSONResponse({"ok": True, **out})

    async def lifespan(app: Any) -> AsyncIterator[None]:
        task = asyncio.create_task(hub.pump())
        try:
            yield
        finally:
            task.cancel()
            hub.monitor.close()

    import contextlib

    routes = [
        Route("/", index), Route("/static/{name}", static),
        Route("/api/transactions", transactions),
        Route("/api/transactions/{tid}", transaction),
        Route("/api/transactions/{tid}/diff", diff),
        Route("/api/transactions/{tid}/checks/{n:int}/log", check_log),
        Route("/api/transactions/{tid}/{action}", act, methods=["POST"]),
        Route("/api/history", history), Route("/api/ledger", ledger),
        Route("/api/events", events),
    ]
    app = Starlette(routes=routes, lifespan=contextlib.asynccontextmanager(lifespan))
    return Guard(app, token, hosts)
