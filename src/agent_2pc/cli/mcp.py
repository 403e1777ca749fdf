"""``agent-2pc mcp`` (serve the tools over stdio) and ``agent-2pc mcp wrap -- CMD ...`` (a fencing
proxy in front of another MCP server). docs/mcp.md is the guide.

Declarative at import time: the MCP SDK (about a second to import) is loaded inside the run
functions only, so that no other command pays for it.
"""

from __future__ import annotations

from ..errors import UsageError
from .args import VALUE, Command, Opt

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_S_MAX = 3650 * 86400.0


def duration_s(value: str) -> float:
    """``90``, ``90s``, ``500ms``, ``10m``, ``2h``, ``1d`` -> seconds."""
    text = value.strip().lower()
    unit = next((u for u in ("ms", "s", "m", "h", "d") if text.endswith(u)), "")
    number = text[:len(text) - len(unit)] if unit else text
    try:
        seconds = float(number) * _UNITS_S.get(unit, 1.0)
    except ValueError:
        raise UsageError(f"not a duration: {value!r} (say 90s, 10m, 2h)") from None
    if not 0 <= seconds <= DURATION_S_MAX or seconds != seconds:
        raise UsageError(f"a duration between 0 and 10 years, not {value!r}")
    return seconds


def run_serve(ctx: Any, args: dict[str, Any]) -> None:
    from ..mcp import serve

    serve(ctx.root_arg, args.get("store"))
    return None


def run_wrap(ctx: Any, args: dict[str, Any]) -> None:
    import os

    argv = args.get("argv") or []
    if not argv:
        raise UsageError("'mcp wrap' needs the downstream server's command line after '--', "
                         "e.g. agent-2pc mcp wrap -- npx -y some-mcp-server")
    store = args.get("store") or os.environ.get("AGENT2PC_FENCE_STORE")
    if not store:
        store = "sqlite:///" + os.path.join(ctx.root(), ".agent-tx", "fence.db").lstrip("/")
    lease_ttl = args.get("lease_ttl")
    if lease_ttl is not None and lease_ttl <= 0:
        raise UsageError("--lease-ttl must be more than 0")
    call_timeout = args.get("call_timeout")
    from ..mcp import wrap

    wrap(argv, store=store,
         window_s=600.0 if args.get("window") is None else args["window"],
         lease_ttl_s=60.0 if lease_ttl is None else lease_ttl,
         result_ttl_s=args.get("result_ttl") or 86400.0,
         call_timeout_s=call_timeout or None)
    return None


_STORE = Opt("--store", VALUE, metavar="URL", help="the effect fence's store: sqlite:///path, "
             "postgresql://... (default: $AGENT2PC_FENCE_STORE, else .agent-tx/fence.db)")

WRAP = Command(
    "wrap", "serve another MCP server's tools, with the effect fence in front of every tool "
    "that is not read-only", run=run_wrap,
    opts=(_STORE,
          Opt("--window", VALUE, metavar="DURATION", type=duration_s, help="without an "
              "idempotency key, a call identical to one that finished less than this ago gets "
              "that call's result instead of running again (default 10m)"),
          Opt("--result-ttl", VALUE, metavar="DURATION", type=duration_s, help="how long a "
              "result is replayed for a call with an idempotency key (default 24h)"),
          Opt("--lease-ttl", VALUE, metavar="DURATION", type=duration_s, help="the lease of a "
              "running call; heartbeated while it runs (default 60s)"),
          Opt("--call-timeout", VALUE, metavar="DURATION", type=duration_s, help="give up on a "
              "downstream call after this long: an unknown outcome, fenced (default: none)")),
    takes_rest=True,
    epilog="A client passes an idempotency key as the argument 'idempotencyKey' or in the "
           "request's _meta; it is not passed downstream. A call whose outcome is unknown (the "
           "downstream died or timed out) stays fenced until 'agent-2pc fence reconcile "
           "--intent I --action clear|done'. See docs/mcp.md.",
)

MCP = Command(
    "mcp", "serve agent-2pc to agents over the Model Context Protocol (stdio)", run=run_serve,
    opts=(_STORE,), subcommands=(WRAP,),
    epilog="Run bare, it serves the agent_2pc_* and fence_* tools on stdin/stdout for an MCP "
           "client (Claude Code: claude mcp add agent-2pc -- agent-2pc mcp). See docs/mcp.md.",
)
