"""The node: serves one workspace to global transactions, through the store only.

A node LISTENs on its channel and also polls (a lost notification costs one poll interval,
never correctness), takes its requests one at a time (oldest first), runs each on the local
engine and writes the answer. Every few seconds, and at start-up, it resolves on its own what
the store has decided for its prepared transactions (docs/distributed.md, "Who finishes"):
committed -> commit here; aborted -> abort here; a coordinator whose lease expired before any
decision -> the abort (the one row update that can only win when the commit has not), then
abort here. A node restarted after a crash therefore finishes every decision it missed.

One process per node name: it holds a session advisory lock on its listening connection.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import sys
import threading
import time

from .. import crashpoints
from ..errors import (
    Agent2PCError,
    BadState,
    CheckFailed,
    IoFailed,
    NodeUnavailable,
    StoreUnavailable,
    TransactionAborted,
    UnknownTid,
    UsageError,
)
from .store import Store, channel, error_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    import psycopg

    from ..coordinator.client import Agent2PC

POLL_MS = 500
RESOLVE_MS = 2000
REQUEST_KEEP_S = 24 * 3600  # answered requests are deleted after a day
STAGE_KINDS = ("write", "delete", "replace", "patch", "cmd", "sql", "read")
COORDINATOR_KIND = "agent2pc-store"
_NODE_LOCK_BASE = 0x41325043  # "A2PC": the high half of the node's advisory lock key


def check_name(name: str) -> str:
    import re

    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", name):
        raise UsageError("a node (workspace) name is letters, digits, '.', '_' and '-', at "
                         f"most 63, not {name!r}", params=("name",))
    return name


def _env_ms(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


class Node:
    def __init__(self, root: str, store: str | None = None, name: str | None = None,
                 poll_ms: int | None = None, resolve_ms: int | None = None,
                 schema: str | None = None) -> None:
        from ..coordinator.client import Agent2PC

        self.root = Agent2PC.find_root(root)
        self.name = check_name(name or os.path.basename(self.root.rstrip("/")) or "root")
        self.poll_ms = poll_ms or _env_ms("AGENT2PC_NODE_POLL_MS", POLL_MS)
        self.resolve_ms = resolve_ms or _env_ms("AGENT2PC_NODE_RESOLVE_MS", RESOLVE_MS)
        if self.poll_ms < 10 or self.resolve_ms < 10:
            raise UsageError("`poll_ms` and `resolve_ms` are at least 10",
                             params=("poll_ms", "resolve_ms"))
        self.store = Store(store, schema)
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.client: Agent2PC = Agent2PC(self.root, daemon=False)
        self._listen: psycopg.Connection[Any] | None = None
        self._stopping = False
        self._stopped = threading.Event()
        self.requests = 0
        self._next_prune = 0.0
        self._ran: list[int] = []  # the last request ids run here (bounded)

    # -- life -----------------------------------------------------------------------------

    def stop(self, *_: object) -> None:
        self._stopping = True
        self._stopped.set()

    def serve(self, ready: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Serve until SIGTERM/SIGINT (or ``stop``). ``ready`` is called once registered."""
        old = {s: signal.signal(s, self.stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._relisten()
            self.store.call(lambda c: self.store.node_register(
                self.name, self.host, self.root, self.pid, self.poll_ms))
            self.resolve()
            if ready is not None:
                ready(self.info())
            # The heartbeat has its own thread and connection: a long request (a check that
            # runs for minutes, a queue of requests) must not make the node look dead.
            beat = threading.Thread(target=self._beat, name="agent-2pc node heartbeat",
                                    daemon=True)
            beat.start()
            next_resolve = time.monotonic() + self.resolve_ms / 1000
            while not self._stopping:
                while not self._stopping and self._one_request():
                    pass
                now = time.monotonic()
                if now >= next_resolve:
                    try:
                        self.resolve()
                    except StoreUnavailable:
                        pass  # the store is away: the next round tries again
                    next_resolve = now + self.resolve_ms / 1000
                self._wait(min(self.poll_ms / 1000, max(0.0, next_resolve - now)))
            self._stopped.set()
            beat.join(5)
            try:
                self.store.node_stopped(self.name, self.pid)
            except StoreUnavailable:
                pass
            return {"stopped": True, "requests": self.requests}
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if self._listen is not None:
                self._listen.close()
            self.store.close()
            self.client.close()

    def _beat(self) -> None:
        store = Store(self.store.url, self.store.schema)
        try:
            while not self._stopped.wait(self.poll_ms / 1000):
                try:
                    store.heartbeat(self.name, self.pid)
                except StoreUnavailable:
                    pass  # the store is away: the next beat tries again
        finally:
            store.close()

    def info(self) -> dict[str, Any]:
        return {"node": self.name, "root": self.root, "pid": self.pid, "host": self.host,
                "store": self.store.where, "schema": self.store.schema}

    # -- the listening connection ---------------------------------------------------------

    def _relisten(self) -> None:
        """(Re)open the listening connection: the node's lock, then LISTEN."""
        import hashlib

        import psycopg

        held_before = self._listen is not None
        if self._listen is not None:
            self._listen.close()
        self._listen = None
        conn = self.store.connect()
        key = int.from_bytes(hashlib.sha256(f"{self.store.schema}\0{self.name}".encode())
                             .digest()[:4], "big")
        # After a cut connection our old backend may still be exiting (and holding the lock)
        # for a moment: wait for it, bounded.
        deadline = time.monotonic() + (10.0 if held_before else 0.0)
        try:
            while True:
                got = conn.execute("SELECT pg_try_advisory_lock(%s, %s)",
                                   (_NODE_LOCK_BASE, key - (1 << 31))).fetchone()
                if (got and got[0]) or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
        except psycopg.Error as exc:
            conn.close()
            raise StoreUnavailable(f"the store ({self.store.where}) was lost: "
                                   f"{str(exc).strip()}") from None
        if not got or not got[0]:
            conn.close()
            row = self.store.node(self.name) or {}
            raise NodeUnavailable(f"node {self.name} is already served (pid {row.get('pid')} on "
                            f"{row.get('host')}, root {row.get('root')})", node=self.name)
        try:
            conn.execute(f'LISTEN "{channel(self.store.schema, "n", self.name)}"')
        except psycopg.Error as exc:
            conn.close()
            raise StoreUnavailable(f"the store refused LISTEN: {exc}") from None
        self._listen = conn

    def _wait(self, timeout_s: float) -> None:
        import psycopg

        if timeout_s <= 0:
            return
        try:
            if self._listen is None or self._listen.closed:
                self._relisten()
            assert self._listen is not None
            for _ in self._listen.notifies(timeout=timeout_s, stop_after=1):
                pass
        except (psycopg.OperationalError, StoreUnavailable):
            time.sleep(min(timeout_s, 0.2))  # the store is away: poll again, then re-listen
            try:
                self._relisten()
            except StoreUnavailable:
                pass

    # -- requests -------------------------------------------------------------------------

    def _one_request(self) -> bool:
        """Take and run one request; False when none waits (or the store is away)."""
        try:
            req = self.store.take(self.name, self.pid, self._ran)
        except StoreUnavailable:
            return False
        if req is None:
            return False
        self.requests += 1
        self._ran = self._ran[-999:] + [req["id"]]
        answer, error = self.run(req["gtid"], req["kind"], req["params"])
        # The answer must reach the store: retry across lost connections (bounded by the
        # store's budget each time; the coordinator gives up on its own clock).
        for _ in range(5):
            try:
                self.store.answer(req["id"], req["gtid"], answer, error)
                break
            except StoreUnavailable:
                time.sleep(0.2)
        return True

    def run(self, gtid: str, kind: str, params: dict[str, Any]
            ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        try:
            if kind == "vote":
                return self.vote(gtid), None
            if kind == "decide":
                return self.decide(gtid, params["outcome"], params.get("reason")), None
            if kind in STAGE_KINDS:
                return self.stage(gtid, kind, params), None
            if kind == "diff":
                return self._tx(gtid).diff(stat=bool(params.get("stat"))), None
            if kind == "status":
                part = self.store.part(gtid, self.name)
                if part is None:
                    return {"joined": False}, None
                return self.client.status(part["local_tid"]), None
            raise UsageError(f"node {self.name} does not know the request {kind!r}")
        except Agent2PCError as err:
            return None, error_json(err)
        except OSError as exc:
            return None, error_json(IoFailed.from_os_error(exc))
        except Exception as exc:  # a bug must not take the node down with it: answer it
            import traceback

            traceback.print_exc(file=sys.stderr)
            return None, {"code": "internal", "exit_status": 2, "class": "Agent2PCError",
                          "message": f"node {self.name}: {type(exc).__name__}: {exc}"}

    def _tx(self, gtid: str) -> Any:
        part = self.store.part(gtid, self.name)
        if part is None:
            raise UsageError(f"workspace {self.name} has nothing staged in {gtid}")
        return self.client.get(part["local_tid"], check=False)

    def stage(self, gtid: str, kind: str, p: dict[str, Any]) -> dict[str, Any]:
        g = self.store.gtx_get(gtid)
        if g is None:
            raise UnknownTid(f"no global transaction {gtid}", tid=gtid)
        if g["state"] != "active":
            raise BadState(f"{gtid} is {g['state']}: only an active transaction stages",
                           tid=gtid, state=g["state"])
        part = self.store.part(gtid, self.name)
        if part is not None:
            return self._step(self.client.get(part["local_tid"], check=False), kind, p)
        # The first step here: a local transaction, joined only once the step succeeded (a
        # refused first step leaves nothing behind).
        remaining_ms = 0
        if g["expires_at"] is not None:
            import datetime

            left = g["expires_at"] - datetime.datetime.now(datetime.timezone.utc)
            remaining_ms = max(1000, int(left.total_seconds() * 1000) + 60_000)
        local = self.client.begin(timeout_ms=remaining_ms, label=gtid)
        try:
            out = self._step(local, kind, p)
        except CheckFailed:  # a check that ran and failed stays in the transaction, as here
            self.store.join(gtid, self.name, local.tid)
            raise
        except BaseException:
            local.abort("its first step in the global transaction failed")
            raise
        self.store.join(gtid, self.name, local.tid)
        return out

    @staticmethod
    def _step(tx: Any, kind: str, p: dict[str, Any]) -> dict[str, Any]:
        if kind == "write":
            return tx.stage_write(p["path"], base64.b64decode(p["content_b64"]),  # type: ignore
                                  mode=p.get("mode"))
        if kind == "delete":
            return tx.stage_delete(p["path"])  # type: ignore[no-any-return]
        if kind == "replace":
            return tx.stage_replace(p["path"], p["old"], p["new"],  # type: ignore
                                    all=bool(p.get("all")))
        if kind == "patch":
            return tx.stage_patch(p["patch"])  # type: ignore[no-any-return]
        if kind == "sql":
            return tx.stage_sql(p["dsn"], p["sql"])  # type: ignore[no-any-return]
        if kind == "read":
            return tx.record_read_result(p["path"])  # type: ignore[no-any-return]
        return tx.stage_cmd(  # type: ignore[no-any-return]
            p["command"], timeout_ms=p.get("timeout_ms"), promote=p.get("promote") or [],
            sandbox=bool(p.get("sandbox")), network=bool(p.get("network")),
            limits=p.get("limits") or None, working_dir=p.get("working_dir"),
            env=p.get("env") or {})

    def vote(self, gtid: str) -> dict[str, Any]:
        g = self.store.gtx_get(gtid)
        part = self.store.part(gtid, self.name)
        if g is None or part is None:
            raise UnknownTid(f"workspace {self.name} has no part in {gtid}", tid=gtid)
        if g["state"] != "preparing":
            if g["state"] == "aborted":
                self.decide(gtid, "abort", g["reason"])
            raise BadState(f"{gtid} is {g['state']}: a vote is asked only while preparing",
                           tid=gtid, state=g["state"])
        tx = self.client.get(part["local_tid"], check=False)
        try:
            out = tx.vote(self.coordinator(gtid))
        except TransactionAborted as err:
            self.store.record_vote(gtid, self.name, "no", err.reason)
            return {"vote": "no", "code": err.code, "reason": err.reason,
                    "local_tid": part["local_tid"]}
        crashpoints.hit("node.after_vote")
        self.store.record_vote(gtid, self.name, "yes", None)
        return {"vote": "yes", "local_tid": part["local_tid"], "state": out.get("state")}

    def coordinator(self, gtid: str) -> dict[str, Any]:
        """Who decides a local transaction we vote on (recorded in the local log): no
        password, only what finds the decision again in this node's store."""
        return {"kind": COORDINATOR_KIND, "gtid": gtid, "schema": self.store.schema,
                "store": self.store.where, "node": self.name}

    def decide(self, gtid: str, outcome: str, reason: str | None = None) -> dict[str, Any]:
        """Carry out the store's decision here. Refuses one the store does not hold."""
        g = self.store.gtx_get(gtid)
        state = g["state"] if g else "aborted"  # no row: presumed abort
        if outcome == "commit" and state != "committed":
            raise BadState(f"{gtid} is {state} in the store: it cannot commit here",
                           tid=gtid, state=state)
        if outcome == "abort" and state == "committed":
            raise BadState(f"{gtid} is committed in the store: it cannot abort here",
                           tid=gtid, state=state)
        part = self.store.part(gtid, self.name)
        if part is None:
            return {"tid": gtid, "state": "aborted", "joined": False}
        crashpoints.hit("node.before_decide")
        try:
            out = self.client.decide(part["local_tid"], outcome,
                                     reason if outcome == "abort" else None)
        except UnknownTid:
            if outcome != "abort":
                raise
            out = {"tid": part["local_tid"], "state": "aborted"}
        except TransactionAborted as err:  # an abort answered as the abort it is
            out = {"tid": part["local_tid"], "state": "aborted", "reason": err.reason}
        crashpoints.hit("node.after_decide")
        self.store.record_done(gtid, self.name, "committed" if outcome == "commit"
                               else "aborted")
        return out

    # -- resolution -----------------------------------------------------------------------

    def resolve(self) -> list[dict[str, Any]]:
        """Finish here what the store decided (and abort what a dead coordinator left
        undecided past its lease). Returns what it did."""
        done: list[dict[str, Any]] = []
        try:
            if time.monotonic() >= self._next_prune:
                self.store.prune(self.name, REQUEST_KEEP_S)
                self._next_prune = time.monotonic() + 60
            rows = self.store.undecided_here(self.name)
        except StoreUnavailable:
            return done
        for row in rows:
            gtid, state = row["gtid"], row["state"]
            if state not in ("committed", "aborted"):
                state = self.store.decide_abort(
                    gtid, "timeout", "the coordinator's lease expired before a decision"
                    if state == "preparing" else "the global transaction timed out")
                if state not in ("committed", "aborted"):
                    continue
            done.append(self._finish(gtid, "commit" if state == "committed" else "abort"))
        # Prepared here for a transaction the store has no part of us for: presumed abort.
        for d in self.client.in_doubt():
            c = d.get("coordinator") or {}
            if not isinstance(c, dict) or c.get("kind") != COORDINATOR_KIND or \
                    c.get("schema") != self.store.schema or c.get("node") != self.name:
                continue
            if self.store.part(c["gtid"], self.name) is None:
                self.client.decide(d["tid"], "abort", "its global transaction is unknown to "
                                   "the store (presumed abort)")
                done.append({"gtid": c["gtid"], "outcome": "abort", "local_tid": d["tid"]})
        return done

    def _finish(self, gtid: str, outcome: str) -> dict[str, Any]:
        try:
            out = self.decide(gtid, outcome, "decided in the store while this node was away"
                              if outcome == "abort" else None)
            return {"gtid": gtid, "outcome": outcome, "local_tid": out.get("tid")}
        except Agent2PCError as err:
            sys.stderr.write(f"agent-2pc node {self.name}: {gtid}: {outcome}: {err.message}\n")
            return {"gtid": gtid, "outcome": outcome, "error": err.code}
