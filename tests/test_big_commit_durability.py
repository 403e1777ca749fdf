"""A big commit is made durable by a constant number of flushes (issue 19, item 2), and stays
all-or-nothing.

From ``durable.SYNCFS_MIN`` changes on, prepare and apply write without an fsync per file and
sync each file system once instead (syncfs): once before the decision (the blobs), once before
the renames into the tree (copies, small files' blobs, modes, new directories), once before the
end record (the renamed names). These tests count the flushes a real commit issues (strace),
kill real commits of such a transaction at every crash point of the commit, fail each syncfs
(AGENT2PC_FAULT_AT) and damage an unsynced copy as a machine crash may, then check that
``recover`` leaves the tree all as before or all as staged.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from crashkit import cli, snapshot, tree_files_with_temp_names, wal_is_clean, write_files

from agent_2pc import Agent2PC
from agent_2pc.storage import durable

pytestmark = pytest.mark.timeout(180)

BEFORE = {f"pkg/m{i:03d}.py": f"VALUE = {i}\n".encode() for i in range(20)}
BEFORE.update({f"old/o{i:02d}.txt": f"old {i}\n".encode() for i in range(10)})
BEFORE["keep.txt"] = b"untouched\n"


def make_repo(root: Path) -> Agent2PC:
    write_files(root, BEFORE)
    return Agent2PC.init(root)


def stage_big(client: Agent2PC, n_new: int) -> str:
    """One transaction of more than SYNCFS_MIN changes: every module rewritten (one made
    executable), ``n_new`` files created in new directories (small ones travel in the
    decision, big ones are blobs synced at prepare; every fifth has the same content as
    another, so the apply copies that blob), every old file deleted (its directory goes)."""
    tx = client.begin(label="big")
    for i in range(20):
        tx.stage_write(f"pkg/m{i:03d}.py", f"VALUE = {i} + 1\n",
                       mode=0o755 if i == 0 else None)
    for i in range(n_new):
        if i % 5 == 0:
            data = b"same content\n"
        elif i % 7 == 0:
            data = bytes([i % 256]) * 12000  # past the inline limit: a blob synced at prepare
        else:
            data = f"new file {i}\n".encode() * 3
        tx.stage_write(f"new/d{i // 25:02d}/f{i:04d}.txt", data)
    for i in range(10):
        tx.stage_delete(f"old/o{i:02d}.txt")
    return tx.tid


def expected_new(root: Path, tid: str) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory(dir=root.parent) as d:
        copy = Path(d) / "copy"
        shutil.copytree(root, copy, symlinks=True)
        Agent2PC.trust(copy)
        assert Agent2PC(copy).engine.commit(tid)["state"] == "committed"
        return snapshot(copy)


@pytest.fixture
def world(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    client = make_repo(root)
    old = snapshot(root)
    tid = stage_big(client, 80)
    return root, client, tid, old, expected_new(root, tid)


def state(root: Path, tid: str) -> str:
    proc = cli(root, "status", "--tid", tid)
    return json.loads(proc.stdout)["transactions"][0]["state"]


def claims(root: Path) -> list[str]:
    return sorted(os.listdir(root / ".agent-tx" / "objects" / "tmp"))


def test_the_batched_path_is_the_one_these_tests_take():
    assert durable.SYNCFS_MIN <= 110  # 20 rewrites + 80 new files + 10 deletes
    assert durable.batching(110) and not durable.batching(3)


# -- the flushes a commit issues ------------------------------------------------------------------

def _flushes(root: Path, tid: str, tmp_path: Path) -> dict[str, int]:
    out = tmp_path / f"strace-{tid}"
    proc = subprocess.run(["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,syncfs,sync",
                           "-o", str(out), sys.executable, "-m", "agent_2pc", "--root",
                           str(root), "commit", "--tid", tid, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["state"] == "committed"
    counts = {"fsync": 0, "fdatasync": 0, "syncfs": 0, "sync": 0}
    for line in out.read_text().splitlines():
        name = line.split(None, 1)[-1].split("(", 1)[0]
        if name in counts:
            counts[name] += 1
    return counts


@pytest.mark.skipif(not shutil.which("strace"), reason="counts system calls with strace")
def test_a_big_commit_flushes_a_constant_number_of_times_whatever_its_size(tmp_path):
    seen = {}
    for n_new in (80, 400):
        root = tmp_path / f"repo{n_new}"
        root.mkdir()
        tid = stage_big(make_repo(root), n_new)
        seen[n_new] = _flushes(root, tid, tmp_path)
        assert snapshot(root)["new/d00/f0001.txt"] == (b"new file 1\n" * 3, 0o644)
    small, big = seen[80], seen[400]
    assert small == big, seen  # O(1): the same calls for 110 and 430 changes
    assert big["syncfs"] == 3, seen  # blobs before the decision; before the renames; the end
    assert big["fsync"] + big["fdatasync"] <= 4, seen  # the log's appends
    assert big["sync"] == 0


@pytest.mark.skipif(not shutil.which("strace"), reason="counts system calls with strace")
def test_a_small_commit_still_fsyncs_file_by_file_and_never_syncs_a_whole_file_system(
        tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    tx = make_repo(root).begin()
    tx.stage_write("pkg/m000.py", "VALUE = 7\n")
    tx.stage_write("new/a.txt", "a\n")
    counts = _flushes(root, tx.tid, tmp_path)
    assert counts["syncfs"] == 0 and counts["sync"] == 0, counts
    assert counts["fsync"] >= 2, counts


# -- crashes -----------------------------------------------------------------------------------

CRASHES = [
    ("prepare.before_decision", "old"),
    ("commit.after_decision", "new"),
    ("commit.mid_apply:1", "new"),  # a delete done; nothing written
    ("commit.mid_apply:60", "new"),  # copies and blobs made, unsynced; nothing renamed
    ("commit.mid_apply:115", "new"),  # after the syncfs, some renamed into the tree
    ("commit.before_end", "new"),
]


@pytest.mark.parametrize("point,expect", CRASHES)
def test_a_big_commit_killed_at_each_crash_point_ends_all_or_nothing(world, point, expect):
    root, _, tid, old, new = world
    proc = cli(root, "commit", "--tid", tid, env={"AGENT2PC_CRASH_AT": point})
    assert proc.returncode == 137, (proc.stdout, proc.stderr[-2000:])
    out = json.loads(cli(root, "recover").stdout)
    assert tid in out["rolled_forward" if expect == "new" else "rolled_back"], out
    assert snapshot(root) == (new if expect == "new" else old)
    assert state(root, tid) == ("committed" if expect == "new" else "aborted")
    assert tree_files_with_temp_names(root) == []
    assert wal_is_clean(root)
    assert not [n for n in claims(root) if n.endswith(".part")]


@pytest.mark.parametrize("redo_batches", [True, False], ids=["redo-batched", "redo-unbatched"])
def test_a_copy_a_machine_crash_damaged_before_the_syncfs_is_made_again(world, redo_batches):
    """A batched apply writes its copies unsynced: a machine crash before its syncfs can keep
    a copy's name with the wrong bytes. No rename has happened then (they all come after the
    syncfs), so the redo checks each copy it finds and makes a damaged one again -- also a
    redo that would not batch itself (another AGENT2PC_SYNCFS_MIN)."""
    root, _, tid, _, new = world
    proc = cli(root, "commit", "--tid", tid, env={"AGENT2PC_CRASH_AT": "commit.mid_apply:60"})
    assert proc.returncode == 137
    made = [n for n in claims(root) if n.startswith("claim-")]
    assert made, "the apply made no copy before the crash point: the test proves nothing"
    for name in made:  # what a lost writeback leaves: the name, zeros of the right size
        path = root / ".agent-tx" / "objects" / "tmp" / name
        size = path.stat().st_size
        path.chmod(0o644)
        path.write_bytes(b"\0" * size)
    assert snapshot(root) != new
    env = None if redo_batches else {"AGENT2PC_SYNCFS_MIN": "0"}
    out = json.loads(cli(root, "recover", env=env).stdout)
    assert tid in out["rolled_forward"], out
    assert snapshot(root) == new


# -- a failing syncfs ------------------------------------------------------------------------------

@pytest.mark.parametrize("site,code,after", [
    ("blobs.make_durable:syncfs", "prepare_failed", "aborted"),
    ("fs._renames:syncfs", "apply_incomplete", "committed"),
    ("fs._apply_in:syncfs", "apply_incomplete", "committed"),
])
def test_a_failing_syncfs_is_an_fsync_failure_never_a_commit(world, site, code, after):
    """EIO from a syncfs is handled as from an fsync: the commit does not answer committed;
    before the decision it votes no (the blobs are discarded: staged again, written anew),
    after it the apply stops and recovery finishes it, writing anew what the failed syncfs was
    to sync."""
    root, _, tid, old, new = world
    proc = cli(root, "commit", "--tid", tid, env={"AGENT2PC_FAULT_AT": f"{site}=EIO"})
    assert proc.returncode in (1, 2), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["ok"] is False and answer["error"]["code"] == code, answer
    assert f"injected at {site}" in proc.stdout
    if site == "fs._renames:syncfs":  # nothing it was to sync is trusted: copies dropped
        assert not [n for n in claims(root) if n.startswith("claim-")]
    assert cli(root, "recover").returncode == 0
    assert state(root, tid) == after
    assert snapshot(root) == (new if after == "committed" else old)
    assert tree_files_with_temp_names(root) == [] and wal_is_clean(root)
