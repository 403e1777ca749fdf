"""One line of the stdio transport -> a JSON-RPC message, or the error that answers it.

JSON-RPC 2.0 (section 5.1) and MCP say how malformed input is answered:

- bytes that are not JSON (or not UTF-8): ``-32700`` parse error, ``id: null``;
- JSON that is not a valid message (not an object, a batch, no ``jsonrpc: "2.0"``, a
  ``method`` that is not a string, ``params`` that are not an object, an ``id`` that is null,
  fractional or boolean -- MCP requires a string or an integer): ``-32600`` invalid request,
  with the message's ``id`` when it has a valid one (so that a client waiting on that id gets
  its answer), else ``id: null``.

The SDK's transports hand such lines to the session as exceptions, which its dispatcher drops
(the client waits for ever), and a request whose ``id`` is null, fractional or boolean even
parses there as a notification, which is never answered. ``decode`` is pure; the transport
(_stdio.py) writes the error back itself. A valid line costs one parse, as before; only a
notification whose line mentions ``"id"`` is parsed a second time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.shared.message import SessionMessage
from pydantic import ValidationError


@dataclass(frozen=True)
class Refusal:
    """A line that is not a message: ``reply`` is the error response to write back."""

    reply: SessionMessage


def error(code: int, message: str, rid: Any = None) -> Refusal:
    return Refusal(SessionMessage(types.JSONRPCError(
        jsonrpc="2.0", id=rid, error=types.ErrorData(code=code, message=message))))


def decode(line: bytes) -> SessionMessage | Refusal:
    """The message on ``line`` (one JSON text, without its newline), or its refusal."""
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError:
        return _refusal(line)
    if isinstance(message, types.JSONRPCNotification) and b'"id"' in line:
        obj = json.loads(line)
        if isinstance(obj, dict) and "id" in obj:  # a request whose id is not valid
            return error(types.INVALID_REQUEST, "Invalid request: id must be a string or an "
                                                "integer")
    return SessionMessage(message)


def too_long(bytes_max: int) -> Refusal:
    """A line over the transport's limit, discarded unread: its id cannot be known."""
    return error(types.INVALID_REQUEST, f"Invalid request: a message longer than {bytes_max} "
                                        "bytes was discarded")


def _refusal(line: bytes) -> Refusal:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return error(types.PARSE_ERROR, "Parse error: the message is not valid JSON")
    if isinstance(obj, list):
        return error(types.INVALID_REQUEST, "Invalid request: JSON-RPC batches are not "
                                            "supported; send one message per line")
    if not isinstance(obj, dict):
        return error(types.INVALID_REQUEST, "Invalid request: a message is a JSON object")
    rid = obj.get("id")
    return error(types.INVALID_REQUEST, f"Invalid request: {_defect(obj)}",
                 rid if _valid_id(rid) else None)


def _defect(obj: dict[str, Any]) -> str:
    if obj.get("jsonrpc") != "2.0":
        return 'jsonrpc must be "2.0"'
    if "id" in obj and not _valid_id(obj["id"]):
        return "id must be a string or an integer"
    if "method" in obj and not isinstance(obj["method"], str):
        return "method must be a string"
    if obj.get("params") is not None and not isinstance(obj["params"], dict):
        return "params must be an object"
    return "not a JSON-RPC request, notification or response"


def _valid_id(rid: Any) -> bool:
    return isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool))
