"""Merge instead of abort at commit: the transaction's edits rebased onto what other writers
changed since they were staged (participants/fs_rebase.py decides what merges and how).

Each merged file is staged again, as a ``stage`` record with ``via: "merge"``, the merged
content as its blob and what is on disk now as its ``pre`` (the record shape every reader
knows): from then on the merge is part of the transaction. Its checks see new staged content,
so the checks bound to it run again before the decision (runs.py); prepare compares the tree
with the new ``pre``; the decision and apply carry the merged blob like any staged write, and a
redo after a crash places the same merged content.

The engine merges under the commit lock, just before prepare; a transaction with checks is
merged once before the lock too, so that in the usual case (the other commit finished before
this one began) its checks run again without holding the lock, and only a commit that got in
meanwhile makes them run under it. The content the merged file was staged from (the other
writer's) is kept as a blob too, named by the new ``pre``, so a second merge has its base.
"""

from __future__ import annotations

from ..errors import TransactionAborted
from ..participants.fs_rebase import NotMerged, plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..core.records import StageRecord
    from ..storage.blobs import BlobStore, Pending
    from .journal import Journal
    from .staging import Staging
    from .twophase import TwoPhase


class Rebase:
    def __init__(self, root: str, blobs: BlobStore, journal: Journal, staging: Staging,
                 twophase: TwoPhase) -> None:
        self.root = root
        self.blobs = blobs
        self.journal = journal
        self.staging = staging
        self.twophase = twophase

    def rebase(self, tid: str) -> list[str]:
        """Merge what other writers changed under ``tid``'s files into its staged content
        (the caller holds its lock); the paths merged now. An edit that cannot be merged
        aborts the transaction: TransactionAborted with code ``conflict``."""
        tx = self.journal.txs[tid]
        try:
            planned = plan(self.root, self.blobs, tx)
        except NotMerged as exc:
            self.twophase.abort(tx, "conflict", str(exc))
            raise TransactionAborted(str(exc), code="conflict", tid=tid) from None
        if not planned:
            return []
        records: list[StageRecord] = []
        pending: list[Pending] = []
        for r in planned:
            blob = self.blobs.put_bytes(r.content)
            pending += [blob, self.blobs.put_bytes(r.now_content)]  # content, and new base
            records.append(self.staging.stage_record(tid, r.op.path, "write", "merge",
                                                     blob.digest, blob.size, r.op.mode, r.now))
        self.staging.append_staged(records, pending)
        return [r.op.path for r in planned]
