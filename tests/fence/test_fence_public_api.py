"""The fence's public surface is exactly what ``__all__`` names (private modules stay private)."""

from __future__ import annotations

import pytest

import agent_2pc.fence as fence_pkg

pytestmark = pytest.mark.timeout(30)

PUBLIC = {"AbortResult", "Certificate", "EffectRequest", "Fence", "Fresh", "HMAC_KEY_ENV",
          "Replay", "Ticket", "chain_problems", "compare", "concurrent", "happened_before",
          "open_fence", "verify_chain"}


def test_public_names_are_exactly_all() -> None:
    assert set(fence_pkg.__all__) == PUBLIC
    for name in fence_pkg.__all__:
        assert getattr(fence_pkg, name) is not None
    assert fence_pkg.HMAC_KEY_ENV == "AGENT2PC_FENCE_HMAC_KEY"


def test_cli_exports_the_fence_command() -> None:
    from agent_2pc.cli.fence import FENCE

    names = {c.name for c in FENCE.subcommands}
    assert {"prepare", "commit", "abort", "heartbeat", "reconcile", "status", "verify",
            "storm"} <= names
    assert all(c.run is not None for c in FENCE.subcommands)
