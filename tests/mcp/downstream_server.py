"""A small downstream MCP server for the ``mcp wrap`` tests and benchmark.

Plain stdio JSON-RPC with the standard library only (the ``initialize`` handshake era): it starts
in a few milliseconds, where one on the SDK takes a second, and it shows that the proxy fronts
any MCP server, not only the SDK's. Each ``tools/call`` runs in its own thread, so a hanging call
does not block the others. It answers the revision its client asks for, or
``$DOWNSTREAM_PROTOCOL`` whatever the client asks (to test a client that gets an older
revision than it asked for). ``server/discover`` (2026-07-28) is an unknown method here, as on
any server of the handshake era. sdk_downstream.py is the 2026-07-28 counterpart.

Every side-effecting tool appends one JSON line to ``$DOWNSTREAM_EFFECTS`` (fsynced) *before* it
answers: the number of lines is the number of real executions, counted by the server itself, not
by the fence. A line holds the tool, the raw arguments, the ``_meta`` keys the call arrived
with (the protocol's own ``io.modelcontextprotocol/*`` and ``progressToken`` left out), so that a
test can check what the proxy passed on, and the protocol revision of the connection.

Tools
  charge(amount, note?)   side effect after sleeping $DOWNSTREAM_SLEEP_S (default 0.2), so that
                          concurrent duplicates overlap; answers {"charge": <its line number>}
  noop(n?)                side effect, no sleep (the benchmark's call)
  count()                 read-only: {"lines": N}
  flaky(label)            answers isError the first time for a label (no effect), then works
  plain(text)             side effect; answers text content only (no structured content)
  tagged(tag)             side effect; its result carries _meta {"example.com/tag": tag}
  crash()                 appends its line, then the process dies (exit 3) without answering
  hang()                  appends its line, then never answers
  reject(x)               a JSON-RPC error (invalid params) instead of a result; no effect
  garbage()               appends its line, then answers something that is not a tool result
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

EFFECTS = os.environ.get("DOWNSTREAM_EFFECTS", os.devnull)
SLEEP_S = float(os.environ.get("DOWNSTREAM_SLEEP_S", "0.2"))
PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
FORCED = os.environ.get("DOWNSTREAM_PROTOCOL")
assert FORCED in (None, *PROTOCOL_VERSIONS), FORCED
protocol = ""  # the connection's revision, once initialized

_out_lock = threading.Lock()
_effects_lock = threading.Lock()
_flaky_seen: set[str] = set()


def send(message: dict) -> None:
    data = json.dumps(message, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(data)
        sys.stdout.flush()


def effect(tool: str, args: dict, meta: dict) -> int:
    keys = sorted(k for k in meta if not k.startswith("io.modelcontextprotocol/")
                  and k != "progressToken")
    line = json.dumps({"tool": tool, "args": args, "meta": keys, "pid": os.getpid(),
                       "protocol": protocol})
    with _effects_lock:
        with open(EFFECTS, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        return lines()


def lines() -> int:
    try:
        with open(EFFECTS) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def tool(name: str, props: dict, read_only: bool = False, output: dict | None = None) -> dict:
    out = {"name": name, "description": f"test tool {name}",
           "inputSchema": {"type": "object", "properties": props},
           "annotations": {"readOnlyHint": read_only, "idempotentHint": read_only}}
    if not read_only:
        out["annotations"]["destructiveHint"] = False
    if output is not None:
        out["outputSchema"] = output
    return out


TOOLS = [
    tool("charge", {"amount": {"type": "integer"}, "note": {"type": "string"}},
         output={"type": "object", "properties": {"charge": {"type": "integer"}},
                 "required": ["charge"]}),
    tool("noop", {"n": {"type": "integer"}}),
    tool("count", {}, read_only=True),
    tool("flaky", {"label": {"type": "string"}}),
    tool("plain", {"text": {"type": "string"}}),
    tool("tagged", {"tag": {"type": "string"}}),
    tool("crash", {}),
    tool("hang", {}),
    tool("reject", {"x": {"type": "integer"}}),
    tool("garbage", {}),
]


def ok(obj: dict) -> dict:
    return {"content": [{"type": "text", "text": json.dumps(obj)}], "structuredContent": obj,
            "isError": False}


def call(req_id: object, params: dict) -> None:
    name = params.get("name")
    args = params.get("arguments") or {}
    meta = params.get("_meta") or {}
    result: dict | None = None
    if name == "charge":
        time.sleep(SLEEP_S)
        result = ok({"charge": effect(name, args, meta)})
    elif name == "noop":
        result = ok({"n": effect(name, args, meta)})
    elif name == "count":
        result = ok({"lines": lines()})
    elif name == "flaky":
        label = str(args.get("label"))
        with _effects_lock:
            first = label not in _flaky_seen
            _flaky_seen.add(label)
        result = ({"content": [{"type": "text", "text": "try again"}], "isError": True}
                  if first else ok({"n": effect(name, args, meta)}))
    elif name == "plain":
        effect(name, args, meta)
        result = {"content": [{"type": "text", "text": str(args.get("text"))}]}
    elif name == "tagged":
        n = effect(name, args, meta)
        result = {"content": [{"type": "text", "text": f"tagged {n}"}],
                  "_meta": {"example.com/tag": args.get("tag")}}
    elif name == "crash":
        effect(name, args, meta)
        os._exit(3)
    elif name == "hang":
        effect(name, args, meta)
        return  # never answered
    elif name == "garbage":
        effect(name, args, meta)
        result = {"content": "not a list of blocks"}
    elif name == "reject":
        send({"jsonrpc": "2.0", "id": req_id,
              "error": {"code": -32602, "message": "x must be positive"}})
        return
    else:
        send({"jsonrpc": "2.0", "id": req_id,
              "error": {"code": -32602, "message": f"unknown tool {name}"}})
        return
    send({"jsonrpc": "2.0", "id": req_id, "result": result})


def handle(msg: dict) -> None:
    method, req_id, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
    if req_id is None:
        return  # a notification (initialized, cancelled, ...)
    if method == "initialize":
        global protocol
        wanted = params.get("protocolVersion")
        protocol = FORCED or (wanted if wanted in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[-1])
        send({"jsonrpc": "2.0", "id": req_id, "result": {
            "protocolVersion": protocol,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "downstream-test", "version": "1.0"}}})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": req_id, "result": {}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        threading.Thread(target=call, args=(req_id, params), daemon=True).start()
    else:
        send({"jsonrpc": "2.0", "id": req_id,
              "error": {"code": -32601, "message": f"method not found: {method}"}})


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            handle(json.loads(line))


if __name__ == "__main__":
    main()
