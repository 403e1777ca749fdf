"""The one result shape of every face: ``{ok: true, ...}`` or ``{ok: false, error: {...}}``.

The library returns dicts (a step's result without ``ok``) and raises Agent2PCError; the CLI
(``--json``), the MCP server and ``mcp wrap`` wrap them here, so that a result reads the same
whichever face produced it (docs/cli.md, "--json").
"""

from __future__ import annotations

from .errors import Agent2PCError, CheckFailed, TransactionAborted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def success(result: dict[str, Any]) -> dict[str, Any]:
    """``{ok: true}`` and the step's fields."""
    out: dict[str, Any] = {"ok": True}
    out.update(result)
    return out


def failure(err: Agent2PCError) -> dict[str, Any]:
    """``{ok: false, error: {code, message, ...}}``; an aborted transaction adds its tid and
    ``state: aborted``, a failed check its tid and the run's result fields."""
    out: dict[str, Any] = {"ok": False}
    if isinstance(err, TransactionAborted) and err.tid:
        out["tid"] = err.tid
        out["state"] = "aborted"
    elif isinstance(err, CheckFailed) and err.tid:
        out["tid"] = err.tid
    extra = err.details.get("result")
    if isinstance(extra, dict):
        out.update(extra)
    out["error"] = {k: v for k, v in err.to_json().items() if k != "result"}
    return out


def refusal(code: str, message: str, **details: Any) -> dict[str, Any]:
    """``{ok: false, error}`` for a refusal that is not an Agent2PCError (a face's own)."""
    return {"ok": False, "error": {"code": code, "message": message, **details}}
