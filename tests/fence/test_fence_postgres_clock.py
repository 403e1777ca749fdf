"""Postgres: the database's clock is the only clock, whatever the clients' clocks say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from agent_2pc.errors import FenceRefusal
from agent_2pc.fence import EffectRequest, Fresh, open_fence

pytestmark = [pytest.mark.timeout(60), pytest.mark.postgres]

WORKER = os.path.join(os.path.dirname(__file__), "fence_worker.py")
HOUR = 3600.0


def _skewed_client(url: str, intent: str, offset_s: float) -> dict[str, Any]:
    """Another process whose clock is off by offset_s tries to take the intent over."""
    out = subprocess.run([sys.executable, WORKER, "skewed", url, intent, str(offset_s)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _req(agent: str) -> EffectRequest:
    return EffectRequest(intent="pay-skew", domain="pay", tool="charge", args={"amount": 5},
                         agent=agent)


def test_clock_skew_between_postgres_clients_the_database_clock_decides(pg_url: str) -> None:
    with open_fence(pg_url, lease_ttl=1.5) as fence:
        holder = fence.prepare(_req("holder"))
        db_now = fence.store.now()
        assert abs(holder.lease_expires_at - (db_now + 1.5)) < 1.0
        # A client an hour ahead would think the lease long expired: the database says it is
        # live, so the takeover is refused.
        ahead = _skewed_client(pg_url, "pay-skew", +HOUR)
        assert ahead["answer"] == "intent_in_flight"
        assert ahead["client_time"] - ahead["store_time"] > HOUR - 60
        # Heartbeats are timed by the database too.
        fence.heartbeat(holder.ticket)
        time.sleep(1.8)  # now the lease has expired by the database's clock
        # A client an hour behind would think the lease still has an hour to run: the database
        # says it expired, so the explicit takeover is granted.
        behind = _skewed_client(pg_url, "pay-skew", -HOUR)
        assert behind["answer"] == "fresh"
        assert abs(behind["lease_expires_at"] - (behind["store_time"] + 60.0)) < 5.0
        with pytest.raises(FenceRefusal) as info:
            fence.commit(holder.ticket, "old holder")
        assert info.value.code == "stale_lease"


def test_a_skewed_clock_in_this_process_changes_nothing(pg_url: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with open_fence(pg_url, lease_ttl=30.0) as fence:
        adm = fence.prepare(_req("holder"))
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 10 * HOUR)
        with pytest.raises(FenceRefusal) as info:
            fence.prepare(_req("other"), takeover=True)
        assert info.value.code == "intent_in_flight"
        expires = fence.heartbeat(adm.ticket)
        assert expires < real() + HOUR  # set from the database's clock, not the skewed one
        assert isinstance(adm, Fresh) and fence.commit(adm.ticket, "ok").verify()
