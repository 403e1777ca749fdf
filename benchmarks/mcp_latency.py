#!/usr/bin/env python3
"""MCP latency: what a tool call costs an agent over stdio, with the SDK's own client.

1. ``agent-2pc mcp``: ``agent_2pc_stage_write`` (a small file into an active transaction)
   against ``agent_2pc_noop`` (the same server's path -- argument validation, worker thread,
   rendering -- doing nothing; registered with $AGENT2PC_MCP_NOOP=1), interleaved. The staging
   overhead is the difference of the medians.
2. ``agent-2pc mcp wrap``: the same side-effecting tool (``noop`` of tests/mcp/downstream_server.py,
   which appends and fsyncs one line per call) called directly and through the proxy, interleaved,
   each call with new arguments so that every wrapped call is fenced fresh (prepare, forward
   with a heartbeat, commit; SQLite store in .agent-tx/). The added latency is the difference of
   the medians. Also: a replayed duplicate, and a read-only tool passed through unfenced.

Each is measured twice: with the client on the initialize handshake (protocol 2025-11-25, as
Claude Code does; ``server`` and ``wrap``, the figures compared across versions), and with the
SDK's ``Client`` at its defaults (``mode="auto"``: protocol 2026-07-28 with agent-2pc;
``server_sdk_default``, ``wrap_sdk_default``). The downstream server speaks the handshake
(2025-11-25) to both the direct client and the proxy.

Targets (issue 5): staging overhead over the no-op <= 1 ms p50; ``wrap`` adds <= 2 ms p50 on
the SQLite store.

    python benchmarks/mcp_latency.py              # 1000 calls of each kind
    python benchmarks/mcp_latency.py --smoke      # CI: 40 calls of each
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

TARGET_STAGING_OVERHEAD_MS = 1.0
TARGET_WRAP_ADDED_MS = 2.0
DOWNSTREAM = os.path.join(C.PROJECT, "tests", "mcp", "downstream_server.py")
WARMUP_CALLS = 20
TX_OPS_MAX = 50  # a new transaction every this many staged writes (untimed)


def _params(python: str, env: dict[str, str], args: list[str], cwd: str) -> Any:
    from mcp import StdioServerParameters

    return StdioServerParameters(command=python, args=args, env=env, cwd=cwd)


async def bench_server(python: str, env: dict[str, str], root: str, calls: int, mode: str
                       ) -> dict[str, Any]:
    from mcp import Client

    params = _params(python, {**env, "AGENT2PC_MCP_NOOP": "1"},
                     ["-m", "agent_2pc", "--root", root, "mcp"], root)
    write_s: list[float] = []
    noop_s: list[float] = []
    async with Client(params, mode=mode, cache=None) as c:
        protocol = c.protocol_version
        async def begin() -> str:
            res = await c.call_tool("agent_2pc_begin", {"label": "mcp latency"})
            return str(res.structured_content["tid"])

        tid = await begin()
        staged = 0
        for i in range(WARMUP_CALLS + calls):
            if staged >= TX_OPS_MAX:
                await c.call_tool("agent_2pc_abort", {"tid": tid})
                tid, staged = await begin(), 0
            order = ("write", "noop") if i % 2 else ("noop", "write")
            for kind in order:
                t = C.now()
                if kind == "write":
                    res = await c.call_tool("agent_2pc_stage_write", {
                        "tid": tid, "path": f"src/file{i % 20:02d}.py",
                        "content": f"VALUE = {i}\n" * 8})
                else:
                    res = await c.call_tool("agent_2pc_noop", {})
                dt = C.now() - t
                if res.is_error or not res.structured_content["ok"]:
                    raise SystemExit(f"{kind} failed: {res.structured_content}")
                if i >= WARMUP_CALLS:
                    (write_s if kind == "write" else noop_s).append(dt)
            staged += 1
        await c.call_tool("agent_2pc_abort", {"tid": tid})
    write, noop = C.latency_ms(write_s), C.latency_ms(noop_s)
    overhead = C.r3(write["p50"] - noop["p50"])
    return {"protocol": protocol,
            "stage_write_ms": write, "noop_ms": noop, "staging_overhead_p50_ms": overhead,
            "target_staging_overhead_p50_ms": TARGET_STAGING_OVERHEAD_MS,
            "staging_target_met": overhead <= TARGET_STAGING_OVERHEAD_MS}


async def bench_wrap(python: str, env: dict[str, str], root: str, effects: str, calls: int,
                     mode: str) -> dict[str, Any]:
    from mcp import Client

    down_env = {**env, "DOWNSTREAM_EFFECTS": effects}
    direct_p = _params(python, down_env, [DOWNSTREAM], root)
    wrap_p = _params(python, down_env, ["-m", "agent_2pc", "--root", root, "mcp", "wrap", "--",
                                        python, DOWNSTREAM], root)
    direct_s: list[float] = []
    wrapped_s: list[float] = []
    replay_s: list[float] = []
    passthrough_s: list[float] = []
    direct_ro_s: list[float] = []
    async with Client(direct_p, mode=mode, cache=None) as direct, \
            Client(wrap_p, mode=mode, cache=None) as wrapped:
        protocols = {"direct": direct.protocol_version, "wrapped": wrapped.protocol_version}
        for i in range(WARMUP_CALLS + calls):
            order = ((direct, direct_s), (wrapped, wrapped_s))
            for client, samples in (order if i % 2 else order[::-1]):
                t = C.now()
                res = await client.call_tool("noop", {"n": i})
                dt = C.now() - t
                if res.is_error:
                    raise SystemExit(f"noop failed: {res}")
                if i >= WARMUP_CALLS:
                    samples.append(dt)
        for i in range(WARMUP_CALLS + calls // 2):
            t = C.now()
            res = await wrapped.call_tool("noop", {"n": i % calls})  # done before: replayed
            dt = C.now() - t
            assert res.meta and "agent-2pc/fence" in res.meta, res
            if i >= WARMUP_CALLS:
                replay_s.append(dt)
            for client, samples in ((direct, direct_ro_s), (wrapped, passthrough_s)):
                t = C.now()
                await client.call_tool("count", {})
                if i >= WARMUP_CALLS:
                    samples.append(C.now() - t)
    with open(effects) as f:
        executions = sum(1 for _ in f)
    d, w = C.latency_ms(direct_s), C.latency_ms(wrapped_s)
    added = C.r3(w["p50"] - d["p50"])
    ro_d, ro_w = C.latency_ms(direct_ro_s), C.latency_ms(passthrough_s)
    return {"protocol": protocols,
            "direct_ms": d, "wrapped_ms": w, "added_p50_ms": added,
            # the hop alone (no fence): what the proxy costs a call before the fence's share
            "read_only_added_p50_ms": C.r3(ro_w["p50"] - ro_d["p50"]),
            "target_added_p50_ms": TARGET_WRAP_ADDED_MS,
            "wrap_target_met": added <= TARGET_WRAP_ADDED_MS,
            "replayed_duplicate_ms": C.latency_ms(replay_s),
            "read_only_direct_ms": ro_d,
            "read_only_passthrough_ms": ro_w,
            "downstream_executions": executions,
            "expected_executions": 2 * (WARMUP_CALLS + calls),
            "store": "sqlite (.agent-tx/fence.db)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a quick run for CI")
    ap.add_argument("--calls", type=int, default=None, help="timed calls of each kind")
    opts = ap.parse_args()
    calls = opts.calls or (40 if opts.smoke else 1000)
    import anyio

    python = C.venv_python()
    env = C.bytecode_env(python)
    C.warm_bytecode(python, env)
    result: dict[str, Any] = {"benchmark": "mcp_latency", "smoke": opts.smoke, "calls": calls}
    with C.BenchDir("mcp") as d:
        from agent_2pc import Agent2PC

        for suffix, mode in (("", "legacy"), ("_sdk_default", "auto")):
            root = os.path.join(d.path, "repo" + suffix)
            os.makedirs(root)
            subprocess.run(["git", "init", "-q", root], check=True)
            Agent2PC.init(root)
            C.log(f"mcp latency ({mode}): {calls} calls of each kind in {root}")
            server = anyio.run(bench_server, python, env, root, calls, mode)
            C.log(f"  stage_write over no-op: {server['staging_overhead_p50_ms']} ms p50 "
                  f"({server['protocol']})")
            wrap = anyio.run(bench_wrap, python, env, root,
                             os.path.join(d.path, f"effects{suffix}.jsonl"), calls, mode)
            C.log(f"  wrap adds: {wrap['added_p50_ms']} ms p50 ({wrap['protocol']})")
            if wrap["downstream_executions"] != wrap["expected_executions"]:
                raise SystemExit(f"the downstream ran {wrap['downstream_executions']} times, "
                                 f"expected {wrap['expected_executions']}: {wrap}")
            result["server" + suffix], result["wrap" + suffix] = server, wrap
        result["targets_met"] = all(result[k]["staging_target_met"] for k in
                                    ("server", "server_sdk_default")) and \
            all(result[k]["wrap_target_met"] for k in ("wrap", "wrap_sdk_default"))
        result["dir"] = d.describe(probe=not opts.smoke)
        result["machine"] = C.machine()
    C.emit(result)


if __name__ == "__main__":
    main()
