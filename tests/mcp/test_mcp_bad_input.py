"""Bad input through `agent-2pc mcp` (the SDK's own client over stdio): the same checks as the
CLI and the library, so the same codes -- a mode with setuid bits, a name the file system cannot
look up, a name the log cannot hold -- never ``internal``."""

from __future__ import annotations

import os
from typing import Any

import pytest
from conftest import take_snapshot
from mcpkit import error, ok, server_params, session

pytestmark = pytest.mark.timeout(60)


def test_modes_names_and_loops_get_their_codes_and_change_nothing(root: str) -> None:
    os.symlink("loop", os.path.join(root, "loop"))

    async def body(c: Any) -> None:
        tid = ok(await c.call_tool("agent_2pc_begin", {}))["tid"]
        before = take_snapshot(root)
        write = "agent_2pc_stage_write"
        for mode in ("4755", "2755", "1777", "07777"):
            res = error(await c.call_tool(write, {"tid": tid, "path": "s.sh", "content": "x",
                                                  "mode": mode}), "usage")
            assert "setuid" in res["error"]["message"]
        for path in ("n" * 256, "sub/" + "n" * 300 + "/x"):
            error(await c.call_tool(write, {"tid": tid, "path": path, "content": "x"}), "usage")
            error(await c.call_tool("agent_2pc_record_read", {"tid": tid, "path": path}),
                  "usage")
        for path in ("loop", "loop/x.txt"):
            error(await c.call_tool(write, {"tid": tid, "path": path, "content": "x"}),
                  "not_a_file")
        error(await c.call_tool("agent_2pc_exec", {
            "tid": tid, "argv": ["python3", "-c", 'open(b"caf\\xe9", "wb").write(b"x")']}),
            "usage")
        assert take_snapshot(root) == before, "a refused call changed something"
        ok(await c.call_tool(write, {"tid": tid, "path": "s.sh", "content": "x",
                                     "mode": "0755"}))

    session(server_params(root), body)
