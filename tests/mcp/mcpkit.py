"""Helpers for the MCP tests: real processes over stdio, driven by the SDK's own client.

(tests/mcp has no __init__.py on purpose: with one, pytest's default import mode would make this
directory the package ``mcp`` and shadow the SDK. Hence no conftest.py here either; the shared
fixtures of tests/conftest.py apply.)

    async def body(client):                       # a connected mcp.Client
        res = await client.call_tool("agent_2pc_begin", {})
        ...
    session(server_params(root), body)            # anyio.run + connect + body, bounded in time
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Awaitable, Callable

import anyio
from mcp import Client, StdioServerParameters

HERE = os.path.dirname(os.path.abspath(__file__))
DOWNSTREAM = os.path.join(HERE, "downstream_server.py")
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


def wrap_params(root: str, effects: str, *args: str, downstream_env: dict[str, str] | None = None
                ) -> StdioServerParameters:
    """``agent-2pc --root ROOT mcp wrap ARGS... -- python downstream_server.py``; the
    downstream server appends its executions to ``effects``."""
    extra = {"DOWNSTREAM_EFFECTS": effects, **(downstream_env or {})}
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "agent_2pc", "--root", root, "mcp", "wrap", *args, "--",
              sys.executable, DOWNSTREAM],
        env=env(extra), cwd=root)


def downstream_params(effects: str, extra_env: dict[str, str] | None = None
                      ) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[DOWNSTREAM],
                                 env=env({"DOWNSTREAM_EFFECTS": effects, **(extra_env or {})}))


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


def session(params: StdioServerParameters, body: Callable[[Client], Awaitable[Any]], *,
            mode: str = "legacy", timeout_s: float = SESSION_TIMEOUT_S) -> Any:
    """Connect the SDK's client to the server over stdio and run ``body(client)``."""

    async def main() -> Any:
        with anyio.fail_after(timeout_s):
            async with Client(params, mode=mode, cache=None) as client:
                return await body(client)

    return _run(main)


def sessions(params: list[StdioServerParameters],
             body: Callable[..., Awaitable[Any]], *, timeout_s: float = SESSION_TIMEOUT_S
             ) -> Any:
    """Several clients at once (each to its own server process): ``body(c1, c2, ...)``."""

    async def main() -> Any:
        with anyio.fail_after(timeout_s):
            from contextlib import AsyncExitStack

            async with AsyncExitStack() as stack:
                clients = [await stack.enter_async_context(Client(p, mode="legacy", cache=None))
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
