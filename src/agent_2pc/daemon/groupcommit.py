"""Group commit: the commits that wait together share one fsync of the log.

Each commit request runs its checks holding its transaction's lock, then queues a ticket and
waits. One waiting thread at a time leads: it takes the commit lock, picks from the queue the
transactions that touch disjoint paths (a transaction with a remote effect goes alone), prepares
each in turn (each votes as it would alone: none of the batch is applied yet, and they touch
nothing in common), appends all their decisions in one write, and syncs the log once, without
the engine's mutex, so that the requests arriving meanwhile go on staging and queue for the
next batch. Then it applies the batch, the transactions' applies running side by side (their
directory syncs overlap), writes their end records in one append, and answers each ticket.
A ticket is answered "committed" only after the fsync that made its decision durable.

A crash anywhere leaves each transaction of the batch whole or absent: before the fsync, a
decision may or may not be on disk (a torn tail loses the ones after the tear) and recovery
rolls back those without one; after it, every decision rolls forward. No client was answered
before the fsync.
"""

from __future__ import annotations

import os
import threading

from .. import crashpoints
from ..core import records
from ..core.states import ACTIVE, COMMITTED
from ..errors import Agent2PCError, IoFailed, TransactionAborted, UsageError
from ..participants.base import ApplyFailed
from ..storage.durable import FsyncFailed, fsync_fd
from ..storage.scratch import discard

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..coordinator.engine import Engine
    from ..core.states import Tx

BATCH_MAX = 64


def _ancestors(path: str) -> set[str]:
    out = set()
    while "/" in path:
        path = path.rsplit("/", 1)[0]
        out.add(path)
    return out


class Ticket:
    """One commit waiting in the queue: what it touches, and, once done, its outcome."""

    __slots__ = ("tid", "paths", "closure", "parents", "delete_parents", "solo", "done",
                 "error", "decided", "merge")

    def __init__(self, tx: Tx, merge: bool = True) -> None:
        self.tid = tx.tid
        self.merge = merge  # merge another writer's edits under the commit lock (rebase.py)
        self.paths = {op.path for op in tx.ops} | {p for p, _ in tx.reads}
        self.paths |= {op.target for op in tx.ops if isinstance(op.target, str)}
        self.parents = set().union(*map(_ancestors, self.paths)) if self.paths else set()
        self.closure = self.paths | self.parents
        self.delete_parents = set().union(*(
            _ancestors(op.path) for op in tx.ops if op.op == "delete")) if tx.ops else set()
        self.solo = bool(tx.effects)  # a remote call or a git commit: alone in its batch
        self.done = False
        self.decided = False
        self.error: BaseException | None = None

    def overlaps(self, other: Ticket) -> bool:
        """Could the order of the two matter? A path of one is (or is under) a path of the
        other, or one deletes in a directory the other writes under."""
        return bool(self.paths & other.closure or other.paths & self.closure
                    or self.delete_parents & other.parents
                    or other.delete_parents & self.parents)


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.commits = 0  # decided and answered "committed" by a group commit
        self.aborted = 0  # refused at prepare (a no vote)
        self.batches = 0  # decision appends
        self.fsyncs = 0  # fsyncs of the log for decisions (one per batch)
        self.largest_batch = 0


class GroupCommit:
    def __init__(self, engine: Engine, mutex: threading.RLock) -> None:
        self.engine = engine
        self.mutex = mutex
        self.stats = Stats()
        self._cv = threading.Condition(threading.Lock())
        self._queue: list[Ticket] = []
        self._leading = False

    def tx_lock(self, tid: str) -> Any:
        """``tid``'s lock object: the one the engine's own steps will take (reentrant) once a
        request holds it (under the mutex: the journal's cache of them is not thread-safe)."""
        with self.mutex:
            return self.engine.journal.tx_lock(tid)

    # -- a commit request --------------------------------------------------------------------

    def commit(self, tid: str, merge: bool = True) -> dict[str, Any]:
        """engine.commit's steps, the prepare and the decision's fsync shared by a batch."""
        from ..coordinator.answers import answer_again, result, with_merged
        from ..coordinator.gate import check_tid

        if type(merge) is not bool:
            raise UsageError(f"`merge` is true or false, not {merge!r}", params=("merge",))
        engine = self.engine
        lock = self.tx_lock(check_tid(tid))
        lock.acquire(what=f"transaction {tid} (another process is working on it)")
        try:
            with self.mutex:
                with engine.gate.locked(tid) as tx:
                    if isinstance(tx, dict) or tx.state != ACTIVE:
                        return with_merged(answer_again(tx, COMMITTED))
                    engine.gate.abort_if_stale(tx)
                    if merge and engine.txs[tid].checks:  # checks re-run outside the lock
                        engine.rebase.rebase(tid)
                    self._run_stale_checks(tid)
                    ticket = Ticket(engine.txs[tid], merge)
            self._wait(ticket)
        finally:
            lock.release()
        with self.mutex:
            engine.compaction.maybe_compact()
            return with_merged(result(engine.txs.get(tid) or engine.journal.lookup(tid)))

    def _run_stale_checks(self, tid: str) -> None:
        from ..coordinator.answers import check_summary

        engine = self.engine
        ok, reason, failed = engine.runs.run_stale_checks(tid)
        if not ok:
            engine.twophase.abort(engine.txs[tid], "verification_failed", reason or "")
            raise TransactionAborted(reason or "a check failed", code="verification_failed",
                                     tid=tid, check=check_summary(failed))

    def _wait(self, ticket: Ticket) -> None:
        """Queue ``ticket``; lead batches while nobody else does, until it is done."""
        with self._cv:
            self._queue.append(ticket)
            while not ticket.done and self._leading:
                self._cv.wait()
            if ticket.done:
                leader = False
            else:
                leader = self._leading = True
        try:
            while not ticket.done:
                with self._cv:
                    batch = self._take()
                self._commit_batch(batch)
                with self._cv:
                    self._cv.notify_all()
        finally:
            if leader:
                with self._cv:
                    self._leading = False
                    self._cv.notify_all()
        if ticket.error is not None:
            raise ticket.error

    def _take(self) -> list[Ticket]:
        """The next batch: from the queue in arrival order, those that overlap nothing taken
        before them; one with remote effects alone."""
        batch: list[Ticket] = []
        rest: list[Ticket] = []
        for t in self._queue:
            if len(batch) >= BATCH_MAX or (batch and (t.solo or batch[0].solo)) or any(
                    t.overlaps(b) for b in batch):
                rest.append(t)
            else:
                batch.append(t)
        self._queue = rest
        return batch

    # -- the leader's work -------------------------------------------------------------------

    def _commit_batch(self, batch: list[Ticket]) -> None:
        engine = self.engine
        journal = engine.journal
        try:
            journal.commit_lock.acquire(what="the commit lock")
        except BaseException as exc:
            self._finish(batch, exc)
            return
        try:
            decided = self._prepare(batch)
            if decided and self._sync(decided):
                crashpoints.hit("commit.after_decision")
                with self.mutex:
                    self._apply(decided)
        except BaseException as exc:  # an fsync or a disk that failed: every one left
            self._finish([t for t in batch if not t.done], exc)
            raise
        finally:
            journal.commit_lock.release()
            self._finish(batch, None)

    def _prepare(self, batch: list[Ticket]) -> list[Ticket]:
        """Prepare each, then append the decisions of those that voted yes (no sync)."""
        engine = self.engine
        journal, twophase = engine.journal, engine.twophase
        decided: list[Ticket] = []
        decisions: list[Any] = []
        with self.mutex:
            engine.recovery.finish_dead_locked()
            for t in batch:
                try:
                    if t.merge and engine.rebase.rebase(t.tid):  # a commit got in meanwhile
                        self._run_stale_checks(t.tid)
                    journal.check_confined(journal.txs[t.tid])
                    twophase.prepare(t.tid)
                except Agent2PCError as exc:
                    t.error = exc
                    t.done = True
                    with self.stats.lock:
                        self.stats.aborted += 1
                    continue
                crashpoints.hit("prepare.before_decision")
                fields: dict[str, Any] = {}
                for participant in engine.participants:
                    fields.update(participant.decision_fields(t.tid))
                decisions.append(records.decision_commit(t.tid, **fields))
                decided.append(t)
            if decisions:
                journal.append(decisions, sync=False)
        return decided

    def _sync(self, decided: list[Ticket]) -> bool:
        """fsync the log, the engine's mutex free meanwhile: other requests go on."""
        fd = os.open(self.engine.layout.wal, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fsync_fd(fd)
        except FsyncFailed as exc:
            with self.mutex:
                self.engine.journal.log._distrust()  # noqa: SLF001 (the log's own rule)
            err = IoFailed.from_os_error(exc)
            for t in decided:
                t.error, t.done = err, True
            return False
        finally:
            os.close(fd)
        for t in decided:
            t.decided = True
        with self.stats.lock:
            self.stats.batches += 1
            self.stats.fsyncs += 1
            self.stats.largest_batch = max(self.stats.largest_batch, len(decided))
        return True

    def _apply(self, decided: list[Ticket]) -> None:
        """Apply the decided ones side by side; their end records in one append (as
        TwoPhase.apply does for one: under the log lock)."""
        from ..coordinator.twophase import end_record

        engine = self.engine
        journal = engine.journal
        ends: list[Any] = []
        with journal.log.lock:
            journal.refresh()
            outcomes: dict[str, tuple[list[str], list[str]] | BaseException] = {}

            def apply_one(t: Ticket) -> None:
                tx = journal.txs[t.tid]
                ctx = journal.context(t.tid)
                files: list[str] = []
                diverged: list[str] = []
                try:
                    for participant in engine.participants:
                        applied = participant.apply(tx, ctx, False)
                        files += applied.files
                        diverged += applied.diverged
                except BaseException as exc:
                    outcomes[t.tid] = exc
                    return
                outcomes[t.tid] = (files, diverged)

            threads = [threading.Thread(target=apply_one, args=(t,)) for t in decided[1:]]
            for th in threads:
                th.start()
            apply_one(decided[0])
            for th in threads:
                th.join()
            crashpoints.hit("commit.before_end")
            for t in decided:
                out = outcomes[t.tid]
                if isinstance(out, ApplyFailed):
                    t.error = engine.twophase.incomplete(journal.txs[t.tid], out)
                elif isinstance(out, BaseException):
                    t.error = out
                else:
                    ends.append(end_record(t.tid, COMMITTED, out[0], out[1]))
            if ends:
                journal.append(ends)
        layout = journal.layout
        for t in decided:
            if t.error is None:
                discard(layout.tx_dir(t.tid), layout.trash)
        with self.stats.lock:
            self.stats.commits += len(ends)

    def _finish(self, batch: list[Ticket], exc: BaseException | None) -> None:
        """Mark the batch done; those still unanswered get ``exc`` as their error."""
        if exc is not None and not isinstance(exc, Agent2PCError):
            exc = IoFailed.from_os_error(exc) if isinstance(exc, OSError) else IoFailed(
                f"the commit stopped: {exc!r}")
        for t in batch:
            if not t.done:
                if t.error is None:
                    t.error = exc
                t.done = True
