"""Rendering of results: one JSON object with ``--json``, readable text otherwise.

Every command returns a dict (its contract result without ``ok``) or raises an Agent2PCError.
The JSON shape is results.py's, the MCP server's too; text is for people.
"""

from __future__ import annotations

import json
import sys

from ..results import failure, success

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..errors import Agent2PCError


def emit_json(obj: dict[str, Any]) -> None:
    text = json.dumps(obj, ensure_ascii=False)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a non-UTF-8 argument: escape it
        data = json.dumps(obj, ensure_ascii=True).encode("ascii")
    sys.stdout.flush()
    sys.stdout.buffer.write(data + b"\n")
    sys.stdout.buffer.flush()


def default_text(result: dict[str, Any]) -> str:
    lines = []
    for key, value in result.items():
        if isinstance(value, (list, dict)):
            value = json.dumps(value, ensure_ascii=False)
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def emit(result: dict[str, Any], as_json: bool,
         text: Callable[[dict[str, Any]], str] | None = None) -> None:
    if as_json:
        emit_json(success(result))
        return
    rendered = (text or default_text)(result)
    if rendered:
        sys.stdout.write(rendered.rstrip("\n") + "\n")


def with_flags(err: Agent2PCError) -> Agent2PCError:
    """``err`` with the parameters its message quotes (``err.params``, as in "`timeout_ms`
    must be ...") spelled as the CLI's flags: "--timeout-ms must be ..."."""
    for name in err.params:
        err.message = err.message.replace(f"`{name}`", "--" + name.replace("_", "-"))
    return err


def emit_error(err: Agent2PCError, as_json: bool) -> None:
    err = with_flags(err)
    if as_json:
        emit_json(failure(err))
        return
    obj = failure(err)
    prefix = f"{obj['tid']}: aborted: " if obj.get("state") == "aborted" else ""
    sys.stderr.write(f"agent-2pc: {prefix}{err.message} [{err.code}]\n")
