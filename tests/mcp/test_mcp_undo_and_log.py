"""agent_2pc_undo and agent_2pc_log over MCP: the CLI's answers, a conflict as a normal
``ok: false`` result, bad input as a tool error."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import read, write
from mcpkit import error, no, ok, server_params, session

pytestmark = pytest.mark.timeout(60)


def test_undo_and_log_over_mcp(root: str) -> None:
    write(root, "a.txt", "one\n")

    async def body(c: Any) -> dict[str, Any]:
        tid = ok(await c.call_tool("agent_2pc_begin", {"label": "edit"}))["tid"]
        ok(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": "a.txt",
                                                       "content": "two\n"}))
        ok(await c.call_tool("agent_2pc_commit", {"tid": tid}))
        undone = ok(await c.call_tool("agent_2pc_undo", {"tid": tid}))
        assert undone["undoes"] == tid and undone["state"] == "committed"
        assert read(root, "a.txt") == b"one\n"
        write(root, "a.txt", "someone else\n")
        no(await c.call_tool("agent_2pc_undo", {"tid": undone["tid"]}), "conflict")
        error(await c.call_tool("agent_2pc_undo", {"tid": "tx-20200101-000000-abcdef"}),
              "unknown_tid")
        log = ok(await c.call_tool("agent_2pc_log", {"limit": 2}))["entries"]
        assert [e["tid"] for e in log] == [undone["tid"], tid]
        assert log[1]["undone_by"] == undone["tid"] and log[0]["prev"] == log[1]["hash"]
        verified = ok(await c.call_tool("agent_2pc_log", {"verify": True}))
        assert verified == {"ok": True, "verified": 0, "unchained": 0}  # nothing compacted yet
        return {}

    session(server_params(root), body)
    assert read(root, "a.txt") == b"someone else\n"
