"""agent_2pc_stage_sql: SQL statements staged over MCP commit with the files (results checked
against the tool's outputSchema by the SDK's client on each call). The server is the throwaway
cluster with prepared transactions of tests/pg_cluster.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from mcpkit import error, ok, server_params, session
from pg_cluster import server_2pc

from agent_2pc import Agent2PC

pytestmark = pytest.mark.timeout(120)


def _sql(dsn: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(query)
        return cur.fetchall() if cur.description else []


def test_stage_sql_tool_stages_rows_that_commit_with_the_files(root: str) -> None:
    dsn = server_2pc()
    table = f"t_{uuid.uuid4().hex[:10]}"
    _sql(dsn, f"CREATE TABLE {table} (id int PRIMARY KEY)")
    client = Agent2PC(root)
    tx = client.begin()
    tx.stage_write("a.txt", "with the row\n")
    client.close()

    async def body(c: Any) -> list[dict[str, Any]]:
        staged = ok(await c.call_tool("agent_2pc_stage_sql", {
            "tid": tx.tid, "dsn": dsn, "sql": f"INSERT INTO {table} VALUES (1), (2)"}))
        bad = error(await c.call_tool("agent_2pc_stage_sql", {
            "tid": tx.tid, "dsn": dsn, "sql": "INSERT INTO no_such_table VALUES (1)"}),
            "sql_failed")
        done = ok(await c.call_tool("agent_2pc_commit", {"tid": tx.tid}))
        return [staged, bad, done]

    staged, bad, done = session(server_params(root), body)
    assert staged["rows_affected"] == 2 and staged["n"] == 0
    assert bad["error"]["sqlstate"] == "42P01"
    assert done["state"] == "committed" and done["files"] == ["a.txt"]
    assert _sql(dsn, f"SELECT id FROM {table} ORDER BY id") == [(1,), (2,)]
