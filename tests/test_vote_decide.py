"""Transactions an outside coordinator decides (issue 17, the local half): ``vote`` prepares
and votes yes durably, the transaction then waits -- across process exits and crashes -- for
``decide`` from any process. Real processes are killed at the named crash points
(``vote.before_record``, ``vote.after_record``, and commit's for decide)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from crashkit import (
    cli,
    make_repo,
    snapshot,
    stage_everything,
    tree_files_with_temp_names,
    wal_is_clean,
)

from agent_2pc import Agent2PC, TransactionAborted
from agent_2pc.errors import BadState, UsageError

pytestmark = pytest.mark.timeout(180)

COORD = {"gtid": "g-test-1", "store": "postgresql://db.example:5432/coord"}


def run(root: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    proc = cli(root, *args, env=env)
    out = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, out


class World:
    """A repo with one transaction that touches it in every way (crashkit), and the tree it
    must hold once committed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.client = make_repo(root)
        self.old = snapshot(root)
        self.tid = stage_everything(self.client)
        with tempfile.TemporaryDirectory(dir=root.parent) as d:
            copy = Path(d) / "copy"
            shutil.copytree(root, copy, symlinks=True)
            Agent2PC.trust(copy)
            Agent2PC(copy, daemon=False).engine.commit(self.tid)
            self.new = snapshot(copy)

    def crash(self, point: str, *args: str) -> None:
        proc = cli(self.root, *args, env={"AGENT2PC_CRASH_AT": point})
        assert proc.returncode == 137, (point, proc.returncode, proc.stdout, proc.stderr)

    def vote(self, **env: str) -> tuple[int, dict[str, Any]]:
        return run(self.root, "vote", "--tid", self.tid, "--coordinator", json.dumps(COORD),
                   env=env)

    def state(self) -> str:
        rc, out = run(self.root, "status", "--tid", self.tid)
        assert rc == 0, out
        return str(out["transactions"][0]["state"])

    def recover(self) -> dict[str, Any]:
        rc, out = run(self.root, "recover")
        assert rc == 0, out
        return out

    def check_invariants(self) -> None:
        assert tree_files_with_temp_names(self.root) == []
        assert wal_is_clean(self.root)
        c = Agent2PC(self.root)
        tx = c.begin()
        tx.stage_write("after.txt", "works\n")
        assert tx.commit()["state"] == "committed"


@pytest.fixture
def world(tmp_path: Path) -> World:
    root = tmp_path / "repo"
    root.mkdir()
    return World(root)


# -- vote and decide in one process --------------------------------------------------------------


def test_a_yes_vote_leaves_the_tree_untouched_until_decide_commit_applies_it(world: World):
    tx = world.client.get(world.tid)
    out = tx.vote(COORD)
    assert out == {"tid": world.tid, "state": "prepared", "vote": "yes"}
    assert snapshot(world.root) == world.old
    assert world.client.in_doubt() == [{
        "tid": world.tid, "coordinator": COORD, "prepared_ms": pytest.approx(
            world.client.in_doubt()[0]["prepared_ms"]),
        "files": sorted(op["path"] for op in tx.status()["files"])}]
    assert tx.vote(COORD) == out  # idempotent: the same coordinator gets the same answer
    with pytest.raises(BadState):
        tx.vote({"gtid": "another"})
    with pytest.raises(BadState, match="prepared"):
        tx.stage_write("late.txt", "no\n")
    done = world.client.decide(world.tid, "commit")
    assert done["state"] == "committed" and done["merged"] == []
    assert snapshot(world.root) == world.new
    assert world.client.decide(world.tid, "commit")["state"] == "committed"  # idempotent
    with pytest.raises(BadState, match="committed"):
        world.client.decide(world.tid, "abort")
    assert world.client.in_doubt() == []
    world.check_invariants()


def test_decide_abort_of_a_prepared_transaction_leaves_the_tree_as_it_was(world: World):
    world.client.get(world.tid).vote(COORD)
    out = world.client.decide(world.tid, "abort", reason="another participant voted no")
    assert out["state"] == "aborted" and "files" not in out
    assert snapshot(world.root) == world.old
    assert world.client.decide(world.tid, "abort")["state"] == "aborted"
    with pytest.raises(BadState, match="aborted"):
        world.client.decide(world.tid, "commit")
    world.check_invariants()


def test_an_active_transaction_can_be_decided_abort_but_not_commit(world: World):
    with pytest.raises(BadState, match="never voted"):
        world.client.decide(world.tid, "commit")
    assert world.client.decide(world.tid, "abort")["state"] == "aborted"
    assert snapshot(world.root) == world.old


def test_a_no_vote_aborts_and_raises_as_commit_does(world: World):
    (world.root / "mod1.txt").write_text("someone else\n")  # a conflict with the staged edit
    with pytest.raises(TransactionAborted) as err:
        world.client.get(world.tid).vote(COORD)
    assert err.value.code == "conflict"
    assert world.state() == "aborted"
    with pytest.raises(TransactionAborted):  # voting again answers no again
        world.client.get(world.tid).vote(COORD)


def test_a_coordinator_with_a_password_or_not_an_object_is_refused_and_nothing_changes(
        world: World):
    tx = world.client.get(world.tid)
    before = (world.root / ".agent-tx" / "wal.bin").read_bytes()
    for bad in ({"store": "postgresql://u:secret@host/db"}, {"password": "x"},
                {"store": "host=h password=s"}, [], "not json", {}):
        with pytest.raises(UsageError):
            tx.vote(bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        world.client.decide(world.tid, "maybe")
    assert (world.root / ".agent-tx" / "wal.bin").read_bytes() == before
    assert world.state() == "active"


# -- in doubt is not a crash ---------------------------------------------------------------------


def test_abort_commit_timeout_boot_and_the_reaper_never_end_a_prepared_transaction(
        tmp_path: Path):
    root = tmp_path / "repo"
    root.mkdir()
    client = make_repo(root)
    tx = client.begin(timeout_ms=200)
    tx.stage_write("mod1.txt", "prepared\n")
    tx.vote(COORD)
    import time

    time.sleep(0.4)  # past its deadline
    rc, out = run(root, "abort", "--tid", tx.tid)
    assert rc == 2 and out["error"]["code"] == "bad_state", out
    assert "g-test-1" in out["error"]["message"] and "decide" in out["error"]["message"]
    rc, out = run(root, "commit", "--tid", tx.tid)
    assert rc == 2 and out["error"]["code"] == "bad_state", out
    rc, out = run(root, "recover")
    assert rc == 0 and out["rolled_back"] == [] and out["in_doubt"][0]["tid"] == tx.tid, out
    assert out["in_doubt"][0]["coordinator"] == COORD
    # Another boot of the machine: recovery plans the same (nothing) for a prepared tx.
    from agent_2pc.core import recovery as plans
    from agent_2pc.core.records import now_ms

    fresh = Agent2PC(root, daemon=False)
    live = fresh.engine.txs[tx.tid]
    assert plans.plan([live], now_ms=now_ms() + 10**9, boot="another-boot",
                      alive=lambda _: False, include_active=True) == []
    import threading

    from agent_2pc.daemon.reaper import Reaper

    assert Reaper(fresh.engine, threading.RLock()).run_once() == {"reaped": []}
    rc, out = run(root, "status")
    assert out["in_doubt"][0]["tid"] == tx.tid, out
    assert (root / "mod1.txt").read_bytes() == b"one\ntwo\nthree\n"
    rc, out = run(root, "decide", "--tid", tx.tid, "commit")
    assert rc == 0 and out["state"] == "committed", out
    assert (root / "mod1.txt").read_text() == "prepared\n"


# -- isolation while in doubt --------------------------------------------------------------------


def test_a_transaction_touching_a_prepared_path_votes_conflict_and_others_commit_meanwhile(
        world: World):
    world.client.get(world.tid).vote(COORD)
    clash = world.client.begin()
    clash.stage_write("mod1.txt", "mine\n")
    with pytest.raises(TransactionAborted) as err:
        clash.commit()
    assert err.value.code == "conflict"
    assert world.tid in err.value.message and "g-test-1" in err.value.message
    reader = world.client.begin()
    reader.record_read("mod2.py")
    reader.stage_write("elsewhere.txt", "x\n")
    with pytest.raises(TransactionAborted, match=world.tid):
        reader.commit()
    other = world.client.begin()  # the commit lock is not held while in doubt
    other.stage_write("keep2.txt", "fine\n")
    assert other.commit()["state"] == "committed"
    world.client.decide(world.tid, "commit")
    assert (world.root / "mod1.txt").read_bytes() == world.new["mod1.txt"][0]  # type: ignore
    later = world.client.begin()
    later.stage_write("mod1.txt", "after the decision\n")
    assert later.commit()["state"] == "committed"


# -- crashes -------------------------------------------------------------------------------------


def test_killed_before_the_vote_record_recover_aborts_it_and_nothing_is_applied(world: World):
    world.crash("vote.before_record", "vote", "--tid", world.tid, "--coordinator",
                json.dumps(COORD))
    assert snapshot(world.root) == world.old
    out = world.recover()
    assert world.tid in out["rolled_back"] and "in_doubt" not in out, out
    assert snapshot(world.root) == world.old and world.state() == "aborted"
    world.check_invariants()


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_killed_after_the_vote_record_it_stays_prepared_and_a_new_process_decides(
        world: World, outcome: str):
    world.crash("vote.after_record", "vote", "--tid", world.tid, "--coordinator",
                json.dumps(COORD))
    out = world.recover()
    assert out["rolled_back"] == [] == out["rolled_forward"], out
    assert [row["tid"] for row in out["in_doubt"]] == [world.tid]
    assert world.state() == "prepared" and snapshot(world.root) == world.old
    rc, voted = world.vote()  # the coordinator asks again: the same yes
    assert (rc, voted["state"], voted["vote"]) == (0, "prepared", "yes"), voted
    rc, done = run(world.root, "decide", "--tid", world.tid, outcome)
    assert rc == 0 and done["state"] == ("committed" if outcome == "commit" else "aborted")
    assert snapshot(world.root) == (world.new if outcome == "commit" else world.old)
    world.check_invariants()


def test_killed_after_decides_commit_record_recover_rolls_forward(world: World):
    rc, out = world.vote()
    assert rc == 0, out
    world.crash("commit.after_decision", "decide", "--tid", world.tid, "commit")
    assert snapshot(world.root) == world.old
    out = world.recover()
    assert world.tid in out["rolled_forward"], out
    assert snapshot(world.root) == world.new and world.state() == "committed"
    world.check_invariants()


def test_killed_mid_apply_of_decide_recover_finishes_it(world: World):
    world.vote()
    world.crash("commit.mid_apply:2", "decide", "--tid", world.tid, "commit")
    out = world.recover()
    assert world.tid in out["rolled_forward"], out
    assert snapshot(world.root) == world.new
    world.check_invariants()


def test_the_vote_record_is_synced_before_vote_answers(world: World, monkeypatch):
    from agent_2pc.storage.log import Log

    synced: list[bool] = []
    real = Log.append

    def append(self: Log, recs: Any, *, sync: bool) -> Any:
        if any(r.get("type") == "vote" for r in recs):
            synced.append(sync)
        return real(self, recs, sync=sync)

    monkeypatch.setattr(Log, "append", append)
    Agent2PC(world.root, daemon=False).get(world.tid).vote(COORD)
    assert synced == [True]


def test_vote_and_decide_through_a_daemon_serving_the_workspace(world: World):
    from daemonkit import DaemonProc

    daemon = DaemonProc(str(world.root))
    try:
        c = Agent2PC(world.root)
        assert c.via_daemon
        assert c.get(world.tid).vote(COORD)["state"] == "prepared"
        assert [r["tid"] for r in c.in_doubt()] == [world.tid]
        other = c.begin()
        other.stage_write("mod1.txt", "clash\n")
        with pytest.raises(TransactionAborted):
            other.commit()  # the daemon's group commit sees the prepared one too
        assert c.decide(world.tid, "commit")["state"] == "committed"
        assert snapshot(world.root) == world.new
        c.close()
    finally:
        daemon.stop()
