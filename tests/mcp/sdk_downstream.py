"""The ``mcp wrap`` tests' downstream server on the SDK's own ``MCPServer``: the protocol revision
2026-07-28 (the stateless per-request envelope, ``server/discover``), which the stdlib
downstream_server.py does not speak, and the kind of server the SDK's users write.

The same tools, and the same record of executions, as downstream_server.py (see there):
``charge`` (structured content with an output schema, after $DOWNSTREAM_SLEEP_S), ``noop``,
``count`` (read-only), ``flaky`` (isError the first time per label), ``plain`` (text content
only), ``tagged`` (a result with ``_meta``). Each line in $DOWNSTREAM_EFFECTS names the protocol
revision the call came in. Same server name ("downstream-test"): behind ``mcp wrap`` both are
the same fence domain.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel

EFFECTS = os.environ.get("DOWNSTREAM_EFFECTS", os.devnull)
SLEEP_S = float(os.environ.get("DOWNSTREAM_SLEEP_S", "0.2"))
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)

app = MCPServer("downstream-test", version="1.0")
_lock = threading.Lock()
_flaky_seen: set[str] = set()


def effect(ctx: Context, tool: str, args: dict[str, Any]) -> int:
    meta = ctx.request_context.meta or {}
    keys = sorted(k for k in meta if not k.startswith("io.modelcontextprotocol/")
                  and k != "progressToken")
    line = json.dumps({"tool": tool, "args": args, "meta": keys, "pid": os.getpid(),
                       "protocol": ctx.protocol_version})
    with _lock, open(EFFECTS, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    with open(EFFECTS) as f:
        return sum(1 for _ in f)


class Charge(BaseModel):
    charge: int


@app.tool(annotations=WRITES)
async def charge(amount: int, ctx: Context, note: str | None = None) -> Charge:
    await anyio.sleep(SLEEP_S)
    args: dict[str, Any] = {"amount": amount} if note is None else {"amount": amount,
                                                                       "note": note}
    return Charge(charge=effect(ctx, "charge", args))


@app.tool(annotations=WRITES)
def noop(ctx: Context, n: int = 0) -> dict[str, int]:
    return {"n": effect(ctx, "noop", {"n": n})}


@app.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
def count() -> dict[str, int]:
    try:
        with open(EFFECTS) as f:
            return {"lines": sum(1 for _ in f)}
    except FileNotFoundError:
        return {"lines": 0}


@app.tool(annotations=WRITES)
def flaky(label: str, ctx: Context) -> CallToolResult:
    with _lock:
        first = label not in _flaky_seen
        _flaky_seen.add(label)
    if first:
        return CallToolResult(content=[TextContent(type="text", text="try again")],
                              is_error=True)
    obj = {"n": effect(ctx, "flaky", {"label": label})}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(obj))],
                          structured_content=obj)


@app.tool(annotations=WRITES, structured_output=False)
def plain(text: str, ctx: Context) -> str:
    effect(ctx, "plain", {"text": text})
    return text


@app.tool(annotations=WRITES)
def tagged(tag: str, ctx: Context) -> CallToolResult:
    n = effect(ctx, "tagged", {"tag": tag})
    return CallToolResult(content=[TextContent(type="text", text=f"tagged {n}")],
                          meta={"example.com/tag": tag})


if __name__ == "__main__":
    app.run()
