"""The Postgres participant (participants/postgres.py) against a real server with prepared
transactions on (a throwaway cluster: tests/pg_cluster.py): files and rows land together or not
at all -- through a commit, a no vote, a cut connection, and a real process killed at every
step (AGENT2PC_CRASH_AT) then `agent-2pc recover`.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from crashkit import cli, snapshot
from pg_cluster import Cluster, can_connect, server_2pc

from agent_2pc import Agent2PC
from agent_2pc.participants.postgres import statement_heads

pytestmark = pytest.mark.timeout(180)

SHARED_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def pg2pc() -> str:
    """A server with max_prepared_transactions > 0."""
    return server_2pc()


def sql(dsn: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


class World:
    """A workspace with one file and a table of its own in the 2PC server."""

    def __init__(self, tmp_path: Path, dsn: str) -> None:
        self.dsn = dsn
        self.root = tmp_path / "ws"
        self.root.mkdir(parents=True)
        (self.root / "app.txt").write_text("v1\n")
        self.client = Agent2PC.init(self.root)
        self.table = f"t_{uuid.uuid4().hex[:10]}"
        sql(dsn, f"CREATE TABLE {self.table} (id int PRIMARY KEY, v text)")
        self.old = snapshot(self.root)

    def cli(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        proc = cli(self.root, *args, env=env)
        out = json.loads(proc.stdout) if proc.stdout.strip() else {}
        return proc.returncode, out

    def begin(self) -> str:
        rc, out = self.cli("begin")
        assert rc == 0, out
        return str(out["tid"])

    def stage(self, tid: str, dsn: str | None = None,
              statements: str | None = None) -> tuple[int, dict[str, Any]]:
        rc, out = self.cli("stage-write", "--tid", tid, "--path", "app.txt", "--content", "v2\n")
        assert rc == 0, out
        return self.cli("stage-sql", "--tid", tid, "--dsn", dsn or self.dsn, "--sql",
                        statements or f"INSERT INTO {self.table} VALUES (1, 'a'), (2, 'b')")

    def rows(self) -> list[tuple[Any, ...]]:
        return sql(self.dsn, f"SELECT id, v FROM {self.table} ORDER BY id")

    def prepared(self, tid: str) -> list[str]:
        mark = "a2pc_" + tid.replace("-", "_") + "_%"
        return [g for (g,) in sql(self.dsn, "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                                  (mark,))]

    def state(self, tid: str) -> str:
        rc, out = self.cli("status", "--tid", tid)
        assert rc == 0, out
        return str(out["transactions"][0]["state"])


@pytest.fixture
def world(tmp_path: Path, pg2pc: str) -> World:
    return World(tmp_path, pg2pc)


# -- commit and staging ------------------------------------------------------------------------


def test_files_and_rows_commit_together(world: World):
    tid = world.begin()
    rc, out = world.stage(tid)
    assert (rc, out["rows_affected"], out["n"]) == (0, 2, 0), out
    # A later statement for the same database sees the earlier ones (one database
    # transaction per DSN), at staging as at commit.
    rc, out = world.cli("stage-sql", "--tid", tid, "--dsn", world.dsn, "--sql",
                        f"UPDATE {world.table} SET v = 'c' WHERE id = 2")
    assert (rc, out["rows_affected"]) == (0, 1), out
    assert world.rows() == []  # staging rolled back: nothing lands before commit
    rc, out = world.cli("commit", "--tid", tid)
    assert rc == 0 and out["state"] == "committed", out
    assert world.rows() == [(1, "a"), (2, "c")]
    assert (world.root / "app.txt").read_text() == "v2\n"
    assert world.prepared(tid) == []


def test_sql_from_a_file_and_the_library_agree(world: World, tmp_path: Path):
    script = tmp_path / "m.sql"
    script.write_text(f"INSERT INTO {world.table} VALUES (7, 'seven');\n"
                      f"DELETE FROM {world.table} WHERE id = 7;\n"
                      f"INSERT INTO {world.table} VALUES (8, 'it''s; COMMIT');\n")
    tid = world.begin()
    rc, out = world.cli("stage-sql", "--tid", tid, "--dsn", world.dsn, "--file", str(script))
    assert (rc, out["rows_affected"]) == (0, 3), out
    tx = world.client.begin()
    assert tx.stage_sql(world.dsn, f"INSERT INTO {world.table} VALUES (9, 'lib')") == {
        "n": 0, "rows_affected": 1}
    tx.commit()
    assert world.cli("commit", "--tid", tid)[0] == 0
    assert world.rows() == [(8, "it's; COMMIT"), (9, "lib")]


def test_a_failing_statement_at_staging_exits_2_with_its_sqlstate(world: World):
    tid = world.begin()
    rc, out = world.stage(tid, statements="INSERT INTO no_such_table VALUES (1)")
    assert rc == 2 and out["error"]["code"] == "sql_failed", out
    assert out["error"]["sqlstate"] == "42P01"
    assert "no_such_table" in out["error"]["message"] and "42P01" in out["error"]["message"]
    rc, out = world.cli("status", "--tid", tid)
    assert "sql" not in out["transactions"][0], out  # nothing was logged
    assert world.cli("commit", "--tid", tid)[0] == 0
    assert world.rows() == []


def test_transaction_control_and_a_password_in_the_dsn_are_refused(world: World):
    tid = world.begin()
    for bad in ("COMMIT", f"INSERT INTO {world.table} VALUES (1, 'x'); commit;",
                "begin; select 1", "prepare transaction 'x'", "/* c */ ROLLBACK"):
        rc, out = world.cli("stage-sql", "--tid", tid, "--dsn", world.dsn, "--sql", bad)
        assert rc == 2 and out["error"]["code"] == "usage", (bad, out)
    secret = world.dsn.replace("postgres@", "postgres:s3cret@")
    rc, out = world.cli("stage-sql", "--tid", tid, "--dsn", secret, "--sql", "SELECT 1")
    assert rc == 2 and "password" in out["error"]["message"], out
    assert b"s3cret" not in (world.root / ".agent-tx" / "wal.bin").read_bytes()
    assert world.rows() == []


def test_statement_heads_skip_quotes_and_comments():
    assert statement_heads("select 'a;commit'; -- commit;\n insert into t values ($$;begin$$)"
                           ) == [("SELECT", "\0"), ("INSERT", "INTO")]
    assert statement_heads('/* x /* commit; */ ; */ update "commit;" set a = E\'\\\';\'') == [
        ("UPDATE", "\0")]
    assert statement_heads("Prepare Transaction 'g'") == [("PREPARE", "TRANSACTION")]


def test_a_dsn_given_as_env_name_keeps_it_out_of_the_log(world: World):
    env = {"A2PC_TEST_DB": world.dsn}
    tid = world.begin()
    rc, out = world.cli("stage-sql", "--tid", tid, "--dsn", "env:A2PC_TEST_DB", "--sql",
                        f"INSERT INTO {world.table} VALUES (3, 'env')", env=env)
    assert rc == 0, out
    assert world.dsn.encode() not in (world.root / ".agent-tx" / "wal.bin").read_bytes()
    assert world.cli("commit", "--tid", tid, env=env)[0] == 0
    assert world.rows() == [(3, "env")]
    rc, out = world.cli("stage-sql", "--tid", world.begin(), "--dsn", "env:A2PC_UNSET_DB",
                        "--sql", "SELECT 1")
    assert rc == 2 and "A2PC_UNSET_DB" in out["error"]["message"], out


def test_a_server_without_prepared_transactions_is_isolation_unavailable(world: World):
    dsn, cluster = SHARED_DSN, None
    if can_connect(dsn) is not None or sql(dsn, "SHOW max_prepared_transactions") != [("0",)]:
        cluster = Cluster(max_prepared_transactions=0)  # no shared server with the setting off
        dsn = cluster.start()
    try:
        tid = world.begin()
        rc, out = world.cli("stage-sql", "--tid", tid, "--dsn", dsn, "--sql", "SELECT 1")
        assert rc == 2 and out["error"]["code"] == "isolation_unavailable", out
        assert "max_prepared_transactions = 0" in out["error"]["message"]
        assert out["error"]["setting"] == "max_prepared_transactions"
    finally:
        if cluster is not None:
            cluster.stop()


# -- no votes ------------------------------------------------------------------------------------


def test_a_unique_violation_after_staging_votes_no_and_nothing_lands(world: World):
    tid = world.begin()
    assert world.stage(tid)[0] == 0
    sql(world.dsn, f"INSERT INTO {world.table} VALUES (2, 'other writer')")
    rc, out = world.cli("commit", "--tid", tid)
    assert rc == 1 and out["error"]["code"] == "conflict", out
    assert "23505" in out["error"]["message"]
    assert snapshot(world.root) == world.old
    assert world.rows() == [(2, "other writer")]
    assert world.prepared(tid) == [] and world.state(tid) == "aborted"


def test_a_connection_cut_at_prepare_aborts_cleanly(world: World):
    # The statement sleeps only once the flag table exists: not at staging, at prepare.
    flag = world.table + "_flag"
    tid = world.begin()
    rc, out = world.stage(tid, statements=(
        f"INSERT INTO {world.table} VALUES (1, 'a'); SELECT pg_sleep(CASE WHEN "
        f"to_regclass('{flag}') IS NULL THEN 0 ELSE 60 END)"))
    assert rc == 0, out
    sql(world.dsn, f"CREATE TABLE {flag} ()")
    cut: list[Any] = []

    def terminate() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not cut:
            cut.extend(sql(world.dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE application_name LIKE %s AND state = 'active'",
                           ("a2pc_" + tid.replace("-", "_") + "%",)))
            time.sleep(0.05)

    killer = threading.Thread(target=terminate)
    killer.start()
    rc, out = world.cli("commit", "--tid", tid)
    killer.join()
    assert cut, "the prepare's session was never seen"
    assert rc == 1 and out["error"]["code"] == "effect_failed", out
    assert snapshot(world.root) == world.old
    assert world.rows() == [] and world.prepared(tid) == []
    assert world.state(tid) == "aborted"


def second_database(dsn: str) -> str:
    """The DSN of another database on the same server (made once)."""
    import psycopg

    if not sql(dsn, "SELECT 1 FROM pg_database WHERE datname = 'a2pc_second'"):
        try:
            sql(dsn, "CREATE DATABASE a2pc_second")
        except psycopg.errors.DuplicateDatabase:
            pass  # another test process made it meanwhile
    return psycopg.conninfo.make_conninfo(dsn, dbname="a2pc_second")


def test_a_no_from_a_second_database_rolls_back_the_first_prepared_one(world: World):
    other = second_database(world.dsn)
    sql(other, f"CREATE TABLE {world.table} (id int PRIMARY KEY)")
    tid = world.begin()
    assert world.stage(tid)[0] == 0  # the first database: prepared first at commit
    rc, out = world.cli("stage-sql", "--tid", tid, "--dsn", other, "--sql",
                        f"INSERT INTO {world.table} VALUES (1)")
    assert rc == 0, out
    sql(other, f"INSERT INTO {world.table} VALUES (1)")  # another writer, after staging
    rc, out = world.cli("commit", "--tid", tid)
    assert rc == 1 and out["error"]["code"] == "conflict", out
    assert world.rows() == [] and snapshot(world.root) == world.old
    assert sql(other, f"SELECT id FROM {world.table}") == [(1,)]
    assert world.prepared(tid) == [] and world.state(tid) == "aborted"


def test_two_workspaces_racing_for_one_row_commit_exactly_one(tmp_path: Path, pg2pc: str):
    import subprocess
    import sys

    a, b = World(tmp_path / "a", pg2pc), World(tmp_path / "b", pg2pc)
    b.table = a.table  # one table, two workspaces
    tids = []
    for w in (a, b):
        tid = w.begin()
        assert w.stage(tid, statements=f"INSERT INTO {a.table} VALUES (1, '{w.root.parent.name}')"
                       )[0] == 0
        tids.append(tid)
    procs = [subprocess.Popen([sys.executable, "-m", "agent_2pc", "--root", str(w.root),
                               "commit", "--tid", tid, "--json"], stdout=subprocess.PIPE,
                              text=True) for w, tid in zip((a, b), tids, strict=True)]
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], outs
    winner = (a, b)[[p.returncode for p in procs].index(0)]
    loser_out = outs[[p.returncode for p in procs].index(1)]
    assert loser_out["error"]["code"] == "conflict", loser_out
    assert a.rows() == [(1, winner.root.parent.name)]
    for w in (a, b):
        expected = "v2\n" if w is winner else "v1\n"
        assert (w.root / "app.txt").read_text() == expected
    assert a.prepared(tids[0]) == [] and b.prepared(tids[1]) == []


def test_status_shows_each_database_and_a_batch_step_commits_sql(world: World, tmp_path: Path):
    tid = world.begin()
    assert world.stage(tid)[0] == 0
    rc, out = world.cli("status", "--tid", tid)
    assert out["transactions"][0]["sql"] == [{
        "dsn": world.dsn, "gid": out["transactions"][0]["sql"][0]["gid"], "statements": 1,
        "outcome": "staged"}], out
    assert world.cli("abort", "--tid", tid)[0] == 0
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"steps": [
        {"participant_id": "fs", "intent": {"type": "fs_write", "path": "app.txt",
                                            "content": "v3\n"}},
        {"participant_id": "db", "intent": {"type": "sql", "dsn": world.dsn,
                                            "sql": f"INSERT INTO {world.table} VALUES (4, 'd')"}},
    ]}))
    rc, out = world.cli("run-batch", "--file", str(manifest))
    assert rc == 0 and out["state"] == "committed", out
    assert world.rows() == [(4, "d")] and (world.root / "app.txt").read_text() == "v3\n"
    manifest.write_text(json.dumps({"steps": [
        {"participant_id": "db", "intent": {"type": "sql", "dsn": world.dsn, "sql": "COMMIT"}}]}))
    rc, out = world.cli("run-batch", "--file", str(manifest))
    assert rc == 2 and out["error"]["code"] == "invalid_manifest", out


# -- crashes -------------------------------------------------------------------------------------

CRASHES = {  # point -> (the outcome recovery reaches, whether a prepared transaction is left)
    "sql.after_gid_logged": ("rolled_back", False),
    "sql.after_prepare": ("rolled_back", True),
    "prepare.before_decision": ("rolled_back", True),
    "commit.after_decision": ("rolled_forward", True),
    "sql.after_commit_prepared": ("rolled_forward", False),
}


@pytest.mark.parametrize("point", sorted(CRASHES))
def test_a_crash_then_recover_lands_files_and_rows_together(world: World, point: str):
    outcome, left_prepared = CRASHES[point]
    tid = world.begin()
    assert world.stage(tid)[0] == 0
    rc, out = world.cli("commit", "--tid", tid, env={"AGENT2PC_CRASH_AT": point})
    assert rc == 137, out
    assert bool(world.prepared(tid)) == left_prepared
    rc, out = world.cli("recover")
    assert rc == 0 and tid in out[outcome], out
    if outcome == "rolled_forward":
        assert world.rows() == [(1, "a"), (2, "b")]
        assert (world.root / "app.txt").read_text() == "v2\n"
    else:
        assert world.rows() == [] and snapshot(world.root) == world.old
    assert world.prepared(tid) == []
    assert world.cli("recover")[0] == 0  # nothing left to do; the same again
    assert world.prepared(tid) == []


def test_sigkill_mid_statement_at_prepare_then_recover_ends_its_session_and_rolls_back(
        world: World):
    import signal
    import subprocess
    import sys

    flag = world.table + "_flag"
    tid = world.begin()
    assert world.stage(tid, statements=(
        f"INSERT INTO {world.table} VALUES (1, 'a'); SELECT pg_sleep(CASE WHEN "
        f"to_regclass('{flag}') IS NULL THEN 0 ELSE 120 END)"))[0] == 0
    sql(world.dsn, f"CREATE TABLE {flag} ()")
    mark = "a2pc_" + tid.replace("-", "_") + "%"
    proc = subprocess.Popen([sys.executable, "-m", "agent_2pc", "--root", str(world.root),
                             "commit", "--tid", tid, "--json"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not sql(world.dsn, "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE %s "
                  "AND state = 'active'", (mark,)):
        assert time.monotonic() < deadline and proc.poll() is None, "no prepare seen"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # The server has not noticed: its session still sleeps, holding the row's lock.
    assert sql(world.dsn, "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE %s",
               (mark,))
    t = time.monotonic()
    rc, out = world.cli("recover")
    assert rc == 0 and tid in out["rolled_back"], out
    assert time.monotonic() - t < 60  # it ended the session rather than wait for the sleep
    assert sql(world.dsn, "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE %s",
               (mark,)) == []
    assert world.rows() == [] and world.prepared(tid) == []
    assert snapshot(world.root) == world.old


def test_recover_lists_a_prepared_transaction_it_cannot_reach_then_resolves_it(world: World):
    good = {"A2PC_TEST_DB": world.dsn}
    tid = world.begin()
    rc, out = world.cli("stage-sql", "--tid", tid, "--dsn", "env:A2PC_TEST_DB", "--sql",
                        f"INSERT INTO {world.table} VALUES (5, 'e')", env=good)
    assert rc == 0, out
    rc, out = world.cli("commit", "--tid", tid,
                        env={**good, "AGENT2PC_CRASH_AT": "sql.after_prepare"})
    assert rc == 137 and world.prepared(tid), out
    gone = {"A2PC_TEST_DB": "postgresql://postgres@127.0.0.1:1/postgres"}
    rc, out = world.cli("recover", env=gone)
    assert rc == 2 and out["error"]["code"] == "apply_incomplete", out
    assert [t["tid"] for t in out["error"]["transactions"]] == [tid]
    assert world.prepared(tid)
    rc, out = world.cli("status", "--tid", tid, env=gone)  # it tries too, and says so
    assert (rc, out["error"]["code"], out["error"]["state"]) == (
        2, "apply_incomplete", "aborting"), out
    rc, out = world.cli("recover", env=good)
    assert rc == 0 and tid in out["rolled_back"], out
    assert world.prepared(tid) == [] and world.rows() == []
