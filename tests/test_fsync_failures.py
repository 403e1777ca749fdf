"""A disk that fails: EIO and ENOSPC injected at every write, fsync and rename of the storage
layer (faults.SITES, ``AGENT2PC_FAULT_AT``). Each failure ends in a clear error (exit 1 or 2,
one JSON object, a contract code, no traceback), the step stops there and retries nothing,
and ``recover`` turns what was left into all or nothing: every transaction committed or
aborted, the tree exactly as after the commits that stand, a clean log, no temp file, and the
next transaction commits. A commit whose decision could not be synced never answers
``committed``.

After a failed fsync the data may be gone from the disk while the page cache still shows it
(PostgreSQL's "fsyncgate", 2018): a later fsync would succeed without writing it. So nothing
whose fsync failed is trusted again: a blob is discarded (staging writes it anew), a small
file's content is written again from the decision, and the log is written anew into a fresh
file by whoever opens it next.

The scenario (fsync_scenarios.py) runs in a private mount namespace where ``mnt/`` is a tmpfs,
so that content placed on another file system is covered too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from fsync_scenarios import steps

from agent_2pc.faults import SITES

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                       reason="the scenario mounts a tmpfs in a private mount namespace"),
]

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsync_scenarios.py")
FENCE_SITES = {"_sqlite.sync:fsync", "_sqlite.sync:fsync_dir"}  # the fence library's own
# `trust` of a log made before logs had headers (by hand, or by an old version): not a step of
# the scenario's workspace, which init made with its header.
TRUST_SITES = {s for s in SITES if s.startswith("workspace._log_id:")}
CLI_SITES = sorted(set(SITES) - FENCE_SITES - TRUST_SITES)
CODES = {"io_error", "apply_incomplete", "prepare_failed"}


def run(tmp_path, *args: str) -> dict:
    root = tmp_path / "repo"
    (root / "mnt").mkdir(parents=True)
    (root / "small.txt").write_text("old small\n")
    (root / "keep.txt").write_text("keep\n")
    setup = ('mount -t tmpfs -o size=16m tmpfs "$1/mnt" && printf "on tmpfs\\n" > "$1/mnt/m.txt" '
             '&& shift && exec "$@"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "--", "sh", "-c", setup,
                           "sh", str(root), sys.executable, SCRIPT, str(root), *args],
                          capture_output=True, text=True, timeout=110, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["other_fs"], "mnt/ is not another file system: the scenario proves less"
    return out


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = run(tmp_path_factory.mktemp("clean"), "clean")
    assert all(s["exit"] == (137 if s["label"] == "torn tail" else 0) for s in out["steps"]), \
        out["steps"]
    return out


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    return run(tmp_path_factory.mktemp("record"), "record")["sites"]


def test_every_fault_site_is_passed_by_the_scenario(sites):
    assert set(sites) <= set(SITES), "unregistered sites (see faults.SITES)"
    assert set(CLI_SITES) <= set(sites), f"never passed: {sorted(set(CLI_SITES) - set(sites))}"


def expected_tree(clean: dict, states: dict, tids: dict) -> dict:
    if states.get(tids.get("t2")) == "committed":
        return clean["trees"]["commit t2"]
    if states.get(tids.get("t1")) == "committed":
        return clean["trees"]["commit t1"]
    if states.get(tids.get("t0")) == "committed":
        return clean["trees"]["commit t0"]
    return clean["initial"]


@pytest.mark.parametrize("err", ["EIO", "ENOSPC"])
@pytest.mark.parametrize("site", CLI_SITES)
def test_a_failing_write_fsync_or_rename_is_a_clear_error_and_recovery_is_all_or_nothing(
        tmp_path, clean, sites, site, err):
    step = sites[site]
    out = run(tmp_path, "fault", str(step), f"{site}={err}")
    failed = out["steps"][-1]
    assert failed["exit"] in (1, 2), failed
    assert "Traceback" not in failed["stderr"], failed["stderr"]
    answer = json.loads(failed["stdout"])  # exactly one JSON object
    assert answer["ok"] is False and answer["error"]["code"] in CODES, answer
    assert f"injected at {site}" in failed["stdout"], answer  # it failed where it was told
    assert answer.get("state") != "committed"
    if failed["label"] == "init":
        # init stopped half-way; the next command refuses the half-made workspace clearly
        # (remove .agent-tx/ and init again).
        nxt = out["next"]
        assert nxt["exit"] == 2 and "Traceback" not in nxt["stderr"], nxt
        assert json.loads(nxt["stdout"])["ok"] is False
        return
    assert out["recover"]["exit"] == 0, out["recover"]
    assert out["log_after_recover"]["damage"] is None
    assert not out["log_after_recover"]["unsynced_mark"]
    tids = out["tids"]
    # A failed staging step leaves its transaction active (as any refused step does); a
    # failure from prepare on ends it, committed or aborted.
    assert all(out["states"][t] in ("committed", "aborted", "active") for t in tids.values())
    if failed["label"].startswith("commit") and not site.startswith(("log._truncate",
                                                                     "log.set_aside")):
        # (cutting a torn tail is the first thing any step does: then the commit never began)
        tid = tids[failed["label"].split()[1]]
        assert out["states"][tid] in ("committed", "aborted"), out["states"]
    want = expected_tree(clean, out["states"], tids)
    assert out["after"] == want, (out["after"], want)
    assert not [n for n in out["objects"] if n.endswith(".part")]
    assert out["probe"]["exit"] == 0, out["probe"]
    assert out["log_after_probe"]["damage"] is None


# The scenario's step that commits t0 (the tests below fail it at one site or another).
COMMIT_T0 = str(next(i for i, (label, _, _) in enumerate(steps("")) if label == "commit t0"))


def test_a_blob_whose_fsync_failed_is_never_trusted_again(tmp_path):
    """Its bytes may be gone from the disk while the page cache still shows them: it is
    discarded, and staging the same content again writes it anew."""
    out = run(tmp_path, "fault", COMMIT_T0, "blobs.make_durable:fsync=EIO")
    assert json.loads(out["steps"][-1]["stdout"])["error"]["code"] == "prepare_failed"
    big = hashlib.sha256(bytes(range(256)) * 400).hexdigest()
    assert big not in out["blobs_after_fault"]


def test_a_small_files_blob_whose_fsync_failed_is_written_again_from_the_decision(tmp_path):
    # The apply's 2nd fsync before a rename: dup2.txt's blob ("same"), moved into the tree
    # (big.bin's mode change was the 1st; dup1.txt got a synced copy).
    out = run(tmp_path, "fault", COMMIT_T0, "fs._put:fsync:2=EIO")
    assert json.loads(out["steps"][-1]["stdout"])["error"]["code"] == "apply_incomplete"
    assert hashlib.sha256(b"same\n").hexdigest() not in out["blobs_after_fault"]
    assert out["states"][out["tids"]["t0"]] == "committed"
    assert out["after"]["dup2.txt"] == ["same\n", 0o644]


def test_a_log_whose_fsync_failed_is_written_anew_before_anyone_believes_it(tmp_path):
    """The commit decision's fsync fails: the commit answers io_error (never committed), the
    log is marked, and the next command writes it into a fresh, synced file before recovery
    reads a decision from it."""
    out = run(tmp_path, "fault", COMMIT_T0, "log.append:fsync=EIO")
    answer = json.loads(out["steps"][-1]["stdout"])
    assert answer["error"]["code"] == "io_error" and answer["error"]["errno"] == "EIO"
    assert out["log_after_fault"]["unsynced_mark"]
    assert out["log_after_recover"]["ino"] != out["log_after_fault"]["ino"]
    assert not out["log_after_recover"]["unsynced_mark"]


def test_a_failing_fsync_of_the_fence_store_raises_and_is_never_taken_for_durable(tmp_path):
    code = """
import sys
from agent_2pc.fence import open_fence, EffectRequest
from agent_2pc.storage.durable import FsyncFailed
f = open_fence("sqlite:///" + sys.argv[1], lease_ttl=60)
adm = f.prepare(EffectRequest(intent="i1", domain="d", tool="t", args={}, agent="a"))
f.commit(adm.ticket, {"ok": 1}, durable=False)
try:
    f.sync()
except FsyncFailed as exc:
    print("failed", exc.errno, f.needs_sync)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    env["AGENT2PC_FAULT_AT"] = "_sqlite.sync:fsync=EIO"
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "fence.db")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["failed", "5", "True"], proc.stdout + proc.stderr


def test_every_write_fsync_and_rename_of_the_commit_path_goes_through_durable():
    """A raw os.fsync, os.rename or os.write in the commit path would be a site that no fault
    can reach and no test covers: they all go through storage/durable.py."""
    import re

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "agent_2pc")
    raw = re.compile(r"\bos\.(fsync|fdatasync|rename|replace|write)\(")
    found = []
    for rel in ("storage/log.py", "storage/blobs.py", "storage/history.py",
                "storage/workspace.py", "participants/fs.py"):
        with open(os.path.join(src, rel), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if raw.search(line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert found == []
