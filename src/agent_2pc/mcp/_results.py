"""Tool results: the CLI's JSON object as structured content, and as text for older clients.

- success: ``{ok: true, ...}``, isError false.
- an answer that is no (an error whose CLI exit status is 1: TransactionAborted, FenceRefusal,
  Busy, UnknownOutcome): ``{ok: false, error: {code, message}, ...}``, isError false -- a normal
  result that the tool's outputSchema describes.
- bad input and a workspace that cannot serve (exit status 2), and internal failures: the same
  ``{ok: false, error}`` object with isError true, so that a client can still read the code.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from ..errors import Agent2PCError
from ..results import failure, refusal
from ..results import success as _success


def _safe(obj: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The object and its JSON text; a lone surrogate (from a non-UTF-8 file name, say) becomes
    U+FFFD rather than breaking the transport's UTF-8."""
    text = json.dumps(obj, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
        obj = json.loads(text)
    return obj, text


def result(obj: dict[str, Any], is_error: bool = False) -> types.CallToolResult:
    obj, text = _safe(obj)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=obj, is_error=is_error)


def success(res: dict[str, Any]) -> types.CallToolResult:
    return result(_success(res))


def error(err: Agent2PCError) -> types.CallToolResult:
    return result(failure(err), is_error=err.exit_status != 1)


def coded(code: str, message: str, **details: Any) -> types.CallToolResult:
    """An isError result with a code of ours (used by ``mcp wrap`` for its own refusals)."""
    return result(refusal(code, message, **details), is_error=True)


def internal(exc: BaseException) -> types.CallToolResult:
    return coded("internal", f"internal error ({type(exc).__name__}: {exc}); the server keeps "
                             "serving; see its stderr")
