"""JSON that comes from outside (option values, files, manifests): parsed within bounds.

One loader for every option and file that carries JSON, so that none of them can reach a
RecursionError, a UnicodeDecodeError or a value that the log cannot hold:

- at most ``JSON_BYTES_MAX`` bytes, nested at most ``JSON_DEPTH_MAX`` levels (the fence's
  canonical form has the same bound);
- valid UTF-8, no ``NaN``/``Infinity`` (not JSON), no lone surrogate (``"\\ud800"``: not
  Unicode text, and the log is UTF-8).

A value that breaks a bound is refused with the error the caller names (``usage`` for an
option, ``invalid_manifest`` for a manifest, ``stale_lease`` for a ticket). Pure: no I/O.
"""

from __future__ import annotations

import json

from ..errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..errors import Agent2PCError

    Error = Callable[[str], Agent2PCError]

JSON_DEPTH_MAX = 64
JSON_BYTES_MAX = 64 << 20


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf (nan never gets here: it has no number syntax)
        raise ValueError(f"{text} is out of range")
    return value


def loads(data: bytes | str, what: str, error: Error = UsageError) -> Any:
    """Parse ``data`` (``what`` names it in messages) within the bounds above. Bytes must be
    UTF-8 (a byte-order mark is skipped)."""
    if len(data) > JSON_BYTES_MAX:
        raise error(f"{what} is larger than {JSON_BYTES_MAX >> 20} MiB")
    if isinstance(data, str):
        text, strings = data, True  # a str may hold a lone surrogate itself
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise error(f"{what} is not UTF-8 text (byte {exc.start})") from None
        strings = "\\ud" in text or "\\uD" in text  # a lone surrogate needs a \u escape
    try:
        obj = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except RecursionError:
        raise error(f"{what} is nested deeper than {JSON_DEPTH_MAX} levels") from None
    except ValueError as exc:  # JSONDecodeError, NaN, 1e999
        raise error(f"{what} is not valid JSON: {exc}") from None
    check(obj, what, error, strings=strings)
    return obj


def check(obj: Any, what: str, error: Error = UsageError, strings: bool = True) -> None:
    """Refuse a value (parsed, or built by a library caller) nested deeper than the bound, or
    holding anything but JSON (with ``strings``: also a string that is not Unicode text)."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > JSON_DEPTH_MAX:
            raise error(f"{what} is nested deeper than {JSON_DEPTH_MAX} levels")
        stack.extend((v, depth + 1) for v in children if isinstance(v, (dict, list)))
    if not strings:
        return
    try:
        json.dumps(obj, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(f"{what} holds a string that is not Unicode text (a lone surrogate "
                    f"{exc.object[exc.start:exc.end]!a})") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise error(f"{what} is not JSON: {exc}") from None
