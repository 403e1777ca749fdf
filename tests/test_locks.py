"""Workspace locks (storage/locks.py): a process that waits for another's hold is woken by the
release, not by a timer; a wait given up at its deadline leaves nothing held; threads sharing
a lock object wait for each other."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from agent_2pc.errors import Busy
from agent_2pc.storage import locks
from agent_2pc.storage.locks import FileLock

pytestmark = pytest.mark.timeout(60)

HOLDER = textwrap.dedent("""\
    import sys, time
    from agent_2pc.storage.locks import FileLock
    path, offset, hold_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    lock = FileLock(path, offset=None if offset == "-" else int(offset))
    lock.acquire()
    print("held", flush=True)
    time.sleep(hold_s)
    lock.release()
    print("released", time.monotonic(), flush=True)
    time.sleep(0.5)
""")


def _hold(path: str, offset: int | None, hold_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, path, "-" if offset is None else
                             str(offset), str(hold_s)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("offset", [None, 12345], ids=["flock", "ofd-byte"])
def test_a_waiting_process_is_woken_by_the_release_not_by_a_timer(tmp_path, monkeypatch,
                                                                   offset):
    monkeypatch.setattr(locks, "_BACKOFF_S", (30.0,))  # a poll would sleep 30 s
    path = str(tmp_path / "lock")
    holder = _hold(path, offset, 0.3)
    lock = FileLock(path, offset=offset)
    t0 = time.monotonic()
    lock.acquire(timeout_s=20)
    took = time.monotonic() - t0
    lock.release()
    assert holder.stdout is not None
    released = float(holder.stdout.readline().split()[1])
    holder.communicate(timeout=10)
    assert took < 5, f"took {took:.2f} s: woken by a timer, not by the release"
    assert time.monotonic() - released < 5


@pytest.mark.parametrize("offset", [None, 777], ids=["flock", "ofd-byte"])
def test_a_wait_given_up_at_its_deadline_leaves_the_lock_free_once_released(tmp_path, offset):
    path = str(tmp_path / "lock")
    holder = _hold(path, offset, 1.0)
    lock = FileLock(path, offset=offset)
    t0 = time.monotonic()
    with pytest.raises(Busy):
        lock.acquire(timeout_s=0.2)
    assert time.monotonic() - t0 < 5
    assert not lock.held
    holder.communicate(timeout=10)
    # The helper given up takes the lock when the holder drops it, and drops it at once.
    probe = FileLock(path, offset=offset)
    deadline = time.monotonic() + 5
    while not probe.is_free():
        assert time.monotonic() < deadline, "a given-up wait kept the lock"
        time.sleep(0.01)
    lock.acquire(timeout_s=5)
    lock.release()


def test_threads_sharing_a_lock_object_wait_for_each_other(tmp_path):
    lock = FileLock(str(tmp_path / "lock"), offset=99)
    inside = []
    order: list[str] = []

    def work(name: str) -> None:
        lock.acquire(timeout_s=20)
        try:
            inside.append(name)
            assert len(inside) == 1, inside  # nobody else in at the same time
            time.sleep(0.05)
            order.append(name)
            inside.remove(name)
        finally:
            lock.release()

    threads = [threading.Thread(target=work, args=(f"t{i}",)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert sorted(order) == [f"t{i}" for i in range(6)]


def test_the_poll_alone_is_still_there_to_compare(tmp_path):
    env = dict(os.environ, AGENT2PC_LOCK_WAIT="poll")
    out = subprocess.run([sys.executable, "-c", "from agent_2pc.storage import locks; "
                          "print(locks._KERNEL_WAIT)"], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_a_live_transactions_lock_object_is_not_dropped_from_the_cache_between_look_up_and_use(
        tmp_path, monkeypatch):
    """A daemon's request thread looks up the transaction's lock object, takes it, then runs
    the step, which looks it up again: if the cache (bounded) dropped the object in between,
    the step got a second object for the tid, whose byte lock waited on the first's hold --
    the thread on itself -- until Busy (seen with 100 agents through the daemon: "timed out
    after 120 s waiting for transaction ...")."""
    from agent_2pc import Agent2PC
    from agent_2pc.coordinator import journal as journal_mod

    monkeypatch.setattr(journal_mod, "TX_LOCKS_CACHED_MAX", 2)
    monkeypatch.setattr(locks, "LOCK_TIMEOUT_S", 2.0)
    client = Agent2PC.init(tmp_path)
    client.close()
    client = Agent2PC(tmp_path, daemon=False)
    journal = client.engine.journal
    tx = client.begin()
    mine = journal.tx_lock(tx.tid)  # what the request thread holds on to
    others = [client.begin() for _ in range(3)]
    for other in others:
        journal.tx_lock(other.tid)  # the cache fills up: the finished ones may go
    others[0].commit()
    for other in others[1:]:
        other.abort("done")
    for _ in range(3):
        journal.tx_lock(f"tx-20261203-000000-00000{_}")  # more look-ups past the bound
    mine.acquire()
    try:
        started = time.monotonic()
        tx.stage_write("a.txt", "a\n")  # the step looks its lock up again
        assert time.monotonic() - started < 1.0
        assert journal.tx_lock(tx.tid) is mine
    finally:
        mine.release()
    tx.commit()
    assert (tmp_path / "a.txt").read_text() == "a\n"
    for i in range(50):  # nothing live: the cache stays bounded
        journal.tx_lock(f"tx-20261203-000001-{i:06d}")
    assert len(journal._tx_locks) <= 8  # noqa: SLF001
    client.close()
