"""The TTL reaper: transactions past their ``timeout_ms`` are aborted without a client call.

Every ``interval`` the daemon does what ``recover`` does for them: under the commit lock, each
stale active transaction that nobody is working on is aborted (code ``timeout``; a prepared
remote call is compensated by its participant's undo), and what dead processes left in flight
is finished. ``daemon reap`` runs it once, now.
"""

from __future__ import annotations

import threading

from ..core import recovery as plans
from ..core.records import now_ms
from ..core.states import ACTIVE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..coordinator.engine import Engine

INTERVAL_MS = 1000


class Reaper:
    def __init__(self, engine: Engine, mutex: threading.RLock, interval_ms: int = INTERVAL_MS
                 ) -> None:
        self.engine = engine
        self.mutex = mutex
        self.interval_ms = interval_ms
        self.runs = 0
        self.reaped = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.interval_ms > 0:
            self._thread = threading.Thread(target=self._loop, name="agent-2pc-reaper",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_ms / 1000):
            try:
                self.run_once()
            except Exception as exc:  # a busy lock, a disk error: tried again next time
                self.last_error = f"{type(exc).__name__}: {exc}"

    def run_once(self) -> dict[str, Any]:
        """Abort the stale active transactions now; ``{reaped: [tid...]}``."""
        engine = self.engine
        journal = engine.journal
        journal.commit_lock.acquire(what="the commit lock")
        try:
            with self.mutex:
                journal.refresh()
                now = now_ms()
                stale = [tid for tid, tx in journal.txs.items() if tx.state == ACTIVE and
                         plans.stale_active(tx, now, journal.boot) is not None]
                if stale:
                    engine.recovery.finish_dead_locked(include_active=True)
                reaped = [tid for tid in stale
                          if not journal.live(tid) or journal.txs[tid].state != ACTIVE]
        finally:
            journal.commit_lock.release()
        self.runs += 1
        self.reaped += len(reaped)
        return {"reaped": reaped}
