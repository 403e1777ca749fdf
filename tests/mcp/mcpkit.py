"""Helpers for the MCP tests: real processes over stdio, driven by the SDK's own client.

(tests/mcp has no __init__.py on purpose: with one, pytest's default import mode would make this
directory the package ``mcp`` and shadow the SDK. Hence no conftest.py here either; the shared
fixtures of tests/conftest.py apply.)

    async def body(client):                       # a connected mcp.Client
        res = await client.call_tool("agent_2pc_begin", {})
        ...
    session(server_params(root), body)            # anyio.run + connect + body, bounded in time

Clients connect as the SDK's ``Client`` does by default (``mode="auto"``: ``server/discover``,
which negotiates the newest revision, 2026-07-28, else the ``initialize`` handshake), unless a
test names a protocol revision (``revision=...``; REVISIONS lists every revision the pinned SDK
speaks): a handshake revision is asked for in ``initialize`` (the SDK's ``Client`` always asks
for the newest), with the SDK's ``ClientSession``, which validates results at that revision and
checks structured content against the tools' output schemas, as ``Client`` does.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
import mcp_types as types
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

HERE = os.path.dirname(os.path.abspath(__file__))
DOWNSTREAM = os.path.join(HERE, "downstream_server.py")
SDK_DOWNSTREAM = os.path.join(HERE, "sdk_downstream.py")
REVISIONS = (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS)
CLIENT_INFO = types.Implementation(name="mcpkit", version="0")
SESSION_TIMEOUT_S = 45.0
# Variables of ours that must not leak from the developer's shell into the servers.
_SCRUB = ("AGENT2PC_ROOT", "AGENT2PC_CRASH_AT", "AGENT2PC_FENCE_STORE", "AGENT2PC_MCP_NOOP")


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    out["PYTHONDONTWRITEBYTECODE"] = "1"
    out.update(extra or {})
    return out


def server_params(root: str, *args: str, cwd: str | None = None,
                  extra_env: dict[str, str] | None = None) -> StdioServerParameters:
    """``python -m agent_2pc --root ROOT mcp ARGS...``"""
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "agent_2pc", "--root", root, "mcp", *args],
                                 env=env(extra_env), cwd=cwd or root)


def downstream_argv(revision: str | None = None) -> list[str]:
    """The test downstream server that speaks ``revision`` (default: the stdlib one, which
    answers the revision its client asks for): downstream_server.py for a handshake revision
    (told which with $DOWNSTREAM_PROTOCOL), sdk_downstream.py (the SDK's MCPServer) for a
    2026-07-28 one."""
    if revision in MODERN_PROTOCOL_VERSIONS:
        return [sys.executable, SDK_DOWNSTREAM]
    return [sys.executable, DOWNSTREAM]


def _downstream_env(effects: str, revision: str | None, extra: dict[str, str] | None
                    ) -> dict[str, str]:
    out = {"DOWNSTREAM_EFFECTS": effects, **(extra or {})}
    if revision in HANDSHAKE_PROTOCOL_VERSIONS:
        out["DOWNSTREAM_PROTOCOL"] = revision
    return out


def wrap_params(root: str, effects: str, *args: str, downstream_env: dict[str, str] | None = None,
                downstream: str | None = None) -> StdioServerParameters:
    """``agent-2pc --root ROOT mcp wrap ARGS... -- python downstream_server.py``; the
    downstream server appends its executions to ``effects``; ``downstream`` names the protocol
    revision it speaks (downstream_argv)."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "agent_2pc", "--root", root, "mcp", "wrap", *args, "--",
              *downstream_argv(downstream)],
        env=env(_downstream_env(effects, downstream, downstream_env)), cwd=root)


def downstream_params(effects: str, extra_env: dict[str, str] | None = None,
                      revision: str | None = None) -> StdioServerParameters:
    argv = downstream_argv(revision)
    return StdioServerParameters(command=argv[0], args=argv[1:],
                                 env=env(_downstream_env(effects, revision, extra_env)))


def _run(main: Callable[[], Awaitable[Any]]) -> Any:
    """anyio.run, with a lone exception out of the SDK's task groups unwrapped (a readable
    assertion error instead of nested exception groups)."""
    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:
        inner: BaseException = group
        while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
            inner = inner.exceptions[0]
        if inner is group:
            raise
        raise inner from None


@asynccontextmanager
async def connect(params: StdioServerParameters, revision: str | None = None
                  ) -> AsyncIterator[Any]:
    """A client connected to the server: the SDK's ``Client`` at its defaults (``revision``
    None), or at a given protocol revision. A 2026-07-28 revision is negotiated as the default
    does (discovery); a handshake revision is asked for in ``initialize``. The server must
    agree on it (checked)."""
    if revision is None or revision in MODERN_PROTOCOL_VERSIONS:
        async with Client(params, cache=None, client_info=CLIENT_INFO) as client:
            assert revision is None or client.protocol_version == revision, \
                (revision, client.protocol_version)
            yield client
        return
    assert revision in HANDSHAKE_PROTOCOL_VERSIONS, revision
    async with stdio_client(params) as (read_stream, write_stream), \
            ClientSession(read_stream, write_stream, client_info=CLIENT_INFO) as client:
        result = await client.send_request(types.InitializeRequest(
            params=types.InitializeRequestParams(protocol_version=revision,
                                                 capabilities=types.ClientCapabilities(),
                                                 client_info=CLIENT_INFO)),
            types.InitializeResult)
        assert result.protocol_version == revision, (revision, result.protocol_version)
        client.adopt(result)
        await client.send_notification(types.InitializedNotification())
        yield client


def session(params: StdioServerParameters, body: Callable[[Any], Awaitable[Any]], *,
            revision: str | None = None, timeout_s: float = SESSION_TIMEOUT_S) -> Any:
    """Connect a client to the server over stdio (``connect``) and run ``body(client)``."""

    async def main() -> Any:
        with anyio.fail_after(timeout_s):
            async with connect(params, revision) as client:
                return await body(client)

    return _run(main)


def sessions(params: list[StdioServerParameters],
             body: Callable[..., Awaitable[Any]], *, revision: str | None = None,
             timeout_s: float = SESSION_TIMEOUT_S) -> Any:
    """Several clients at once (each to its own server process): ``body(c1, c2, ...)``."""

    async def main() -> Any:
        with anyio.fail_after(timeout_s):
            async with AsyncExitStack() as stack:
                clients = [await stack.enter_async_context(connect(p, revision))
                           for p in params]
                return await body(*clients)

    return _run(main)


def structured(res: Any) -> dict[str, Any]:
    """A result's structured content, checked against its text content (the same JSON)."""
    assert isinstance(res.structured_content, dict), res
    assert res.content and res.content[0].type == "text", res
    assert json.loads(res.content[0].text) == res.structured_content
    return res.structured_content  # type: ignore[no-any-return]


def ok(res: Any) -> dict[str, Any]:
    """A success: ok true, not isError."""
    obj = structured(res)
    assert res.is_error is False and obj["ok"] is True, obj
    return obj


def no(res: Any, code: str) -> dict[str, Any]:
    """An answer that is no (the CLI's exit 1): a normal result with ok false and the code."""
    obj = structured(res)
    assert res.is_error is False, obj
    assert obj["ok"] is False and obj["error"]["code"] == code, obj
    assert isinstance(obj["error"]["message"], str) and obj["error"]["message"]
    return obj


def error(res: Any, code: str) -> dict[str, Any]:
    """A tool error (the CLI's exit 2): isError, still carrying {ok: false, error: {code}}."""
    obj = structured(res)
    assert res.is_error is True, obj
    assert obj["ok"] is False and obj["error"]["code"] == code, obj
    assert isinstance(obj["error"]["message"], str) and obj["error"]["message"]
    return obj


def effects(path: str) -> list[dict[str, Any]]:
    """The downstream server's own record of its real executions, one per line."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


class RawClient:
    """JSON-RPC lines written to a real server process's stdin, its answers read from its
    stdout: for what the SDK's client would never send, and to see the exact wire shape.

        with RawClient(server_params(root)) as raw:
            raw.send_bytes(b"not json\\n")
            raw.read()                              # the next message the server wrote
            raw.request("tools/list", {})           # -> the response to it (id matched)
    """

    def __init__(self, params: StdioServerParameters, timeout_s: float = SESSION_TIMEOUT_S
                 ) -> None:
        import subprocess

        self.timeout_s = timeout_s
        self.proc = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=params.env, cwd=params.cwd)
        self._n = 0
        self._buf = b""
        self.envelope: dict[str, Any] | None = None  # a 2026-07-28 connection's

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def send_bytes(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, obj: Any) -> None:
        self.send_bytes(json.dumps(obj).encode() + b"\n")

    def read(self) -> dict[str, Any]:
        """The next line the server writes, parsed (bounded by the timeout)."""
        import select

        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], self.timeout_s)
            assert ready, f"no answer within {self.timeout_s} s"
            chunk = os.read(fd, 1 << 16)
            assert chunk, "the server closed its stdout"
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request (with the 2026-07-28 envelope once ``discover`` set one); its answer
        (notifications and other ids in between are skipped)."""
        self._n += 1
        params = dict(params or {})
        if self.envelope is not None:
            params["_meta"] = {**params.get("_meta", {}), **self.envelope}
        self.send({"jsonrpc": "2.0", "id": self._n, "method": method, "params": params})
        while True:
            msg = self.read()
            if msg.get("id") == self._n:
                return msg

    def initialize(self, revision: str) -> dict[str, Any]:
        """The handshake at a handshake revision, or discovery at a 2026-07-28 one."""
        if revision in MODERN_PROTOCOL_VERSIONS:
            self.envelope = {types.PROTOCOL_VERSION_META_KEY: revision,
                             types.CLIENT_CAPABILITIES_META_KEY: {},
                             types.CLIENT_INFO_META_KEY: {"name": "raw", "version": "0"}}
            answer = self.request("server/discover")
            assert revision in answer["result"]["supportedVersions"], answer
            return answer
        answer = self.request("initialize", {"protocolVersion": revision, "capabilities": {},
                                             "clientInfo": {"name": "raw", "version": "0"}})
        assert answer["result"]["protocolVersion"] == revision, answer
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def close(self) -> int:
        """Close stdin (the end of the session); the exit status."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=self.timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
