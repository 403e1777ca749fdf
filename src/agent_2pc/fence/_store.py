"""The store interface: what every backend (memory, SQLite, Postgres) promises, method by method.

The ledger (_ledger.py) decides; a store keeps the state and makes each decision atomic. All
three stores pass the same tests (tests/fence/), which are the executable form of this contract.

Time: a store has exactly one clock, ``now`` in seconds since the epoch as a float. Memory and
SQLite use the host's clock (every process of one host shares it); Postgres uses the database
server's ``clock_timestamp()`` and never the client's clock.

Contract, per method:

``snapshot(intent) -> (now, Entry | None)``
    One consistent read of one entry, with the store's current time, taking no lock and writing
    nothing. It may be stale by the time the caller looks at it, but it was true at one instant,
    so an answer that needs no write (replay, or a refusal) can be given from it.

``decide(intent, fn, counters) -> Decision``
    Runs ``fn(txn)`` inside one transaction that holds the intent exclusively: no other decide on
    the same intent interleaves, ``txn.entry`` is the entry as of that lock and ``txn.now`` the
    store's time after taking it. ``txn.domains(names)`` (at most once per decision) locks the
    named domains in sorted order, creating the missing ones at seq 0, and returns them;
    ``txn.peek(intent)`` reads another entry without locking it; ``txn.token()`` draws the next
    fencing token, strictly greater than every token drawn before in this store, even across
    retention sweeps. When ``fn`` returns, the store writes ``decision.entry`` (insert or
    replace), every domain in ``decision.domains``, and -- only when it writes anything else --
    adds ``counters.take()`` to its counters, then commits; when ``fn`` raises, nothing is
    written. A decision is durable once decide returns (SQLite: WAL with synchronous=FULL;
    Postgres: a committed transaction). Lock waits are bounded: a decide that cannot get its
    locks in time raises Busy; a connection that fails while committing raises UnknownOutcome.

``decide(intent, fn, counters, durable=False)``
    The same decision, committed and visible to every reader (and kept by a process crash),
    whose durability against a power cut may wait for the next ``sync()`` or durable decide.
    Stores must keep durability *in commit order*: once any later decision is durable, this one
    is too (SQLite: the WAL is one append-only file, and every fsync covers all of it). A store
    may ignore the flag and make every decision durable (memory, Postgres).

``sync()``
    Makes every decision committed so far durable; a no-op when there is nothing to sync.
    ``needs_sync`` says whether a ``durable=False`` decision may still be unsynced. Any thread.

``get(intent) -> Entry | None`` and ``now() -> float``
    Plain reads.

``add_counters(delta)`` / ``counters() -> {name: n}``
    Counters are added atomically (never lost by a race between processes).

``summary(limit) -> dict``
    ``{"states": {state: count}, "domains": count, "fenced": [intent...], "running":
    [intent...]}`` with at most ``limit`` names per list.

``sweep(idle_s, limit) -> int``
    Deletes at most ``limit`` done or failed entries whose ``expires_at`` has passed and at most
    ``limit`` domains with no claims that have not changed for ``idle_s`` seconds; returns how
    many rows went. Never deletes a running or fenced entry, nor a domain somebody claims. Safe to
    run at any time, from any process, concurrently with decisions.

``close()``
    Releases connections; idempotent.
"""

from __future__ import annotations

import _thread
from abc import ABC, abstractmethod

from ._ledger import Decision, Domain, Entry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from typing import Any

if TYPE_CHECKING:
    from ._ledger import Txn

COUNTER_NAMES = ("admitted", "replayed", "takeovers", "committed", "aborted_failed",
                 "aborted_unknown", "reconciled_clear", "reconciled_done")
REFUSED_PREFIX = "refused_"


class CounterBuffer:
    """Counts of this process not yet written to the store (thread-safe)."""

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._counts: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + n

    def add_all(self, delta: dict[str, int]) -> None:
        if not delta:
            return
        with self._lock:
            for name, n in delta.items():
                self._counts[name] = self._counts.get(name, 0) + n

    def take(self) -> dict[str, int]:
        with self._lock:
            out, self._counts = self._counts, {}
        return out

    def peek(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class Store(ABC):
    """One backend of the ledger. See the module docstring for the per-method contract."""

    url: str
    clock: str  # "host" or "database": which clock decides

    @abstractmethod
    def now(self) -> float: ...

    @abstractmethod
    def snapshot(self, intent: str) -> tuple[float, Entry | None]: ...

    @abstractmethod
    def decide(self, intent: str, fn: Callable[[Txn], Decision],
               counters: CounterBuffer, durable: bool = True) -> Decision: ...

    @property
    def needs_sync(self) -> bool:
        return False

    def sync(self) -> None:  # noqa: B027 -- a store that never defers has nothing to do
        """Every decision committed so far is durable."""

    @abstractmethod
    def get(self, intent: str) -> Entry | None: ...

    @abstractmethod
    def add_counters(self, delta: dict[str, int]) -> None: ...

    @abstractmethod
    def counters(self) -> dict[str, int]: ...

    @abstractmethod
    def summary(self, limit: int) -> dict[str, Any]: ...

    @abstractmethod
    def sweep(self, idle_s: float, limit: int) -> int: ...

    @abstractmethod
    def close(self) -> None: ...


class BaseTxn:
    """The part of a Txn that every store shares: the one-call-per-decision rule for domains."""

    def __init__(self, now: float, entry: Entry | None) -> None:
        self.now = now
        self.entry = entry
        self._domains_taken = False

    def domains(self, names: Collection[str]) -> dict[str, Domain]:
        assert not self._domains_taken, "domains() is called once per decision"
        self._domains_taken = True
        return self._lock_domains(sorted(set(names)))

    def _lock_domains(self, names: list[str]) -> dict[str, Domain]:
        raise NotImplementedError

    def peek(self, intent: str) -> Entry | None:
        raise NotImplementedError

    def token(self) -> int:
        raise NotImplementedError


# -- row <-> entry, shared by the SQL stores ------------------------------------------------------

ENTRY_COLUMNS = ("intent", "fingerprint", "state", "generation", "token", "lease_id",
                 "lease_expires_at", "request", "cert", "reason", "created_at", "updated_at",
                 "expires_at")


def entry_to_row(e: Entry, dumps: Callable[[Any], str]) -> tuple[Any, ...]:
    return (e.intent, e.fingerprint, e.state, e.generation, e.token, e.lease_id,
            e.lease_expires_at, dumps(e.request),
            dumps(e.cert.to_json()) if e.cert is not None else None, e.reason,
            e.created_at, e.updated_at, e.expires_at)


def entry_from_row(row: tuple[Any, ...], loads: Callable[[Any], Any]) -> Entry:
    from ._cert import Certificate

    (intent, fp, state, gen, token, lease_id, lease_exp, request, cert, reason, created,
     updated, expires) = row
    return Entry(intent=intent, fingerprint=fp, state=state, generation=int(gen),
                 token=int(token), lease_id=lease_id, lease_expires_at=lease_exp,
                 request=loads(request), cert=Certificate(**loads(cert)) if cert else None,
                 reason=reason or "", created_at=created, updated_at=updated,
                 expires_at=expires)


def domain_from_row(row: tuple[Any, ...], loads: Callable[[Any], Any]) -> Domain:
    name, seq, clock, claims, updated = row
    c = loads(claims) if claims else {}
    return Domain(name=name, seq=int(seq), clock=loads(clock) if clock else {},
                  readers=c.get("r", {}), writers=c.get("w", {}), updated_at=updated or 0.0)


def domain_claims(d: Domain) -> dict[str, Any] | None:
    if not d.readers and not d.writers:
        return None
    return {"r": d.readers, "w": d.writers}
