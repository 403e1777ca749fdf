"""Recovery: finishing what dead processes left between prepare and end, aborting stale
transactions, repairing a torn tail, and the report of ``recover``.

What to do with each transaction is planned by a pure function (core/recovery.py); this part
carries the plan out through the two-phase part. It takes the commit lock and then only
*tries* transaction locks: a transaction whose lock is held has a live worker and is left
alone.
"""

from __future__ import annotations

import time

from ..core import recovery as plans
from ..core.records import now_ms
from ..core.states import COMMITTED, FINISHED, Tx
from ..errors import ApplyIncomplete
from ..participants.base import ApplyFailed
from .outside import in_doubt

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .compaction import Compaction
    from .journal import Journal
    from .twophase import TwoPhase


# A redo that failed (a lock, a database out of reach) is tried again by the commands that
# finish dead transactions on their way (start-up, a commit, the daemon's reaper) only after a
# back-off: 1 s, doubled at each failure up to a minute. A failure can cost its wait (a ref lock
# is waited for 1 s, git/run.py), under the commit lock. ``recover`` always tries at once.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0


def _nothing_recovered() -> dict[str, list[str]]:
    return {"rolled_forward": [], "rolled_back": [], "diverged": []}


class Recovery:
    def __init__(self, journal: Journal, twophase: TwoPhase, compaction: Compaction) -> None:
        self.journal = journal
        self.twophase = twophase
        self.compaction = compaction
        # What this engine finished on its own (at start-up, or before a commit) since the
        # last report: recover() reports it too.
        self._recovered = _nothing_recovered()
        self._truncation_reported = 0
        self._retry: dict[str, tuple[float, float]] = {}  # tid -> (not before, back-off)

    def plan_one(self, tx: Tx, alive: bool) -> plans.Action:
        acts = plans.plan([tx], now_ms=now_ms(), boot=self.journal.boot, alive=lambda _: alive,
                          include_active=True)
        assert acts, f"nothing to do for {tx.tid} in state {tx.state}"
        return acts[0]

    def finish(self, tx: Tx, act: plans.Action) -> None:
        """Carry out a recovery action; the caller holds the commit lock and tx's lock.
        Nothing of a transaction the log describes in a way staging never writes (a path out
        of the root, a blob name that is no hash, ...) is applied, undone or cleaned up:
        CorruptWal. ApplyFailed when a redo stops on an error."""
        # Aborting a transaction that never prepared touches no path: its tid is enough.
        self.journal.check_confined(tx, paths=act.kind == plans.ROLL_FORWARD or tx.prepared)
        if act.kind == plans.ROLL_FORWARD:
            self.twophase.apply(tx, redo=True)
        elif act.kind == plans.FINISH_ABORT:
            self.twophase.finish_abort(tx)
        else:
            self.twophase.abort(tx, act.code or "interrupted", act.reason or "")

    def finish_orphan(self, tx: Tx) -> None:
        """Finish ``tx``, in flight with no live worker (the caller holds its lock)."""
        with self.journal.commit_lock:
            try:
                self.finish(tx, self.plan_one(tx, alive=False))
            except ApplyFailed as exc:
                raise self.twophase.incomplete(tx, exc) from exc

    def recover_dead(self) -> None:
        """Finish the transactions that dead processes left between prepare and end."""
        commit_lock = self.journal.commit_lock
        if not commit_lock.try_acquire():
            return  # a live commit runs; it finishes them before its own prepare
        try:
            self.finish_dead_locked()
        finally:
            commit_lock.release()

    def finish_dead_locked(self, include_active: bool = False, now: bool = False) -> None:
        """Finish every transaction whose worker died (the caller holds the commit lock);
        with ``include_active``, abort the stale active ones too; with ``now``, retry failed
        redos without their back-off."""
        journal = self.journal
        journal.refresh()
        for tid in [tid for tid in self._retry if tid not in journal.txs]:
            del self._retry[tid]  # finished elsewhere
        actions = plans.plan(list(journal.txs.values()), now_ms=now_ms(), boot=journal.boot,
                             alive=journal.alive, include_active=include_active)
        for act in actions:
            lock = journal.tx_lock(act.tid)
            if not now and time.monotonic() < self._retry.get(act.tid, (0.0, 0.0))[0]:
                continue  # still in self.twophase.stuck, and reported as such
            if lock.held or not lock.try_acquire():
                continue  # somebody is working on it right now
            try:
                self._finish_dead(act.tid, include_active)
            finally:
                lock.release()

    def _finish_dead(self, tid: str, include_active: bool) -> None:
        """One transaction of ``finish_dead_locked``, its lock held: planned again now."""
        journal = self.journal
        journal.refresh()
        tx = journal.txs.get(tid)
        if tx is None or tx.state in FINISHED:
            return
        again = plans.plan([tx], now_ms=now_ms(), boot=journal.boot, alive=lambda _: False,
                           include_active=include_active)
        if not again:
            return
        try:
            self.finish(tx, again[0])
        except ApplyFailed as exc:
            # Left 'committing' for recover to retry: the other transactions, and the
            # command that opened the workspace, go on.
            self.twophase.stuck[tid] = self.twophase.incomplete(tx, exc).details
            wait = min(self._retry.get(tid, (0.0, RETRY_FIRST_S / 2))[1] * 2, RETRY_MAX_S)
            self._retry[tid] = (time.monotonic() + wait, wait)
            return
        self.twophase.stuck.pop(tid, None)
        self._retry.pop(tid, None)
        tx = journal.txs[tid]
        key = "rolled_forward" if tx.state == COMMITTED else "rolled_back"
        self._recovered[key].append(tid)
        self._recovered["diverged"].extend(tx.diverged)

    def finish_all(self) -> None:
        """The first half of ``recover``: under the commit lock, repair a torn tail, finish
        or undo what crashes left, abort expired transactions, sweep the scratch."""
        journal = self.journal
        with journal.commit_lock:
            journal.log.lock.acquire(what="the log")
            try:
                journal.refresh()  # under the log lock: repairs a torn tail
            finally:
                journal.log.lock.release()
            self.finish_dead_locked(include_active=True, now=True)
            self.compaction.sweep_scratch()

    def report(self, views_removed: dict[str, int]) -> dict[str, Any]:
        """What ``recover`` answers: what was finished since the last report (and
        ``views_removed``, what staged views of dead callers left); ``truncated_bytes``, what
        the log cut off since then. ApplyIncomplete when decided commits still fail to
        apply."""
        done, self._recovered = self._recovered, _nothing_recovered()
        truncated = self.journal.log.truncated_bytes
        out: dict[str, Any] = {
            "rolled_forward": done["rolled_forward"], "rolled_back": done["rolled_back"],
            "truncated_bytes": truncated - self._truncation_reported}
        self._truncation_reported = truncated
        if done["diverged"]:
            out["diverged"] = done["diverged"]
        if any(views_removed.values()):
            out["views_removed"] = views_removed
        waiting = in_doubt(self.journal.txs.values())
        if waiting:  # prepared, in doubt: left to their coordinators (outside.py)
            out["in_doubt"] = waiting
        stuck = [info for tid, info in self.twophase.stuck.items() if self.journal.live(tid)]
        if stuck:
            names = ", ".join(info["tid"] for info in stuck)
            raise ApplyIncomplete(
                f"{names}: decided, and carrying the decision out still fails "
                f"({stuck[0]['error']}); fix the cause and run 'agent-2pc recover' again",
                transactions=stuck, **out)
        return out
