"""Certificates: what the fence hands out as proof that an effect happened, and vector clocks.

A certificate is the record of one finished effect. Its ``hash`` is SHA-256 (hex) over the RFC 8785
canonical JSON of the object made of exactly these fields::

    intent, parent, domain, seq, tool, args, result, vector_clock, read_set, agent

``parent`` is the hash of the parent's certificate (or null), so certificates form hash chains.
``signature``, when present, is ``"hmac-sha256:" + hex(HMAC-SHA256(key, same canonical bytes))``
with the key taken from the environment variable AGENT2PC_FENCE_HMAC_KEY (UTF-8 bytes).

Vector clocks are keyed by domain: the domain is what the ledger serialises (its ``seq``), so it is
the clock's "process". A certificate's clock is the merge of what its effect knew (the caller's
``known_clock``, the parent's clock, the clocks at the heads of its read-set domains and of its own
domain) with its own entry set to ``clock[domain] = seq``. Distinct certificates therefore have
distinct clocks, the certificates of one domain are totally ordered, and a parent always
happened-before its children.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import UsageError
from ._canon import CanonicalError, canonical, sha256_hex
from ._record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any, Union

HMAC_KEY_ENV = "AGENT2PC_FENCE_HMAC_KEY"
SIGNATURE_PREFIX = "hmac-sha256:"
CERT_FIELDS = ("intent", "parent", "domain", "seq", "tool", "args", "result", "vector_clock",
               "read_set", "agent")


def env_key() -> bytes | None:
    """The signing key from AGENT2PC_FENCE_HMAC_KEY, or None when it is unset or empty."""
    value = os.environ.get(HMAC_KEY_ENV)
    return value.encode("utf-8") if value else None


def _key_bytes(key: bytes | str | None) -> bytes | None:
    if key is None:
        return None
    return key.encode("utf-8") if isinstance(key, str) else bytes(key)


def _same(expected: str, given: Any) -> bool:
    """Constant-time comparison that tolerates a tampered value of any type."""
    import hmac

    if not isinstance(given, str):
        return False
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogatepass"))


def _sign(key: bytes, body: bytes) -> str:
    import hmac

    return SIGNATURE_PREFIX + hmac.new(key, body, "sha256").hexdigest()


class Certificate(Record):
    """The proof that an effect ran once, with the result it recorded."""

    __slots__ = CERT_FIELDS + ("hash", "signature")
    _defaults = {"signature": None}

    intent: str
    parent: str | None
    domain: str
    seq: int
    tool: str
    args: Any
    result: Any
    vector_clock: dict[str, int]
    read_set: list[dict[str, Any]]
    agent: str
    hash: str
    if TYPE_CHECKING:  # the default, for mypy (at run time: _defaults; fence/_record.py)
        signature: str | None = None

    # -- building -------------------------------------------------------------------------------

    @classmethod
    def issue(cls, *, intent: str, parent: str | None, domain: str, seq: int, tool: str,
              args: Any, result: Any, vector_clock: Mapping[str, int],
              read_set: Sequence[Mapping[str, Any]], agent: str,
              key: bytes | str | None = None) -> "Certificate":
        """Make a certificate: compute its hash and, with a key, sign it."""
        body = {"intent": intent, "parent": parent, "domain": domain, "seq": seq, "tool": tool,
                "args": args, "result": result, "vector_clock": dict(vector_clock),
                "read_set": [dict(r) for r in read_set], "agent": agent}
        data = canonical(body)
        kb = _key_bytes(key)
        return cls(hash=sha256_hex(data), signature=_sign(kb, data) if kb else None, **body)

    def body(self) -> dict[str, Any]:
        """The hashed fields, in contract order."""
        return {name: getattr(self, name) for name in CERT_FIELDS}

    def to_json(self) -> dict[str, Any]:
        out = self.body()
        out["hash"] = self.hash
        if self.signature is not None:
            out["signature"] = self.signature
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "Certificate":
        """Read a certificate; raises UsageError when it is not shaped like one.

        The shape is checked here; whether the content is authentic is what ``verify()`` says.
        """
        if not isinstance(obj, Mapping):
            raise UsageError("a certificate must be a JSON object")
        missing = [k for k in CERT_FIELDS + ("hash",) if k not in obj]
        if missing:
            raise UsageError(f"certificate lacks {', '.join(missing)}")
        extra = set(obj) - set(CERT_FIELDS) - {"hash", "signature"}
        if extra:
            raise UsageError(f"certificate has unknown fields: {', '.join(sorted(extra))}")
        kwargs = {k: obj[k] for k in CERT_FIELDS}
        cert = cls(hash=obj["hash"], signature=obj.get("signature"), **kwargs)
        problems = cert._shape_problems()
        if problems:
            raise UsageError("malformed certificate: " + "; ".join(problems))
        return cert

    # -- checking -------------------------------------------------------------------------------

    def _shape_problems(self) -> list[str]:
        p: list[str] = []
        for name in ("intent", "domain", "tool", "agent", "hash"):
            if not isinstance(getattr(self, name), str):
                p.append(f"{name} is not a string")
        if self.parent is not None and not isinstance(self.parent, str):
            p.append("parent is neither null nor a string")
        if type(self.seq) is not int or self.seq < 1:
            p.append("seq is not a positive integer")
        vc = self.vector_clock
        if not isinstance(vc, Mapping) or not all(
                isinstance(k, str) and type(v) is int and v >= 1 for k, v in vc.items()):
            p.append("vector_clock is not an object of positive integers")
        elif vc.get(self.domain) != self.seq:
            p.append("vector_clock[domain] is not seq")
        rs = self.read_set
        if not isinstance(rs, list) or not all(
                isinstance(r, Mapping) and set(r) == {"domain", "seq"}
                and isinstance(r["domain"], str) and type(r["seq"]) is int for r in rs):
            p.append("read_set is not a list of {domain, seq}")
        if self.signature is not None and (not isinstance(self.signature, str)
                                           or not self.signature.startswith(SIGNATURE_PREFIX)):
            p.append("signature is not an hmac-sha256 signature")
        return p

    def problems(self, key: bytes | str | None = None) -> list[str]:
        """Why this certificate does not verify (empty when it does).

        ``key`` (else AGENT2PC_FENCE_HMAC_KEY) checks the signature. A signed certificate with no
        key at hand does not verify: nothing vouches for the signature then. With a key at
        hand, an unsigned certificate does not verify either: anyone can recompute a hash, so
        a changed certificate stripped of its signature would otherwise pass.
        """
        found = self._shape_problems()
        try:
            data = canonical(self.body())
        except CanonicalError as exc:
            return found + [f"not canonical JSON: {exc}"]
        if not _same(sha256_hex(data), self.hash):
            found.append("hash does not match the content")
        kb = _key_bytes(key) or env_key()
        if self.signature is not None:
            if kb is None:
                found.append(f"signed, but no key to check it (set {HMAC_KEY_ENV})")
            elif not _same(_sign(kb, data), self.signature):
                found.append("signature does not match")
        elif kb is not None:
            found.append("unsigned, but a signing key is configured: only its signature "
                         "vouches for a certificate")
        return found

    def verify(self, key: bytes | str | None = None) -> bool:
        """True when the hash matches the content and, with a key (given or in the
        environment), the signature matches too; without a key, only an unsigned one can."""
        return not self.problems(key)

    def sign(self, key: bytes | str) -> "Certificate":
        """A copy signed with ``key`` (the hash does not change)."""
        kb = _key_bytes(key)
        if not kb:
            raise UsageError("an empty signing key")
        return self.replace(signature=_sign(kb, canonical(self.body())))

    # -- causality ------------------------------------------------------------------------------

    def happened_before(self, other: "Certificate") -> bool:
        return happened_before(self, other)

    def concurrent_with(self, other: "Certificate") -> bool:
        return concurrent(self, other)


if TYPE_CHECKING:
    Clock = Union[Certificate, Mapping[str, int]]


def _clock(x: Clock) -> Mapping[str, int]:
    return x.vector_clock if isinstance(x, Certificate) else x


def compare(a: Clock, b: Clock) -> str:
    """``"before"`` (a happened-before b), ``"after"``, ``"equal"`` or ``"concurrent"``."""
    ca, cb = _clock(a), _clock(b)
    a_le = all(v <= cb.get(k, 0) for k, v in ca.items())
    b_le = all(v <= ca.get(k, 0) for k, v in cb.items())
    if a_le and b_le:
        return "equal"
    if a_le:
        return "before"
    if b_le:
        return "after"
    return "concurrent"


def happened_before(a: Clock, b: Clock) -> bool:
    return compare(a, b) == "before"


def concurrent(a: Clock, b: Clock) -> bool:
    return compare(a, b) == "concurrent"


def merge(clocks: Iterable[Mapping[str, int] | None]) -> dict[str, int]:
    """The entry-wise maximum of some clocks."""
    out: dict[str, int] = {}
    for c in clocks:
        if not c:
            continue
        for k, v in c.items():
            if v > out.get(k, 0):
                out[k] = v
    return out


def chain_problems(certs: Sequence[Certificate], key: bytes | str | None = None,
                   *, complete: bool = True) -> list[str]:
    """Why ``certs`` (root first) is not a valid chain; empty when it is.

    Each certificate must verify, name the one before it as its parent (by hash), and come after
    it causally. With ``complete`` the first one must be a root (no parent).
    """
    found: list[str] = []
    if not certs:
        return ["an empty chain"]
    for i, cert in enumerate(certs):
        for p in cert.problems(key):
            found.append(f"[{i}] {cert.intent if isinstance(cert.intent, str) else '?'}: {p}")
        if i == 0:
            if complete and cert.parent is not None:
                found.append("[0] is not a root: it names a parent")
            continue
        prev = certs[i - 1]
        if cert.parent != prev.hash:
            found.append(f"[{i}] does not name [{i - 1}] as its parent")
        elif not happened_before(prev, cert):
            found.append(f"[{i}] does not come after [{i - 1}] in its vector clock")
    return found


def verify_chain(certs: Sequence[Certificate], key: bytes | str | None = None,
                 *, complete: bool = True) -> bool:
    """True when ``certs`` (root first) is an intact chain of verified certificates."""
    return not chain_problems(certs, key, complete=complete)
