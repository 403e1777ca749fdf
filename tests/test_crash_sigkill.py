"""All-or-nothing under SIGKILL at random moments, liveness told by locks, and damaged logs
never applied."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crashkit import cli, snapshot, tree_files_with_temp_names, wal_is_clean

from agent_2pc import Agent2PC
from agent_2pc.storage import wal_format

FILES = 300


def _big_repo(root: Path) -> tuple[Agent2PC, dict, str, dict]:
    for i in range(FILES):
        p = root / f"d{i % 10}" / f"f{i}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"old {i}\n")
    client = Agent2PC.init(root)
    old = snapshot(root)
    tx = client.begin(label="big")
    for i in range(FILES):
        if i % 50 == 7:
            tx.stage_delete(f"d{i % 10}/f{i}.txt")
        else:
            tx.stage_write(f"d{i % 10}/f{i}.txt", f"new {i}\n")
    tx.stage_write("added/one.txt", "added\n")
    new = {}
    for rel, v in old.items():
        if rel.endswith("/"):
            new[rel] = v
            continue
        i = int(rel.rsplit("f", 1)[1].split(".")[0])
        if i % 50 != 7:
            new[rel] = (f"new {i}\n".encode(), 0o644)
    new["added/"] = "dir 755"
    new["added/one.txt"] = (b"added\n", 0o644)
    return client, old, tx.tid, new


def _commit_proc(root: Path, tid: str, env: dict | None = None) -> subprocess.Popen:
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "agent_2pc", "--root", str(root), "commit",
                             "--tid", tid, "--json"], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _wait_for_log_growth(root: Path, proc: subprocess.Popen, appends: int = 1) -> float:
    """Spin until the child appended ``appends`` times (1: prepare; 2: the decision)."""
    wal = root / ".agent-tx" / "wal.bin"
    size = wal.stat().st_size
    deadline = time.monotonic() + 60
    for _ in range(appends):
        while wal.stat().st_size == size and proc.poll() is None:
            assert time.monotonic() < deadline
        size = wal.stat().st_size
    return time.monotonic()


@pytest.mark.timeout(300)
def test_sigkill_at_random_moments_of_a_big_commit_leaves_all_old_or_all_new(tmp_path):
    rng = random.Random(int(os.environ.get("AGENT2PC_TEST_SEED", "20261130")))
    # One undisturbed run tells how long a commit takes here, from its first log append
    # (the prepare record) to its exit; kills are spread over that window.
    probe = tmp_path / "probe"
    probe.mkdir()
    _, _, tid, _ = _big_repo(probe)
    proc = _commit_proc(probe, tid)
    t0 = _wait_for_log_growth(probe, proc)
    t1 = _wait_for_log_growth(probe, proc)
    proc.communicate(timeout=120)
    window, after_decision = time.monotonic() - t0, time.monotonic() - t1
    outcomes = {"old": 0, "new": 0, "finished_by_recover": 0}
    for round_ in range(16):
        root = tmp_path / f"r{round_}"
        root.mkdir()
        client, old, tid, new = _big_repo(root)
        proc = _commit_proc(root, tid)
        if round_ % 2:  # anywhere from prepare to exit
            _wait_for_log_growth(root, proc)
            time.sleep(rng.uniform(0, 1.2) * window)
        else:  # after the decision, where the apply runs
            _wait_for_log_growth(root, proc, appends=2)
            time.sleep(rng.uniform(0, 0.5) * after_decision)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        before = snapshot(root)
        out = json.loads(cli(root, "recover").stdout)
        after = snapshot(root)
        assert after in (old, new), f"round {round_}: half-applied after recover"
        outcomes["old" if after == old else "new"] += 1
        if before != after:
            outcomes["finished_by_recover"] += 1
            assert tid in out["rolled_forward"] + out["rolled_back"]
        assert tree_files_with_temp_names(root) == []
        assert wal_is_clean(root)
        tx = Agent2PC(root).begin()
        tx.stage_write("later.txt", "ok\n")
        assert tx.commit()["state"] == "committed"
    print("outcomes", outcomes, f"window {window * 1000:.0f} ms")


@pytest.mark.timeout(120)
def test_recover_never_interferes_with_a_live_commit(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    client, old, tid, new = _big_repo(root)
    # The committing process stalls after its first file operation, holding its locks.
    proc = _commit_proc(root, tid, {"AGENT2PC_STALL_AT": "commit.mid_apply:1",
                                    "AGENT2PC_STALL_S": "3"})
    deadline = time.monotonic() + 30
    while snapshot(root) == old:  # wait until it is really mid-apply
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    # Meanwhile another agent stages into its own transaction: no waiting on the commit.
    other = Agent2PC(root).begin()
    t0 = time.monotonic()
    other.stage_write("elsewhere.txt", "x\n")
    assert time.monotonic() - t0 < 2.0
    # recover, started while the commit is live, must leave it to its owner.
    rec = json.loads(cli(root, "recover").stdout)
    assert tid not in rec["rolled_back"] and tid not in rec["rolled_forward"]
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["state"] == "committed"
    assert {k: v for k, v in snapshot(root).items()} == new
    assert other.state() == "active"


@pytest.mark.timeout(120)
def test_a_damaged_decision_record_is_never_applied(tmp_path):
    """Cut the log at every offset inside the commit decision record: recovery must then
    roll back (the decision is gone), and with the whole record, roll forward."""
    root = tmp_path / "repo"
    root.mkdir()
    for i in range(3):
        (root / f"f{i}.txt").write_text(f"old {i}\n")
    client = Agent2PC.init(root)
    old = snapshot(root)
    tx = client.begin()
    for i in range(3):
        tx.stage_write(f"f{i}.txt", f"new {i}\n")
    proc = cli(root, "commit", "--tid", tx.tid, env={"AGENT2PC_CRASH_AT":
                                                       "commit.after_decision"})
    assert proc.returncode == 137
    wal = root / ".agent-tx" / "wal.bin"
    full = wal.read_bytes()
    decoded = wal_format.decode(full)
    assert decoded.records[-1]["type"] == "decision"
    start = len(full) - len(wal_format.encode(decoded.records[-1]))
    objects = root / ".agent-tx" / "objects"
    blobs = {p: p.read_bytes() for p in objects.glob("??/*")}  # moved into the tree on apply
    expected_new = {**old, **{f"f{i}.txt": (f"new {i}\n".encode(), 0o644) for i in range(3)}}
    for cut in list(range(start, len(full), 7)) + [len(full)]:
        wal.write_bytes(full[:cut])
        for path, data in blobs.items():
            if not path.exists():
                path.write_bytes(data)
                path.chmod(0o444)
        for i in range(3):
            (root / f"f{i}.txt").write_text(f"old {i}\n")
        out = Agent2PC(root).recover()
        if cut == len(full):
            assert out["rolled_forward"] == [tx.tid] and snapshot(root) == expected_new
        else:
            assert out["rolled_back"] == [tx.tid] and snapshot(root) == old, cut
            assert out["truncated_bytes"] == cut - start
        assert wal_is_clean(root)


def test_a_corrupt_record_in_the_middle_is_reported_with_its_offset(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    client = Agent2PC.init(root)
    for _ in range(3):
        client.begin()
    wal = root / ".agent-tx" / "wal.bin"
    data = bytearray(wal.read_bytes())
    first = len(wal_format.encode(wal_format.decode(bytes(data)).records[0]))
    data[first + 15] ^= 0xFF
    wal.write_bytes(bytes(data))
    proc = cli(root, "recover")
    assert proc.returncode == 2
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == "corrupt_wal" and err["offset"] == first
    assert wal.read_bytes() == bytes(data)  # refused to guess: nothing cut, nothing changed
