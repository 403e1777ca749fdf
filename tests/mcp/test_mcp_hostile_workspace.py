"""MCP over a workspace that came with a repository: agent_2pc_status writes nothing and says
why (tests/hostile.py builds the clone; tests/test_hostile_workspace.py has the CLI side)."""

from __future__ import annotations

from typing import Any

import pytest
from hostile import attack_failed, forged_clone  # tests/ is on the path (its conftest.py)
from mcpkit import error, server_params, session

pytestmark = pytest.mark.timeout(120)


def test_mcp_status_in_a_clone_that_ships_a_forged_decision_writes_nothing(tmp_path: Any
                                                                             ) -> None:
    clone = forged_clone(str(tmp_path))

    async def body(c: Any) -> None:
        res = await c.call_tool("agent_2pc_status", {})
        assert attack_failed(clone)
        err = error(res, "untrusted_workspace")["error"]
        assert "agent-2pc trust" in err["message"]

    session(server_params(clone, extra_env={"AGENT2PC_SAFE_DIRECTORY": ""}), body)
    assert attack_failed(clone)
