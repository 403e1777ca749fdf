"""The SQLite store: every process of one host (the default, in ``.agent-tx/fence.db``).

Each thread has its own connection. The database runs in WAL mode with ``synchronous=FULL``
(NORMAL can lose a committed decision at a power cut). A decision is one ``BEGIN IMMEDIATE``
transaction: SQLite's write lock is the intent lock and the domain lock at once, so the ledger's
checks and claims are atomic across any number of domains. Snapshots are plain reads, which in WAL
mode neither wait for nor block the writer; that is why a storm of replays scales across
processes. Lock waits are bounded by ``busy_timeout``. The clock is the host's (time.time()).

``decide(..., durable=False)`` commits with ``synchronous=NORMAL`` for that one transaction: its
WAL frames are written (every reader sees the decision, a killed process keeps it) but not
fsynced. The WAL is a single append-only file, so durability stays in commit order: the next
``synchronous=FULL`` commit of any connection, a checkpoint, or ``sync()`` (an fsync of the
``-wal`` file) makes it durable with everything before it. A power cut before then loses this
decision and only what was committed after it, never an earlier one.

Schema (version 1, ``PRAGMA user_version``)::

    fence_entries(intent PK, fingerprint, state, generation, token, lease_id, lease_expires_at,
                  request JSON, cert JSON, reason, created_at, updated_at, expires_at)
    fence_domains(name PK, seq, clock JSON, claims JSON or NULL, updated_at)
    fence_counters(name PK, n)
    fence_meta(key PK, value)          -- 'token': the last fencing token drawn
"""

from __future__ import annotations

import _thread
import json
import os
import sqlite3
import time

from ..errors import Busy, UsageError, WorkspaceError
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
    from typing import Any, NoReturn

    from ._ledger import Txn

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fence_entries (
    intent TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('running', 'done', 'failed', 'fenced')),
    generation INTEGER NOT NULL,
    token INTEGER NOT NULL,
    lease_id TEXT NOT NULL,
    lease_expires_at REAL,
    request TEXT NOT NULL,
    cert TEXT,
    reason TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS fence_entries_expiry ON fence_entries (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS fence_entries_open ON fence_entries (state)
    WHERE state IN ('running', 'fenced');
CREATE TABLE IF NOT EXISTS fence_domains (
    name TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    clock TEXT,
    claims TEXT,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS fence_domains_idle ON fence_domains (updated_at)
    WHERE claims IS NULL;
CREATE TABLE IF NOT EXISTS fence_counters (name TEXT PRIMARY KEY, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS fence_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO fence_meta (key, value) VALUES ('token', 0);
"""

_COLS = ", ".join(ENTRY_COLUMNS)
_SELECT_ENTRY = f"SELECT {_COLS} FROM fence_entries WHERE intent = ?"
_PUT_ENTRY = (f"INSERT OR REPLACE INTO fence_entries ({_COLS}) "
              f"VALUES ({', '.join('?' * len(ENTRY_COLUMNS))})")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class _SqliteTxn(BaseTxn):
    def __init__(self, conn: sqlite3.Connection, now: float, entry: Entry | None) -> None:
        super().__init__(now, entry)
        self._conn = conn

    def _lock_domains(self, names: list[str]) -> dict[str, Domain]:
        # BEGIN IMMEDIATE already holds the database's write lock: reading is locking.
        out = {n: Domain(n, updated_at=self.now) for n in names}
        if names:
            marks = ", ".join("?" * len(names))
            rows = self._conn.execute(
                f"SELECT name, seq, clock, claims, updated_at FROM fence_domains "
                f"WHERE name IN ({marks})", names).fetchall()
            for row in rows:
                out[row[0]] = domain_from_row(row, json.loads)
        return out

    def peek(self, intent: str) -> Entry | None:
        row = self._conn.execute(_SELECT_ENTRY, (intent,)).fetchone()
        return entry_from_row(row, json.loads) if row else None

    def token(self) -> int:
        row = self._conn.execute("UPDATE fence_meta SET value = value + 1 WHERE key = 'token' "
                                 "RETURNING value").fetchone()
        return int(row[0])


class SqliteStore(Store):
    clock = "host"

    def __init__(self, url: str, path: str, busy_timeout_s: float = BUSY_TIMEOUT_S, *,
                 read_only: bool = False) -> None:
        self.url = url
        self.path = path
        # read_only (the monitor): queries only, nothing written, no file created while the
        # database is quiescent (no -wal: the last connection checkpointed it).
        self.read_only = read_only
        self.busy_timeout_s = busy_timeout_s
        self._local = _thread._local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = _thread.allocate_lock()
        self._closed = False
        self._deferred = 0      # durable=False commits made (under _all_lock) ...
        self._synced = 0        # ... and how many of them are known to be synced
        self._dir_synced = False
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise UsageError(f"no directory {parent} for the fence store {url}")
        self._ensure_schema(self._conn())

    # -- connections ----------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self._closed:
            raise UsageError("the fence store is closed")
        try:
            if self.read_only:
                from urllib.parse import quote

                mode = "ro" if os.path.exists(self.path + "-wal") else "ro&immutable=1"
                conn = sqlite3.connect(f"file:{quote(self.path)}?mode={mode}", uri=True,
                                       timeout=self.busy_timeout_s, isolation_level=None,
                                       check_same_thread=False)
            else:
                conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s,
                                       isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as exc:
            raise WorkspaceError(f"cannot open the fence store {self.path}: {exc}",
                                 code="store_unavailable") from exc
        self._local.conn = conn
        with self._all_lock:
            self._all.append(conn)
        return conn

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        """Make the schema once, whoever comes first. Processes that open a new store at once
        race for it, and SQLite answers some of them "locked" without waiting (switching the
        journal to WAL takes the database exclusively, and a lock upgrade that could deadlock
        is refused at once, not waited for): those try again until the busy timeout."""
        deadline = time.monotonic() + self.busy_timeout_s
        pause_s = 0.005
        while True:
            try:
                self._ensure_schema_once(conn)
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() + pause_s > deadline:
                    self._refuse(exc)
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 0.1)
            except sqlite3.Error as exc:
                self._refuse(exc)

    def _refuse(self, exc: sqlite3.Error) -> NoReturn:
        self.close()
        if isinstance(exc, sqlite3.OperationalError) and _busy(exc):
            raise Busy(f"the fence store {self.path} stayed locked for "
                       f"{self.busy_timeout_s:g} s") from exc
        raise WorkspaceError(f"cannot use the fence store {self.path}: {exc}",
                             code="store_unavailable") from exc

    def _ensure_schema_once(self, conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return
        if self.read_only:
            raise WorkspaceError(f"the fence store {self.path} has no schema this "
                                 "agent-2pc knows", code="store_unavailable")
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise WorkspaceError(f"the fence store {self.path} has schema version "
                                     f"{version}; this agent-2pc knows {SCHEMA_VERSION}",
                                     code="store_unavailable")
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # -- the contract ---------------------------------------------------------------------------

    def now(self) -> float:
        return time.time()

    def snapshot(self, intent: str) -> tuple[float, Entry | None]:
        now = time.time()
        row = self._conn().execute(_SELECT_ENTRY, (intent,)).fetchone()
        return now, (entry_from_row(row, json.loads) if row else None)

    def decide(self, intent: str, fn: Callable[[Txn], Decision],
               counters: CounterBuffer, durable: bool = True) -> Decision:
        conn = self._conn()
        if durable:
            # Every deferred commit finished before this BEGIN is in the WAL ahead of this
            # transaction: this commit's fsync covers it.
            mark = self._deferred
            dec = self._decide(conn, intent, fn, counters)
            if dec.writes and mark > self._synced:
                with self._all_lock:
                    self._synced = max(self._synced, mark)
            return dec
        conn.execute("PRAGMA synchronous = NORMAL")
        try:
            dec = self._decide(conn, intent, fn, counters)
        finally:
            conn.execute("PRAGMA synchronous = FULL")
        if dec.writes:
            with self._all_lock:
                self._deferred += 1
        return dec

    @property
    def needs_sync(self) -> bool:
        return self._deferred > self._synced

    def sync(self) -> None:
        """fsync the WAL: every decision committed so far (deferred ones too) is durable."""
        mark = self._deferred
        if mark <= self._synced:
            return
        try:
            fd = os.open(self.path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1  # the last connection closed: its checkpoint synced the database
        if fd >= 0:
            from ..storage.durable import fsync_dir, fsync_fd

            try:
                fsync_fd(fd)  # an fsync failure raises FsyncFailed: fatal, as everywhere
            finally:
                os.close(fd)
            if not self._dir_synced:  # SQLite's own first sync of a new WAL does this too
                fsync_dir(os.path.dirname(os.path.abspath(self.path)))
                self._dir_synced = True
        with self._all_lock:
            self._synced = max(self._synced, mark)

    def _decide(self, conn: sqlite3.Connection, intent: str, fn: Callable[[Txn], Decision],
                counters: CounterBuffer) -> Decision:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                raise Busy(f"the fence store stayed locked for {self.busy_timeout_s:g} s",
                           intent=intent) from exc
            raise
        taken: dict[str, int] = {}
        try:
            now = time.time()
            row = conn.execute(_SELECT_ENTRY, (intent,)).fetchone()
            entry = entry_from_row(row, json.loads) if row else None
            dec = fn(_SqliteTxn(conn, now, entry))
            if not dec.writes:
                conn.execute("ROLLBACK")  # nothing to write (a token drawn is simply skipped)
                return dec
            if dec.entry is not None:
                assert dec.entry.intent == intent
                conn.execute(_PUT_ENTRY, entry_to_row(dec.entry, _dumps))
            for d in dec.domains:
                claims = domain_claims(d)
                conn.execute("INSERT OR REPLACE INTO fence_domains "
                             "(name, seq, clock, claims, updated_at) VALUES (?, ?, ?, ?, ?)",
                             (d.name, d.seq, _dumps(d.clock) if d.clock else None,
                              _dumps(claims) if claims else None, d.updated_at))
            taken = counters.take()
            taken_all = dict(taken)
            for name, n in dec.counters.items():
                taken_all[name] = taken_all.get(name, 0) + n
            self._add(conn, taken_all)
            conn.execute("COMMIT")
            return dec
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            counters.add_all(taken)
            raise

    def get(self, intent: str) -> Entry | None:
        return self.snapshot(intent)[1]

    @staticmethod
    def _add(conn: sqlite3.Connection, delta: dict[str, int]) -> None:
        for name, n in delta.items():
            if n:
                conn.execute("INSERT INTO fence_counters (name, n) VALUES (?, ?) "
                             "ON CONFLICT (name) DO UPDATE SET n = n + excluded.n", (name, n))

    def add_counters(self, delta: dict[str, int]) -> None:
        if not any(delta.values()):
            return
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._add(conn, delta)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def counters(self) -> dict[str, int]:
        rows = self._conn().execute("SELECT name, n FROM fence_counters").fetchall()
        return {name: int(n) for name, n in rows}

    def summary(self, limit: int) -> dict[str, Any]:
        conn = self._conn()
        conn.execute("BEGIN")  # one read snapshot for the whole summary
        try:
            states = {s: 0 for s in STATES}
            for state, n in conn.execute(
                    "SELECT state, count(*) FROM fence_entries GROUP BY state"):
                states[state] = int(n)
            domains = conn.execute("SELECT count(*) FROM fence_domains").fetchone()[0]
            lists = {}
            for state in ("fenced", "running"):
                lists[state] = [r[0] for r in conn.execute(
                    "SELECT intent FROM fence_entries WHERE state = ? ORDER BY intent LIMIT ?",
                    (state, limit))]
        finally:
            conn.execute("COMMIT")
        return {"states": states, "domains": int(domains), **lists}

    def entries(self, offset: int, limit: int) -> tuple[int, list[Entry]]:
        """(how many entries, a page of them, most recently changed first): for the monitor."""
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            total = int(conn.execute("SELECT count(*) FROM fence_entries").fetchone()[0])
            rows = conn.execute(f"SELECT {_COLS} FROM fence_entries ORDER BY updated_at DESC, "
                                "intent LIMIT ? OFFSET ?", (limit, offset)).fetchall()
        finally:
            conn.execute("COMMIT")
        return total, [entry_from_row(r, json.loads) for r in rows]

    def sweep(self, idle_s: float, limit: int) -> int:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            now = time.time()
            n = conn.execute(
                "DELETE FROM fence_entries WHERE rowid IN (SELECT rowid FROM fence_entries "
                "WHERE expires_at <= ? AND state IN ('done', 'failed') LIMIT ?)",
                (now, limit)).rowcount
            n += conn.execute(
                "DELETE FROM fence_domains WHERE rowid IN (SELECT rowid FROM fence_domains "
                "WHERE claims IS NULL AND updated_at <= ? LIMIT ?)",
                (now - idle_s, limit)).rowcount
            conn.execute("COMMIT")
            return n
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        if not self._closed and self.needs_sync:
            self.sync()  # another process may keep the WAL open (and unsynced) after us
        self._closed = True
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = _thread._local()
