"""The ledger's semantics: every decision of the fence, as functions over one store transaction.

Nothing here touches a disk, a socket or a clock. A store opens a transaction, hands it over as a
``Txn`` (the current time in the store's clock, the locked entry of the intent, and callbacks that
lock domains, read another entry and draw a fencing token), and writes back what the ``Decision``
says -- or nothing, when the decision is a refusal. The same functions therefore decide for the
memory, SQLite and Postgres stores, and every store test is a test of this module.

States of an intent (one entry per intent)::

    (absent) --prepare--> running --commit--------------> done    (replayed until result_ttl)
                            |  \\--abort(failed)--------> failed  (free: the next prepare is fresh)
                            |   \\-abort(unknown)-------> fenced  (refused until reconciled)
                            `-- lease expires: refused as fenced; prepare(takeover=True) or
                                reconcile() move it on; the holder's own late commit still counts
    fenced --reconcile(clear)--> failed      fenced --reconcile(done)--> done
    fenced or expired --prepare(takeover=True)--> running (generation + 1)
    done / failed past result_ttl: forgotten (swept); the intent starts a new period.

Domains: ``seq`` counts the effects committed in a domain. A running or fenced entry holds a
*writer* claim on its own domain and a *reader* claim on every domain of its read-set. A prepare
is refused with ``read_set_stale`` when a read-set domain is not at the seq the caller saw, and
with ``domain_race`` when another entry writes a domain it reads or reads the domain it writes;
the checks and the claims happen in the one transaction, for any number of domains. So a
read-set stays true from prepare to commit, and certificates of a domain are totally ordered.
"""

from __future__ import annotations

import os

from ..errors import BadState, FenceRefusal, UsageError
from ._canon import canonical
from ._cert import Certificate, merge
from ._record import Record
from ._types import REASON_CHARS_MAX, AbortResult, EffectRequest, Fresh, Replay, Ticket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from typing import Any, Protocol

RUNNING, DONE, FAILED, FENCED = "running", "done", "failed", "fenced"
STATES = (RUNNING, DONE, FAILED, FENCED)


class Entry(Record):
    """The ledger's row for one intent.

    ``request`` is the JSON of the current (or last) holder's request plus what prepare resolved:
    ``{domain, tool, args, agent, read_set: [[d, s]...], parent, parent_hash, parent_clock,
    known_clock}``. ``lease_expires_at`` is set while running; ``expires_at`` once done or failed
    (when retention may forget the entry).
    """

    __slots__ = ("intent", "fingerprint", "state", "generation", "token", "lease_id",
                 "lease_expires_at", "request", "cert", "reason", "created_at", "updated_at",
                 "expires_at")

    intent: str
    fingerprint: str
    state: str
    generation: int
    token: int
    lease_id: str
    lease_expires_at: float | None
    request: dict[str, Any]
    cert: Certificate | None
    reason: str
    created_at: float
    updated_at: float
    expires_at: float | None

    def forgotten(self, now: float) -> bool:
        """True when retention is over: the entry counts as absent."""
        return self.state in (DONE, FAILED) and self.expires_at is not None \
            and self.expires_at <= now

    def claimed_domains(self) -> set[str]:
        if self.state not in (RUNNING, FENCED):
            return set()
        return {self.request["domain"]} | {d for d, _ in self.request["read_set"]}


class Domain(Record):
    """A domain's position and the claims of the entries in flight on it (intent -> token)."""

    __slots__ = ("name", "seq", "clock", "readers", "writers", "updated_at")
    _defaults = {"seq": 0, "clock": {}, "readers": {}, "writers": {}, "updated_at": 0.0}
    name: str
    if TYPE_CHECKING:  # the defaults, for mypy (at run time: _defaults; fence/_record.py)
        seq: int = 0
        clock: dict[str, int] = {}
        readers: dict[str, int] = {}
        writers: dict[str, int] = {}
        updated_at: float = 0.0


class Decision(Record):
    """What a ledger function decided, and what the store must write for it (maybe nothing).

    ``outcome`` is a Fresh, Replay, Certificate, AbortResult, float (a new lease expiry), None
    (reconcile clear), or a FenceRefusal that the caller raises after the store has rolled back.
    """

    __slots__ = ("outcome", "entry", "domains", "counters")
    _defaults = {"entry": None, "domains": (), "counters": {}}
    outcome: Any
    if TYPE_CHECKING:  # the defaults, for mypy (at run time: _defaults; fence/_record.py)
        entry: Entry | None = None
        domains: tuple[Domain, ...] = ()
        counters: dict[str, int] = {}

    @property
    def writes(self) -> bool:
        return self.entry is not None or bool(self.domains)


if TYPE_CHECKING:
    class Txn(Protocol):
        """One store transaction, as the ledger sees it (see _store.py for the contract)."""

        now: float
        entry: Entry | None

        def peek(self, intent: str) -> Entry | None: ...

        def domains(self, names: Collection[str]) -> dict[str, Domain]: ...

        def token(self) -> int: ...

    LedgerFn = Callable[[Txn], Decision]


# -- refusals -----------------------------------------------------------------------------------


def refusal(code: str, message: str, **details: Any) -> FenceRefusal:
    return FenceRefusal(message, code=code, **details)


def _stale(message: str, intent: str) -> FenceRefusal:
    return refusal("stale_lease", message, intent=intent)


def check_ticket(entry: Entry | None, ticket: Ticket) -> FenceRefusal | None:
    """None when ``ticket`` is the lease the entry records, else the stale_lease refusal."""
    if entry is None:
        return _stale(f"no lease on intent {ticket.intent!r}", ticket.intent)
    if (entry.generation != ticket.generation or entry.token != ticket.token
            or entry.lease_id != ticket.lease_id or entry.fingerprint != ticket.fingerprint):
        return _stale(f"the ticket is not the current lease on {ticket.intent!r} "
                      f"(the intent is at generation {entry.generation})", ticket.intent)
    return None


# -- prepare ------------------------------------------------------------------------------------


def classify(now: float, entry: Entry | None, req: EffectRequest,
             takeover: bool) -> Replay | FenceRefusal | None:
    """The answer that needs no write (replay or refusal), or None when a lease may be granted.

    Used twice: on an unlocked snapshot (the fast path: most attempts of a storm end here) and
    again under the transaction's lock before granting.
    """
    e = entry
    if e is None or e.forgotten(now):
        return None
    if e.fingerprint != req.fingerprint:
        return refusal("intent_conflict", f"intent {req.intent!r} was first used with other "
                       "tool, domain or args", intent=req.intent, state=e.state)
    state = e.state
    if state == DONE:
        assert e.cert is not None, e.intent
        return Replay(e.cert)
    if state == FAILED:
        return None
    if state == RUNNING:
        assert e.lease_expires_at is not None, e.intent
        if e.lease_expires_at > now:
            return refusal("intent_in_flight", f"intent {req.intent!r} is in flight elsewhere",
                           intent=req.intent, generation=e.generation,
                           lease_expires_in_s=round(e.lease_expires_at - now, 3))
        if takeover:
            return None
        return refusal("intent_fenced", f"the lease on intent {req.intent!r} expired before an "
                       "outcome was recorded; the effect may have happened: reconcile it, or "
                       "take over if it is safe to repeat", intent=req.intent,
                       reason="lease_expired", generation=e.generation)
    assert state == FENCED, state
    if takeover:
        return None
    return refusal("intent_fenced", f"intent {req.intent!r} ended with an unknown outcome; "
                   "reconcile it", intent=req.intent, reason=e.reason or "unknown",
                   generation=e.generation)


def _release(doms: dict[str, Domain], intent: str, now: float) -> dict[str, Domain]:
    """The domains whose claims by ``intent`` are dropped (only those that change)."""
    out = {}
    for name, d in doms.items():
        if intent in d.readers or intent in d.writers:
            out[name] = d.replace(readers={k: v for k, v in d.readers.items() if k != intent},
                                  writers={k: v for k, v in d.writers.items() if k != intent},
                                  updated_at=now)
    return out


def prepare(txn: Txn, req: EffectRequest, *, takeover: bool, lease_ttl_s: float) -> Decision:
    now, e = txn.now, txn.entry
    answer = classify(now, e, req, takeover)
    if answer is not None:
        return Decision(answer)
    parent_hash = parent_clock = None
    if req.parent is not None:
        p = txn.peek(req.parent)
        if p is None or p.state != DONE or p.forgotten(now):
            raise UsageError(f"parent intent {req.parent!r} has no certificate (it must be done "
                             "before its children are prepared)", code="unknown_parent",
                             parent=req.parent)
        assert p.cert is not None
        parent_hash, parent_clock = p.cert.hash, p.cert.vector_clock
    intent, own = req.intent, req.domain
    names = {own} | {d for d, _ in req.read_set} | set(req.known_clock)
    if e is not None:
        names |= e.claimed_domains()
    doms = txn.domains(names)
    for d, s in req.read_set:
        if doms[d].seq != s:
            return Decision(refusal("read_set_stale", f"domain {d!r} moved from seq {s} to "
                                    f"{doms[d].seq}", intent=intent, domain=d, expected=s,
                                    actual=doms[d].seq))
    for d, s in req.known_clock.items():
        if s > doms[d].seq:
            raise UsageError(f"known_clock names seq {s} of domain {d!r}, which is at "
                             f"{doms[d].seq}")
    for d, _ in req.read_set:
        other = next((i for i in doms[d].writers if i != intent), None)
        if other is not None:
            return Decision(refusal("domain_race", f"domain {d!r} of the read-set is being "
                                    f"written by intent {other!r}", intent=intent, domain=d,
                                    holder=other))
    other = next((i for i in doms[own].readers if i != intent), None)
    if other is not None:
        return Decision(refusal("domain_race", f"intent {other!r} relies on domain {own!r} "
                                "staying where it is", intent=intent, domain=own, holder=other))

    generation = (e.generation if e is not None else 0) + 1
    token = txn.token()
    lease_id = os.urandom(16).hex()
    expires = now + lease_ttl_s
    changed = _release(doms, intent, now)
    merged = {**doms, **changed}
    mine = merged[own]
    changed[own] = mine.replace(writers={**mine.writers, intent: token}, updated_at=now)
    for name, _ in req.read_set:
        dom = changed.get(name, merged[name])
        changed[name] = dom.replace(readers={**dom.readers, intent: token}, updated_at=now)
    request = {"domain": own, "tool": req.tool, "args": req.args, "agent": req.agent,
               "read_set": [[n, s] for n, s in req.read_set], "parent": req.parent,
               "parent_hash": parent_hash, "parent_clock": parent_clock,
               "known_clock": dict(req.known_clock)}
    was = e.state if e is not None and not e.forgotten(now) else None
    entry = Entry(intent=intent, fingerprint=req.fingerprint, state=RUNNING,
                  generation=generation, token=token, lease_id=lease_id,
                  lease_expires_at=expires, request=request, cert=None, reason="",
                  created_at=e.created_at if e is not None and was else now, updated_at=now,
                  expires_at=None)
    previous = {RUNNING: "lease_expired", FENCED: "unknown"}.get(was or "")
    fresh = Fresh(Ticket(intent, generation, token, lease_id, req.fingerprint), expires,
                  takeover=previous is not None, previous=previous)
    counters = {"takeovers": 1} if previous else {}
    return Decision(fresh, entry, tuple(changed.values()), counters)


# -- finishing ----------------------------------------------------------------------------------


def _finish_done(txn: Txn, e: Entry, result: Any, *, result_ttl_s: float,
                 key: bytes | None, generation: int, token: int, reason: str) -> Decision:
    """Record the effect as done: advance the domain, issue the certificate, drop the claims."""
    now, req = txn.now, e.request
    own = req["domain"]
    read_set = [(d, s) for d, s in req["read_set"]]
    names = {own} | {d for d, _ in read_set} | set(req["known_clock"])
    doms = txn.domains(names)
    for d, s in read_set:  # the claims kept every read-set domain where it was
        assert doms[d].seq == s, (e.intent, d, s, doms[d].seq)
    seq = doms[own].seq + 1
    clock = merge([req["known_clock"], req["parent_clock"], doms[own].clock]
                  + [doms[d].clock for d, _ in read_set])
    assert clock.get(own, 0) < seq, (e.intent, own, clock, seq)
    clock[own] = seq
    cert = Certificate.issue(intent=e.intent, parent=req["parent_hash"], domain=own, seq=seq,
                             tool=req["tool"], args=req["args"], result=result,
                             vector_clock=clock,
                             read_set=[{"domain": d, "seq": s} for d, s in read_set],
                             agent=req["agent"], key=key)
    changed = _release(doms, e.intent, now)
    d = changed.get(own, doms[own])
    changed[own] = d.replace(seq=seq, clock=clock, updated_at=now)
    entry = e.replace(state=DONE, generation=generation, token=token, lease_expires_at=None,
                      cert=cert, reason=reason, updated_at=now, expires_at=now + result_ttl_s)
    return Decision(cert, entry, tuple(changed.values()))


def commit(txn: Txn, ticket: Ticket, result: Any, *, result_ttl_s: float,
           key: bytes | None) -> Decision:
    e = txn.entry
    bad = check_ticket(e, ticket)
    if bad is not None:
        return Decision(bad)
    assert e is not None
    if e.state == DONE:
        assert e.cert is not None
        if canonical(e.cert.result) == canonical(result):
            return Decision(e.cert)  # a retried commit: same answer
        return Decision(refusal("intent_conflict", f"intent {e.intent!r} was already committed "
                                "with another result", intent=e.intent))
    if e.state != RUNNING:
        return Decision(_stale(f"the lease on {e.intent!r} is over (the intent is {e.state})",
                               e.intent))
    dec = _finish_done(txn, e, result, result_ttl_s=result_ttl_s, key=key,
                       generation=e.generation, token=e.token, reason="")
    dec.counters["committed"] = 1
    return dec


def abort(txn: Txn, ticket: Ticket, reason: str, outcome: str, *,
          result_ttl_s: float) -> Decision:
    assert outcome in ("failed", "unknown"), outcome
    e = txn.entry
    bad = check_ticket(e, ticket)
    if bad is not None:
        return Decision(bad)
    assert e is not None
    now = txn.now
    if e.state == DONE:
        return Decision(AbortResult(e.intent, DONE, False))  # abort after commit: nothing changes
    wanted = FAILED if outcome == "failed" else FENCED
    if e.state != RUNNING:
        if e.state == wanted:
            return Decision(AbortResult(e.intent, e.state, False))
        return Decision(_stale(f"the lease on {e.intent!r} is over (the intent is {e.state}"
                               + ("; reconcile it)" if e.state == FENCED else ")"), e.intent))
    reason = (reason or outcome)[:REASON_CHARS_MAX]
    if wanted == FAILED:
        changed = _release(txn.domains(e.claimed_domains()), e.intent, now)
        entry = e.replace(state=FAILED, lease_expires_at=None, reason=reason, updated_at=now,
                          expires_at=now + result_ttl_s)
        return Decision(AbortResult(e.intent, FAILED, True), entry, tuple(changed.values()),
                        {"aborted_failed": 1})
    entry = e.replace(state=FENCED, lease_expires_at=None, reason=reason, updated_at=now)
    return Decision(AbortResult(e.intent, FENCED, True), entry, (), {"aborted_unknown": 1})


def heartbeat(txn: Txn, ticket: Ticket, *, lease_ttl_s: float) -> Decision:
    e = txn.entry
    bad = check_ticket(e, ticket)
    if bad is not None:
        return Decision(bad)
    assert e is not None
    if e.state != RUNNING:
        return Decision(_stale(f"the lease on {e.intent!r} is over (the intent is {e.state})",
                               e.intent))
    expires = txn.now + lease_ttl_s
    return Decision(expires, e.replace(lease_expires_at=expires, updated_at=txn.now))


def reconcile(txn: Txn, intent: str, action: str, result: Any, reason: str, *,
              result_ttl_s: float, key: bytes | None) -> Decision:
    """Settle an intent whose outcome is unknown (fenced, or running with an expired lease).

    ``clear``: the effect did not happen; the intent is free. ``done``: it happened with
    ``result``; a certificate is issued. Either way the generation goes up, so the old holder's
    ticket is stale from now on.
    """
    assert action in ("clear", "done"), action
    now, e = txn.now, txn.entry
    if e is None or e.forgotten(now):
        raise UsageError(f"no intent {intent!r} in the ledger", code="unknown_intent",
                         intent=intent)
    if e.state == RUNNING and e.lease_expires_at is not None and e.lease_expires_at > now:
        return Decision(refusal("intent_in_flight", f"intent {intent!r} is in flight: its lease "
                                "is live", intent=intent, generation=e.generation))
    if e.state == DONE:
        assert e.cert is not None
        if action == "done" and canonical(e.cert.result) == canonical(result):
            return Decision(e.cert)
        raise BadState(f"intent {intent!r} is done; there is nothing to reconcile",
                       intent=intent, state=DONE)
    if e.state == FAILED:
        if action == "clear":
            return Decision(None)
        raise BadState(f"intent {intent!r} failed definitely; there is nothing to reconcile",
                       intent=intent, state=FAILED)
    generation, token = e.generation + 1, txn.token()
    reason = (reason or f"reconciled: {action}")[:REASON_CHARS_MAX]
    if action == "done":
        dec = _finish_done(txn, e, result, result_ttl_s=result_ttl_s, key=key,
                           generation=generation, token=token, reason=reason)
        dec.counters["reconciled_done"] = 1
        return dec
    changed = _release(txn.domains(e.claimed_domains()), e.intent, now)
    entry = e.replace(state=FAILED, generation=generation, token=token, lease_expires_at=None,
                      reason=reason, updated_at=now, expires_at=now + result_ttl_s)
    return Decision(None, entry, tuple(changed.values()), {"reconciled_clear": 1})


# -- reading ------------------------------------------------------------------------------------


def describe(e: Entry, now: float) -> dict[str, Any]:
    """An entry as status shows it (never the lease_id: that is the holder's secret)."""
    req = e.request
    out: dict[str, Any] = {
        "intent": e.intent, "state": e.state, "generation": e.generation, "token": e.token,
        "fingerprint": e.fingerprint, "domain": req["domain"], "tool": req["tool"],
        "agent": req["agent"], "reason": e.reason or None,
        "created_at": e.created_at, "updated_at": e.updated_at,
    }
    if e.state == RUNNING:
        assert e.lease_expires_at is not None
        out["lease_expires_at"] = e.lease_expires_at
        out["lease_live"] = e.lease_expires_at > now
    if e.expires_at is not None:
        out["expires_at"] = e.expires_at
    if e.cert is not None:
        out["cert"] = e.cert.to_json()
    return out
