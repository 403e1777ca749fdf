"""Every SQL statement of the global coordinator (psycopg 3; imported only by this package).

Each method is one statement in autocommit (or one short transaction), so that a connection
cut between two of them leaves Postgres consistent; ``Store.call`` reconnects and retries the
ones that are safe to retry. The decision statements are the commit point (docs/distributed.md,
"The commit point"): exactly one of ``decide_commit`` and an abort can win, by the row lock.

Times are the database's (``now()``): one clock for every host.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

from ..errors import Agent2PCError, StoreUnavailable, UsageError
from .schema import DDL_LOCK_KEY, DEFAULT_SCHEMA, SCHEMA_VERSION, check_schema, ddl

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, TypeVar

    import psycopg

    T = TypeVar("T")

CONNECT_TIMEOUT_S = 5
RETRY_BUDGET_S = 20.0  # how long a statement keeps retrying through lost connections


def store_url(url: str | None) -> str:
    """The store's URL: the argument, else $AGENT2PC_STORE. Checked for shape, not reached."""
    url = url or os.environ.get("AGENT2PC_STORE")
    if not url:
        raise UsageError("a global transaction needs its store: `store` "
                         "(postgresql://user@host/db) or $AGENT2PC_STORE", params=("store",))
    if not url.startswith(("postgresql://", "postgres://")):
        raise UsageError(f"the store is a postgresql:// URL, not {url!r}", params=("store",))
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError as exc:  # the postgres extra is not installed
        raise UsageError(f"a global transaction needs psycopg (pip install "
                         f"'agent-2pc[postgres]'): {exc}") from None
    try:
        conninfo_to_dict(url)
    except Exception as exc:  # psycopg.ProgrammingError: a malformed URL
        raise UsageError(f"the store URL is malformed: {exc}", params=("store",)) from None
    return url


def channel(schema: str, kind: str, name: str) -> str:
    """A NOTIFY channel (at most 63 bytes whatever the names): per schema and node/transaction."""
    return "a2pc_" + kind + "_" + hashlib.sha256(f"{schema}\0{name}".encode()).hexdigest()[:24]


def _redact(url: str) -> str:
    try:
        from psycopg.conninfo import conninfo_to_dict

        d = conninfo_to_dict(url)
        return f"{d.get('host') or 'localhost'}:{d.get('port') or 5432}/{d.get('dbname') or ''}"
    except Exception:
        return "the store"


class Store:
    """A connection to the store and the statements. Not thread-safe: one per thread."""

    def __init__(self, url: str | None = None, schema: str | None = None) -> None:
        self.url = store_url(url)
        self.schema = check_schema(schema or os.environ.get("AGENT2PC_STORE_SCHEMA")
                                   or DEFAULT_SCHEMA)
        self.where = _redact(self.url)
        self._conn: psycopg.Connection[Any] | None = None
        self._ready = False
        # Names this process's connections (tests cut them with pg_terminate_backend).
        self.app_name = f"agent-2pc global {self.schema} {os.getpid()}"[:63]

    # -- connections ----------------------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection (the schema made on the first)."""
        import psycopg

        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                   application_name=self.app_name)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"the store ({self.where}) cannot be reached: "
                                   f"{str(exc).strip()}") from None
        if not self._ready:
            self._ensure_schema(conn)
            self._ready = True
        return conn

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = self.connect()
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def call(self, fn: Callable[[psycopg.Connection[Any]], T], retry: bool = True) -> T:
        """``fn(conn)``; a lost connection is re-made and ``fn`` run again (within
        RETRY_BUDGET_S) when ``retry``: only for statements whose repetition is harmless."""
        import psycopg

        deadline = time.monotonic() + RETRY_BUDGET_S
        delay = 0.05
        while True:
            try:
                return fn(self.conn)
            except psycopg.OperationalError as exc:
                self.close()
                if not retry or time.monotonic() + delay > deadline:
                    raise StoreUnavailable(f"the store ({self.where}) was lost: "
                                           f"{str(exc).strip()}") from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except psycopg.Error as exc:
                raise StoreUnavailable(f"the store ({self.where}) refused a statement: "
                                       f"{str(exc).strip()}") from None

    def _ensure_schema(self, conn: psycopg.Connection[Any]) -> None:
        import psycopg

        s = self.q
        try:  # the common case: made already, one cheap look
            row = conn.execute(f"SELECT value FROM {s}.meta WHERE key = "
                               "'schema_version'").fetchone()
            if row is not None and int(row[0]) == SCHEMA_VERSION:
                return
        except psycopg.errors.UndefinedTable:
            pass
        except psycopg.Error as exc:
            raise StoreUnavailable(f"the store ({self.where}) refused a statement: "
                                   f"{str(exc).strip()}") from None
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK_KEY,))
                for stmt in ddl(self.schema):
                    conn.execute(stmt)
                row = conn.execute(f"SELECT value FROM {s}.meta WHERE key = "
                                   "'schema_version'").fetchone()
        except psycopg.Error as exc:
            raise StoreUnavailable(f"the store ({self.where}) refused its schema "
                                   f"{self.schema!r}: {str(exc).strip()}") from None
        if row is None or int(row[0]) != SCHEMA_VERSION:
            raise StoreUnavailable(f"the store's schema {self.schema!r} is version "
                                   f"{row and row[0]}; this agent-2pc speaks version "
                                   f"{SCHEMA_VERSION}")

    @property
    def q(self) -> str:
        return f'"{self.schema}"'

    def _one(self, sql: str, params: tuple[Any, ...] = (), retry: bool = True
             ) -> dict[str, Any] | None:
        from psycopg.rows import dict_row

        def run(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(sql.replace("{s}", self.q), params)
                return cur.fetchone() if cur.description else None

        return self.call(run, retry)

    def _all(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        from psycopg.rows import dict_row

        def run(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(sql.replace("{s}", self.q), params)
                return cur.fetchall()

        return self.call(run)

    # -- global transactions ----------------------------------------------------------------

    def gtx_create(self, gtid: str, label: str | None, timeout_ms: int) -> None:
        self._one("INSERT INTO {s}.gtx (gtid, label, state, expires_at) VALUES "
                  "(%s, %s, 'active', CASE WHEN %s > 0 THEN now() + make_interval(secs => "
                  "%s / 1000.0) END) ON CONFLICT (gtid) DO NOTHING",
                  (gtid, label, timeout_ms, timeout_ms))

    def gtx_get(self, gtid: str) -> dict[str, Any] | None:
        return self._one("SELECT *, lease_until < now() AS lease_expired, "
                         "expires_at < now() AS expired FROM {s}.gtx WHERE gtid = %s", (gtid,))

    def gtx_list(self, limit: int = 1000) -> list[dict[str, Any]]:
        return self._all("SELECT * FROM {s}.gtx ORDER BY created_at DESC LIMIT %s", (limit,))

    def start_prepare(self, gtid: str, coordinator: str, lease_ms: int) -> bool:
        """active -> preparing, with the lease; False when it is not active (or expired)."""
        return self._one(
            "UPDATE {s}.gtx SET state = 'preparing', coordinator = %s, lease_until = now() + "
            "make_interval(secs => %s / 1000.0) WHERE gtid = %s AND state = 'active' AND "
            "(expires_at IS NULL OR expires_at > now()) RETURNING gtid",
            (coordinator, lease_ms, gtid)) is not None

    def renew(self, gtid: str, coordinator: str, lease_ms: int) -> bool:
        """Extend a lease that still holds; False once it has expired (it is never revived)."""
        return self._one(
            "UPDATE {s}.gtx SET lease_until = now() + make_interval(secs => %s / 1000.0) "
            "WHERE gtid = %s AND state = 'preparing' AND coordinator = %s AND "
            "lease_until > now() RETURNING gtid", (lease_ms, gtid, coordinator)) is not None

    def decide_commit(self, gtid: str, coordinator: str) -> str:
        """THE COMMIT POINT: preparing -> committed while our lease holds. Returns the state
        the transaction is in afterwards (read back when the connection was cut mid-way)."""
        row = self._one(
            "UPDATE {s}.gtx SET state = 'committed', decided_at = now() WHERE gtid = %s AND "
            "state = 'preparing' AND coordinator = %s AND lease_until > now() RETURNING state",
            (gtid, coordinator))
        if row is not None:
            return "committed"
        got = self.gtx_get(gtid)
        return got["state"] if got else "aborted"

    def decide_abort(self, gtid: str, code: str, reason: str, coordinator: str | None = None
                     ) -> str:
        """-> aborted: an active transaction, a preparing one whose lease expired, or ours.
        Returns the state afterwards (committed when the commit won)."""
        self._one(
            "UPDATE {s}.gtx SET state = 'aborted', code = %s, reason = %s, decided_at = now() "
            "WHERE gtid = %s AND (state = 'active' OR (state = 'preparing' AND "
            "(coordinator = %s OR lease_until < now())))",
            (code, reason, gtid, coordinator or ""))
        got = self.gtx_get(gtid)
        return got["state"] if got else "aborted"

    # -- participants ---------------------------------------------------------------------

    def parts(self, gtid: str) -> list[dict[str, Any]]:
        return self._all("SELECT * FROM {s}.gpart WHERE gtid = %s ORDER BY workspace", (gtid,))

    def part(self, gtid: str, workspace: str) -> dict[str, Any] | None:
        return self._one("SELECT * FROM {s}.gpart WHERE gtid = %s AND workspace = %s",
                         (gtid, workspace))

    def join(self, gtid: str, workspace: str, local_tid: str) -> None:
        self._one("INSERT INTO {s}.gpart (gtid, workspace, local_tid) VALUES (%s, %s, %s) "
                  "ON CONFLICT DO NOTHING", (gtid, workspace, local_tid))

    def record_vote(self, gtid: str, workspace: str, vote: str, reason: str | None) -> None:
        self._one("UPDATE {s}.gpart SET vote = %s, reason = %s, voted_at = now() WHERE "
                  "gtid = %s AND workspace = %s", (vote, reason, gtid, workspace))

    def record_done(self, gtid: str, workspace: str, outcome: str) -> None:
        self._one("UPDATE {s}.gpart SET outcome = %s, done_at = now() WHERE gtid = %s AND "
                  "workspace = %s AND done_at IS NULL", (outcome, gtid, workspace))

    def undecided_here(self, workspace: str) -> list[dict[str, Any]]:
        """This workspace's parts not yet finished whose global transaction is decided, or
        whose coordinator's lease expired before a decision (the abort is then due)."""
        return self._all(
            "SELECT p.gtid, p.local_tid, g.state, g.lease_until < now() AS lease_expired, "
            "g.expires_at < now() AS expired FROM {s}.gpart p JOIN {s}.gtx g USING (gtid) "
            "WHERE p.workspace = %s AND p.done_at IS NULL AND (g.state IN ('committed', "
            "'aborted') OR (g.state = 'preparing' AND g.lease_until < now()) OR "
            "(g.state = 'active' AND g.expires_at < now()))", (workspace,))

    # -- nodes ----------------------------------------------------------------------------

    def node_register(self, name: str, host: str, root: str, pid: int, poll_ms: int) -> None:
        self._one(
            "INSERT INTO {s}.node (name, host, root, pid, poll_ms) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (name) DO UPDATE SET host = excluded.host, root = excluded.root, "
            "pid = excluded.pid, poll_ms = excluded.poll_ms, started_at = now(), "
            "heartbeat_at = now(), stopped_at = NULL", (name, host, root, pid, poll_ms))
        # What a previous process of this node took and never answered will not be answered.
        self._one("UPDATE {s}.request SET done_at = now(), error = %s WHERE node = %s AND "
                  "taken_at IS NOT NULL AND done_at IS NULL",
                  (json.dumps({"code": "node_unavailable", "exit_status": 2,
                               "message": f"node {name} restarted while it ran the request"}),
                   name))

    def heartbeat(self, name: str, pid: int) -> None:
        self._one("UPDATE {s}.node SET heartbeat_at = now() WHERE name = %s AND pid = %s",
                  (name, pid))

    def node_stopped(self, name: str, pid: int) -> None:
        self._one("UPDATE {s}.node SET stopped_at = now() WHERE name = %s AND pid = %s",
                  (name, pid))

    def node(self, name: str) -> dict[str, Any] | None:
        """The node's row and ``alive``: heartbeat within 3 poll intervals (at least 2 s)."""
        return self._one(
            "SELECT *, stopped_at IS NULL AND heartbeat_at > now() - make_interval(secs => "
            "greatest(poll_ms * 3, 2000) / 1000.0) AS alive FROM {s}.node WHERE name = %s",
            (name,))

    def nodes(self) -> list[dict[str, Any]]:
        return self._all(
            "SELECT name, host, root, pid, started_at, heartbeat_at, stopped_at IS NULL AND "
            "heartbeat_at > now() - make_interval(secs => greatest(poll_ms * 3, 2000) / "
            "1000.0) AS alive FROM {s}.node ORDER BY name")

    # -- requests -------------------------------------------------------------------------

    def send(self, gtid: str | None, node: str, kind: str, params: dict[str, Any]) -> int:
        """Insert a request for ``node`` and wake it (NOTIFY is delivered at commit)."""
        # ``rid`` makes the insert idempotent: a retry after a lost connection finds the row
        # the first try may have written instead of asking twice.
        rid = os.urandom(12).hex()
        row = self._one(
            "WITH r AS (INSERT INTO {s}.request (rid, gtid, node, kind, params) VALUES "
            "(%s, %s, %s, %s, %s) ON CONFLICT (rid) DO UPDATE SET rid = excluded.rid "
            "RETURNING id) SELECT id, pg_notify(%s, id::text) FROM r",
            (rid, gtid, node, kind, json.dumps(params), channel(self.schema, "n", node)))
        assert row is not None
        return int(row["id"])

    def take(self, node: str, pid: int, ran: list[int]) -> dict[str, Any] | None:
        """The node's oldest request nobody took, now taken by us -- or one we took but never
        ran (the answer to our UPDATE was lost with the connection): ``ran`` are the ids we
        ran, whose answers may still be on their way."""
        return self._one(
            "UPDATE {s}.request SET taken_at = now(), taken_by = %s WHERE id = (SELECT id FROM "
            "{s}.request WHERE node = %s AND (taken_at IS NULL OR (taken_by = %s AND "
            "done_at IS NULL AND NOT id = ANY(%s))) ORDER BY id LIMIT 1 FOR UPDATE "
            "SKIP LOCKED) RETURNING id, gtid, kind, params", (pid, node, pid, ran))

    def answer(self, req_id: int, gtid: str | None, answer: dict[str, Any] | None,
               error: dict[str, Any] | None) -> None:
        """Record the answer (once) and wake whoever waits on the transaction's channel."""
        self._one(
            "WITH r AS (UPDATE {s}.request SET answer = %s, error = %s, done_at = now() WHERE "
            "id = %s AND done_at IS NULL RETURNING id) SELECT pg_notify(%s, id::text) FROM r",
            (None if answer is None else json.dumps(answer),
             None if error is None else json.dumps(error), req_id,
             channel(self.schema, "a", gtid or "")))

    def prune(self, node: str, keep_s: int) -> None:
        """Forget this node's answered requests older than ``keep_s`` (at most 10 000 a
        call): messages, not history (``gtx`` and ``gpart`` keep what was decided)."""
        self._one("DELETE FROM {s}.request WHERE id IN (SELECT id FROM {s}.request WHERE "
                  "node = %s AND done_at < now() - make_interval(secs => %s) LIMIT 10000)",
                  (node, keep_s))

    def results(self, ids: list[int]) -> list[dict[str, Any]]:
        return self._all("SELECT id, node, answer, error FROM {s}.request WHERE id = ANY(%s) "
                         "AND done_at IS NOT NULL", (ids,))

    def forget(self, ids: list[int], why: str) -> None:
        """Requests that will not be waited for: answered with an error, so a node that takes
        one late sees it done (it is taken only while ``taken_at IS NULL``)."""
        self._one("UPDATE {s}.request SET taken_at = coalesce(taken_at, now()), done_at = now(),"
                  " error = %s WHERE id = ANY(%s) AND taken_at IS NULL",
                  (json.dumps({"code": "timeout", "exit_status": 1, "message": why}), ids))


def error_json(err: Agent2PCError) -> dict[str, Any]:
    out = err.to_json()
    out["exit_status"] = err.exit_status
    out["class"] = type(err).__name__
    return out
