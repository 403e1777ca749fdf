"""The way into a transaction: ``with gate.locked(tid) as tx`` holds its lock for a step.

A transaction found in flight under its lock has a dead worker (the lock dies with its holder):
it is finished first (recovery.py). ``active`` also refuses a transaction that is not active
(bad_state) and aborts one past its deadline (timeout).
"""

from __future__ import annotations

from ..core import confine
from ..core import recovery as plans
from ..core.records import now_ms
from ..core.states import ACTIVE, FINISHED, IN_FLIGHT, Tx
from ..errors import TransactionAborted, UnknownTid
from .answers import refuse_inactive

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..storage.locks import FileLock
    from .journal import Journal
    from .recovery import Recovery
    from .twophase import TwoPhase

TID_RE = confine.TID_RE


def check_tid(tid: Any) -> str:
    if not isinstance(tid, str) or not TID_RE.fullmatch(tid):
        raise UnknownTid(f"{tid!r} is not a transaction id (they look like "
                         "tx-20260101-120000-a1b2c3)", tid=tid if isinstance(tid, str) else None)
    return tid


class Gate:
    def __init__(self, journal: Journal, twophase: TwoPhase, recovery: Recovery) -> None:
        self.journal = journal
        self.twophase = twophase
        self.recovery = recovery

    def locked(self, tid: str) -> Held:
        """``with gate.locked(tid) as tx``: hold ``tid``'s lock; ``tx`` is its live state,
        or the history entry (a dict) of a finished one, which needs no lock."""
        return Held(self, tid)

    def active(self, tid: str) -> HeldActive:
        """As ``locked``, for a transaction that must still be active (bad_state otherwise);
        one past its deadline is aborted here (timeout)."""
        return HeldActive(self, tid)

    def hold(self, tid: str, active: bool) -> tuple[Tx | dict[str, Any], FileLock | None]:
        """Take ``tid``'s lock (none for a finished transaction): what ``locked`` and
        ``active`` do on entry."""
        check_tid(tid)
        journal = self.journal
        journal.refresh()
        found = journal.lookup(tid)
        if isinstance(found, dict) or found.state in FINISHED:
            if active:
                refuse_inactive(found)
            return found, None
        lock = journal.tx_lock(tid)
        lock.acquire(what=f"transaction {tid} (another process is working on it)")
        try:
            journal.refresh()
            found = journal.lookup(tid)
            if not isinstance(found, dict) and found.state in IN_FLIGHT:
                # We hold its lock, so whoever was deciding or applying it has died.
                self.recovery.finish_orphan(found)
                found = journal.lookup(tid)
            if active:
                if isinstance(found, dict) or found.state != ACTIVE:
                    refuse_inactive(found)
                assert not isinstance(found, dict)
                self.abort_if_stale(found)
            return found, lock
        except BaseException:
            lock.release()
            raise

    def abort_if_stale(self, tx: Tx) -> None:
        """Abort ``tx`` (its lock held) when it is past its deadline or outlived its boot:
        TransactionAborted."""
        act = plans.stale_active(tx, now_ms(), self.journal.boot)
        if act is not None:
            self.twophase.abort(tx, act.code or "timeout", act.reason or "")
            raise TransactionAborted(act.reason or "it is stale", code=act.code or "timeout",
                                     tid=tx.tid)


class Held:
    """The context manager of Gate.locked (contextlib costs milliseconds to import)."""

    __slots__ = ("_gate", "_tid", "_lock")
    _active = False

    def __init__(self, gate: Gate, tid: str) -> None:
        self._gate, self._tid = gate, tid
        self._lock: FileLock | None = None

    def __enter__(self) -> Tx | dict[str, Any]:
        found, self._lock = self._gate.hold(self._tid, self._active)
        return found

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


class HeldActive(Held):
    """The context manager of Gate.active: its transaction is live and active."""

    __slots__ = ()
    _active = True

    def __enter__(self) -> Tx:
        found = super().__enter__()
        assert not isinstance(found, dict)
        return found
