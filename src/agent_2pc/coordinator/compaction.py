"""Keeping a workspace small: compaction of the log into history.jsonl, garbage collection of
blobs and pre-images, and the sweep of scratch that finished transactions left."""

from __future__ import annotations

import os
import time

from ..core.states import FINISHED, named_blobs
from ..storage.pids import pid_alive
from ..storage.scratch import discard, sweep_in_background

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .journal import Journal

# Automatic compaction keeps the log short, so that a step costs the same with 10k finished
# transactions in the history as in a new workspace.
COMPACT_FINISHED_MAX = 64
COMPACT_BYTES_MAX = 1 << 20
# Garbage: blobs unnamed by live transactions after an hour. Pre-images are what `undo` needs
# (coordinator/undo.py): kept for a week, and those of the latest 100 committed transactions
# however old (docs/collaboration.md, "Undo and log").
BLOB_GRACE_S = float(os.environ.get("AGENT2PC_BLOB_GRACE_S", 3600))
PREIMAGE_RETENTION_S = float(os.environ.get("AGENT2PC_PREIMAGE_RETENTION_S", 7 * 24 * 3600))
UNDO_KEEP = int(os.environ.get("AGENT2PC_UNDO_KEEP", 100))
GC_INTERVAL_S = 3600.0


class Compaction:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.layout = journal.layout

    def maybe_compact(self) -> None:
        """Compact when the log holds many finished transactions, or is big and holds some."""
        journal = self.journal
        finished = sum(1 for tx in journal.txs.values() if tx.state in FINISHED)
        if finished >= COMPACT_FINISHED_MAX or (
                finished and journal.log.size() > COMPACT_BYTES_MAX):
            self.compact(gc=self._gc_due())

    def compact(self, gc: bool = True) -> dict[str, Any]:
        """Move finished transactions out of the log into history.jsonl; replace the log.
        With ``gc``, also collect garbage (see ``collect_garbage``)."""
        before, after = self.journal.move_finished_to_history()
        out: dict[str, Any] = {"before_bytes": before, "after_bytes": after}
        if gc:
            out.update(self.collect_garbage())
        return out

    def collect_garbage(self) -> dict[str, int]:
        """Drop blobs no live transaction names (older than a grace period), pre-images past
        their retention, dead processes' temp files. Files go to trash/ at once and are
        deleted in the background. Blobs are judged under the log lock, after reading every
        record: a stager that named one just before finds it gone when it settles, and writes
        it again (storage/blobs.py). The store is scanned for blobs past the grace period
        before the lock is taken, so that the lock is held for what may be garbage, not for a
        walk of every blob (100,000 blobs held every append back 0.3 s on tmpfs)."""
        layout = self.layout
        now_s = time.time()
        bin_dir = os.path.join(layout.trash, f"gc-{os.getpid()}-{os.urandom(4).hex()}")
        os.makedirs(bin_dir, exist_ok=True)
        old = self._old_blobs(now_s)
        blobs = 0
        with self.journal.log.lock:
            self.journal.refresh()
            live = {name for tx in self.journal.txs.values() if tx.state not in FINISHED
                    for op in tx.ops for name in named_blobs(op) if name}
            for path in old:
                name = os.path.basename(path)
                if name in live:
                    continue
                try:  # made again since the scan (another collector took it)? then it is new
                    if now_s - os.stat(path).st_ctime < BLOB_GRACE_S:
                        continue
                except FileNotFoundError:
                    continue
                blobs += _to_bin(path, bin_dir, name)
        preimages = 0
        latest = self.latest_committed(UNDO_KEEP)
        for entry in os.scandir(layout.preimages):
            tid = entry.name.partition(".")[0]  # preimages/<tid>.<k>
            if tid in latest or self.journal.live(tid):
                continue
            if now_s - entry.stat().st_ctime >= PREIMAGE_RETENTION_S:
                preimages += _to_bin(entry.path, bin_dir, "pre-" + entry.name)
        self.sweep_scratch()
        if blobs or preimages:
            sweep_in_background(layout.trash)
        else:
            try:
                os.rmdir(bin_dir)
            except FileNotFoundError:
                pass  # a sweeper emptying trash/ took it
        with open(layout.gc_stamp, "w"):
            pass
        return {"blobs_collected": blobs, "preimages_collected": preimages}

    def _old_blobs(self, now_s: float) -> list[str]:
        """The paths of the blobs older than the grace period (named or not: that is judged
        under the lock)."""
        out = []
        for fan in os.scandir(self.layout.objects):
            if len(fan.name) != 2 or not fan.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(fan.path):
                try:
                    if now_s - entry.stat().st_ctime >= BLOB_GRACE_S:
                        out.append(entry.path)
                except FileNotFoundError:
                    continue
        return out

    def latest_committed(self, n: int) -> set[str]:
        """The tids of the ``n`` latest committed transactions (log and history)."""
        if n <= 0:
            return set()
        rows = self.journal.transactions("committed", limit=n)  # read from the end
        return {row["tid"] for row in rows}

    def _gc_due(self) -> bool:
        try:
            return time.time() - os.stat(self.layout.gc_stamp).st_mtime >= GC_INTERVAL_S
        except FileNotFoundError:
            return True

    def sweep_scratch(self) -> None:
        """Remove scratch of finished or unknown transactions, copies their applies left, and
        dead processes' blob temp files."""
        layout = self.layout
        try:
            names = os.listdir(layout.tx)
        except FileNotFoundError:
            names = []
        # Read the log again after the listing: a transaction whose scratch is listed was begun
        # before (its begin record precedes its tx dir), maybe after our last look, and an
        # exec may be running its command there without holding the transaction's lock.
        self.journal.refresh()
        for name in names:
            if not self.journal.live(name) and self.journal.tx_lock(name).is_free():
                discard(layout.tx_dir(name), layout.trash)
        for name in os.listdir(layout.objects_tmp):
            head, _, rest = name.partition("-")
            if head in ("claim", "spare"):
                # claim-<tid>-<k>[.part], spare-<tid>-<digest>-<pid>.<n>
                tid = rest.rsplit("-", 2 if head == "spare" else 1)[0]
                # Not live in our picture of the log, which may predate the transaction
                # (it began after our refresh): its lock, held from commit to end, says.
                dead = not self.journal.live(tid) and self.journal.tx_lock(tid).is_free()
            else:  # <pid>-<n>-<random>
                dead = head.isdigit() and not pid_alive(int(head))
            if dead:
                try:
                    os.unlink(os.path.join(layout.objects_tmp, name))
                except FileNotFoundError:
                    pass


def _to_bin(path: str, bin_dir: str, name: str) -> int:
    """Move ``path`` into this collection's folder of trash/ (1), or 0 when it is gone. A
    sweeper that another collection started empties trash/, this folder included: it is
    made again."""
    for _ in range(2):
        try:
            os.rename(path, os.path.join(bin_dir, name))
            return 1
        except FileNotFoundError:
            if not os.path.lexists(path):
                return 0
            os.makedirs(bin_dir, exist_ok=True)
    return 0
