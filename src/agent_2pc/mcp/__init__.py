"""agent-2pc over the Model Context Protocol (the official Python SDK, stdio).

- ``agent-2pc mcp`` (``serve``): the transaction and fence tools (_tools.py holds the table).
- ``agent-2pc mcp wrap -- CMD ...`` (``wrap``): a proxy that puts the effect fence in front of
  another MCP server's tools (_wrap.py).

Importing the SDK costs about a second, so nothing here imports it at module level: the CLI's
other commands never load it (tests/mcp/test_mcp_cli.py checks ``sys.modules``).
docs/mcp.md is the user's guide.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence

__all__ = ["serve", "wrap"]


def serve(root: str | None = None, store: str | None = None) -> None:
    """Serve agent-2pc's tools over stdin/stdout until the client hangs up."""
    from ._server import serve as _serve

    _serve(root, store)


def wrap(argv: Sequence[str], *, store: str, window_s: float = 600.0,
         lease_ttl_s: float = 60.0, result_ttl_s: float = 86400.0,
         call_timeout_s: float | None = None) -> None:
    """Serve the tools of the MCP server ``argv`` over stdin/stdout, fenced (see _wrap.py)."""
    from ._wrap import wrap as _wrap

    _wrap(list(argv), store=store, window_s=window_s, lease_ttl_s=lease_ttl_s,
          result_ttl_s=result_ttl_s, call_timeout_s=call_timeout_s)
