"""Transactions an outside coordinator decides (issue 17, the local half): ``vote`` prepares
and votes yes durably, the transaction then waits -- across process exits and crashes -- for
``decide`` from any process. Real processes are killed at the named crash points
(``vote.before_record``, ``vote.after_record``, and commit's for decide)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from crashkit import (
    assert_recovered_and_usable,
    cli,
    make_repo,
    snapshot,
    stage_everything,
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
        assert_recovered_and_usable(self.root)


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
    rc, out = run(root, "status", "--tid", tx.tid)
    row = out["transactions"][0]
    assert row["state"] == "prepared" and row["coordinator"] == COORD, row
    assert "expires_at" not in row  # its timeout no longer applies
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


# -- a Postgres participant across the gap -------------------------------------------------------


def _sql(dsn: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def _pg_world(tmp_path: Path) -> tuple[str, Path, str, str]:
    """A workspace with app.txt, a table of its own in the 2PC server, and a transaction that
    changes both: (dsn, root, table, tid)."""
    import uuid

    from pg_cluster import server_2pc

    dsn = server_2pc()
    root = tmp_path / "ws"
    root.mkdir()
    (root / "app.txt").write_text("v1\n")
    Agent2PC.init(root).close()
    table = f"t_{uuid.uuid4().hex[:10]}"
    _sql(dsn, f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    rc, out = run(root, "begin")
    tid = out["tid"]
    assert run(root, "stage-write", "--tid", tid, "--path", "app.txt", "--content", "v2\n")[0] == 0
    rc, out = run(root, "stage-sql", "--tid", tid, "--dsn", dsn, "--sql",
                  f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
    assert rc == 0, out
    return dsn, root, table, tid


def test_with_postgres_killed_before_the_vote_record_recover_rolls_the_prepared_one_back(
        tmp_path: Path):
    dsn, root, table, tid = _pg_world(tmp_path)
    proc = cli(root, "vote", "--tid", tid, "--coordinator", json.dumps(COORD),
               env={"AGENT2PC_CRASH_AT": "vote.before_record"})
    assert proc.returncode == 137, proc.stderr
    mark = "a2pc_" + tid.replace("-", "_") + "_%"
    assert len(_sql(dsn, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (mark,))) == 1
    rc, out = run(root, "recover")
    assert rc == 0 and tid in out["rolled_back"] and "in_doubt" not in out, out
    assert _sql(dsn, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (mark,)) == []
    assert _sql(dsn, f"SELECT count(*) FROM {table}") == [(0,)]
    assert (root / "app.txt").read_text() == "v1\n"


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_with_postgres_a_vote_in_one_process_and_decide_in_another_land_rows_and_files_together(
        tmp_path: Path, outcome: str):
    dsn, root, table, tid = _pg_world(tmp_path)
    # The voting process ends at once (the CLI): the prepared transaction outlives it.
    rc, out = run(root, "vote", "--tid", tid, "--coordinator", json.dumps(COORD))
    assert (rc, out["state"]) == (0, "prepared"), out
    mark = "a2pc_" + tid.replace("-", "_") + "_%"
    gids = _sql(dsn, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (mark,))
    assert len(gids) == 1
    assert _sql(dsn, f"SELECT count(*) FROM {table}") == [(0,)]
    assert (root / "app.txt").read_text() == "v1\n"
    rc, out = run(root, "recover")
    assert rc == 0 and out["in_doubt"][0]["tid"] == tid, out
    rc, out = run(root, "decide", "--tid", tid, outcome)
    assert rc == 0, out
    assert _sql(dsn, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (mark,)) == []
    if outcome == "commit":
        assert _sql(dsn, f"SELECT id, v FROM {table} ORDER BY id") == [(1, "a"), (2, "b")]
        assert (root / "app.txt").read_text() == "v2\n"
    else:
        assert _sql(dsn, f"SELECT count(*) FROM {table}") == [(0,)]
        assert (root / "app.txt").read_text() == "v1\n"


# -- a git commit across the gap -----------------------------------------------------------------


@pytest.mark.parametrize("voter", ["cli", "library"])
def test_with_git_the_branch_moves_at_decide_commit_from_another_process(tmp_path: Path,
                                                                         voter: str):
    """The vote's process releases git's ref lock (a CLI process exits; a library process lets
    it go after the vote), so a decide in another process moves the branch by
    compare-and-swap, from the commit the vote built."""
    from test_git_commit import changed_in, git, head, make_repo, stage_change

    repo = make_repo(tmp_path)
    tid = stage_change(repo)
    client = Agent2PC(repo, daemon=False)
    client.engine.stage_effect(tid, "git", {"message": "global", "author": None,
                                            "branch": None, "sign": None})
    old = head(repo)
    if voter == "cli":
        rc, out = run(repo, "vote", "--tid", tid, "--coordinator", json.dumps(COORD))
        assert rc == 0, out
    else:
        client.get(tid).vote(COORD)
    assert head(repo) == old and not (repo / ".git" / "refs" / "heads" / "main.lock").exists()
    clash = client.begin()  # another commit onto the branch waits for the decision
    clash.stage_write("elsewhere.txt", "x\n")
    client.engine.stage_effect(clash.tid, "git", {"message": "clash", "author": None,
                                                  "branch": None, "sign": None})
    with pytest.raises(TransactionAborted, match="git branch main"):
        clash.commit()
    rc, out = run(repo, "decide", "--tid", tid, "commit")
    assert rc == 0 and out["state"] == "committed" and out["branch"] == "main", out
    new = head(repo)
    assert new == out["commit"] and git(repo, "rev-parse", new + "^").strip() == old
    assert sorted(changed_in(repo, new)) == ["A\tnew/tool.sh", "D\tb.txt", "M\ta.txt"]
    assert (repo / "a.txt").read_text() == "A changed\n"
    client.close()


# -- a remote call across the gap ----------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_with_an_api_call_it_is_made_once_at_the_vote_and_compensated_only_on_decide_abort(
        world: World, outcome: str):
    from api_server import Service

    service = Service()
    try:
        world.client.get(world.tid).stage_api(
            "POST", f"{service.url}/charges", {"amount": 5},
            compensate={"method": "POST", "url": f"{service.url}/refunds",
                        "body": {"amount": 5}})
        rc, out = world.vote()
        assert rc == 0, out
        assert service.performed["/charges"] == 1 and service.performed["/refunds"] == 0
        world.recover()  # in doubt: nothing compensated, nothing sent again
        assert service.performed["/charges"] == 1 and service.performed["/refunds"] == 0
        rc, out = run(world.root, "decide", "--tid", world.tid, outcome)
        assert rc == 0, out
        assert service.performed["/charges"] == 1
        assert service.performed["/refunds"] == (1 if outcome == "abort" else 0)
        assert snapshot(world.root) == (world.new if outcome == "commit" else world.old)
    finally:
        service.close()


def test_a_vote_whose_decided_fields_staging_cannot_have_written_is_corrupt_wal_at_decide(
        world: World):
    from agent_2pc.core import records
    from agent_2pc.errors import CorruptWal

    engine = Agent2PC(world.root, daemon=False).engine
    k = len(engine.txs[world.tid].changes()) + 5  # no change of the transaction has this k
    engine.journal.append([records.prepare(world.tid, pid=os.getpid()),
                           records.vote(world.tid, pid=os.getpid(), coordinator=COORD,
                                        decided={"modes": {str(k): 0o644}})], sync=True)
    with pytest.raises(CorruptWal):
        engine.decide(world.tid, "commit")
    assert snapshot(world.root) == world.old


def test_two_processes_deciding_commit_at_once_both_answer_committed_and_apply_once(
        world: World):
    import subprocess
    import sys

    world.client.get(world.tid).vote(COORD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    procs = [subprocess.Popen([sys.executable, "-m", "agent_2pc", "--root", str(world.root),
                               "decide", "--tid", world.tid, "commit", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert [o["state"] for o in outs] == ["committed", "committed"], outs
    assert snapshot(world.root) == world.new
    rows = Agent2PC(world.root).transactions()
    assert [r["tid"] for r in rows].count(world.tid) == 1
