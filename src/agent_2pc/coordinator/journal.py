"""The journal: the log, the transaction table folded from it, the locks, and liveness.

Every other part of the engine reads transactions from ``Journal.txs`` (re-read from the log by
``refresh``, which tails what other processes appended) and writes by ``append``. The locks,
always taken in this order (docs/design.md, "Concurrency"):
  tx/<tid>/lock  (one byte of txlocks) while a process works on that transaction;
  commit.lock    from prepare to end, so commits and recoveries of the tree are serial;
  lock           for a moment around each log append.
"""

from __future__ import annotations

import os
import time
from _thread import RLock

from .. import crashpoints
from ..core import confine, records
from ..core.paging import LIST_LIMIT
from ..core.states import COMMITTED, FINISHED, IllegalTransition, Tx, apply_record
from ..errors import CorruptWal, UnknownTid
from ..storage import history
from ..storage.durable import fsync_dir
from ..storage.history_store import NotInHistory, Store
from ..storage.locks import FileLock, byte_for
from ..storage.log import Batch, Log, PausedGc
from ..storage.workspace import log_check

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Iterator

    from ..storage.workspace import Layout

TX_LOCKS_CACHED_MAX = 256


def boot_id() -> str | None:
    """This boot of the machine (Linux); active transactions do not outlive a machine crash."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().strip().decode() or None
    except OSError:
        return None


class Journal:
    """The log of one workspace and what it says. Opening it checks the log's header."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.log = Log(layout.wal, layout.lock, check_header=log_check(layout.root))
        self.commit_lock = FileLock(layout.commit_lock)
        self.boot = boot_id()
        self.txs: dict[str, Tx] = {}
        self._mutex = RLock()
        self._tx_locks: dict[str, FileLock] = {}
        self._tx_locks_max = TX_LOCKS_CACHED_MAX  # doubled past the live ones it must keep
        self._ends: dict[str, int] = {}  # finished tid -> its place in the log's end records
        self.history = Store(layout.history, layout.history_head)

    def close(self) -> None:
        self.log.close()

    # -- reading and appending ---------------------------------------------------------------

    def _absorb(self, batch: Batch) -> None:
        if batch.reset:
            self.txs = {}
            self._ends = {}
        txs = self.txs
        for rec, frame in zip(batch.records, batch.frames, strict=True):
            try:
                tx = apply_record(txs, rec, frame)
                if tx.state in FINISHED and tx.tid not in self._ends:
                    self._ends[tx.tid] = len(self._ends)  # the order of the end records
            except (IllegalTransition, records.BadRecord) as exc:
                # Corruption; any other exception of the fold is a bug, raised as it is.
                offset = self.log.offset_of(frame)
                raise CorruptWal(f"{self.layout.wal}: the record at offset {offset}: {exc}",
                                 path=self.layout.wal, offset=offset, tid=exc.tid) from None

    def refresh(self) -> None:
        """Fold in what was appended since the last read (by any process)."""
        with self._mutex, PausedGc():
            self._absorb(self.log.read())

    def append(self, recs: Sequence[records.AnyRecord], *, sync: bool = False) -> None:
        with self._mutex:
            self._absorb(self.log.append(records.as_json(recs), sync=sync))

    def context(self, tid: str) -> TxContext:
        """What a participant may do to the log while it works on ``tid`` (base.Context)."""
        return TxContext(self, tid)

    def move_finished_to_history(self) -> tuple[int, int]:
        """Compaction: append the finished transactions to history.jsonl and replace the log
        with the frames of the others. Returns the log's size before and after."""
        from .answers import summary

        with self._mutex:
            self.log.lock.acquire(what="the log")
            try:
                self.refresh()
                before = self.log.size()
                finished = self.finished()
                if any(tx.state == COMMITTED for tx in finished):
                    fsync_dir(self.layout.preimages)  # what undo needs, named by history
                history.append(self.layout.history, [summary(tx) for tx in finished],
                               self.layout.history_head, self.history.start_hash())
                crashpoints.hit("compact.after_history")
                live = {tid: tx for tid, tx in self.txs.items() if tx.state not in FINISHED}
                after = self.log.replace([f for tx in live.values() for f in tx.frames])
                self.txs = live  # the new log is exactly these: nothing to read back
                self._ends = {}
                # After the log is replaced: the tids just appended must stay at the end of
                # history.jsonl until then (a compaction that crashed finds them there).
                self.history.seal_if_due()
            finally:
                self.log.lock.release()
        return before, after

    def finished(self) -> list[Tx]:
        """The finished transactions still in the log, in the order compaction writes them
        to the history: the order of their end records in the log (the same in every process
        that reads it)."""
        ends = self._ends
        done = [tx for tx in self.txs.values() if tx.state in FINISHED]
        done.sort(key=lambda tx: ends.get(tx.tid, len(ends)))
        return done

    # -- finding transactions ----------------------------------------------------------------

    def lookup(self, tid: str) -> Tx | dict[str, Any]:
        """The live transaction, or the history entry of a finished and compacted one."""
        tx = self.txs.get(tid)
        if tx is not None:
            return tx
        entry = self.history.lookup(tid)
        if entry is None:
            raise UnknownTid(f"no transaction {tid} in this workspace", tid=tid)
        return entry

    def live(self, tid: str) -> bool:
        """Is ``tid`` in the log and not finished?"""
        tx = self.txs.get(tid)
        return tx is not None and tx.state not in FINISHED

    def transactions(self, state: str | None = None, *, finished: bool = True,
                     limit: int | None = LIST_LIMIT, before: str | None = None
                     ) -> list[dict[str, Any]]:
        """A row per transaction, oldest first: the history's (with ``finished``) in the order
        they finished, then the log's finished ones in that order, then the live ones by
        creation. At most the ``limit`` newest (None: all) of those before ``before`` (a tid;
        UnknownTid if it is nowhere). Reads the history from its end, as far as the page
        needs: the cost is the page's, not the history's."""
        self.refresh()
        done = self.finished()
        live = sorted((tx for tx in self.txs.values() if tx.state not in FINISHED),
                      key=lambda tx: (tx.created_ms or 0, tx.tid))
        in_log = [tx.summary() for tx in done + live]
        rows: list[dict[str, Any]] = []
        seen = {r["tid"] for r in in_log}
        older_than: str | None = None  # the history's lines older than this tid's
        if before is not None:
            at = next((i for i, r in enumerate(in_log) if r["tid"] == before), None)
            if at is not None:
                in_log = in_log[:at]
            elif not finished:
                raise UnknownTid(f"no transaction {before} in this workspace", tid=before)
            else:
                older_than, in_log = before, []

        def want(row: dict[str, Any]) -> bool:
            return state is None or row["state"] == state

        for row in reversed(in_log):
            if limit is not None and len(rows) >= limit:
                break
            if want(row):
                rows.append(row)
        # The history holds finished transactions only: a filter on another state stops here
        # (a filter on a finished state reads back until its page is full).
        if finished and (state is None or state in FINISHED) and (
                limit is None or len(rows) < limit):
            try:
                for entry in self.history.newest_first(older_than):
                    if entry["tid"] in seen:
                        continue
                    row = {k: entry.get(k) for k in ("tid", "state", "label", "created_at",
                                                     "ops")}
                    if want(row):
                        rows.append(row)
                        if limit is not None and len(rows) >= limit:
                            break
            except NotInHistory:
                raise UnknownTid(f"no transaction {before} in this workspace",
                                 tid=before) from None
        elif older_than is not None and self.history.lookup(older_than) is None:
            raise UnknownTid(f"no transaction {before} in this workspace", tid=before)
        rows.reverse()
        return rows

    # -- transaction locks and liveness ------------------------------------------------------

    def tx_lock(self, tid: str) -> FileLock:
        """The lock a process holds while it works on ``tid``: one byte of ``txlocks``. One
        object per tid and engine (its mutex excludes this process's threads; its open file
        description, other processes)."""
        lock = self._tx_locks.get(tid)
        if lock is None:
            if len(self._tx_locks) >= self._tx_locks_max:
                # Only a finished transaction's object goes. A live one's may be in a caller's
                # hands between this look-up and its acquire (a daemon's request thread takes
                # it, then runs the step, which looks it up again): a second object for the
                # tid would wait on the first one's hold, the thread on itself, until Busy.
                self._tx_locks = {t: lk for t, lk in self._tx_locks.items()
                                  if lk.held or t in self.txs}
                self._tx_locks_max = max(TX_LOCKS_CACHED_MAX, 2 * len(self._tx_locks))
            lock = self._tx_locks[tid] = FileLock(self.layout.txlocks, offset=byte_for(tid))
        return lock

    def alive(self, tid: str) -> bool:
        """Does a live process hold ``tid``'s lock? (The lock dies with its holder.)"""
        return not self.tx_lock(tid).is_free()

    # -- what the log may describe -----------------------------------------------------------

    def check_confined(self, tx: Tx, paths: bool = True) -> None:
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


class TxContext:
    """base.Context over the journal: a participant's records go to the log of one
    transaction."""

    __slots__ = ("_journal", "tid")

    def __init__(self, journal: Journal, tid: str) -> None:
        self._journal = journal
        self.tid = tid

    def record(self, fields: dict[str, Any], sync: bool) -> None:
        self._journal.append([records.result(self.tid, **fields)], sync=sync)
        crashpoints.hit("api.after_record")

    def sync(self) -> None:
        self._journal.log.sync()

    def others(self) -> Iterator[Tx]:
        return (tx for tx in self._journal.txs.values()
                if tx.tid != self.tid and tx.state not in FINISHED)


def tid_of_new_transaction(txs: dict[str, Tx]) -> str:
    """A fresh transaction id (tx-YYYYmmdd-HHMMSS-hex6), not in ``txs``."""
    while True:
        tid = time.strftime("tx-%Y%m%d-%H%M%S-", time.gmtime()) + os.urandom(3).hex()
        if tid not in txs:
            return tid
