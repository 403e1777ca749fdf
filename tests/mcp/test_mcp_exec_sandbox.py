"""agent_2pc_exec and agent_2pc_overlay_exec take the sandbox option of agent_2pc_stage_cmd
(issue 10.2): the same confinement (host read-only, private /tmp, no network unless asked),
said in the result's ``sandbox``; ``network`` alone is a usage error."""

from __future__ import annotations

import os
from typing import Any

from conftest import write
from mcpkit import error, ok, server_params, session

PROBE = ("echo made > made.txt; touch /etc/agent2pc-probe 2>/dev/null && echo HOST-WRITABLE; "
         "echo seen")


def test_exec_and_overlay_exec_run_sandboxed_when_asked(root: str) -> None:
    write(root, "README.md", "hello\n")

    async def body(c: Any) -> dict[str, Any]:
        tid = ok(await c.call_tool("agent_2pc_begin", {}))["tid"]
        ran = ok(await c.call_tool("agent_2pc_exec", {
            "tid": tid, "argv": ["sh", "-c", PROBE], "sandbox": True}))
        looked = ok(await c.call_tool("agent_2pc_overlay_exec", {
            "tid": tid, "command": PROBE + "; cat made.txt", "sandbox": True}))
        bad = error(await c.call_tool("agent_2pc_exec", {
            "tid": tid, "argv": ["true"], "network": True}), "usage")
        kept = await c.call_tool("agent_2pc_exec", {
            "tid": tid, "argv": ["sh", "-c", "echo partial > partial.txt; exit 3"],
            "keep_on_failure": True})
        return {"ran": ran, "looked": looked, "bad": bad, "kept": kept.structured_content}

    out = session(server_params(root), body)
    ran, looked = out["ran"], out["looked"]
    assert ran["sandbox"]["readonly_host"] is True and ran["sandbox"]["network"] is False
    assert [c["path"] for c in ran["captured"]] == ["made.txt"]
    assert "HOST-WRITABLE" not in (ran["tail"] or "")
    assert looked["sandbox"]["private_tmp"] is True
    assert looked["tail"].splitlines() == ["seen", "made"]
    assert not os.path.exists("/etc/agent2pc-probe")
    assert out["kept"]["ok"] is False and out["kept"]["error"]["code"] == "command_failed"
    assert [c["path"] for c in out["kept"]["captured"]] == ["partial.txt"]
