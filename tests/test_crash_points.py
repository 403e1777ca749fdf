"""All-or-nothing across crashes: a real process is killed at every named crash point
(os._exit(137), crashpoints.POINTS), then `recover` runs; every file of the transaction is
all as before or all as staged, no temp file is left in the tree, the log reads clean, and
new transactions work.

Every point in the registry must have a scenario here: a new point is tested the day it is
added (test_every_crash_point_has_a_scenario).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from crashkit import (
    assert_recovered_and_usable,
    cli,
    make_repo,
    snapshot,
    stage_everything,
    wal_is_clean,
)

from agent_2pc import Agent2PC
from agent_2pc.crashpoints import POINTS

pytestmark = pytest.mark.timeout(120)


class World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.client = make_repo(root)
        self.old = snapshot(root)
        self.tid = stage_everything(self.client)
        self.new = self._expected_new()

    def _expected_new(self) -> dict:
        # Commit the same change in a scratch copy to learn the expected final tree.
        import shutil
        import tempfile

        with tempfile.TemporaryDirectory(dir=self.root.parent) as d:
            copy = Path(d) / "copy"
            shutil.copytree(self.root, copy, symlinks=True)
            Agent2PC.trust(copy)  # a copy is not the workspace init made: say it is ours
            Agent2PC(copy).engine.commit(self.tid)
            return snapshot(copy)

    def crash(self, point: str, *args: str) -> None:
        proc = cli(self.root, *args, env={"AGENT2PC_CRASH_AT": point})
        assert proc.returncode == 137, (point, proc.returncode, proc.stdout, proc.stderr)

    def recover(self) -> dict:
        proc = cli(self.root, "recover")
        assert proc.returncode == 0, proc.stderr + proc.stdout
        import json

        return json.loads(proc.stdout)

    def state(self) -> str:
        import json

        proc = cli(self.root, "status", "--tid", self.tid)
        return json.loads(proc.stdout)["transactions"][0]["state"]

    def check_invariants(self) -> None:
        assert_recovered_and_usable(self.root)


def commit_crash(point: str, expect: str, rolled: str):
    def scenario(w: World) -> None:
        w.crash(point, "commit", "--tid", w.tid)
        mid = snapshot(w.root)
        assert mid in (w.old, w.new) or point == "commit.mid_apply:2", "only mid-apply is half"
        out = w.recover()
        assert w.tid in out[rolled], out
        assert snapshot(w.root) == (w.new if expect == "new" else w.old)
        assert w.state() == ("committed" if expect == "new" else "aborted")
    return scenario


def torn_append(w: World) -> None:
    # The first append of a commit is its prepare record: half of it reaches the log.
    w.crash("wal.torn_append", "commit", "--tid", w.tid)
    out = w.recover()
    assert out["truncated_bytes"] > 0 and out["rolled_back"] == [] == out["rolled_forward"]
    assert snapshot(w.root) == w.old and w.state() == "active"
    assert w.client.engine.commit(w.tid)["state"] == "committed"
    assert snapshot(w.root) == w.new


def after_truncate(w: World) -> None:
    w.crash("wal.torn_append", "commit", "--tid", w.tid)
    w.crash("wal.after_truncate", "status")  # any command repairs the torn tail first
    w.recover()
    assert wal_is_clean(w.root) and w.state() == "active" and snapshot(w.root) == w.old
    assert w.client.engine.commit(w.tid)["state"] == "committed"
    assert snapshot(w.root) == w.new


def abort_crash(w: World) -> None:
    w.crash("abort.after_decision", "abort", "--tid", w.tid)
    out = w.recover()
    assert w.tid in out["rolled_back"]
    assert snapshot(w.root) == w.old and w.state() == "aborted"


def stage_crash(w: World) -> None:
    w.crash("stage.after_blob", "stage-write", "--tid", w.tid, "--path", "extra.txt",
            "--content", "never staged")
    w.recover()
    assert snapshot(w.root) == w.old and w.state() == "active"
    status = w.client.status(w.tid)["transactions"][0]
    assert "extra.txt" not in [f["path"] for f in status["files"]]
    assert w.client.engine.commit(w.tid)["state"] == "committed"
    assert snapshot(w.root) == w.new


def compact_crash(point: str):
    def scenario(w: World) -> None:
        assert w.client.engine.commit(w.tid)["state"] == "committed"
        w.crash(point, "compact")
        w.recover()
        assert snapshot(w.root) == w.new
        assert w.state() == "committed"
        rows = Agent2PC(w.root).transactions()
        assert [r["tid"] for r in rows].count(w.tid) == 1
        log = w.client.engine.log
        assert w.client.engine.compact()["after_bytes"] == len(log.header) > 0  # header only
        assert Agent2PC(w.root).engine.commit(w.tid)["state"] == "committed"  # same answer
    return scenario


def api_crash(point: str):
    """A transaction with files and a remote call dies at an API point of its commit: recover
    rolls it back, and the service ends with the charge undone exactly once (or never made)."""
    def scenario(w: World) -> None:
        from api_server import Service

        service = Service()
        try:
            w.client.get(w.tid).stage_api(
                "POST", f"{service.url}/charges", {"amount": 5},
                compensate={"method": "POST", "url": f"{service.url}/refunds",
                            "body": {"amount": 5}})
            w.crash(point, "commit", "--tid", w.tid)
            out = w.recover()
            assert w.tid in out["rolled_back"], out
            assert snapshot(w.root) == w.old and w.state() == "aborted"
            assert service.performed["/charges"] == service.performed["/refunds"] <= 1
            assert len({k for _, p, k in service.requests if p == "/charges"}) <= 1
            w.recover()
            assert service.performed["/charges"] == service.performed["/refunds"] <= 1
        finally:
            service.close()
    return scenario


SCENARIOS = {
    "api.before_send": api_crash("api.before_send"),
    "api.after_send": api_crash("api.after_send"),
    "api.after_record": api_crash("api.after_record:2"),
    "prepare.before_decision": commit_crash("prepare.before_decision", "old", "rolled_back"),
    "commit.after_decision": commit_crash("commit.after_decision", "new", "rolled_forward"),
    "commit.mid_apply": commit_crash("commit.mid_apply:2", "new", "rolled_forward"),
    "commit.before_end": commit_crash("commit.before_end", "new", "rolled_forward"),
    "abort.after_decision": abort_crash,
    "stage.after_blob": stage_crash,
    "wal.torn_append": torn_append,
    "wal.after_truncate": after_truncate,
    "compact.after_history": compact_crash("compact.after_history"),
    "compact.before_rename": compact_crash("compact.before_rename"),
}


# Points whose scenario needs more than this module's World (a git repository, say): each is
# killed at, recovered and checked by the test file named here.
COVERED_IN = {
    "git.after_objects": "tests/test_git_commit.py",
    "git.after_lock": "tests/test_git_commit.py",
    "git.after_ref": "tests/test_git_commit.py",
    "export.before_rename": "tests/test_bundles.py",
    "import.after_blobs": "tests/test_bundles.py",
    "sql.after_gid_logged": "tests/test_postgres_sql.py",
    "sql.after_prepare": "tests/test_postgres_sql.py",
    "sql.after_commit_prepared": "tests/test_postgres_sql.py",
    "undo.after_stage": "tests/test_undo_and_log.py",
    "history.seal.after_index": "tests/test_long_history.py",
    "history.trim.after_index": "tests/test_long_history.py",
    "global.after_votes": "tests/distributed/test_global_crashes.py",
    "global.after_decision": "tests/distributed/test_global_crashes.py",
    "node.after_vote": "tests/distributed/test_global_crashes.py",
    "node.before_decide": "tests/distributed/test_global_crashes.py",
    "node.after_decide": "tests/distributed/test_global_crashes.py",
    "vote.before_record": "tests/test_vote_decide.py",
    "vote.after_record": "tests/test_vote_decide.py",
}


def test_every_crash_point_has_a_scenario():
    assert set(SCENARIOS) | set(COVERED_IN) == set(POINTS)
    assert not set(SCENARIOS) & set(COVERED_IN)
    for point, test_file in COVERED_IN.items():
        text = (Path(__file__).parent.parent / test_file).read_text()
        assert f'"{point}"' in text, (point, test_file)


@pytest.mark.parametrize("point", sorted(SCENARIOS))
def test_crash_at_point_then_recover_leaves_all_or_nothing(tmp_path, point):
    root = tmp_path / "repo"
    root.mkdir()
    w = World(root)
    SCENARIOS[point](w)
    w.check_invariants()


@pytest.mark.parametrize("n", range(1, 6))  # the transaction has 6 file operations
def test_crash_after_each_file_operation_of_apply_rolls_forward(tmp_path, n):
    root = tmp_path / "repo"
    root.mkdir()
    w = World(root)
    w.crash(f"commit.mid_apply:{n}", "commit", "--tid", w.tid)
    half = snapshot(w.root)
    assert half != w.new  # it really died half-way
    assert w.tid in w.recover()["rolled_forward"]
    assert snapshot(w.root) == w.new
    assert Agent2PC(w.root).status(w.tid)["transactions"][0]["state"] == "committed"
    w.check_invariants()


class LinksWorld(World):
    """A transaction staged by exec that makes links and directories, removes a link and an
    empty directory, turns a file into a directory, a link into another link and a directory
    into a file."""

    def __init__(self, root: Path) -> None:
        import os

        self.root = root
        self.client = make_repo(root)
        os.symlink("keep.txt", root / "linkold")
        os.symlink("keep.txt", root / "relink")
        (root / "emptyold").mkdir()
        (root / "pkg" / "sub").mkdir(parents=True)
        (root / "pkg" / "a.py").write_text("a\n")
        (root / "pkg" / "sub" / "b.py").write_text("b\n")
        self.old = snapshot(root)
        tx = self.client.begin(label="links and directories")
        tx.exec(["sh", "-c", "ln -s mod1.txt link1 && mkdir -p made/empty && rm linkold && "
                             "rmdir emptyold && rm gone.txt && mkdir -m 0700 gone.txt && "
                             "ln -sfn mod2.py relink && rm -r pkg && echo module > pkg"])
        assert len(tx.status()["files"]) == 9
        self.tid = tx.tid
        self.new = self._expected_new()


@pytest.mark.parametrize("n", range(1, 9))  # nine operations: four deletes, five puts
def test_a_crash_in_the_apply_of_links_and_directories_rolls_forward(tmp_path, n):
    root = tmp_path / "repo"
    root.mkdir()
    w = LinksWorld(root)
    assert w.new["link1"] == "symlink:mod1.txt" and w.new["gone.txt/"] == "dir 700"
    assert w.new["pkg"] == (b"module\n", 0o644) and "pkg/a.py" not in w.new
    w.crash(f"commit.mid_apply:{n}", "commit", "--tid", w.tid)
    assert snapshot(w.root) not in (w.old, w.new)
    assert w.tid in w.recover()["rolled_forward"]
    assert snapshot(w.root) == w.new
    assert w.recover()["rolled_forward"] == []  # the redo is done, and stays done
    assert snapshot(w.root) == w.new
    w.check_invariants()


def test_a_crash_before_the_decision_leaves_links_and_directories_as_they_were(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    w = LinksWorld(root)
    commit_crash("prepare.before_decision", "old", "rolled_back")(w)
    w.check_invariants()


def test_next_command_finishes_a_dead_processs_commit_first(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    w = World(root)
    w.crash("commit.mid_apply:1", "commit", "--tid", w.tid)
    assert snapshot(w.root) not in (w.old, w.new)
    proc = cli(w.root, "list")  # any command, not recover
    assert proc.returncode == 0
    assert snapshot(w.root) == w.new and w.state() == "committed"


def test_a_redo_writes_a_small_file_again_from_the_decision_when_its_blob_is_lost(tmp_path):
    """Small files are not synced at prepare: their content travels in the decision record.
    A machine crash may then lose an unsynced blob; the redo takes the decision's copy."""
    import json as _json

    root = tmp_path / "repo"
    root.mkdir()
    w = World(root)
    w.crash("commit.after_decision", "commit", "--tid", w.tid)
    from agent_2pc.coordinator.engine import Engine

    engine = Engine(str(root), recover_dead=False)  # look, without finishing it
    tx = engine.txs[w.tid]
    engine.close()
    assert tx.state == "committing" and tx.decision_fields.get("inline")
    objects = root / ".agent-tx" / "objects"
    lost = damaged = 0
    for op in tx.changes():  # lose one blob, damage another: a machine crash may do either
        if op.op == "write" and op.blob and str(tx.changes().index(op)) in \
                tx.decision_fields["inline"]:
            blob = objects / op.blob[:2] / op.blob
            if lost == 0:
                blob.unlink()
                lost += 1
            elif damaged == 0:
                blob.chmod(0o644)
                blob.write_bytes(b"garbage")
                damaged += 1
    assert lost == 1 and damaged == 1
    out = _json.loads(cli(root, "recover").stdout)
    assert w.tid in out["rolled_forward"] and not out.get("diverged")
    assert snapshot(w.root) == w.new
    w.check_invariants()


def test_a_large_file_is_synced_at_prepare_and_not_carried_in_the_decision(tmp_path):
    from agent_2pc.participants.fs import INLINE_BYTES_MAX

    root = tmp_path / "repo"
    root.mkdir()
    client = Agent2PC.init(root)
    tx = client.begin()
    tx.stage_write("big.bin", b"x" * (INLINE_BYTES_MAX + 1))
    tx.stage_write("small.txt", "small\n")
    tx.commit()
    fields = Agent2PC(root).engine.txs[tx.tid].decision_fields
    assert list(fields["inline"]) == ["1"]  # small.txt (k=1, sorted by path); big.bin not
    assert (root / "big.bin").read_bytes() == b"x" * (INLINE_BYTES_MAX + 1)
