"""agent_2pc_status carries the monitor's health summary (checked against its outputSchema by
the SDK's client on each call)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from mcpkit import ok, server_params, session

from agent_2pc import Agent2PC

pytestmark = pytest.mark.timeout(60)


def test_status_says_healthy_then_names_a_transaction_past_its_deadline(root: str) -> None:
    async def body(c: Any) -> dict[str, Any]:
        first = ok(await c.call_tool("agent_2pc_status", {}))
        Agent2PC(root).begin(timeout_ms=1, label="forgotten")
        time.sleep(0.05)
        second = ok(await c.call_tool("agent_2pc_status", {}))
        return {"first": first, "second": second}

    out = session(server_params(root), body)
    assert out["first"]["health"] == {"health": "healthy", "reasons": [], "in_flight": 0,
                                      "stuck": 0}
    health = out["second"]["health"]
    assert health["health"] == "degraded" and health["stuck"] == 1
    assert [r["code"] for r in health["reasons"]] == ["stuck"]
