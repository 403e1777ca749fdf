"""The transaction engine: one workspace, its log, its locks, and the protocol.

Every public method is one step of the contract (begin, stage, commit, ...). The engine keeps
the state of the live transactions folded from the log (core/states.py) and tails the log
before each step, so it sees what other processes appended.

Locks, always taken in this order (docs/design.md, "Concurrency"):
  tx/<tid>/lock  while a process works on that transaction (staging, committing);
  commit.lock    from prepare to end, so commits and recoveries of the tree are serial;
  lock           for a moment around each log append.
Recovery takes commit.lock and then only *tries* transaction locks: a transaction whose lock
is held has a live worker and is left alone.
"""

from __future__ import annotations

import os
import time
from _thread import RLock

from .. import crashpoints
from ..core import confine, records, recovery
from ..core.states import (
    ABORTED,
    ACTIVE,
    COMMITTED,
    FINISHED,
    IN_FLIGHT,
    IllegalTransition,
    Tx,
    apply_record,
    effects_summary,
    iso_ms,
)
from ..errors import (
    Agent2PCError,
    ApplyIncomplete,
    BadState,
    CorruptWal,
    NotInitialized,
    TransactionAborted,
    UnknownTid,
    UsageError,
)
from ..participants.api import ApiParticipant
from ..participants.api import lease_ttl_s as api_lease_ttl_s
from ..participants.fs import ApplyFailed, FileParticipant, Vote
from ..storage import history
from ..storage.blobs import BlobStore
from ..storage.locks import FileLock, byte_for
from ..storage.log import Batch, Log, PausedGc
from ..storage.pids import pid_alive
from ..storage.scratch import discard, sweep_in_background
from ..storage.workspace import Layout, check_intact, is_workspace, log_check
from .runs import Runs
from .staging import Staging

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are lazy
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

TID_RE = confine.TID_RE
DEFAULT_TIMEOUT_MS = 24 * 3600 * 1000
TIMEOUT_MS_MAX = 30 * 24 * 3600 * 1000  # a deadline further out is 0 (none) or a typo
# Automatic compaction keeps the log short, so that a step costs the same with 10k finished
# transactions in the history as in a new workspace.
COMPACT_FINISHED_MAX = 64
COMPACT_BYTES_MAX = 1 << 20
# Garbage: blobs unnamed by live transactions after an hour; pre-images after a day.
BLOB_GRACE_S = float(os.environ.get("AGENT2PC_BLOB_GRACE_S", 3600))
PREIMAGE_RETENTION_S = float(os.environ.get("AGENT2PC_PREIMAGE_RETENTION_S", 24 * 3600))
GC_INTERVAL_S = 3600.0
TX_LOCKS_CACHED_MAX = 256


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def boot_id() -> str | None:
    """This boot of the machine (Linux); active transactions do not outlive a machine crash."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().strip().decode() or None
    except OSError:
        return None


def check_tid(tid: Any) -> str:
    if not isinstance(tid, str) or not TID_RE.fullmatch(tid):
        raise UnknownTid(f"{tid!r} is not a transaction id (they look like "
                         "tx-20260101-120000-a1b2c3)", tid=tid if isinstance(tid, str) else None)
    return tid


class Engine(Staging, Runs):
    def __init__(self, root: str, *, recover_dead: bool = True) -> None:
        if not is_workspace(root):
            raise NotInitialized(f"no agent-2pc workspace at {root}", root=root)
        self.root = root
        self.layout = Layout(root)
        check_intact(self.layout, log=False)  # FORMAT; the log's open checks wal.bin
        self.log = Log(self.layout.wal, self.layout.lock, check_header=log_check(root))
        self.blobs = BlobStore(self.layout.objects, self.layout.preimages)
        self.commit_lock = FileLock(self.layout.commit_lock)
        self.fs = FileParticipant(root, self.blobs)
        self.api = ApiParticipant(self._open_fence)
        self.boot = boot_id()
        self.txs: dict[str, Tx] = {}
        self._mutex = RLock()
        self._truncation_reported = 0
        self._tx_locks: dict[str, FileLock] = {}
        # What this engine finished on its own (at start-up, or before a commit) since the
        # last recover(): recover() reports it too.
        self._recovered: dict[str, list[str]] = {"rolled_forward": [], "rolled_back": [],
                                                 "diverged": []}
        # Decided commits whose apply (or redo) stopped on an error in this process: tid ->
        # what is not applied. They stay 'committing'; recover() retries them and reports.
        self._stuck: dict[str, dict[str, Any]] = {}
        self._refresh()
        if recover_dead and any(tx.state in IN_FLIGHT for tx in self.txs.values()):
            self._recover_dead()

    def _open_fence(self) -> Any:
        """The fence the API participant runs on: SQLite in .agent-tx/ (opened on first use)."""
        from ..fence import open_fence

        return open_fence(f"sqlite:///{os.path.join(self.layout.dir, 'fence.db')}",
                          lease_ttl=api_lease_ttl_s())

    def close(self) -> None:
        self.api.close()
        self.log.close()

    # -- the log -----------------------------------------------------------------------------

    def _absorb(self, batch: Batch) -> None:
        if batch.reset:
            self.txs = {}
        txs = self.txs
        for rec, frame in zip(batch.records, batch.frames, strict=True):
            try:
                apply_record(txs, rec, frame)
            except (IllegalTransition, records.BadRecord) as exc:
                # Corruption; any other exception of the fold is a bug, raised as it is.
                offset = self.log.offset_of(frame)
                raise CorruptWal(f"{self.layout.wal}: the record at offset {offset}: {exc}",
                                 path=self.layout.wal, offset=offset, tid=exc.tid) from None

    def _refresh(self) -> None:
        with self._mutex, PausedGc():
            self._absorb(self.log.read())

    def _append(self, recs: Sequence[records.AnyRecord], *, sync: bool = False) -> None:
        with self._mutex:
            self._absorb(self.log.append(records.as_json(recs), sync=sync))

    # -- finding and locking a transaction ---------------------------------------------------

    def _lookup(self, tid: str) -> Tx | dict[str, Any]:
        """The live transaction, or the history entry of a finished and compacted one."""
        tx = self.txs.get(tid)
        if tx is not None:
            return tx
        entry = history.lookup(self.layout.history, tid)
        if entry is None:
            raise UnknownTid(f"no transaction {tid} in this workspace", tid=tid)
        return entry

    def locked(self, tid: str) -> "_Held":
        """``with engine.locked(tid) as tx``: hold ``tid``'s lock; ``tx`` is its live state,
        or the history entry (a dict) of a finished one, which needs no lock."""
        return _Held(self, tid, active=False)

    def active(self, tid: str) -> "_Held":
        """As ``locked``, for a transaction that must still be active (bad_state otherwise);
        one past its deadline is aborted here (timeout)."""
        return _Held(self, tid, active=True)

    def _hold(self, tid: str, active: bool) -> tuple[Tx | dict[str, Any], FileLock | None]:
        check_tid(tid)
        self._refresh()
        found = self._lookup(tid)
        if isinstance(found, dict) or found.state in FINISHED:
            if active:
                self._refuse_inactive(found)
            return found, None
        lock = self._tx_lock(tid)
        lock.acquire(what=f"transaction {tid} (another process is working on it)")
        try:
            self._refresh()
            found = self._lookup(tid)
            if not isinstance(found, dict) and found.state in IN_FLIGHT:
                # We hold its lock, so whoever was deciding or applying it has died.
                with self.commit_lock:
                    try:
                        self._finish(found, self._plan_one(found, alive=False))
                    except ApplyFailed as exc:
                        raise self._incomplete(found, exc) from exc
                found = self._lookup(tid)
            if active:
                if isinstance(found, dict) or found.state != ACTIVE:
                    self._refuse_inactive(found)
                assert not isinstance(found, dict)
                self._abort_if_stale(found)
            return found, lock
        except BaseException:
            lock.release()
            raise

    @staticmethod
    def _refuse_inactive(tx: Tx | dict[str, Any]) -> None:
        tid = tx["tid"] if isinstance(tx, dict) else tx.tid
        state = tx["state"] if isinstance(tx, dict) else tx.state
        raise BadState(f"{tid} is {state}; only an active transaction can be changed",
                       tid=tid, state=state)

    def _abort_if_stale(self, tx: Tx) -> None:
        act = recovery.stale_active(tx, now_ms(), self.boot)
        if act is not None:
            self._abort_locked(tx, act.code or "timeout", act.reason or "")
            raise TransactionAborted(act.reason or "it is stale", code=act.code or "timeout",
                                     tid=tx.tid)

    # -- begin -------------------------------------------------------------------------------

    def begin(self, timeout_ms: int | None = None, label: str | None = None) -> dict[str, Any]:
        if timeout_ms is None:
            timeout_ms = DEFAULT_TIMEOUT_MS
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not (
                0 <= timeout_ms <= TIMEOUT_MS_MAX):
            raise UsageError(f"--timeout-ms must be a whole number of milliseconds from 0 (no "
                             f"timeout) to {TIMEOUT_MS_MAX} (30 days), not {timeout_ms!r}")
        if label is not None and (not isinstance(label, str) or len(label) > 200):
            raise UsageError("--label must be a string of at most 200 characters")
        while True:
            tid = time.strftime("tx-%Y%m%d-%H%M%S-", time.gmtime()) + os.urandom(3).hex()
            if tid not in self.txs:
                break
        self._append([records.begin(tid, label=label, timeout_ms=timeout_ms or None,
                                    boot=self.boot, pid=os.getpid())])
        return {"tid": tid}

    # -- commit ------------------------------------------------------------------------------

    def commit(self, tid: str) -> dict[str, Any]:
        with self.locked(tid) as tx:
            if isinstance(tx, dict) or tx.state != ACTIVE:
                return self._answer_again(tx, COMMITTED)
            self._abort_if_stale(tx)
            # Checks run before the commit lock is taken (they may take minutes); the
            # transaction's own lock, held meanwhile, keeps its staged content as they saw it.
            ok, reason, failed = self.run_stale_checks(tid)
            if not ok:
                self._abort_locked(self.txs[tid], "verification_failed", reason or "")
                raise TransactionAborted(reason or "a check failed", code="verification_failed",
                                         tid=tid, check=_check_summary(failed))
            with self.commit_lock:
                self._finish_dead_locked()
                self._check_confined(self.txs[tid])
                self._prepare(tid)
                crashpoints.hit("prepare.before_decision")
                self._append([records.decision_commit(tid, **self.fs.decision_fields(tid))],
                             sync=True)
                crashpoints.hit("commit.after_decision")
                try:
                    self._apply(self.txs[tid], redo=False)
                except ApplyFailed as exc:
                    raise self._incomplete(self.txs[tid], exc) from exc
        self._maybe_compact()
        return self._result(self.txs.get(tid) or self._lookup(tid))

    def _apply(self, tx: Tx, redo: bool) -> None:
        """Apply a decided commit and write its end record. Holds the log lock meanwhile: the
        file participant moves blobs into the tree, and must know every transaction that still
        names one (see storage/blobs.py)."""
        with self.log.lock:
            self._refresh()
            keep = {op.blob for other in self.txs.values() if other.tid != tx.tid
                    and other.state not in FINISHED for op in other.ops if op.blob}
            applied = (self.fs.recover if redo else self.fs.commit)(tx, keep)
            crashpoints.hit("commit.before_end")
            self._append([self._end(tx.tid, COMMITTED, applied.files, applied.diverged)])
        discard(self.layout.tx_dir(tx.tid), self.layout.trash)

    def _prepare(self, tid: str) -> Tx:
        """Record the start of prepare and collect the votes; abort on the first no."""
        self._append([records.prepare(tid, pid=os.getpid())])
        vote = self._stuck_overlap(self.txs[tid]) or self._vote(self.txs[tid])
        if not vote.yes:
            code, reason = vote.code or "conflict", vote.reason or "a participant voted no"
            self._abort_locked(self.txs[tid], code, reason)
            extra = {"uncompensated": self.txs[tid].uncompensated} if (
                tid in self.txs and self.txs[tid].uncompensated) else {}
            raise TransactionAborted(reason, code=code, tid=tid, **extra)
        return self.txs[tid]

    def _vote(self, tx: Tx) -> Vote:
        """Ask the participants in turn; the first no stops the rest. The files go first: a
        conflict must abort before any remote call is made."""
        try:
            vote = self.fs.prepare(tx, self.log.sync)
        except OSError as exc:  # a participant that raises has voted no
            vote = Vote.no("prepare_failed", f"preparing the files failed: {exc}")
        if vote.yes and tx.effects:
            try:
                vote = self.api.prepare(tx, self._recorder(tx.tid))
            except (OSError, Agent2PCError) as exc:
                vote = Vote.no(getattr(exc, "code", "prepare_failed"),
                               f"the remote calls could not be made: {exc}")
        return vote

    def _recorder(self, tid: str) -> Any:
        """A callback that logs one ``result`` record of ``tid``, synced when asked."""
        def record(fields: dict[str, Any], sync: bool) -> None:
            self._append([records.result(tid, **fields)], sync=sync)
            crashpoints.hit("api.after_record")
        return record

    def _end(self, tid: str, state: str, files: list[str] | None = None,
             diverged: list[str] | None = None, uncompensated: list[int] | None = None
             ) -> records.EndRecord:
        return records.end(tid, state=state, files=files, diverged=diverged,
                           uncompensated=uncompensated)

    def _answer_again(self, tx: Tx | dict[str, Any], wanted: str) -> dict[str, Any]:
        """commit of a committed transaction, abort of an aborted one: the same answer."""
        state = tx["state"] if isinstance(tx, dict) else tx.state
        tid = tx["tid"] if isinstance(tx, dict) else tx.tid
        if state == wanted:
            return self._result(tx)
        reason = tx.get("reason") if isinstance(tx, dict) else tx.reason
        why = f" ({reason})" if reason else ""
        raise BadState(f"{tid} is {state}{why}; it cannot be "
                       f"{'committed' if wanted == COMMITTED else 'aborted'}",
                       tid=tid, state=state)

    @staticmethod
    def _result(tx: Tx | dict[str, Any]) -> dict[str, Any]:
        if isinstance(tx, dict):
            out = {"tid": tx["tid"], "state": tx["state"], "files": tx.get("files", [])}
            if tx.get("diverged"):
                out["diverged"] = tx["diverged"]
            return out
        out = {"tid": tx.tid, "state": tx.state, "files": tx.files}
        out.update(_outcome_details(tx))
        return out

    # -- abort -------------------------------------------------------------------------------

    def abort(self, tid: str, reason: str | None = None) -> dict[str, Any]:
        with self.locked(tid) as tx:
            if isinstance(tx, dict) or tx.state != ACTIVE:
                out = self._answer_again(tx, ABORTED)
            else:
                self._abort_locked(tx, "aborted", reason or "aborted by request")
                out = self._result(self.txs[tid])
        self._maybe_compact()
        out.pop("files", None)
        return out

    def _abort_locked(self, tx: Tx, code: str, reason: str) -> None:
        """Abort an active or preparing transaction whose lock we hold."""
        self.fs.forget(tx.tid)
        self._append([records.decision_abort(tx.tid, code=code, reason=reason)])
        crashpoints.hit("abort.after_decision")
        self._finish_abort(self.txs[tx.tid])

    def _finish_abort(self, tx: Tx) -> None:
        """Undo what may have happened remotely, drop the scratch, write the end record."""
        left: list[int] = []
        if tx.prepared:
            self.fs.undo_prepare(tx)
        if tx.effects and tx.prepared:
            left = self.api.compensate(tx, self._recorder(tx.tid))
        discard(self.layout.tx_dir(tx.tid), self.layout.trash)
        self._append([self._end(tx.tid, ABORTED, uncompensated=left)])

    # -- recovery ----------------------------------------------------------------------------

    def _tx_lock(self, tid: str) -> FileLock:
        """The lock a process holds while it works on ``tid``: one byte of ``txlocks``. One
        object per tid and engine (its mutex excludes this process's threads; its open file
        description, other processes)."""
        lock = self._tx_locks.get(tid)
        if lock is None:
            if len(self._tx_locks) >= TX_LOCKS_CACHED_MAX:
                self._tx_locks = {t: lk for t, lk in self._tx_locks.items() if lk.held}
            lock = self._tx_locks[tid] = FileLock(self.layout.txlocks, offset=byte_for(tid))
        return lock

    def _alive(self, tid: str) -> bool:
        """Does a live process hold ``tid``'s lock? (The lock dies with its holder.)"""
        return not self._tx_lock(tid).is_free()

    def _plan_one(self, tx: Tx, alive: bool) -> recovery.Action:
        acts = recovery.plan([tx], now_ms=now_ms(), boot=self.boot, alive=lambda _: alive,
                             include_active=True)
        assert acts, f"nothing to do for {tx.tid} in state {tx.state}"
        return acts[0]

    def _finish(self, tx: Tx, act: recovery.Action) -> None:
        """Carry out a recovery action; the caller holds the commit lock and tx's lock.
        Nothing of a transaction the log describes in a way staging never writes (a path out
        of the root, a blob name that is no hash, ...) is applied, undone or cleaned up:
        CorruptWal. ApplyFailed when a redo stops on an error."""
        # Aborting a transaction that never prepared touches no path: its tid is enough.
        self._check_confined(tx, paths=act.kind == recovery.ROLL_FORWARD or tx.prepared)
        if act.kind == recovery.ROLL_FORWARD:
            self._apply(tx, redo=True)
        elif act.kind == recovery.FINISH_ABORT:
            self._finish_abort(tx)
        else:
            self._abort_locked(tx, act.code or "interrupted", act.reason or "")

    def _recover_dead(self) -> None:
        """Finish the transactions that dead processes left between prepare and end."""
        if not self.commit_lock.try_acquire():
            return  # a live commit runs; it finishes them before its own prepare
        try:
            self._finish_dead_locked()
        finally:
            self.commit_lock.release()

    def _finish_dead_locked(self, include_active: bool = False) -> None:
        self._refresh()
        actions = recovery.plan(list(self.txs.values()), now_ms=now_ms(), boot=self.boot,
                                alive=self._alive, include_active=include_active)
        for act in actions:
            lock = self._tx_lock(act.tid)
            if lock.held or not lock.try_acquire():
                continue  # somebody is working on it right now
            try:
                self._refresh()
                tx = self.txs.get(act.tid)
                if tx is None or tx.state in FINISHED:
                    continue
                again = recovery.plan([tx], now_ms=now_ms(), boot=self.boot,
                                      alive=lambda _: False, include_active=include_active)
                if not again:
                    continue
                try:
                    self._finish(tx, again[0])
                except ApplyFailed as exc:
                    # Left 'committing' for recover to retry: the other transactions, and
                    # the command that opened the workspace, go on.
                    self._stuck[act.tid] = self._incomplete(tx, exc).details
                    continue
                self._stuck.pop(act.tid, None)
                tx = self.txs[act.tid]
                key = "rolled_forward" if tx.state == COMMITTED else "rolled_back"
                self._recovered[key].append(act.tid)
                self._recovered["diverged"].extend(tx.diverged)
            finally:
                lock.release()

    def recover(self) -> dict[str, Any]:
        """Finish or undo what crashes left; abort expired transactions; repair a torn tail.

        ``truncated_bytes`` counts what this engine cut off since it opened the log (or since
        its previous recover).
        """
        with self.commit_lock:
            self.log.lock.acquire(what="the log")
            try:
                self._refresh()  # under the log lock: repairs a torn tail
            finally:
                self.log.lock.release()
            self._finish_dead_locked(include_active=True)
            self._sweep_scratch()
        leftovers = self.sweep_views()  # staged views of dead callers (runs.py)
        self._maybe_compact()
        done, self._recovered = self._recovered, {"rolled_forward": [], "rolled_back": [],
                                                  "diverged": []}
        out: dict[str, Any] = {
            "rolled_forward": done["rolled_forward"], "rolled_back": done["rolled_back"],
            "truncated_bytes": self.log.truncated_bytes - self._truncation_reported}
        self._truncation_reported = self.log.truncated_bytes
        if done["diverged"]:
            out["diverged"] = done["diverged"]
        if any(leftovers.values()):
            out["views_removed"] = leftovers
        stuck = [info for tid, info in self._stuck.items() if self._live(tid)]
        if stuck:
            names = ", ".join(info["tid"] for info in stuck)
            raise ApplyIncomplete(
                f"{names}: decided (commit), and applying it still fails "
                f"({stuck[0]['error']}); fix the cause and run 'agent-2pc recover' again",
                transactions=stuck, **out)
        return out

    def _incomplete(self, tx: Tx, exc: ApplyFailed) -> ApplyIncomplete:
        """The answer for a decided commit whose apply stopped: what is not applied, why."""
        done = set(exc.done)
        left = [op.path for op in tx.changes() if op.path not in done]
        return ApplyIncomplete(
            f"{tx.tid} is decided (commit) but applying it stopped: {exc.cause}; not applied: "
            f"{', '.join(left) or 'nothing'}; 'agent-2pc recover' retries it",
            tid=tx.tid, state=tx.state, not_applied=left, error=str(exc.cause))

    def _stuck_overlap(self, tx: Tx) -> Vote | None:
        """A no when ``tx`` changes a path that a decided commit, still not applied because
        its apply failed, changes too: that one comes first (recover retries it)."""
        if not self._stuck:
            return None
        mine = {op.path for op in tx.ops} | {p for p, _ in tx.reads}
        for tid in self._stuck:
            other = self.txs.get(tid)
            if other is None or other.state in FINISHED:
                continue
            shared = sorted(mine.intersection(op.path for op in other.ops))
            if shared:
                return Vote.no("conflict", (
                    f"{shared[0]} is also changed by {tid}, which is committed but not "
                    "fully applied yet (its apply failed); run 'agent-2pc recover'"))
        return None

    def _check_confined(self, tx: Tx, paths: bool = True) -> None:
        """Refuse (CorruptWal, with the record's offset) a transaction that the log describes
        in a way staging never writes: it did not come from agent-2pc."""
        problem = confine.tx_problem(tx, paths)
        if problem is None:
            return
        offset = self._offset_of(tx, problem.match)
        where = f" at offset {offset}" if offset is not None else ""
        raise CorruptWal(
            f"{self.layout.wal}: the record{where} of transaction {tx.tid!r} cannot come from "
            f"agent-2pc: {problem.why}. Nothing of it is applied. If this workspace came with "
            "a repository or from someone else, remove .agent-tx/ and run 'agent-2pc init'.",
            path=self.layout.wal, offset=offset, tid=tx.tid)

    def _offset_of(self, tx: Tx, match: dict[str, Any]) -> int | None:
        """The log offset of the first record of ``tx`` with the fields of ``match``."""
        import json

        from ..storage.wal_format import HEADER_SIZE

        for frame in tx.frames:
            try:
                rec = json.loads(bytes(frame[HEADER_SIZE:]))
            except ValueError:
                continue
            if all(rec.get(k) == v for k, v in match.items()):
                with open(self.layout.wal, "rb") as f:
                    at = f.read().find(bytes(frame))
                return at if at >= 0 else None
        return None

    def _live(self, tid: str) -> bool:
        tx = self.txs.get(tid)
        return tx is not None and tx.state not in FINISHED

    def _sweep_scratch(self) -> None:
        """Remove scratch of finished or unknown transactions, copies their applies left, and
        dead processes' blob temp files."""
        try:
            names = os.listdir(self.layout.tx)
        except FileNotFoundError:
            names = []
        for name in names:
            if not self._live(name) and self._tx_lock(name).is_free():
                discard(self.layout.tx_dir(name), self.layout.trash)
        for name in os.listdir(self.layout.objects_tmp):
            if name.startswith("claim-"):
                tid = name[len("claim-"):].rsplit("-", 1)[0]  # claim-<tid>-<k>[.part]
                dead = not self._live(tid)
            else:
                pid = name.partition("-")[0]
                dead = pid.isdigit() and not pid_alive(int(pid))
            if dead:
                try:
                    os.unlink(os.path.join(self.layout.objects_tmp, name))
                except FileNotFoundError:
                    pass

    # -- compaction --------------------------------------------------------------------------

    def _maybe_compact(self) -> None:
        finished = sum(1 for tx in self.txs.values() if tx.state in FINISHED)
        if finished >= COMPACT_FINISHED_MAX or (finished and self.log.size() > COMPACT_BYTES_MAX):
            self.compact(gc=self._gc_due())

    def compact(self, gc: bool = True) -> dict[str, Any]:
        """Move finished transactions out of the log into history.jsonl; replace the log.
        With ``gc``, also collect garbage (see ``collect_garbage``)."""
        with self._mutex:
            self.log.lock.acquire(what="the log")
            try:
                self._refresh()
                before = self.log.size()
                finished = [tx for tx in self.txs.values() if tx.state in FINISHED]
                history.append(self.layout.history, [summary(tx) for tx in finished])
                crashpoints.hit("compact.after_history")
                live = {tid: tx for tid, tx in self.txs.items() if tx.state not in FINISHED}
                after = self.log.replace([f for tx in live.values() for f in tx.frames])
                self.txs = live  # the new log is exactly these: nothing to read back
            finally:
                self.log.lock.release()
        out: dict[str, Any] = {"before_bytes": before, "after_bytes": after}
        if gc:
            out.update(self.collect_garbage())
        return out

    def collect_garbage(self) -> dict[str, int]:
        """Drop blobs no live transaction names (older than a grace period), pre-images past
        their retention, dead processes' temp files. Files go to trash/ at once and are
        deleted in the background. Blobs are judged under the log lock, after reading every
        record: a stager that named one just before finds it gone when it settles, and writes
        it again (storage/blobs.py)."""
        now_s = time.time()
        bin_dir = os.path.join(self.layout.trash, f"gc-{os.getpid()}-{os.urandom(4).hex()}")
        os.makedirs(bin_dir, exist_ok=True)
        blobs = 0
        with self.log.lock:
            self._refresh()
            live = {op.blob for tx in self.txs.values() if tx.state not in FINISHED
                    for op in tx.ops if op.blob}
            for fan in os.scandir(self.layout.objects):
                if len(fan.name) != 2 or not fan.is_dir(follow_symlinks=False):
                    continue
                for entry in os.scandir(fan.path):
                    if entry.name in live or now_s - entry.stat().st_ctime < BLOB_GRACE_S:
                        continue
                    os.rename(entry.path, os.path.join(bin_dir, entry.name))
                    blobs += 1
        preimages = 0
        for entry in os.scandir(self.layout.preimages):
            if self._live(entry.name.partition(".")[0]):  # preimages/<tid>.<k>
                continue
            if now_s - entry.stat().st_ctime >= PREIMAGE_RETENTION_S:
                os.rename(entry.path, os.path.join(bin_dir, "pre-" + entry.name))
                preimages += 1
        self._sweep_scratch()
        if blobs or preimages:
            sweep_in_background(self.layout.trash)
        else:
            os.rmdir(bin_dir)
        with open(self.layout.gc_stamp, "w"):
            pass
        return {"blobs_collected": blobs, "preimages_collected": preimages}

    def _gc_due(self) -> bool:
        try:
            return time.time() - os.stat(self.layout.gc_stamp).st_mtime >= GC_INTERVAL_S
        except FileNotFoundError:
            return True

    # -- listing -----------------------------------------------------------------------------

    def transactions(self, state: str | None = None, *, finished: bool = True
                     ) -> list[dict[str, Any]]:
        self._refresh()
        rows = {tid: tx.summary() for tid, tx in self.txs.items()}
        if finished:
            for entry in history.all_entries(self.layout.history):
                if entry["tid"] not in rows:
                    rows[entry["tid"]] = {k: entry.get(k) for k in
                                          ("tid", "state", "label", "created_at", "ops")}
        out = [r for r in rows.values() if state is None or r["state"] == state]
        out.sort(key=lambda r: (r["created_at"] or "", r["tid"]))
        return out


class _Held:
    """The context manager of Engine.locked/active (contextlib costs milliseconds to import)."""

    __slots__ = ("_engine", "_tid", "_active", "_lock")

    def __init__(self, engine: Engine, tid: str, active: bool) -> None:
        self._engine, self._tid, self._active = engine, tid, active
        self._lock: FileLock | None = None

    def __enter__(self) -> Any:
        found, self._lock = self._engine._hold(self._tid, self._active)
        return found

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def _check_summary(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {k: rec.get(k) for k in ("command", "exit_code", "timed_out", "log", "tail")}


def summary(tx: Tx) -> dict[str, Any]:
    """The history line of a finished transaction."""
    out = tx.summary()
    out.update({"ended_at": iso_ms(tx.ended_ms) if tx.ended_ms else None, "files": tx.files,
                "code": tx.code, "reason": tx.reason})
    out.update(_outcome_details(tx))
    return out


def _outcome_details(tx: Tx) -> dict[str, Any]:
    """What a finished transaction's answer adds when there is something to say."""
    out: dict[str, Any] = {}
    if tx.diverged:
        out["diverged"] = tx.diverged
    if tx.effects:
        out["effects"] = effects_summary(tx)
    if tx.uncompensated:
        out["uncompensated"] = tx.uncompensated
    return out
