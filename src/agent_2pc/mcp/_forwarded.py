"""A tool result from the downstream server, made independent of the protocol revision it came in.

``mcp wrap`` speaks two protocol revisions at once: the one negotiated with its client and the
one negotiated with the downstream server (each side picks its own; a 2025-11-25 downstream can
sit behind a 2026-07-28 client, or the reverse). A result must reach the client in the shape
of the *client's* revision, whatever the downstream's.

The SDK's server already shapes a result for the client's revision, from the SDK's
version-free model (``mcp_types.CallToolResult``): it validates it against that revision's
schema, adds what the revision requires (``resultType``, the ``serverInfo`` stamp of
2026-07-28) and drops what the revision does not know. What it cannot take is another
revision's wire dict (a 2025 result has no ``resultType``, which 2026-07-28 requires). So the
downstream's dict is read into that model and handed on as the model's JSON form
(``neutral``): that is what is recorded in the fence, replayed, and given to the SDK's server.

What belongs to the downstream hop stays there: the protocol's own ``_meta`` keys
(``io.modelcontextprotocol/...``: the downstream's ``serverInfo`` stamp, its task ids), as the
client's are not passed down. A result that is not a complete tool result -- not a
CallToolResult, or a ``resultType`` other than ``complete`` (an ``input_required`` interim
result, an extension's shape) -- raises NotAToolResult.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from pydantic import ValidationError

RESERVED_META_PREFIX = "io.modelcontextprotocol/"


class NotAToolResult(Exception):
    """The downstream answered something that is not a complete tool result."""


def neutral(raw: Any) -> dict[str, Any]:
    """``raw`` (a ``tools/call`` result as some revision sends it) as the JSON form of the
    version-free CallToolResult, without the downstream hop's reserved ``_meta`` keys."""
    try:
        model = types.CallToolResult.model_validate(raw, by_name=False)
    except ValidationError as exc:
        raise NotAToolResult(str(exc)) from None
    if model.result_type != "complete":
        raise NotAToolResult(f"resultType {model.result_type!r}: not a complete tool result")
    out: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    meta = out.get("_meta")
    if meta and any(k.startswith(RESERVED_META_PREFIX) for k in meta):
        out["_meta"] = {k: v for k, v in meta.items() if not k.startswith(RESERVED_META_PREFIX)}
    return out
