"""A migration (stage-sql in one workspace, through its own Postgres participant) and the
code that needs it (a file in another workspace) commit together or not at all -- also when
the coordinator dies before or after the decision."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pg_cluster import server_2pc

from .conftest import World, wait_until

pytestmark = pytest.mark.postgres


@pytest.fixture
def app_db(world: World) -> str:
    """The application's database: a server that allows PREPARE TRANSACTION (each test uses
    its own table name)."""
    return server_2pc()


def _q(dsn: str, stmt: str) -> list[tuple[object, ...]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(stmt)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def _table_exists(dsn: str, table: str) -> bool:
    return bool(_q(dsn, f"SELECT 1 FROM pg_tables WHERE tablename = '{table}'"))


def _stage(world: World, dsn: str, table: str) -> str:
    world.workspace("backend")
    world.workspace("frontend", {"app.js": "v1\n"})
    tid = world.begin("migration + code")
    status, out = world.cli("stage-sql", "--tid", tid, "--workspace", "backend", "--dsn", dsn,
                            "--sql", f"CREATE TABLE {table} (id int PRIMARY KEY, email text); "
                            f"INSERT INTO {table} VALUES (1, 'a@example.com')")
    assert status == 0 and out["rows_affected"] == 1, out
    status, out = world.cli("stage-write", "--tid", tid, "--workspace", "frontend", "--path",
                            "app.js", "--content", f"select email from {table}\n")
    assert status == 0, out
    return tid


def _app_js(world: World) -> str:
    with open(os.path.join(world.nodes["frontend"].root, "app.js")) as f:
        return f.read()


def _no_prepared_left(dsn: str) -> bool:
    return not _q(dsn, "SELECT gid FROM pg_prepared_xacts")


def test_a_migration_and_the_code_that_needs_it_commit_together(world: World,
                                                                 app_db: str) -> None:
    table = f"users_{world.schema[-8:]}"
    tid = _stage(world, app_db, table)
    assert not _table_exists(app_db, table)  # staged, not visible
    status, out = world.cli("commit", "--tid", tid)
    assert status == 0 and out["state"] == "committed", out
    assert _table_exists(app_db, table)
    assert _q(app_db, f"SELECT email FROM {table}") == [("a@example.com",)]
    assert _app_js(world) == f"select email from {table}\n"
    assert _no_prepared_left(app_db)


def test_a_no_from_the_code_workspace_rolls_the_migration_back(world: World,
                                                               app_db: str) -> None:
    table = f"users_{world.schema[-8:]}"
    tid = _stage(world, app_db, table)
    with open(os.path.join(world.nodes["frontend"].root, "app.js"), "w") as f:
        f.write("edited meanwhile\n")  # the frontend's prepare sees a conflict
    status, out = world.cli("commit", "--tid", tid)
    assert status == 1 and out["error"]["workspace"] == "frontend", out
    assert wait_until(lambda: world.all_done(tid))
    assert not _table_exists(app_db, table)
    assert _no_prepared_left(app_db)


@pytest.mark.parametrize("point,outcome", [("global.after_votes", "aborted"),
                                           ("global.after_decision", "committed")])
def test_migration_and_code_stay_together_when_the_coordinator_dies(
        world: World, app_db: str, point: str, outcome: str) -> None:
    table = f"users_{world.schema[-8:]}"
    tid = _stage(world, app_db, table)
    proc = subprocess.run([sys.executable, "-m", "agent_2pc", "commit", "--tid", tid, "--json"],
                          capture_output=True, timeout=120,
                          env=world.env({"AGENT2PC_CRASH_AT": point}))
    assert proc.returncode == 137, proc
    g = wait_until(lambda: world.all_done(tid), 60)
    assert g["state"] == outcome
    assert _table_exists(app_db, table) is (outcome == "committed")
    assert (_app_js(world) == f"select email from {table}\n") is (outcome == "committed")
    assert _no_prepared_left(app_db)
