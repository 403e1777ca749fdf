"""The values that cross the fence's public surface: requests, tickets and answers.

Everything is checked where it enters: an EffectRequest refuses bad input at construction
(UsageError, exit 2), and a ticket that is malformed, forged or stale in any field is refused with
FenceRefusal ``stale_lease`` (exit 1) -- never with a TypeError or KeyError.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ..errors import FenceRefusal, UsageError
from ._canon import CanonicalError, canonical, sha256_hex
from ._cert import Certificate
from ._record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Limits (TIGER_STYLE: a bound on everything that comes in).
NAME_BYTES_MAX = 512          # intent, domain, tool, agent
ARGS_BYTES_MAX = 1 << 20      # canonical JSON of args, and of a result
READ_SET_MAX = 256            # domains in one read-set
KNOWN_CLOCK_MAX = 4096        # entries in a vector clock
REASON_CHARS_MAX = 2000       # abort / reconcile reasons are cut to this

_HEX = frozenset("0123456789abcdef")


def _hex(value: Any, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and set(value) <= _HEX


def _name(what: str, value: Any, *, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{what} must be a string, not {type(value).__name__}")
    if not value and not empty_ok:
        raise UsageError(f"{what} is empty")
    if len(value.encode("utf-8", "surrogatepass")) > NAME_BYTES_MAX:
        raise UsageError(f"{what} is longer than {NAME_BYTES_MAX} bytes")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not valid Unicode") from None
    return value


def _valid_name(value: str) -> bool:
    try:
        return 0 < len(value.encode("utf-8")) <= NAME_BYTES_MAX
    except UnicodeEncodeError:
        return False


def check_intent(value: Any) -> str:
    """An intent named by a caller (UsageError when it cannot be one)."""
    return _name("intent", value)


def canonical_json(what: str, value: Any) -> bytes:
    """Canonical bytes of a JSON value given by the caller (UsageError when there are none)."""
    try:
        data = canonical(value)
    except CanonicalError as exc:
        raise UsageError(f"{what} is not canonical JSON: {exc}") from None
    if len(data) > ARGS_BYTES_MAX:
        raise UsageError(f"{what} is larger than {ARGS_BYTES_MAX} bytes as canonical JSON")
    return data


def _seq(what: str, value: Any) -> int:
    if type(value) is not int or value < 0:
        raise UsageError(f"{what} must be a whole number >= 0")
    return value


def normalize_read_set(value: Any) -> tuple[tuple[str, int], ...]:
    """``[{"domain": D, "seq": N}, ...]`` (or ``[[D, N], ...]`` / ``{D: N}``) -> sorted pairs."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = []
        for r in value:
            if isinstance(r, Mapping):
                if set(r) != {"domain", "seq"}:
                    raise UsageError("a read-set entry is {\"domain\": D, \"seq\": N}")
                items.append((r["domain"], r["seq"]))
            elif isinstance(r, (list, tuple)) and len(r) == 2:
                items.append((r[0], r[1]))
            else:
                raise UsageError("a read-set entry is {\"domain\": D, \"seq\": N}")
    else:
        raise UsageError("read_set must be a list of {domain, seq}")
    if len(items) > READ_SET_MAX:
        raise UsageError(f"a read-set names at most {READ_SET_MAX} domains")
    seen: dict[str, int] = {}
    for d, s in items:
        d = _name("a read-set domain", d)
        s = _seq(f"the read-set seq of {d!r}", s)
        if seen.get(d, s) != s:
            raise UsageError(f"the read-set names domain {d!r} twice with different seqs")
        seen[d] = s
    return tuple(sorted(seen.items()))


def normalize_clock(value: Any) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError("known_clock must be an object {domain: seq}")
    if len(value) > KNOWN_CLOCK_MAX:
        raise UsageError(f"known_clock has more than {KNOWN_CLOCK_MAX} entries")
    out = {}
    for d, s in value.items():
        d = _name("a known_clock domain", d)
        s = _seq(f"known_clock[{d!r}]", s)
        if s:
            out[d] = s
    return out


class EffectRequest(Record):
    """One attempt at an effect. ``intent`` names the logical action (the idempotency key).

    The fingerprint that ``intent_conflict`` compares covers (tool, domain, args) only: the same
    intent from another agent, with another read-set, parent or known clock, is a duplicate.
    ``read_set`` lists the domain positions the caller's decision relied on; ``parent`` is the
    intent of a finished effect this one follows (its certificate must exist); ``known_clock`` is a
    vector clock the caller has seen (e.g. an earlier certificate's).
    """

    __slots__ = ("intent", "domain", "tool", "args", "agent", "read_set", "parent",
                 "known_clock", "fingerprint")
    _no_compare = frozenset({"fingerprint"})
    intent: str
    domain: str
    tool: str
    args: Any
    agent: str
    read_set: tuple[tuple[str, int], ...]
    parent: str | None
    known_clock: dict[str, int]
    fingerprint: str

    def __init__(self, intent: str, domain: str = "default", tool: str = "",
                 args: Any = None, agent: str = "", read_set: Any = (),
                 parent: str | None = None, known_clock: Any = None) -> None:
        _name("intent", intent)
        _name("domain", domain)
        _name("tool", tool, empty_ok=True)
        _name("agent", agent, empty_ok=True)
        if args is None:
            args = {}
        if parent is not None:
            _name("parent", parent)
            if parent == intent:
                raise UsageError("an intent cannot be its own parent")
        fp = sha256_hex(canonical_json("args", {"tool": tool, "domain": domain, "args": args}))
        super().__init__(intent, domain, tool, args, agent, normalize_read_set(read_set),
                         parent, normalize_clock(known_clock), fp)

    def replace(self, **changes: Any) -> "EffectRequest":
        if set(changes) == {"intent"}:  # the fingerprint does not depend on the intent
            intent = changes["intent"]
            _name("intent", intent)
            if self.parent == intent:
                raise UsageError("an intent cannot be its own parent")
            return Record.replace(self, intent=intent)
        fields = {f: getattr(self, f) for f in self.__slots__ if f != "fingerprint"}
        fields.update(changes)
        return EffectRequest(**fields)

    @classmethod
    def from_json(cls, obj: Any) -> "EffectRequest":
        if not isinstance(obj, Mapping):
            raise UsageError("an effect request must be a JSON object")
        known = {"intent", "domain", "tool", "args", "agent", "read_set", "parent", "known_clock"}
        extra = set(obj) - known
        if extra:
            raise UsageError(f"unknown effect request fields: {', '.join(sorted(extra))}")
        if "intent" not in obj:
            raise UsageError("an effect request needs an intent")
        return cls(**obj)

    def to_json(self) -> dict[str, Any]:
        return {"intent": self.intent, "domain": self.domain, "tool": self.tool,
                "args": self.args, "agent": self.agent,
                "read_set": [{"domain": d, "seq": s} for d, s in self.read_set],
                "parent": self.parent, "known_clock": dict(self.known_clock)}


TICKET_FIELDS = ("intent", "generation", "token", "lease_id", "fingerprint")


def _stale(message: str, **details: Any) -> FenceRefusal:
    return FenceRefusal(message, code="stale_lease", **details)


class Ticket(Record):
    """A lease on an intent. Every field is checked by the store on every mutation.

    ``generation`` counts the grants of this intent; ``token`` is the fencing token, increasing
    across the whole store, which a downstream service can compare to refuse a stale worker;
    ``lease_id`` is a random secret known only to the holder and the store.
    """

    __slots__ = TICKET_FIELDS
    intent: str
    generation: int
    token: int
    lease_id: str
    fingerprint: str

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in TICKET_FIELDS}

    @classmethod
    def parse(cls, value: Any) -> "Ticket":
        """A Ticket from a Ticket, a dict or a JSON text; FenceRefusal ``stale_lease`` otherwise."""
        if isinstance(value, Ticket):
            obj: Any = value.to_json()
        elif isinstance(value, (str, bytes)):
            try:
                obj = json.loads(value)
            except (ValueError, RecursionError):
                raise _stale("the ticket is not JSON") from None
        else:
            obj = value
        if not isinstance(obj, Mapping):
            raise _stale("the ticket is not a JSON object")
        if set(obj) != set(TICKET_FIELDS):
            raise _stale("the ticket's fields are not " + ", ".join(TICKET_FIELDS))
        intent, gen, token = obj["intent"], obj["generation"], obj["token"]
        lease_id, fp = obj["lease_id"], obj["fingerprint"]
        if not isinstance(intent, str) or not _valid_name(intent):
            raise _stale("the ticket's intent is malformed")
        if type(gen) is not int or gen < 1 or type(token) is not int or token < 1:
            raise _stale("the ticket's generation or token is malformed")
        if not _hex(lease_id, 32):
            raise _stale("the ticket's lease_id is malformed")
        if not _hex(fp, 64):
            raise _stale("the ticket's fingerprint is malformed")
        if isinstance(value, Ticket):
            return value
        return cls(intent, gen, token, lease_id, fp)


class Fresh(Record):
    """Admitted: the caller holds the lease and must run the effect, then commit or abort.

    ``lease_expires_at`` is in the store's clock (seconds since the epoch). ``previous`` says why
    a takeover was possible (``"lease_expired"`` or ``"unknown"``): the effect may already have
    happened once, so only an effect that is safe to repeat (an idempotency key, a fencing token
    checked downstream) may be run again.
    """

    __slots__ = ("ticket", "lease_expires_at", "takeover", "previous")
    _defaults = {"takeover": False, "previous": None}
    ticket: Ticket
    lease_expires_at: float
    if TYPE_CHECKING:  # the defaults, for mypy (at run time: _defaults; fence/_record.py)
        takeover: bool = False
        previous: str | None = None
    status = "fresh"

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "ticket": self.ticket.to_json(),
                "lease_expires_at": self.lease_expires_at, "takeover": self.takeover,
                "previous": self.previous}


class Replay(Record):
    """Already done: here is the certificate; do not run the effect."""

    __slots__ = ("cert",)
    cert: Certificate
    status = "already_done"

    @property
    def result(self) -> Any:
        return self.cert.result

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "cert": self.cert.to_json()}


class AbortResult(Record):
    """What an abort left: ``state`` is ``failed`` (free for a retry), ``fenced`` (outcome
    unknown) or ``done`` (the abort came after a commit and changed nothing)."""

    __slots__ = ("intent", "state", "changed")
    intent: str
    state: str
    changed: bool

    def to_json(self) -> dict[str, Any]:
        return {"intent": self.intent, "state": self.state, "changed": self.changed}
