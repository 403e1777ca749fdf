"""A commit reaches targets on another file system than .agent-tx/ (a mount inside the repo),
all or nothing: prepare places their content next to them, synced, and the apply renames it in;
an abort, a crash before the decision and a crash after it leave no placed file behind.

Each case runs in a private mount namespace (unshare -m) where ``repo/mnt`` is a tmpfs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_2pc import Agent2PC

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                       reason="mounting a tmpfs in a private mount namespace needs root and "
                              "unshare(1)"),
]

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cross_device_scenarios.py")


def run(tmp_path: Path, scenario: str) -> dict:
    root = tmp_path / "repo"
    (root / "mnt").mkdir(parents=True)
    (root / "local.txt").write_text("local\n")
    Agent2PC.init(root)
    # The tmpfs is mounted inside the namespace; its files are made there.
    setup = ('mount -t tmpfs -o size=16m tmpfs "$1/mnt" && printf "data\\n" > "$1/mnt/data.txt" '
             '&& exec "$2" "$3" "$1" "$4"')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(SCRIPT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "--", "sh", "-c", setup,
                           "sh", str(root), sys.executable, SCRIPT, scenario],
                          capture_output=True, text=True, timeout=100, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["other_fs"], "mnt/ is not another file system: the test proves nothing"
    return out


NEW = {
    "mnt/new/deep.txt": ["deep\n", "0o644"],
    "mnt/data.txt": ["changed\n", "0o600"],
    "mnt/link": "link:data.txt",
    "mnt/empty/": "dir",
    "local.txt": ["local changed\n", "0o644"],
}


def expect_new(out: dict) -> None:
    for rel, value in NEW.items():
        assert out["after"].get(rel) == value, (rel, out["after"])
    assert out["placed"] == []


def expect_old(out: dict) -> None:
    assert out["after"] == out["before"]
    assert out["placed"] == []


def test_a_commit_reaches_another_file_system_inside_the_repo(tmp_path):
    out = run(tmp_path, "commit")
    expect_new(out)
    assert sorted(out["files"]) == sorted(p.rstrip("/") for p in NEW)


def test_an_abort_after_prepare_removes_what_prepare_placed(tmp_path):
    out = run(tmp_path, "api_says_no")
    assert out["aborted"] and out["code"] != "cross_device"
    expect_old(out)


def test_a_crash_before_the_decision_rolls_back_and_removes_what_was_placed(tmp_path):
    out = run(tmp_path, "crash:prepare.before_decision")
    assert out["exit"] == 137
    assert len(out["placed_after_crash"]) == 3  # the crash really left placed content
    assert out["recover"]["rolled_back"]
    expect_old(out)


def test_a_crash_in_the_apply_rolls_forward_across_file_systems(tmp_path):
    out = run(tmp_path, "crash:commit.mid_apply:1")
    assert out["exit"] == 137 and out["recover"]["rolled_forward"]
    expect_new(out)


def test_a_redo_places_again_what_someone_removed_after_the_decision(tmp_path):
    out = run(tmp_path, "crash:commit.after_decision")
    assert out["exit"] == 137 and len(out["placed_after_crash"]) == 3
    assert out["recover"]["rolled_forward"] and not out["recover"].get("diverged")
    expect_new(out)


def test_a_redo_removes_a_placed_name_that_a_crash_kept_beside_its_target(tmp_path):
    """A rename across directories is not atomic on every file system: a crash may keep the
    new name and the old one. The redo finds the target in place and drops the placed name."""
    out = run(tmp_path, "both_names")
    assert out["exit"] == 137 and len(out["placed_after_crash"]) == 3
    assert out["recover"]["rolled_forward"]
    expect_new(out)


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_a_vote_places_content_on_the_other_file_system_and_decide_in_another_process_ends_it(
        tmp_path, outcome):
    """vote (tests/test_vote_decide.py): the placed content waits beside its targets while the
    transaction is in doubt; decide commit renames it in, decide abort removes it."""
    out = run(tmp_path, f"vote:{outcome}")
    assert out["vote"]["state"] == "prepared", out["vote"]
    assert len(out["placed_while_in_doubt"]) == 3 and out["in_doubt_tree_unchanged"]
    assert out["decide"]["state"] == ("committed" if outcome == "commit" else "aborted")
    expect_new(out) if outcome == "commit" else expect_old(out)
