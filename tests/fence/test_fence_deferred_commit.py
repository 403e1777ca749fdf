"""``commit(durable=False)``: the result is recorded before the caller answers, its fsync comes
later (docs/fence.md, "Deferred commits"). What must hold:

- the decision is committed at once: every reader (another connection, another process) sees it
  and replays it, and a killed process keeps it (the WAL frames are written, only not synced);
- losing what was not synced (a power cut) takes the intent back to where prepare durably put
  it -- running, then fenced when the lease ends -- and never frees it: a duplicate is refused,
  never run again. The loss is simulated by cutting the WAL back to its length at the last
  durable decision, which is what a disk that drops unsynced bytes leaves of an append-only file;
- durability stays in commit order: a later durable decision, or ``sync()``, covers it.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from typing import Any

import pytest

from agent_2pc.errors import FenceRefusal
from agent_2pc.fence import EffectRequest, open_fence

RESULT = {"content": [{"type": "text", "text": "charged"}], "isError": False}


def _url(path: str) -> str:
    return "sqlite:///" + path.lstrip("/")


def _req(intent: str = "charge-1") -> EffectRequest:
    return EffectRequest(intent=intent, domain="payments", tool="charge", args={"amount": 5})


def _copy_store(src_dir: str, dst_dir: str, wal_bytes: int | None) -> str:
    """The store as a disk would hold it: the database, and the WAL cut to ``wal_bytes`` (all of
    it when None); no -shm (SQLite rebuilds its index from the WAL, as after a reboot)."""
    os.makedirs(dst_dir)
    shutil.copyfile(os.path.join(src_dir, "fence.db"), os.path.join(dst_dir, "fence.db"))
    with open(os.path.join(src_dir, "fence.db-wal"), "rb") as f:
        data = f.read()
    with open(os.path.join(dst_dir, "fence.db-wal"), "wb") as f:
        f.write(data if wal_bytes is None else data[:wal_bytes])
    return os.path.join(dst_dir, "fence.db")


def test_a_deferred_commit_is_visible_at_once_and_lost_only_back_to_fenced(tmp_path: Any) -> None:
    live = tmp_path / "live"
    live.mkdir()
    db = str(live / "fence.db")
    fence = open_fence(_url(db), lease_ttl=0.2)
    try:
        ticket = fence.prepare(_req()).ticket
        assert not fence.needs_sync
        synced_wal = os.path.getsize(db + "-wal")  # everything up to here was fsynced
        fence.commit(ticket, RESULT, durable=False)
        assert fence.needs_sync
        assert os.path.getsize(db + "-wal") > synced_wal  # written, not yet synced
        # The commit restored the connection's synchronous=FULL for every later decision.
        assert fence.store._conn().execute("PRAGMA synchronous").fetchone()[0] == 2

        # Another connection (any process) replays it at once.
        with open_fence(_url(db)) as other:
            assert other.prepare(_req()).cert.result == RESULT

        # A power cut now: the disk keeps the WAL up to the last fsync.
        lost = _copy_store(str(live), str(tmp_path / "power-cut"), synced_wal)
        # A killed process: the written WAL is in the OS's hands and stays.
        killed = _copy_store(str(live), str(tmp_path / "killed"), None)
    finally:
        fence.close()

    with open_fence(_url(killed)) as f:
        assert f.prepare(_req()).cert.result == RESULT  # replayed
    with open_fence(_url(lost)) as f:
        assert f.status("charge-1")["state"] == "running"  # prepare's record survived
        with pytest.raises(FenceRefusal) as live_lease:
            f.prepare(_req())
        assert live_lease.value.code == "intent_in_flight"
        time.sleep(0.3)  # the lease (0.2 s) ends: fenced, never fresh
        with pytest.raises(FenceRefusal) as fenced:
            f.prepare(_req())
        assert fenced.value.code == "intent_fenced"
        assert f.status("charge-1")["state"] == "running"


def test_a_later_durable_decision_or_sync_makes_a_deferred_commit_durable(tmp_path: Any) -> None:
    db = str(tmp_path / "fence.db")
    with open_fence(_url(db)) as fence:
        fence.commit(fence.prepare(_req("a")).ticket, RESULT, durable=False)
        assert fence.needs_sync
        fence.prepare(_req("b"))  # a durable decision: its fsync covers the WAL before it
        assert not fence.needs_sync
        fence.commit(fence.prepare(_req("c")).ticket, RESULT, durable=False)
        assert fence.needs_sync
        fence.sync()
        assert not fence.needs_sync
        fence.sync()  # nothing to do: no error
        # A refused deferred commit (the lease is gone) writes nothing and keeps FULL.
        ticket = fence.prepare(_req("d")).ticket
        fence.abort(ticket, "gave up", "failed")
        with pytest.raises(FenceRefusal):
            fence.commit(ticket, RESULT, durable=False)
        assert not fence.needs_sync
        assert fence.store._conn().execute("PRAGMA synchronous").fetchone()[0] == 2


def test_a_deferred_commit_outlives_a_sigkill(tmp_path: Any) -> None:
    """A real process commits with durable=False and is killed at once (no fsync, no close)."""
    db = str(tmp_path / "fence.db")
    code = (
        "import os, signal, sys\n"
        "from agent_2pc.fence import EffectRequest, open_fence\n"
        f"f = open_fence({_url(db)!r})\n"
        "req = EffectRequest(intent='charge-1', domain='payments', tool='charge',"
        " args={'amount': 5})\n"
        f"f.commit(f.prepare(req).ticket, {RESULT!r}, durable=False)\n"
        "assert f.needs_sync\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60,
                          check=False)
    assert proc.returncode == -9, proc.stderr
    with open_fence(_url(db)) as fence:
        assert fence.prepare(_req()).cert.result == RESULT
        assert fence.status()["states"]["done"] == 1


def test_other_stores_accept_the_flag_and_are_durable_anyway() -> None:
    with open_fence("memory://") as fence:
        cert = fence.commit(fence.prepare(_req()).ticket, RESULT, durable=False)
        assert cert.result == RESULT and not fence.needs_sync
        fence.sync()


def test_sqlite_cli_opens_the_cut_wal_copy(tmp_path: Any) -> None:
    """The simulation itself: SQLite reads a WAL cut at a commit boundary as a valid WAL."""
    db = str(tmp_path / "x.db")
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE t (v INTEGER)")
    conn.execute("INSERT INTO t VALUES (1)")
    size = os.path.getsize(db + "-wal")
    conn.execute("INSERT INTO t VALUES (2)")
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copyfile(db, copy / "x.db")
    with open(db + "-wal", "rb") as f:
        (copy / "x.db-wal").write_bytes(f.read()[:size])
    conn.close()
    back = sqlite3.connect(str(copy / "x.db"))
    try:
        assert [r[0] for r in back.execute("SELECT v FROM t ORDER BY v")] == [1]
    finally:
        back.close()
