"""Two-phase commit over the participants: begin, prepare (the votes), the decision, apply,
abort and undo. Knows no kind of participant: it drives the list it is given, in order.

The callers hold the locks (journal.py): the transaction's own for every step here, and the
commit lock from prepare to the end record.
"""

from __future__ import annotations

import os

from .. import crashpoints
from ..core import records
from ..core.states import ABORTED, COMMITTED, FINISHED, Tx
from ..errors import ApplyIncomplete, TransactionAborted, UsageError
from ..participants.base import YES, ApplyFailed, Vote
from ..storage.scratch import discard
from .journal import tid_of_new_transaction
from .outside import prepared_overlap

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..participants.base import Participant
    from .journal import Journal

DEFAULT_TIMEOUT_MS = 24 * 3600 * 1000
TIMEOUT_MS_MAX = 30 * 24 * 3600 * 1000  # a deadline further out is 0 (none) or a typo


class TwoPhase:
    def __init__(self, journal: Journal, participants: list[Participant]) -> None:
        self.journal = journal
        self.participants = participants
        # Decided commits whose apply (or redo) stopped on an error in this process: tid ->
        # what is not applied. They stay 'committing'; recover() retries them and reports.
        self.stuck: dict[str, dict[str, Any]] = {}

    def close(self) -> None:
        for participant in self.participants:
            participant.close()

    # -- begin -------------------------------------------------------------------------------

    def begin(self, timeout_ms: int | None = None, label: str | None = None,
              undoes: str | None = None) -> dict[str, Any]:
        if timeout_ms is None:
            timeout_ms = DEFAULT_TIMEOUT_MS
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not (
                0 <= timeout_ms <= TIMEOUT_MS_MAX):
            raise UsageError(f"`timeout_ms` must be a whole number of milliseconds from 0 (no "
                             f"timeout) to {TIMEOUT_MS_MAX} (30 days), not {timeout_ms!r}",
                             params=("timeout_ms",))
        if label is not None and (not isinstance(label, str) or len(label) > 200):
            raise UsageError("`label` must be a string of at most 200 characters",
                             params=("label",))
        tid = tid_of_new_transaction(self.journal.txs)
        self.journal.append([records.begin(tid, label=label, timeout_ms=timeout_ms or None,
                                        boot=self.journal.boot, pid=os.getpid(),
                                        undoes=undoes)])
        return {"tid": tid}

    # -- commit ------------------------------------------------------------------------------

    def prepare_and_commit(self, tid: str) -> None:
        """Prepare ``tid``, decide, apply; the caller holds its lock and the commit lock.
        TransactionAborted on a no vote; ApplyIncomplete when the apply stops."""
        self.journal.check_confined(self.journal.txs[tid])
        self.prepare(tid)
        crashpoints.hit("prepare.before_decision")
        fields: dict[str, Any] = {}
        for participant in self.participants:
            fields.update(participant.decision_fields(tid))
        self.journal.append([records.decision_commit(tid, **fields)],
                            sync=True)
        crashpoints.hit("commit.after_decision")
        try:
            self.apply(self.journal.txs[tid], redo=False)
        except ApplyFailed as exc:
            raise self.incomplete(self.journal.txs[tid], exc) from exc

    def prepare_and_vote(self, tid: str, coordinator: dict[str, Any]) -> None:
        """Prepare ``tid`` and vote yes for ``coordinator`` (coordinator/outside.py); the
        caller holds its lock and the commit lock. TransactionAborted on a no vote. What the
        commit decision would carry goes into the vote record, so that any process can
        decide; what the participants keep in memory for this process is dropped (git's ref
        lock too: a commit decided later moves the ref by compare-and-swap)."""
        self.journal.check_confined(self.journal.txs[tid])
        self.prepare(tid)
        crashpoints.hit("vote.before_record")
        fields: dict[str, Any] = {}
        for participant in self.participants:
            fields.update(participant.decision_fields(tid))
        self.journal.append([records.vote(tid, pid=os.getpid(), coordinator=coordinator,
                                          decided=fields)], sync=True)
        crashpoints.hit("vote.after_record")
        for participant in self.participants:
            participant.forget(tid)

    def decide_commit(self, tid: str) -> None:
        """Carry out a commit decision for a prepared ``tid`` (its lock and the commit lock
        held): the decision record with what the vote kept, then the apply as a redo (time
        passed since the vote: every target is looked at again)."""
        tx = self.journal.txs[tid]
        self.journal.check_confined(tx)
        self.journal.append([records.decision_commit(tid, **tx.voted)], sync=True)
        crashpoints.hit("commit.after_decision")
        try:
            self.apply(self.journal.txs[tid], redo=True)
        except ApplyFailed as exc:
            raise self.incomplete(self.journal.txs[tid], exc) from exc

    def prepare(self, tid: str) -> Tx:
        """Record the start of prepare and collect the votes; abort on the first no."""
        self.journal.append([records.prepare(tid, pid=os.getpid())])
        tx = self.journal.txs[tid]
        vote = (self._stuck_overlap(tx) or prepared_overlap(tx, self.journal.txs.values())
                or self._vote(tx))
        if not vote.yes:
            code, reason = vote.code or "conflict", vote.reason or "a participant voted no"
            try:
                self.abort(self.journal.txs[tid], code, reason)
            except ApplyFailed as exc:  # an undo stopped (a database out of reach): the
                # transaction stays 'aborting' and recover retries the undo
                self.stuck[tid] = self.incomplete(self.journal.txs[tid], exc).details
            txs = self.journal.txs
            extra = {"uncompensated": txs[tid].uncompensated} if (
                tid in txs and txs[tid].uncompensated) else {}
            raise TransactionAborted(reason, code=code, tid=tid, **extra)
        return self.journal.txs[tid]

    def _vote(self, tx: Tx) -> Vote:
        """Ask the participants in turn; the first no stops the rest."""
        ctx = self.journal.context(tx.tid)
        vote = YES
        for participant in self.participants:
            vote = participant.prepare(tx, ctx)
            if not vote.yes:
                break
        return vote

    def apply(self, tx: Tx, redo: bool) -> None:
        """Apply a decided commit and write its end record. Holds the log lock meanwhile: the
        file participant moves blobs into the tree, and must know every transaction that still
        names one (see storage/blobs.py)."""
        ctx = self.journal.context(tx.tid)
        with self.journal.log.lock:
            self.journal.refresh()
            files: list[str] = []
            diverged: list[str] = []
            for participant in self.participants:
                applied = participant.apply(tx, ctx, redo)
                files += applied.files
                diverged += applied.diverged
            crashpoints.hit("commit.before_end")
            self.journal.append([end_record(tx.tid, COMMITTED, files, diverged)])
        layout = self.journal.layout
        discard(layout.tx_dir(tx.tid), layout.trash)

    def incomplete(self, tx: Tx, exc: ApplyFailed) -> ApplyIncomplete:
        """The answer for a decided commit whose apply stopped: what is not applied, why."""
        done = set(exc.done)
        left = [op.path for op in tx.changes() if op.path not in done]
        return ApplyIncomplete(
            f"{tx.tid} is decided ({tx.outcome or 'commit'}) but carrying it out stopped: "
            f"{exc.cause}; not applied: "
            f"{', '.join(left) or 'nothing'}; 'agent-2pc recover' retries it",
            tid=tx.tid, state=tx.state, not_applied=left, error=str(exc.cause))

    def _stuck_overlap(self, tx: Tx) -> Vote | None:
        """A no when ``tx`` changes a path that a decided commit, still not applied because
        its apply failed, changes too: that one comes first (recover retries it)."""
        if not self.stuck:
            return None
        mine = {op.path for op in tx.ops} | {p for p, _ in tx.reads}
        for tid in self.stuck:
            other = self.journal.txs.get(tid)
            if other is None or other.state in FINISHED:
                continue
            shared = sorted(mine.intersection(op.path for op in other.ops))
            if shared:
                return Vote.no("conflict", (
                    f"{shared[0]} is also changed by {tid}, which is committed but not "
                    "fully applied yet (its apply failed); run 'agent-2pc recover'"))
        return None

    # -- abort -------------------------------------------------------------------------------

    def abort(self, tx: Tx, code: str, reason: str) -> None:
        """Abort an active, preparing or prepared transaction whose lock we hold."""
        for participant in self.participants:
            participant.forget(tx.tid)
        self.journal.append([records.decision_abort(tx.tid, code=code,
                                        reason=reason)])
        crashpoints.hit("abort.after_decision")
        self.finish_abort(self.journal.txs[tx.tid])

    def finish_abort(self, tx: Tx) -> None:
        """Undo what prepare did (placed files, remote calls), drop the scratch, write the
        end record."""
        fields: dict[str, Any] = {}
        if tx.prepared:
            ctx = self.journal.context(tx.tid)
            for participant in self.participants:
                fields.update(participant.undo(tx, ctx))
        layout = self.journal.layout
        discard(layout.tx_dir(tx.tid), layout.trash)
        self.journal.append([end_record(tx.tid, ABORTED, **fields)])


def end_record(tid: str, state: str, files: list[str] | None = None,
               diverged: list[str] | None = None, **fields: Any) -> records.EndRecord:
    """The end record: the state, the files applied, what diverged, and what the
    participants' undo adds (e.g. ``uncompensated``)."""
    return records.end(tid, state=state, files=files, diverged=diverged, **fields)
