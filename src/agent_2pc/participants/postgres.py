"""The Postgres participant: SQL statements committed with the files, through Postgres's own
two-phase commit (PREPARE TRANSACTION / COMMIT PREPARED). docs/postgres.md is the user's page.

``stage-sql`` stages one effect of kind ``sql`` ({dsn, sql}). Its statements are grouped by DSN:
each database a transaction names gets one prepared transaction holding all its statements, in
staging order, with the global id (gid) of the group's first effect (``a2pc_<tid>_<n>_<hex>``,
the effect's key: logged at staging, unique across workspaces).

staging   (``check_effect``; the engine passes the statements staged before for the same DSN)
          connect; ``max_prepared_transactions`` must be above 0 (else isolation_unavailable
          naming the setting); run the earlier statements and the new ones in one database
          transaction, count the rows the new ones affect, ROLLBACK. An error is ``sql_failed``
          (exit 2) with the server's message and SQLSTATE; nothing is logged. No lock outlives
          the step.
prepare   per DSN, in order: log ``preparing`` (synced) -- recovery then knows a prepared
          transaction may exist -- then connect (``application_name`` = the gid), BEGIN, run
          the statements, ``PREPARE TRANSACTION 'gid'``; log ``prepared``. A statement that
          fails now (a unique violation another writer introduced since staging, a lock
          timeout) votes no: ``conflict`` for SQLSTATE classes 23 and 40 and lock timeouts,
          else ``effect_failed``; the reason carries the SQLSTATE.
apply     (after the files) ``COMMIT PREPARED 'gid'``; a gid no longer in pg_prepared_xacts is
          done (a redo). A server out of reach raises ApplyFailed: the transaction stays
          'committing' and ``recover`` retries it (and lists it while it cannot).
undo      for each group whose prepare began: end the backend of a crashed prepare still
          running (found by its application_name), then ``ROLLBACK PREPARED`` if the gid is in
          pg_prepared_xacts. Out of reach: ApplyFailed; the transaction stays 'aborting' and
          ``recover`` retries it.

The DSN is logged as given, so a password in it is refused: it goes in PGPASSWORD or
~/.pgpass, or the DSN is given as ``env:NAME`` (the variable NAME holds it; it is read at every
connection, so ``recover`` must run with it set too).
psycopg is imported here only, when a statement is staged or a group is prepared or resolved.
"""

from __future__ import annotations

import os
import re

from .. import crashpoints
from ..errors import Agent2PCError, IsolationUnavailable, SqlFailed, UsageError
from .base import YES, Applied, ApplyFailed, Vote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..core.states import Tx
    from .base import Context, EffectFields

KIND = "sql"
SQL_BYTES_MAX = 1 << 20
DSN_CHARS_MAX = 4096
CONNECT_TIMEOUT_S = int(os.environ.get("AGENT2PC_SQL_CONNECT_TIMEOUT_S", "10"))
# How long a statement waits for a lock (another writer, a prepared transaction) before it
# fails: staging and prepare hold no lock of the agent's session for longer than this.
LOCK_TIMEOUT_MS = int(os.environ.get("AGENT2PC_SQL_LOCK_TIMEOUT_MS", "10000"))
ROW_COMMANDS = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "COPY"})
# Outcomes of a group's prepare (result records, phase "effect", n = the group's first effect).
PREPARING, PREPARED, FAILED, UNKNOWN, ROLLED_BACK = (
    "preparing", "prepared", "failed", "unknown", "rolled_back")
MAY_BE_PREPARED = frozenset({PREPARING, PREPARED, UNKNOWN})
GID_RE = re.compile(r"a2pc_[A-Za-z0-9_]{1,150}")


class PostgresParticipant:
    """SQL statements in Postgres databases (participants/base.py: the protocol)."""

    name = "postgres"
    kinds = frozenset({KIND})

    # -- staging (base.py: EffectStager) -----------------------------------------------------

    def check_effect(self, kind: str, args: dict[str, Any]) -> Any:
        unknown = set(args) - {"dsn", "sql", "before"}
        if unknown:
            raise UsageError(f"a SQL step takes dsn and sql, not {', '.join(sorted(unknown))}")
        dsn = check_dsn(args.get("dsn"))
        sql = check_sql(args.get("sql"))
        before = [check_sql(s) for s in args.get("before") or ()]
        rows = validate(dsn, before, sql)
        return {"dsn": dsn, "sql": sql, "rows_affected": rows}

    def effect_fields(self, tid: str, n: int, checked: Any) -> EffectFields:
        gid = f"a2pc_{tid}_{n}_{os.urandom(4).hex()}".replace("-", "_")
        return {"request": checked, "key": gid, "compensate": None}

    def staged_answer(self, effect: dict[str, Any]) -> dict[str, Any]:
        return {"n": effect["n"], "rows_affected": effect["request"]["rows_affected"]}

    # -- the participant protocol (base.py) --------------------------------------------------

    def prepare(self, tx: Tx, ctx: Context) -> Vote:
        for group in groups(tx):
            last = tx.results.get(("effect", group["n"]))
            if last is not None and last["outcome"] == PREPARED:
                continue
            vote = self._prepare_group(group, ctx)
            if not vote.yes:
                return vote
        return YES

    def _prepare_group(self, group: dict[str, Any], ctx: Context) -> Vote:
        n, gid = group["n"], group["gid"]
        shown = shown_dsn(group["dsn"])
        ctx.record({"phase": "effect", "n": n, "outcome": PREPARING}, True)
        crashpoints.hit("sql.after_gid_logged")
        psycopg = _psycopg()
        sent = False  # PREPARE TRANSACTION sent: a failure after it leaves the outcome unknown
        try:
            with connect(group["dsn"], application_name=gid) as conn:
                with conn.cursor() as cur:
                    cur.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
                    for sql in group["sql"]:
                        cur.execute(sql)
                    sent = True
                    cur.execute(f"PREPARE TRANSACTION '{gid}'")  # a checked gid: groups()
        except psycopg.Error as exc:
            # Before PREPARE was sent, the server rolls the transaction back on any error or
            # a lost connection; after it, only pg_prepared_xacts can tell (undo asks it).
            outcome = UNKNOWN if sent else FAILED
            code = vote_code(exc)
            why = f"{shown}: {server_message(exc)}"
            ctx.record({"phase": "effect", "n": n, "outcome": outcome, "code": code,
                        "error": why}, False)
            return Vote.no(code, why)
        crashpoints.hit("sql.after_prepare")
        ctx.record({"phase": "effect", "n": n, "outcome": PREPARED}, False)
        return YES

    def decision_fields(self, tid: str) -> dict[str, Any]:
        return {}  # the gids are in the effect records; the decision is all a redo needs

    def apply(self, tx: Tx, ctx: Context, redo: bool) -> Applied:
        # The log takes no result record once decided: a redo asks pg_prepared_xacts.
        for group in groups(tx):
            try:
                self._finish(group, commit=True)
            except Agent2PCError as exc:
                raise ApplyFailed(exc, [op.path for op in tx.changes()]) from exc
            crashpoints.hit("sql.after_commit_prepared")
        return Applied()

    def undo(self, tx: Tx, ctx: Context) -> dict[str, Any]:
        for group in groups(tx):
            last = tx.results.get(("effect", group["n"]))
            if last is None or last["outcome"] not in MAY_BE_PREPARED:
                continue  # never prepared (or rolled back already)
            try:
                self._finish(group, commit=False)
            except Agent2PCError as exc:
                raise ApplyFailed(exc, []) from exc
            ctx.record({"phase": "effect", "n": group["n"], "outcome": ROLLED_BACK}, False)
        return {}

    def _finish(self, group: dict[str, Any], commit: bool) -> None:
        """COMMIT or ROLLBACK PREPARED the group's gid if it is still prepared; a crashed
        prepare's backend still running is ended first (it could still prepare)."""
        psycopg = _psycopg()
        gid = group["gid"]
        try:
            with connect(group["dsn"], autocommit=True) as conn:
                if not commit:
                    end_backends_of(conn, gid)
                if conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s",
                                (gid,)).fetchone():
                    conn.execute(f"{'COMMIT' if commit else 'ROLLBACK'} PREPARED '{gid}'")
        except psycopg.Error as exc:
            raise SqlFailed(f"{'COMMIT' if commit else 'ROLLBACK'} PREPARED '{gid}' on "
                            f"{shown_dsn(group['dsn'])}: {server_message(exc)}",
                            sqlstate=exc.sqlstate, gid=gid) from None

    def forget(self, tid: str) -> None:
        pass  # prepare keeps nothing in memory: the log has every outcome

    def close(self) -> None:
        pass  # every connection ends within its step

    def describe(self, tx: Tx) -> dict[str, Any]:
        rows = []
        for group in groups(tx):
            last = tx.results.get(("effect", group["n"]))
            rows.append({"dsn": shown_dsn(group["dsn"]), "gid": group["gid"],
                         "statements": len(group["sql"]),
                         "outcome": last["outcome"] if last is not None else "staged"})
        return {"sql": rows} if rows else {}


# -- groups: one prepared transaction per DSN ----------------------------------------------------


def groups(tx: Tx) -> list[dict[str, Any]]:
    """The transaction's SQL effects by DSN, in the order of each DSN's first statement:
    [{dsn, gid, n (its first effect), sql: [statements in staging order]}]."""
    out: dict[str, dict[str, Any]] = {}
    for eff in tx.effects:
        if eff.get("kind") != KIND:
            continue
        if not GID_RE.fullmatch(eff["key"]):  # it goes into SQL: only what staging makes
            from ..errors import CorruptWal

            raise CorruptWal(f"{tx.tid}: effect {eff['n']} has the key {eff['key']!r}, which "
                             "is no global id agent-2pc makes")
        dsn = eff["request"]["dsn"]
        group = out.setdefault(dsn, {"dsn": dsn, "gid": eff["key"], "n": eff["n"], "sql": []})
        group["sql"].append(eff["request"]["sql"])
    return list(out.values())


def statements_before(tx: Tx, dsn: str) -> list[str]:
    """The statements ``tx`` staged for ``dsn`` so far (a new one is validated after them)."""
    return [eff["request"]["sql"] for eff in tx.effects
            if eff.get("kind") == KIND and eff["request"]["dsn"] == dsn]


# -- checks --------------------------------------------------------------------------------------


def check_sql(sql: Any) -> str:
    if not isinstance(sql, str) or not sql.strip():
        raise UsageError("a SQL step needs statements (`sql`)", params=("sql",))
    if "\0" in sql or len(sql.encode("utf-8", "surrogatepass")) > SQL_BYTES_MAX:
        raise UsageError(f"SQL is text without NUL, at most {SQL_BYTES_MAX} bytes",
                         params=("sql",))
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError("SQL must be Unicode text", params=("sql",)) from None
    for words in statement_heads(sql):
        if words[:1] in TX_CONTROL or words[:2] in TX_CONTROL:
            raise UsageError(
                f"{' '.join(words)}: a SQL step may not control its transaction (BEGIN, "
                "COMMIT, ROLLBACK, SAVEPOINT, PREPARE TRANSACTION...): agent-2pc runs the "
                "statements in one transaction and commits it with the files",
                params=("sql",))
    return sql


TX_CONTROL = frozenset({("BEGIN",), ("START",), ("COMMIT",), ("END",), ("ROLLBACK",),
                        ("ABORT",), ("SAVEPOINT",), ("RELEASE",), ("PREPARE", "TRANSACTION")})


def statement_heads(sql: str) -> list[tuple[str, ...]]:
    """The first two words (upper case) of each statement of ``sql``: a lexer that knows
    Postgres's quotes ('...', E'...', "...", $tag$...$tag$) and comments (--, nested /* */),
    so a semicolon or a word inside them is not taken for one."""
    heads: list[tuple[str, ...]] = []
    words: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c == ";":
            if words:
                heads.append(tuple(words))
            words, i = [], i + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif sql.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if sql.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif sql.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c in "'\"":
            escapes = c == "'" and i > 0 and sql[i - 1] in "eE"
            i += 1
            while i < n:
                if escapes and sql[i] == "\\":
                    i += 2
                elif sql[i] == c:
                    if sql.startswith(c + c, i):
                        i += 2
                    else:
                        break
                else:
                    i += 1
            i += 1
            words.append("\0")  # a literal: no keyword
        elif c == "$" and (m := re.match(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$", sql[i:])):
            end = sql.find(m.group(0), i + len(m.group(0)))
            i = n if end < 0 else end + len(m.group(0))
            words.append("\0")
        elif c.isalpha() or c == "_":
            j = i
            while j < n and (sql[j].isalnum() or sql[j] in "_$"):
                j += 1
            words.append(sql[i:j].upper())
            i = j
        else:
            if not c.isspace():
                words.append(c)
            i += 1
    if words:
        heads.append(tuple(words))
    return [tuple(h[:2]) for h in heads]


def check_dsn(dsn: Any) -> str:
    """The DSN as it will be logged: a postgres URL or key=value conninfo without a password,
    or ``env:NAME``."""
    if not isinstance(dsn, str) or not dsn.strip() or len(dsn) > DSN_CHARS_MAX or \
            not dsn.isprintable():
        raise UsageError("`dsn` is a postgresql:// URL, a libpq conninfo or env:NAME",
                         params=("dsn",))
    if dsn.startswith("env:"):
        name = dsn[4:]
        if not name or not all(c.isalnum() or c == "_" for c in name):
            raise UsageError(f"{dsn!r}: env: names an environment variable", params=("dsn",))
        resolve_dsn(dsn)
        return dsn
    if has_password(dsn):
        raise UsageError(
            "the DSN holds a password, which would be written to the transaction log: put the "
            "password in PGPASSWORD or ~/.pgpass, or give the DSN as env:NAME (the variable "
            "NAME holds it)", params=("dsn",))
    return dsn


def has_password(dsn: str) -> bool:
    psycopg = _psycopg()
    try:
        return bool(psycopg.conninfo.conninfo_to_dict(dsn).get("password"))
    except psycopg.ProgrammingError as exc:
        raise UsageError(f"the DSN does not parse: {exc}", params=("dsn",)) from None


def resolve_dsn(dsn: str) -> str:
    """The DSN to connect with: ``env:NAME`` read from the environment now."""
    if not dsn.startswith("env:"):
        return dsn
    value = os.environ.get(dsn[4:])
    if not value:
        raise UsageError(f"the environment variable {dsn[4:]} (named by the DSN {dsn}) is "
                         "not set", params=("dsn",))
    return value


def shown_dsn(dsn: str) -> str:
    """The DSN as messages show it: as given (it holds no password; env:NAME as such)."""
    return dsn


# -- talking to the server -----------------------------------------------------------------------


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the postgres extra is missing
        raise IsolationUnavailable(
            "SQL steps need psycopg: pip install 'agent-2pc[postgres]'") from None
    return psycopg


def connect(dsn: str, **kw: Any) -> Any:
    psycopg = _psycopg()
    return psycopg.connect(resolve_dsn(dsn), connect_timeout=CONNECT_TIMEOUT_S, **kw)


def validate(dsn: str, before: list[str], sql: str) -> int:
    """Run ``before`` and ``sql`` in one database transaction and roll it back; the rows
    ``sql`` affected. IsolationUnavailable when the server cannot prepare transactions;
    SqlFailed (the server's message, SQLSTATE) when a statement fails."""
    psycopg = _psycopg()
    shown = shown_dsn(dsn)
    try:
        conn = connect(dsn)
    except psycopg.Error as exc:
        raise SqlFailed(f"cannot connect to {shown}: {server_message(exc)}",
                        sqlstate=exc.sqlstate) from None
    try:
        with conn.cursor() as cur:
            (setting,) = cur.execute("SHOW max_prepared_transactions").fetchone()
            if int(setting) <= 0:
                raise IsolationUnavailable(
                    f"{shown} has max_prepared_transactions = {setting}: a SQL step commits "
                    "through PREPARE TRANSACTION; set max_prepared_transactions (e.g. to "
                    "max_connections) in postgresql.conf and restart the server "
                    "(docs/postgres.md)", setting="max_prepared_transactions", value=setting)
            cur.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
            for earlier in before:
                cur.execute(earlier)
            try:
                cur.execute(sql)
            except psycopg.Error as exc:
                raise SqlFailed(f"{shown}: {server_message(exc)}", sqlstate=exc.sqlstate,
                                ) from None
            return rows_affected(cur)
    except psycopg.Error as exc:  # an earlier statement fails now, or the connection broke
        raise SqlFailed(f"{shown}: {server_message(exc)}", sqlstate=exc.sqlstate) from None
    finally:
        try:
            conn.rollback()
        except psycopg.Error:
            pass
        conn.close()


def rows_affected(cur: Any) -> int:
    """The rows the statements of the last execute inserted, updated, deleted, merged or
    copied (each result's command tag)."""
    total = 0
    while True:
        tag = (cur.statusmessage or "").split(" ", 1)[0]
        if tag in ROW_COMMANDS and cur.rowcount > 0:
            total += cur.rowcount
        if not cur.nextset():
            return total


def end_backends_of(conn: Any, gid: str) -> None:
    """End the sessions still running a prepare of ``gid`` (a crashed process's backend the
    server has not reaped yet) and wait until they are gone: then no PREPARE of it can come."""
    import time

    deadline = time.monotonic() + 30
    while conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE application_name = %s AND pid <> pg_backend_pid()",
                       (gid,)).fetchall():
        if time.monotonic() > deadline:
            raise SqlFailed(f"the session preparing {gid} does not end")
        time.sleep(0.05)


def server_message(exc: Any) -> str:
    """The server's message with its SQLSTATE, or the client's error."""
    diag = getattr(exc, "diag", None)
    primary = diag.message_primary if diag is not None else None
    text = primary or str(exc).strip() or type(exc).__name__
    state = getattr(exc, "sqlstate", None)
    return f"{text} (SQLSTATE {state})" if state else text


def vote_code(exc: Any) -> str:
    """A no vote's code: ``conflict`` when another writer is in the way (integrity, a
    serialization failure or deadlock, a lock not granted in time), else ``effect_failed``."""
    state = getattr(exc, "sqlstate", None) or ""
    return "conflict" if state[:2] in ("23", "40") or state == "55P03" else "effect_failed"

