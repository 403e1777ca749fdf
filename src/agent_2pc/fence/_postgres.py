"""The Postgres store: many hosts share one ledger (psycopg 3).

The database's clock is the only clock: every ``now`` is ``clock_timestamp()`` read in the same
statement or transaction as the rows it judges; the client's clock is never consulted.

A decision is one transaction. ``pg_advisory_xact_lock(A2PC, hashtext(intent))`` is the intent
lock (it also covers an intent that has no row yet); domains are locked by one
``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` over the sorted names, which creates the missing
ones and locks all of them in a fixed order. The writes go in one pipelined batch; a decision that
writes nothing is rolled back. Snapshots are one autocommit ``SELECT`` that returns the row and
the database time together: the common answers (replay, in flight, fenced, conflict) cost one
round trip. Counters are sharded rows so that decisions on different intents do not queue on one
counter row. Retention deletes only rows whose intent lock it can take without waiting.

Schema (``fence_`` tables in the search_path's first schema, or in ``?fence_schema=NAME``)::

    fence_entries(intent PK, fingerprint, state, generation, token, lease_id, lease_expires_at,
                  request JSON text, cert JSON text, reason, created_at, updated_at, expires_at)
    fence_domains(name PK, seq, clock JSON text, claims JSON text or NULL, updated_at)
    fence_counters(name, shard, n; PK (name, shard))
    fence_meta(key PK, value)          -- 'schema': 1
    fence_token_seq                    -- fencing tokens
"""

from __future__ import annotations

import _thread
import json
import random
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerr

from ..errors import Busy, UnknownOutcome, UsageError, WorkspaceError
from ._ledger import STATES, Decision, Domain, Entry
from ._store import (
    ENTRY_COLUMNS,
    BaseTxn,
    CounterBuffer,
    Store,
    domain_claims,
    domain_from_row,
    entry_from_row,
    entry_to_row,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

if TYPE_CHECKING:
    from ._ledger import Txn

SCHEMA_VERSION = 1
LOCK_CLASS = 0x41325043  # "A2PC": the first key of our two-key advisory locks
CONNECT_TIMEOUT_S = 10
LOCK_TIMEOUT_MS = 10_000
STATEMENT_TIMEOUT_MS = 60_000
IDLE_IN_TX_TIMEOUT_MS = 60_000
COUNTER_SHARDS = 8
RETRIES_MAX = 3  # deadlock / serialization failures retried before giving up with Busy

_IDENT = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_NOW = "extract(epoch FROM clock_timestamp())::float8"
_COLS = ", ".join(ENTRY_COLUMNS)
_ECOLS = ", ".join(f"e.{c}" for c in ENTRY_COLUMNS)
_SNAPSHOT = (f"SELECT {_NOW}, {_ECOLS} FROM (SELECT 1) AS one "
             "LEFT JOIN fence_entries AS e ON e.intent = %s")
_SELECT_ENTRY = f"SELECT {_COLS} FROM fence_entries WHERE intent = %s"
_MARKS = ", ".join(["%s"] * len(ENTRY_COLUMNS))
_PUT_ENTRY = (f"INSERT INTO fence_entries ({_COLS}) VALUES ({_MARKS}) "
              "ON CONFLICT (intent) DO UPDATE SET "
              + ", ".join(f"{c} = excluded.{c}" for c in ENTRY_COLUMNS[1:]))
_LOCK_DOMAINS = ("INSERT INTO fence_domains (name, seq, updated_at) "
                 f"SELECT n, 0, {_NOW} FROM unnest(%s::text[]) AS n ORDER BY n "
                 "ON CONFLICT (name) DO UPDATE SET name = excluded.name "
                 "RETURNING name, seq, clock, claims, updated_at")
_PUT_DOMAIN = ("INSERT INTO fence_domains (name, seq, clock, claims, updated_at) "
               "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
               "seq = excluded.seq, clock = excluded.clock, claims = excluded.claims, "
               "updated_at = excluded.updated_at")
_ADD_COUNTER = ("INSERT INTO fence_counters (name, shard, n) VALUES (%s, %s, %s) "
                "ON CONFLICT (name, shard) DO UPDATE SET n = fence_counters.n + excluded.n")

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS fence_entries (
        intent text PRIMARY KEY,
        fingerprint text NOT NULL,
        state text NOT NULL CHECK (state IN ('running', 'done', 'failed', 'fenced')),
        generation bigint NOT NULL,
        token bigint NOT NULL,
        lease_id text NOT NULL,
        lease_expires_at double precision,
        request text NOT NULL,
        cert text,
        reason text NOT NULL DEFAULT '',
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        expires_at double precision)""",
    """CREATE INDEX IF NOT EXISTS fence_entries_expiry ON fence_entries (expires_at)
        WHERE expires_at IS NOT NULL""",
    """CREATE INDEX IF NOT EXISTS fence_entries_open ON fence_entries (state)
        WHERE state IN ('running', 'fenced')""",
    """CREATE TABLE IF NOT EXISTS fence_domains (
        name text PRIMARY KEY,
        seq bigint NOT NULL,
        clock text,
        claims text,
        updated_at double precision NOT NULL)""",
    """CREATE INDEX IF NOT EXISTS fence_domains_idle ON fence_domains (updated_at)
        WHERE claims IS NULL""",
    """CREATE TABLE IF NOT EXISTS fence_counters (
        name text NOT NULL, shard integer NOT NULL, n bigint NOT NULL,
        PRIMARY KEY (name, shard))""",
    "CREATE SEQUENCE IF NOT EXISTS fence_token_seq",
    "CREATE TABLE IF NOT EXISTS fence_meta (key text PRIMARY KEY, value bigint NOT NULL)",
    f"INSERT INTO fence_meta (key, value) VALUES ('schema', {SCHEMA_VERSION}) "
    "ON CONFLICT (key) DO NOTHING",
]


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def split_url(url: str) -> tuple[str, str | None]:
    """The libpq URL without our ``fence_schema`` parameter, and that schema (or None)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = None
    kept = []
    for k, v in query:
        if k == "fence_schema":
            schema = v
        else:
            kept.append((k, v))
    if schema is not None and not _IDENT.fullmatch(schema):
        raise UsageError(f"fence_schema must match {_IDENT.pattern}: {schema!r}")
    return urlunsplit(parts._replace(query=urlencode(kept))), schema


class _PgTxn(BaseTxn):
    def __init__(self, conn: psycopg.Connection[Any], now: float, entry: Entry | None) -> None:
        super().__init__(now, entry)
        self._conn = conn

    def _lock_domains(self, names: list[str]) -> dict[str, Domain]:
        if not names:
            return {}
        rows = self._conn.execute(_LOCK_DOMAINS, (names,)).fetchall()
        out = {row[0]: domain_from_row(row, json.loads) for row in rows}
        assert set(out) == set(names), (names, list(out))
        return out

    def peek(self, intent: str) -> Entry | None:
        row = self._conn.execute(_SELECT_ENTRY, (intent,)).fetchone()
        return entry_from_row(row, json.loads) if row else None

    def token(self) -> int:
        row = self._conn.execute("SELECT nextval('fence_token_seq')").fetchone()
        assert row is not None
        return int(row[0])


class PostgresStore(Store):
    clock = "database"

    def __init__(self, url: str, schema: str | None = None) -> None:
        self.url = url
        conninfo, url_schema = split_url(url)
        self.schema = schema or url_schema
        if self.schema is not None and not _IDENT.fullmatch(self.schema):
            raise UsageError(f"schema must match {_IDENT.pattern}: {self.schema!r}")
        params: dict[str, Any] = dict(psycopg.conninfo.conninfo_to_dict(conninfo))
        options = [str(params.get("options") or ""),
                   f"-c lock_timeout={LOCK_TIMEOUT_MS}",
                   f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                   f"-c idle_in_transaction_session_timeout={IDLE_IN_TX_TIMEOUT_MS}"]
        if self.schema:
            options.append(f"-c search_path={self.schema}")
        params["options"] = " ".join(o for o in options if o)
        params.setdefault("connect_timeout", str(CONNECT_TIMEOUT_S))
        self._params = params
        self._local = _thread._local()
        self._all: list[psycopg.Connection[Any]] = []
        self._all_lock = _thread.allocate_lock()
        self._closed = False
        self._ensure_schema(self._conn())

    # -- connections ----------------------------------------------------------------------------

    def _conn(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise UsageError("the fence store is closed")
        try:
            conn = psycopg.connect(autocommit=True, **self._params)
        except psycopg.Error as exc:
            raise WorkspaceError(f"cannot connect to the fence store: {exc}".strip(),
                                 code="store_unavailable") from exc
        self._local.conn = conn
        with self._all_lock:
            self._all.append(conn)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def _ensure_schema(self, conn: psycopg.Connection[Any]) -> None:
        try:
            self._create_schema(conn)
        except psycopg.Error as exc:
            self.close()
            raise WorkspaceError(f"cannot set up the fence store: {exc}".strip(),
                                 code="store_unavailable") from exc

    def _create_schema(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute("SELECT to_regclass('fence_meta') IS NOT NULL "
                           "AND to_regclass('fence_token_seq') IS NOT NULL").fetchone()
        if row and row[0]:
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_CLASS,))
            if self.schema:
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            for stmt in _SCHEMA:
                conn.execute(stmt)

    def _map(self, exc: psycopg.Error, intent: str | None, committing: bool) -> Exception:
        if isinstance(exc, (pgerr.LockNotAvailable, pgerr.QueryCanceled)):
            return Busy(f"the fence store did not answer in time: {exc}".strip(), intent=intent)
        if isinstance(exc, psycopg.OperationalError):
            self._drop()
            if committing:
                return UnknownOutcome("the connection to the fence store failed while a decision "
                                      "was being committed; it may or may not be recorded",
                                      intent=intent)
            return WorkspaceError(f"the fence store failed: {exc}".strip(),
                                  code="store_unavailable")
        return exc

    # -- the contract ---------------------------------------------------------------------------

    def now(self) -> float:
        try:
            row = self._conn().execute(f"SELECT {_NOW}").fetchone()
        except psycopg.Error as exc:
            raise self._map(exc, None, False) from exc
        assert row is not None
        return float(row[0])

    def snapshot(self, intent: str) -> tuple[float, Entry | None]:
        try:
            row = self._conn().execute(_SNAPSHOT, (intent,)).fetchone()
        except psycopg.Error as exc:
            raise self._map(exc, intent, False) from exc
        assert row is not None
        now = float(row[0])
        return now, (entry_from_row(row[1:], json.loads) if row[1] is not None else None)

    def decide(self, intent: str, fn: Callable[[Txn], Decision],
               counters: CounterBuffer, durable: bool = True) -> Decision:
        # Every decision is a durable commit here: ``durable=False`` is not taken up (a
        # ``synchronous_commit = off`` commit would be the equivalent; the network round trips
        # dominate a Postgres decision anyway).
        for attempt in range(RETRIES_MAX):
            try:
                return self._decide_once(intent, fn, counters)
            except (pgerr.DeadlockDetected, pgerr.SerializationFailure) as exc:
                if attempt == RETRIES_MAX - 1:
                    raise Busy(f"the fence store kept failing the decision: {exc}".strip(),
                               intent=intent) from exc
        raise AssertionError("unreachable")

    def _decide_once(self, intent: str, fn: Callable[[Txn], Decision],
                     counters: CounterBuffer) -> Decision:
        conn = self._conn()
        committing = False
        taken: dict[str, int] = {}
        dec: Decision | None = None
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                             (LOCK_CLASS, intent))
                row = conn.execute(_SNAPSHOT, (intent,)).fetchone()
                assert row is not None
                entry = entry_from_row(row[1:], json.loads) if row[1] is not None else None
                dec = fn(_PgTxn(conn, float(row[0]), entry))
                if not dec.writes:
                    raise psycopg.Rollback()
                taken = counters.take()
                delta = dict(taken)
                for name, n in dec.counters.items():
                    delta[name] = delta.get(name, 0) + n
                shard = random.randrange(COUNTER_SHARDS)
                with conn.pipeline():
                    if dec.entry is not None:
                        assert dec.entry.intent == intent
                        conn.execute(_PUT_ENTRY, entry_to_row(dec.entry, _dumps))
                    for d in dec.domains:
                        claims = domain_claims(d)
                        conn.execute(_PUT_DOMAIN, (d.name, d.seq,
                                                   _dumps(d.clock) if d.clock else None,
                                                   _dumps(claims) if claims else None,
                                                   d.updated_at))
                    for name, n in delta.items():
                        if n:
                            conn.execute(_ADD_COUNTER, (name, shard, n))
                committing = True
        except psycopg.Error as exc:
            counters.add_all(taken)
            if isinstance(exc, (pgerr.DeadlockDetected, pgerr.SerializationFailure)):
                raise
            raise self._map(exc, intent, committing) from exc
        except BaseException:
            counters.add_all(taken)
            raise
        assert dec is not None
        return dec

    def get(self, intent: str) -> Entry | None:
        return self.snapshot(intent)[1]

    def add_counters(self, delta: dict[str, int]) -> None:
        if not any(delta.values()):
            return
        conn = self._conn()
        shard = random.randrange(COUNTER_SHARDS)
        try:
            with conn.transaction(), conn.pipeline():
                for name, n in delta.items():
                    if n:
                        conn.execute(_ADD_COUNTER, (name, shard, n))
        except psycopg.Error as exc:
            raise self._map(exc, None, True) from exc

    def counters(self) -> dict[str, int]:
        try:
            rows = self._conn().execute(
                "SELECT name, sum(n) FROM fence_counters GROUP BY name").fetchall()
        except psycopg.Error as exc:
            raise self._map(exc, None, False) from exc
        return {name: int(n) for name, n in rows}

    def summary(self, limit: int) -> dict[str, Any]:
        conn = self._conn()
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                states = {s: 0 for s in STATES}
                for state, n in conn.execute(
                        "SELECT state, count(*) FROM fence_entries GROUP BY state"):
                    states[state] = int(n)
                row = conn.execute("SELECT count(*) FROM fence_domains").fetchone()
                lists = {}
                for state in ("fenced", "running"):
                    lists[state] = [r[0] for r in conn.execute(
                        "SELECT intent FROM fence_entries WHERE state = %s "
                        "ORDER BY intent LIMIT %s", (state, limit))]
        except psycopg.Error as exc:
            raise self._map(exc, None, False) from exc
        assert row is not None
        return {"states": states, "domains": int(row[0]), **lists}

    def sweep(self, idle_s: float, limit: int) -> int:
        conn = self._conn()
        try:
            with conn.transaction():
                cur = conn.execute(
                    "WITH c AS MATERIALIZED (SELECT intent FROM fence_entries "
                    f"  WHERE state IN ('done', 'failed') AND expires_at <= {_NOW} LIMIT %s) "
                    "DELETE FROM fence_entries AS e USING c WHERE e.intent = c.intent "
                    f"AND e.state IN ('done', 'failed') AND e.expires_at <= {_NOW} "
                    "AND pg_try_advisory_xact_lock(%s, hashtext(e.intent))",
                    (limit, LOCK_CLASS))
                n = cur.rowcount
                cur = conn.execute(
                    "DELETE FROM fence_domains WHERE name IN (SELECT name FROM fence_domains "
                    f"WHERE claims IS NULL AND updated_at <= {_NOW} - %s "
                    "LIMIT %s FOR UPDATE SKIP LOCKED)", (idle_s, limit))
                n += cur.rowcount
        except psycopg.Error as exc:
            raise self._map(exc, None, False) from exc
        return n

    def close(self) -> None:
        self._closed = True
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except psycopg.Error:
                pass
        self._local = _thread._local()

    def drop_schema(self) -> None:
        """Drop this store's schema and everything in it (for tests and throwaway ledgers)."""
        if not self.schema:
            raise UsageError("drop_schema needs a store opened with a schema")
        self._conn().execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
