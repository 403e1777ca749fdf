"""agent_2pc_hook_check: the pre-commit gate's question over MCP (results checked against the
tool's outputSchema by the SDK's client on each call)."""

from __future__ import annotations

from typing import Any

import pytest
from mcpkit import error, no, ok, server_params, session

from agent_2pc import Agent2PC

pytestmark = pytest.mark.timeout(60)


def test_hook_check_passes_then_lists_a_live_transaction_as_a_no(root: str) -> None:
    async def body(c: Any) -> dict[str, Any]:
        clean = ok(await c.call_tool("agent_2pc_hook_check", {}))
        client = Agent2PC(root)
        tx = client.begin(label="edit")
        tx.stage_write("a.txt", "a\n")
        client.close()
        live = no(await c.call_tool("agent_2pc_hook_check", {}), "in_flight")
        return {"clean": clean, "live": live, "tid": tx.tid}

    out = session(server_params(root), body)
    assert out["clean"] == {"ok": True, "in_flight": [], "workspace": root}
    [row] = out["live"]["in_flight"]
    assert (row["tid"], row["label"], row["state"], row["files"]) == (
        out["tid"], "edit", "active", ["a.txt"])
    assert out["tid"] in out["live"]["error"]["message"]


def test_hook_check_without_a_workspace_is_not_initialized_unless_missing_ok(tmp_path: Any
                                                                              ) -> None:
    empty = str(tmp_path)

    async def body(c: Any) -> dict[str, Any]:
        return {"missing": error(await c.call_tool("agent_2pc_hook_check", {}),
                                 "not_initialized"),
                "passes": ok(await c.call_tool("agent_2pc_hook_check", {"missing_ok": True}))}

    params = server_params(empty)
    params.args = ["-m", "agent_2pc", "mcp"]  # no --root: the server looks from its cwd
    out = session(params, body)
    assert "missing_ok" in out["missing"]["error"]["message"]
    assert out["passes"] == {"ok": True, "in_flight": [], "workspace": None}
