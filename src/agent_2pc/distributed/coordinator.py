"""The global transaction: one transaction across workspaces (and hosts), decided in Postgres.

    from agent_2pc.distributed import GlobalClient
    g = GlobalClient("postgresql://host/db")
    tx = g.begin(label="migration + code")
    tx.stage_sql("backend", "postgresql://host/app", "ALTER TABLE t ADD c int")
    tx.stage_write("frontend", "src/c.ts", "...")
    tx.commit()          # all workspaces commit, or none (TransactionAborted names who said no)

Each workspace is served by a node (node.py). Staging goes to the workspace's node as a
request; commit runs the protocol of docs/distributed.md: the coordinator takes a lease
(active -> preparing), asks every workspace to vote, and records the decision with one row
update in the store -- the commit point, possible only while its lease holds. Then it tells the
workspaces; one that does not hear (dead, cut off) finishes on its own from the store.
"""

from __future__ import annotations

import base64
import os
import secrets
import socket
import time

from .. import crashpoints
from ..errors import (
    Agent2PCError,
    BadState,
    NodeUnavailable,
    Refusal,
    TransactionAborted,
    UnknownTid,
    UnknownWorkspace,
    UsageError,
)
from .node import check_name
from .store import Store, channel

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import psycopg

LEASE_MS = 30_000
REQUEST_TIMEOUT_MS = 120_000  # a staging request (a command: its own timeout on top)
VOTE_TIMEOUT_MS = 600_000  # preparing re-runs checks: bounded, the lease renewed meanwhile
DECIDE_WAIT_MS = 30_000  # then the answer says which workspaces finish on their own
DEFAULT_TIMEOUT_MS = 24 * 3600 * 1000
CONTENT_BYTES_MAX = 64 << 20  # per staged file: it travels in a request row
GTID_PREFIX = "g-"


def is_global(tid: object) -> bool:
    return isinstance(tid, str) and tid.startswith(GTID_PREFIX)


class RemoteError(Agent2PCError):
    """An error a node answered: its code and exit status, and the workspace that said it."""

    def __init__(self, message: str, *, code: str, exit_status: int, **details: Any) -> None:
        super().__init__(message, code=code, **details)
        self.exit_status = exit_status


def _raise_remote(workspace: str, err: dict[str, Any], gtid: str) -> None:
    err = dict(err)
    code, status = str(err.pop("code", "internal")), int(err.pop("exit_status", 2))
    cls, message = err.pop("class", ""), str(err.pop("message", ""))
    message = f"workspace {workspace}: {message}"
    if code == "unknown_tid":
        raise UnknownTid(message, workspace=workspace, tid=gtid)
    if code == "bad_state":
        raise BadState(message, workspace=workspace, tid=gtid, state=err.get("state"))
    if cls == "CheckFailed":
        from ..errors import CheckFailed

        raise CheckFailed(message, code=code, tid=gtid, workspace=workspace,
                          result=err.get("result"))
    err.pop("tid", None)
    raise RemoteError(message, code=code, exit_status=status, workspace=workspace, **err)


def _env_ms(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


class GlobalClient:
    """The global transactions of one store. ``lease_ms``: how long a coordinator's silence
    is tolerated while it prepares (renewed every third of it)."""

    def __init__(self, store: str | None = None, schema: str | None = None,
                 lease_ms: int | None = None) -> None:
        self.store = Store(store, schema)
        self.lease_ms = lease_ms or _env_ms("AGENT2PC_GLOBAL_LEASE_MS", LEASE_MS)
        if self.lease_ms < 100:
            raise UsageError("`lease_ms` is at least 100", params=("lease_ms",))

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> GlobalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def begin(self, label: str | None = None, timeout_ms: int | None = None
              ) -> GlobalTransaction:
        if timeout_ms is None:
            timeout_ms = DEFAULT_TIMEOUT_MS
        if type(timeout_ms) is not int or timeout_ms < 0:
            raise UsageError("`timeout_ms` is a whole number of ms >= 0 (0: never)",
                             params=("timeout_ms",))
        if label is not None and (not isinstance(label, str) or len(label) > 200):
            raise UsageError("`label` is text of at most 200 characters", params=("label",))
        gtid = GTID_PREFIX + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + \
            secrets.token_hex(4)
        self.store.gtx_create(gtid, label, timeout_ms)
        return GlobalTransaction(self, gtid)

    def get(self, gtid: str) -> GlobalTransaction:
        if not is_global(gtid):
            raise UnknownTid(f"{gtid!r} is not a global transaction id (they look like "
                             "g-20260101-120000-a1b2c3d4)", tid=gtid if isinstance(gtid, str)
                             else None)
        if self.store.gtx_get(gtid) is None:
            raise UnknownTid(f"no global transaction {gtid} in the store ({self.store.where}, "
                             f"schema {self.store.schema})", tid=gtid)
        return GlobalTransaction(self, gtid)

    def nodes(self) -> list[dict[str, Any]]:
        return [{**n, "started_at": _iso(n["started_at"]),
                 "heartbeat_at": _iso(n["heartbeat_at"])} for n in self.store.nodes()]

    def status(self, gtid: str | None = None) -> dict[str, Any]:
        if gtid is not None:
            return {"transactions": [self.get(gtid).status_row()]}
        return {"transactions": [GlobalTransaction(self, g["gtid"]).status_row(g)
                                 for g in self.store.gtx_list()]}

    # -- messages -------------------------------------------------------------------------

    def check_node(self, workspace: str) -> None:
        row = self.store.node(check_name(workspace))
        if row is None:
            raise UnknownWorkspace(f"no node serves a workspace named {workspace!r} in the "
                                   f"store ({self.store.where}, schema {self.store.schema}); "
                                   "start its node in that workspace, under that name "
                                   "(docs/distributed.md)", workspace=workspace)
        if not row["alive"]:
            raise NodeUnavailable(f"the node of workspace {workspace!r} is not alive (pid "
                                  f"{row['pid']} on {row['host']}, last heard "
                                  f"{_iso(row['heartbeat_at'])})", workspace=workspace)

    def ask(self, gtid: str, workspace: str, kind: str, params: dict[str, Any],
            timeout_ms: int = REQUEST_TIMEOUT_MS) -> dict[str, Any]:
        """One request to one workspace's node, its answer (an error answer raised)."""
        self.check_node(workspace)
        out = self.ask_all(gtid, {workspace: (kind, params)}, timeout_ms)[workspace]
        if "error" in out:
            _raise_remote(workspace, out["error"], gtid)
        return out["answer"]  # type: ignore[no-any-return]

    def ask_all(self, gtid: str, asks: dict[str, tuple[str, dict[str, Any]]],
                timeout_ms: int, renew: str | None = None) -> dict[str, dict[str, Any]]:
        """Send each workspace its request, wait for every answer (``{answer}`` or
        ``{error}``). A node that dies or stays silent past ``timeout_ms`` answers an error.
        ``renew``: our coordinator id, whose lease is renewed while we wait (an error
        answer ``lease_lost`` for all when it cannot be)."""
        conn = self._listener(gtid)
        try:
            ids = {self.store.send(gtid, ws, kind, params): ws
                   for ws, (kind, params) in asks.items()}
            out: dict[str, dict[str, Any]] = {}
            deadline = time.monotonic() + timeout_ms / 1000
            next_renew = next_alive = 0.0
            while True:
                pending = [i for i, ws in ids.items() if ws not in out]
                for row in self.store.results(pending) if pending else []:
                    ws = ids[row["id"]]
                    out[ws] = {"error": row["error"]} if row["error"] else \
                        {"answer": row["answer"]}
                pending = [i for i, ws in ids.items() if ws not in out]
                if not pending:
                    return out
                now = time.monotonic()
                if renew is not None and now >= next_renew:
                    if not self.store.renew(gtid, renew, self.lease_ms):
                        self.store.forget(pending, "the coordinator lost its lease")
                        for i in pending:
                            out[ids[i]] = {"error": {"code": "timeout", "exit_status": 1,
                                                     "message": "the coordinator's lease "
                                                     "expired before the vote"}}
                        return out
                    next_renew = now + self.lease_ms / 3000
                if now >= next_alive:
                    for i in pending:
                        node = self.store.node(ids[i])
                        if node is None or not node["alive"]:
                            out[ids[i]] = {"error": {
                                "code": "node_unavailable", "exit_status": 2,
                                "message": f"the node of workspace {ids[i]} is not alive"}}
                    next_alive = now + 0.5
                    continue
                if now >= deadline:
                    self.store.forget(pending, "nobody waits for the answer any more")
                    for i in pending:
                        out[ids[i]] = {"error": {"code": "timeout", "exit_status": 1,
                                                 "message": f"no answer within {timeout_ms} "
                                                 "ms"}}
                    return out
                conn = self._wait(conn, gtid, min(deadline, next_alive,
                                                  next_renew if renew else deadline) - now)
        finally:
            if conn is not None:
                conn.close()

    def _listener(self, gtid: str) -> psycopg.Connection[Any] | None:
        try:
            conn = self.store.connect()
            conn.execute(f'LISTEN "{channel(self.store.schema, "a", gtid)}"')
            return conn
        except Exception:
            return None  # polling alone still answers

    def _wait(self, conn: psycopg.Connection[Any] | None, gtid: str, timeout_s: float
              ) -> psycopg.Connection[Any] | None:
        timeout_s = max(0.001, min(timeout_s, 0.25))
        if conn is None:
            time.sleep(min(timeout_s, 0.05))
            return self._listener(gtid)
        try:
            for _ in conn.notifies(timeout=timeout_s, stop_after=1):
                pass
            return conn
        except Exception:
            conn.close()
            return self._listener(gtid)


class GlobalTransaction:
    """One global transaction: staging per workspace, then commit or abort across all."""

    def __init__(self, client: GlobalClient, gtid: str) -> None:
        self.client = client
        self.tid = gtid
        self.coordinator = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    def __repr__(self) -> str:
        return f"GlobalTransaction({self.tid!r})"

    @property
    def store(self) -> Store:
        return self.client.store

    def _stage(self, workspace: str, kind: str, params: dict[str, Any],
               timeout_ms: int = REQUEST_TIMEOUT_MS) -> dict[str, Any]:
        g = self.store.gtx_get(self.tid)
        if g is None:
            raise UnknownTid(f"no global transaction {self.tid}", tid=self.tid)
        if g["state"] != "active":
            raise BadState(f"{self.tid} is {g['state']}: only an active transaction stages",
                           tid=self.tid, state=g["state"])
        out = self.client.ask(self.tid, workspace, kind, params, timeout_ms)
        return {"workspace": workspace, **out}

    # -- staging (the same arguments as a local transaction's, after the workspace) ---------

    def stage_write(self, workspace: str, path: str, content: str | bytes,
                    mode: int | None = None) -> dict[str, Any]:
        data = content.encode("utf-8", "surrogateescape") if isinstance(content, str) \
            else content
        if not isinstance(data, bytes) or len(data) > CONTENT_BYTES_MAX:
            raise UsageError(f"`content` is text or bytes of at most {CONTENT_BYTES_MAX} bytes "
                             "in a global transaction", params=("content",))
        return self._stage(workspace, "write", {"path": path, "mode": mode,
                                                "content_b64": base64.b64encode(data).decode()})

    def stage_delete(self, workspace: str, path: str) -> dict[str, Any]:
        return self._stage(workspace, "delete", {"path": path})

    def stage_replace(self, workspace: str, path: str, old: str, new: str, all: bool = False
                      ) -> dict[str, Any]:
        return self._stage(workspace, "replace", {"path": path, "old": old, "new": new,
                                                  "all": all})

    def stage_patch(self, workspace: str, patch: str | bytes) -> dict[str, Any]:
        text = patch.decode("utf-8", "surrogateescape") if isinstance(patch, bytes) else patch
        return self._stage(workspace, "patch", {"patch": text})

    def stage_cmd(self, workspace: str, command: str, timeout_ms: int | None = None,
                  promote: list[str] | None = None, sandbox: bool = False,
                  network: bool = False, limits: dict[str, int] | None = None,
                  working_dir: str | None = None, env: dict[str, str] | None = None
                  ) -> dict[str, Any]:
        wait = (timeout_ms or 600_000) + REQUEST_TIMEOUT_MS
        return self._stage(workspace, "cmd", {
            "command": command, "timeout_ms": timeout_ms, "promote": promote or [],
            "sandbox": sandbox, "network": network, "limits": limits,
            "working_dir": working_dir, "env": env or {}}, wait)

    def stage_sql(self, workspace: str, dsn: str, sql: str) -> dict[str, Any]:
        """SQL through the workspace's own Postgres participant: ``dsn`` is resolved on the
        workspace's host (env:NAME reads the node's environment)."""
        return self._stage(workspace, "sql", {"dsn": dsn, "sql": sql})

    def record_read(self, workspace: str, path: str) -> dict[str, Any]:
        return self._stage(workspace, "read", {"path": path})

    def diff(self, workspace: str, stat: bool = False) -> dict[str, Any]:
        self._known()
        return {"workspace": workspace,
                **self.client.ask(self.tid, workspace, "diff", {"stat": stat})}

    # -- state ----------------------------------------------------------------------------

    def _known(self) -> dict[str, Any]:
        g = self.store.gtx_get(self.tid)
        if g is None:
            raise UnknownTid(f"no global transaction {self.tid}", tid=self.tid)
        return g

    def status_row(self, g: dict[str, Any] | None = None) -> dict[str, Any]:
        g = g or self._known()
        parts = self.store.parts(self.tid)
        return {"tid": self.tid, "state": g["state"], "label": g["label"],
                "created_at": _iso(g["created_at"]), "coordinator": g["coordinator"],
                "lease_until": _iso(g["lease_until"]), "decided_at": _iso(g["decided_at"]),
                "code": g["code"], "reason": g["reason"],
                "workspaces": [{"workspace": p["workspace"], "local_tid": p["local_tid"],
                                "vote": p["vote"], "outcome": p["outcome"],
                                "done": p["done_at"] is not None} for p in parts]}

    def status(self) -> dict[str, Any]:
        return {"transactions": [self.status_row()]}

    # -- the decision ---------------------------------------------------------------------

    def commit(self) -> dict[str, Any]:
        """Prepare everywhere, decide in the store, tell every workspace. Raises
        TransactionAborted (naming the workspace that said no) when it aborts."""
        g = self._known()
        if g["state"] == "committed":
            return self._answer("committed", self.store.parts(self.tid), {})
        if g["state"] == "aborted":
            raise BadState(f"{self.tid} is aborted ({g['reason']}): it cannot commit",
                           tid=self.tid, state="aborted")
        if g["state"] == "preparing":
            if not g["lease_expired"]:
                raise BadState(f"{self.tid} is being committed by {g['coordinator']}",
                               tid=self.tid, state="preparing")
            self._abort_everywhere("timeout", "its coordinator's lease expired before a "
                                   "decision", None)
            raise TransactionAborted(f"{self.tid}: its coordinator's lease expired before a "
                                     "decision", code="timeout", tid=self.tid)
        if not self.store.start_prepare(self.tid, self.coordinator, self.client.lease_ms):
            g = self._known()
            if g["state"] == "active" and g["expired"]:
                self._abort_everywhere("timeout", "the transaction timed out", None)
                raise TransactionAborted(f"{self.tid} timed out before commit", code="timeout",
                                         tid=self.tid)
            return self.commit()  # someone else moved it: answer from its new state
        parts = self.store.parts(self.tid)
        votes = self.client.ask_all(self.tid, {p["workspace"]: ("vote", {}) for p in parts},
                                    _env_ms("AGENT2PC_GLOBAL_VOTE_TIMEOUT_MS", VOTE_TIMEOUT_MS),
                                    renew=self.coordinator)
        no = self._first_no(votes)
        if no is not None:
            ws, code, reason = no
            self._abort_everywhere(code, f"workspace {ws}: {reason}", self.coordinator)
            raise TransactionAborted(f"workspace {ws} voted no: {reason}", code=code,
                                     tid=self.tid, workspace=ws)
        crashpoints.hit("global.after_votes")
        state = self.store.decide_commit(self.tid, self.coordinator)  # THE COMMIT POINT
        if state != "committed":
            self._abort_everywhere("timeout", "the coordinator's lease expired before the "
                                   "decision", self.coordinator)
            raise TransactionAborted(f"{self.tid}: the coordinator's lease expired before the "
                                     "decision", code="timeout", tid=self.tid)
        crashpoints.hit("global.after_decision")
        done = self.client.ask_all(self.tid, {p["workspace"]: ("decide", {"outcome": "commit"})
                                              for p in parts},
                                   _env_ms("AGENT2PC_GLOBAL_DECIDE_WAIT_MS", DECIDE_WAIT_MS))
        return self._answer("committed", parts, done)

    @staticmethod
    def _first_no(votes: dict[str, dict[str, Any]]) -> tuple[str, str, str] | None:
        for ws in sorted(votes):
            v = votes[ws]
            if "error" in v:
                e = v["error"]
                return ws, str(e.get("code") or "conflict"), str(e.get("message"))
            if v["answer"].get("vote") != "yes":
                return ws, str(v["answer"].get("code") or "conflict"), \
                    str(v["answer"].get("reason"))
        return None

    def _answer(self, state: str, parts: list[dict[str, Any]],
                done: dict[str, dict[str, Any]]) -> dict[str, Any]:
        workspaces: dict[str, Any] = {}
        files: list[str] = []
        pending: list[str] = []
        for p in parts:
            ws = p["workspace"]
            d = done.get(ws, {})
            if "answer" in d:
                got = d["answer"].get("files") or []
                names = [f["path"] if isinstance(f, dict) else str(f) for f in got]
                files += [f"{ws}:{n}" for n in names]
                workspaces[ws] = {"local_tid": p["local_tid"], "state": d["answer"].get("state"),
                                  "files": names}
            else:
                again = self.store.part(self.tid, ws) or p
                finished = again.get("done_at") is not None
                if not finished:
                    pending.append(ws)
                workspaces[ws] = {"local_tid": p["local_tid"],
                                  "state": again.get("outcome") if finished else None}
        out: dict[str, Any] = {"tid": self.tid, "state": state, "files": files,
                               "workspaces": workspaces}
        if pending:
            out["pending"] = pending  # they finish on their own, from the store
        return out

    def _abort_everywhere(self, code: str, reason: str, coordinator: str | None) -> str:
        state = self.store.decide_abort(self.tid, code, reason, coordinator)
        if state != "aborted":
            return state
        parts = [p for p in self.store.parts(self.tid) if p["done_at"] is None]
        alive = {}
        for p in parts:
            row = self.store.node(p["workspace"])
            if row is not None and row["alive"]:
                alive[p["workspace"]] = ("decide", {"outcome": "abort", "reason": reason})
        if alive:  # the others abort on their own when they come back (presumed abort)
            self.client.ask_all(self.tid, alive,
                                _env_ms("AGENT2PC_GLOBAL_DECIDE_WAIT_MS", DECIDE_WAIT_MS))
        return state

    def abort(self, reason: str | None = None) -> dict[str, Any]:
        g = self._known()
        if g["state"] == "committed":
            raise BadState(f"{self.tid} is committed: it cannot abort", tid=self.tid,
                           state="committed")
        if g["state"] == "preparing" and not g["lease_expired"]:
            raise BadState(f"{self.tid} is being committed by {g['coordinator']}",
                           tid=self.tid, state="preparing")
        if g["state"] != "aborted":
            state = self._abort_everywhere("aborted", reason or "aborted by request", None)
            if state == "committed":
                raise BadState(f"{self.tid} is committed: it cannot abort", tid=self.tid,
                               state="committed")
        return {"tid": self.tid, "state": "aborted"}


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


__all__ = ["GlobalClient", "GlobalTransaction", "NodeUnavailable", "RemoteError", "Refusal",
           "UnknownWorkspace", "is_global"]
