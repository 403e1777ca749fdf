"""Rendering of results: one JSON object with ``--json``, readable text otherwise.

Every command returns a dict (its contract result without ``ok``) or raises an Agent2PCError.
The JSON shape is the same for the CLI and the MCP server; text is for people.
"""

from __future__ import annotations

import json
import sys

from ..errors import Agent2PCError, CheckFailed, TransactionAborted

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any, Callable


def success(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": True}
    out.update(result)
    return out


def failure(err: Agent2PCError) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": False}
    if isinstance(err, TransactionAborted) and err.tid:
        out["tid"] = err.tid
        out["state"] = "aborted"
    elif isinstance(err, CheckFailed) and err.tid:
        out["tid"] = err.tid
    extra = err.details.get("result")
    if isinstance(extra, dict):
        out.update(extra)
    error = {k: v for k, v in err.to_json().items() if k != "result"}
    out["error"] = error
    return out


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


def emit_error(err: Agent2PCError, as_json: bool) -> None:
    if as_json:
        emit_json(failure(err))
        return
    obj = failure(err)
    prefix = f"{obj['tid']}: aborted: " if obj.get("state") == "aborted" else ""
    sys.stderr.write(f"agent-2pc: {prefix}{err.message} [{err.code}]\n")
