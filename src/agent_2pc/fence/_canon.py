"""Canonical JSON (RFC 8785, "JCS") and the SHA-256 digests built on it.

Fingerprints and certificate hashes are SHA-256 over these bytes, so two values that mean the
same JSON (``1`` and ``1.0``, keys in another order) get the same digest, and values that JSON
cannot carry exactly (NaN, infinities, integers beyond 2**53 - 1, non-string keys, lone
surrogates) are refused instead of being rounded into a collision.

The reference is the ``rfc8785`` package. It costs about 14 us for a small object, which is most of
the budget of a replayed decision, so plain values take a fast path: the standard library's JSON
encoder, with sorted keys and no whitespace, writes exactly the RFC 8785 bytes when the value holds
no floats, only integers in the safe range and only keys made of ASCII characters (JCS sorts keys
by UTF-16 code units, which agrees with Python's code point order there). Everything else goes to
the reference. tests/fence/test_canonical.py checks the fast path against the reference over many
random values.
"""

from __future__ import annotations

import json

from ..storage.hashing import sha256_bytes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SAFE_INT_MAX = 2**53 - 1
DEPTH_MAX = 64  # nesting deeper than this is refused (a bound on recursion)

_encode = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                           allow_nan=False, check_circular=False).encode


class CanonicalError(ValueError):
    """The value has no RFC 8785 form (NaN, a huge integer, a non-string key, ...)."""


def _plain(value: Any, depth: int) -> bool:
    """True when the fast encoder writes ``value`` exactly as RFC 8785 does."""
    t = type(value)
    if t is str or value is None or t is bool:
        return True
    if t is int:
        return bool(-SAFE_INT_MAX <= value <= SAFE_INT_MAX)
    if depth >= DEPTH_MAX:
        return False
    if t is dict:
        for k, v in value.items():
            if type(k) is not str or not k.isascii() or not _plain(v, depth + 1):
                return False
        return True
    if t is list or t is tuple:
        for v in value:
            if not _plain(v, depth + 1):
                return False
        return True
    return False


def _depth_ok(value: Any, depth: int = 0) -> bool:
    if depth > DEPTH_MAX:
        return False
    if isinstance(value, dict):
        return all(_depth_ok(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_depth_ok(v, depth + 1) for v in value)
    return True


def canonical(value: Any) -> bytes:
    """The RFC 8785 bytes of ``value``; raises CanonicalError when there are none."""
    if _plain(value, 0):
        try:
            return _encode(value).encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate in a string
            raise CanonicalError(f"a string is not valid Unicode: {exc.reason}") from None
    if not _depth_ok(value):
        raise CanonicalError(f"nested deeper than {DEPTH_MAX} levels")
    import rfc8785

    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeError, RecursionError) as exc:
        raise CanonicalError(str(exc) or type(exc).__name__) from None


def reference(value: Any) -> bytes:
    """The reference encoder alone (for tests that check the fast path against it)."""
    import rfc8785

    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeError, RecursionError) as exc:
        raise CanonicalError(str(exc) or type(exc).__name__) from None


def sha256_hex(data: bytes) -> str:
    return sha256_bytes(data)


def fingerprint(tool: str, domain: str, args: Any) -> str:
    """What ``intent_conflict`` compares: SHA-256 of the canonical JSON of (tool, domain, args)."""
    return sha256_hex(canonical({"tool": tool, "domain": domain, "args": args}))
