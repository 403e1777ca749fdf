"""agent_2pc_daemon_status: is the workspace's daemon running, over MCP (results checked against
the tool's outputSchema by the SDK's client on each call); the other tools go through it."""

from __future__ import annotations

from typing import Any

import pytest
from daemonkit import DaemonProc
from mcpkit import ok, server_params, session

pytestmark = pytest.mark.timeout(120)


def test_daemon_status_says_not_running_then_running(root: str) -> None:
    async def body(c: Any) -> dict[str, Any]:
        return {"status": ok(await c.call_tool("agent_2pc_daemon_status", {}))}

    out = session(server_params(root), body)
    assert out["status"] == {"ok": True, "running": False, "pid": None, "socket": None,
                             "uptime_s": None, "clients": 0, "requests": 0, "commits": 0,
                             "fsyncs": 0}

    async def through(c: Any) -> dict[str, Any]:
        tid = ok(await c.call_tool("agent_2pc_begin", {}))["tid"]
        ok(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": "m.txt",
                                                       "content": "via mcp\n"}))
        done = ok(await c.call_tool("agent_2pc_commit", {"tid": tid}))
        return {"done": done, "status": ok(await c.call_tool("agent_2pc_daemon_status", {}))}

    with DaemonProc(root) as d:
        out = session(server_params(root), through)
    assert out["done"]["state"] == "committed"
    st = out["status"]
    assert st["running"] is True and st["pid"] == d.pid
    assert st["commits"] == 1 and st["fsyncs"] == 1 and st["requests"] >= 3
