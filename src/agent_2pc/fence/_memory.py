"""The memory store: one process, one lock. For tests, and for threads of one program.

Entries and domains are immutable objects in dicts; a decision replaces them under the lock, so
an unlocked ``snapshot`` (a single dict lookup) always sees a whole entry.
"""

from __future__ import annotations

import _thread
import time

from ._ledger import DONE, FAILED, FENCED, RUNNING, STATES, Decision, Domain, Entry
from ._store import BaseTxn, CounterBuffer, Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

if TYPE_CHECKING:
    from ._ledger import Txn


class _MemoryTxn(BaseTxn):
    def __init__(self, store: "MemoryStore", now: float, entry: Entry | None) -> None:
        super().__init__(now, entry)
        self._store = store

    def _lock_domains(self, names: list[str]) -> dict[str, Domain]:
        doms = self._store._domains
        return {n: doms.get(n) or Domain(n, updated_at=self.now) for n in names}

    def peek(self, intent: str) -> Entry | None:
        return self._store._entries.get(intent)

    def token(self) -> int:
        self._store._token += 1
        return self._store._token


class MemoryStore(Store):
    clock = "host"

    def __init__(self, url: str = "memory://", clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self._clock = clock
        self._lock = _thread.allocate_lock()
        self._entries: dict[str, Entry] = {}
        self._domains: dict[str, Domain] = {}
        self._counters: dict[str, int] = {}
        self._token = 0

    def now(self) -> float:
        return self._clock()

    def snapshot(self, intent: str) -> tuple[float, Entry | None]:
        now = self._clock()  # read before the entry: a lease judged live was live at the read
        return now, self._entries.get(intent)

    def decide(self, intent: str, fn: Callable[[Txn], Decision],
               counters: CounterBuffer, durable: bool = True) -> Decision:
        with self._lock:
            dec = fn(_MemoryTxn(self, self._clock(), self._entries.get(intent)))
            if dec.entry is not None:
                assert dec.entry.intent == intent
                self._entries[intent] = dec.entry
            for d in dec.domains:
                self._domains[d.name] = d
            if dec.writes:
                self._add(counters.take())
                self._add(dec.counters)
            return dec

    def get(self, intent: str) -> Entry | None:
        return self._entries.get(intent)

    def _add(self, delta: dict[str, int]) -> None:
        for name, n in delta.items():
            self._counters[name] = self._counters.get(name, 0) + n

    def add_counters(self, delta: dict[str, int]) -> None:
        with self._lock:
            self._add(delta)

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def summary(self, limit: int) -> dict[str, Any]:
        with self._lock:
            states = {s: 0 for s in STATES}
            fenced: list[str] = []
            running: list[str] = []
            for e in self._entries.values():
                states[e.state] += 1
                if e.state == FENCED and len(fenced) < limit:
                    fenced.append(e.intent)
                elif e.state == RUNNING and len(running) < limit:
                    running.append(e.intent)
            return {"states": states, "domains": len(self._domains),
                    "fenced": sorted(fenced), "running": sorted(running)}

    def sweep(self, idle_s: float, limit: int) -> int:
        with self._lock:
            now = self._clock()
            gone = [i for i, e in self._entries.items()
                    if e.state in (DONE, FAILED) and e.expires_at is not None
                    and e.expires_at <= now][:limit]
            for i in gone:
                del self._entries[i]
            idle = [n for n, d in self._domains.items()
                    if not d.readers and not d.writers and d.updated_at <= now - idle_s][:limit]
            for n in idle:
                del self._domains[n]
            return len(gone) + len(idle)

    def close(self) -> None:
        pass
