"""`agent-2pc mcp wrap` in front of a small downstream MCP server (issue 5, item 3, third
scenario). Executions are counted by the downstream server's own side effect (a line appended to
a file before it answers: mcpkit.effects), never by the fence.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import anyio
import pytest
from conftest import run_cli
from mcp.shared.exceptions import MCPError
from mcpkit import downstream_params, effects, error, session, sessions, wrap_params

from agent_2pc.fence import open_fence

pytestmark = pytest.mark.timeout(60)
REPLAYED = "agent-2pc/fence"


def fence_of(root: str) -> Any:
    return open_fence("sqlite:///" + os.path.join(root, ".agent-tx", "fence.db").lstrip("/"))


def lines_of(path: str, tool: str) -> list[dict[str, Any]]:
    return [e for e in effects(path) if e["tool"] == tool]


def test_concurrent_identical_calls_and_retries_from_two_proxies_execute_once(
        root: str, tmp_path: Any) -> None:
    out = str(tmp_path / "effects.jsonl")
    slow = {"DOWNSTREAM_SLEEP_S": "0.5"}

    async def body(a: Any, b: Any) -> list[Any]:
        results: list[Any] = []

        async def call(client: Any) -> None:
            results.append(await client.call_tool("charge", {"amount": 5, "note": "x"}))

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(call, a if i % 3 else b)
        for client in (a, b, a, b):  # retries after the first finished
            await call(client)
        return results

    results = sessions([wrap_params(root, out, downstream_env=slow),
                        wrap_params(root, out, downstream_env=slow)], body)
    assert len(lines_of(out, "charge")) == 1, effects(out)
    assert {json.dumps(r.structured_content) for r in results} == {'{"charge": 1}'}
    assert all(r.is_error is False for r in results)
    replayed = [r for r in results if r.meta and REPLAYED in r.meta]
    assert len(replayed) == len(results) - 1
    with fence_of(root) as fence:
        ledger = fence.status()
    assert ledger["states"]["done"] == 1 and ledger["counters"]["admitted"] == 1


def test_a_tool_level_isError_frees_the_intent_and_a_rejected_request_passes_through(
        root: str, tmp_path: Any) -> None:
    out = str(tmp_path / "effects.jsonl")

    async def body(c: Any) -> None:
        first = await c.call_tool("flaky", {"label": "a"})
        assert first.is_error is True and first.content[0].text == "try again"
        second = await c.call_tool("flaky", {"label": "a"})
        assert second.is_error is False and second.structured_content == {"n": 1}
        third = await c.call_tool("flaky", {"label": "a"})
        assert third.structured_content == {"n": 1} and third.meta[REPLAYED]["replayed"]
        for _ in range(2):  # a JSON-RPC rejection stays one, and frees the intent
            with pytest.raises(MCPError, match="x must be positive"):
                await c.call_tool("reject", {"x": -1})

    session(wrap_params(root, out), body)
    assert [e["tool"] for e in effects(out)] == ["flaky"]
    with fence_of(root) as fence:
        states = fence.status()["states"]
    assert states["done"] == 1 and states["failed"] == 1 and states["fenced"] == 0


def test_duplicates_without_a_key_are_answered_only_within_the_window(
        root: str, tmp_path: Any) -> None:
    out = str(tmp_path / "effects.jsonl")

    async def body(c: Any) -> list[Any]:
        got = [await c.call_tool("charge", {"amount": 1}),
               await c.call_tool("charge", {"amount": 1})]       # a retry: replayed
        await anyio.sleep(1.3)                                   # past the window
        got += [await c.call_tool("charge", {"amount": 1}),      # a deliberate repeat: runs
                await c.call_tool("charge", {"amount": 1})]      # its retry: replayed
        return got

    got = session(wrap_params(root, out, "--window", "1s",
                              downstream_env={"DOWNSTREAM_SLEEP_S": "0"}), body)
    assert [r.structured_content for r in got] == [{"charge": 1}, {"charge": 1},
                                                   {"charge": 2}, {"charge": 2}]
    assert [bool(r.meta and REPLAYED in r.meta) for r in got] == [False, True, False, True]
    assert len(lines_of(out, "charge")) == 2


def test_an_idempotency_key_dedupes_past_the_window_and_is_never_passed_downstream(
        root: str, tmp_path: Any) -> None:
    out = str(tmp_path / "effects.jsonl")

    async def body(c: Any) -> list[Any]:
        got = [await c.call_tool("charge", {"amount": 2, "idempotencyKey": "order-7"})]
        got.append(await c.call_tool("charge", {"amount": 2},
                                     meta={"idempotencyKey": "order-7", "trace": "t1"}))
        await anyio.sleep(1.3)                                   # past the window: still one
        got.append(await c.call_tool("charge", {"amount": 2, "idempotencyKey": "order-7"}))
        # The same key for another action is refused, not run.
        error(await c.call_tool("charge", {"amount": 3, "idempotencyKey": "order-7"}),
              "intent_conflict")
        error(await c.call_tool("charge", {"amount": 3, "idempotencyKey": 7}), "usage")
        got.append(await c.call_tool("noop", {"n": 1},
                                     meta={"idempotencyKey": "k2", "trace": "t2"}))
        return got

    got = session(wrap_params(root, out, "--window", "1s",
                              downstream_env={"DOWNSTREAM_SLEEP_S": "0"}), body)
    assert [r.structured_content for r in got[:3]] == [{"charge": 1}] * 3
    assert [r.meta[REPLAYED]["intent"] for r in got[1:3]] == ["order-7", "order-7"]
    ran = effects(out)
    assert [e["tool"] for e in ran] == ["charge", "noop"]
    assert ran[0]["args"] == {"amount": 2}                       # the key did not go down
    assert ran[1]["args"] == {"n": 1} and ran[1]["meta"] == ["trace"]


def test_read_only_tools_pass_through_unfenced_and_the_listing_is_unchanged(
        root: str, tmp_path: Any) -> None:
    out = str(tmp_path / "effects.jsonl")

    async def body(proxy: Any, direct: Any) -> None:
        via = [t.model_dump() for t in (await proxy.list_tools()).tools]
        plain = [t.model_dump() for t in (await direct.list_tools()).tools]
        assert via == plain
        await proxy.call_tool("noop", {"n": 1})
        for expected in (1, 1):
            res = await proxy.call_tool("count", {})
            assert res.structured_content == {"lines": expected}
            assert REPLAYED not in (res.meta or {})

    sessions([wrap_params(root, out), downstream_params(out)], body)
    with fence_of(root) as fence:
        assert fence.status()["counters"]["attempts"] == 1      # noop only


def test_a_dead_transport_a_timeout_or_a_cancel_is_an_unknown_outcome_fenced_until_reconciled(
        root: str, tmp_path: Any) -> None:
    out = str(tmp_path / "effects.jsonl")

    async def body(c: Any) -> str:
        err = error(await c.call_tool("crash", {}), "unknown_outcome")["error"]
        intent = err["intent"]
        assert "fence reconcile --intent " + intent in err["message"]
        # A retry is refused while the outcome is unknown; the server was restarted meanwhile.
        assert error(await c.call_tool("crash", {}), "intent_fenced")["error"]["intent"] \
            == intent
        assert (await c.call_tool("count", {})).structured_content == {"lines": 1}
        # Settle it: it did happen.
        proc = await anyio.to_thread.run_sync(lambda: run_cli(
            ("fence", "reconcile", "--intent", intent, "--action", "done", "--result",
             json.dumps({"content": [{"type": "text", "text": "crashed once"}]})),
            json_out=True, root=root))
        assert proc.returncode == 0, proc.stderr
        again = await c.call_tool("crash", {})
        assert again.content[0].text == "crashed once" and again.meta[REPLAYED]["replayed"]
        # A call that outlives --call-timeout is an unknown outcome too.
        hung = error(await c.call_tool("hang", {}), "unknown_outcome")["error"]
        assert "did not finish within" in hung["message"]
        assert (await c.call_tool("count", {})).structured_content == {"lines": 2}
        # A call the client gives up on (it cancels the request) is an unknown outcome too.
        with pytest.raises(MCPError):
            await c.call_tool("charge", {"amount": 7}, read_timeout_seconds=0.05)
        error(await c.call_tool("charge", {"amount": 7}), "intent_fenced")
        return str(intent)

    session(wrap_params(root, out, "--call-timeout", "1s"), body)
    # (the cancelled charge may or may not have run before the downstream was stopped: that is
    # exactly why it is fenced)
    assert [e["tool"] for e in effects(out)][:2] == ["crash", "hang"]
    with fence_of(root) as fence:
        assert fence.status()["states"]["fenced"] == 2          # the hung and cancelled calls


def test_leases_are_heartbeated_while_a_long_call_runs(root: str, tmp_path: Any) -> None:
    out = str(tmp_path / "effects.jsonl")
    # The call takes 2 s, more than three times the lease: without heartbeats the duplicate,
    # sent 1 s in, would find the lease expired and be refused with intent_fenced.
    flags = ("--lease-ttl", "0.6s")

    async def body(a: Any, b: Any) -> list[Any]:
        got: list[Any] = []

        async def first() -> None:
            got.append(await a.call_tool("charge", {"amount": 9}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await anyio.sleep(1.0)
            got.append(await b.call_tool("charge", {"amount": 9}))
        return got

    got = sessions([wrap_params(root, out, *flags, downstream_env={"DOWNSTREAM_SLEEP_S": "2"}),
                    wrap_params(root, out, *flags)], body)
    assert [r.structured_content for r in got] == [{"charge": 1}, {"charge": 1}], got
    assert len(effects(out)) == 1


def test_a_downstream_that_cannot_start_is_a_clear_error(root: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agent_2pc", "--root", root, "mcp", "wrap", "--json", "--",
         os.path.join(root, "no-such-server")],
        capture_output=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 2, proc
    obj = json.loads(proc.stdout)
    assert obj["ok"] is False and obj["error"]["code"] == "downstream_unavailable"


def _proxy_pid(downstream_pid: int) -> int:
    """The proxy is the downstream server's parent (it starts it without a shell)."""
    with open(f"/proc/{downstream_pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_a_proxy_killed_while_a_call_runs_leaves_it_fenced_and_a_duplicate_never_reruns_it(
        root: str, tmp_path: Any) -> None:
    """prepare is durable before the call is forwarded: a SIGKILL of the proxy mid-call leaves
    the intent running, then fenced when its lease ends, never free."""
    out = str(tmp_path / "effects.jsonl")

    async def doomed(c: Any) -> None:
        async def call() -> None:
            with pytest.raises(MCPError):  # the proxy dies under the call
                await c.call_tool("hang", {})

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(20):
                while not lines_of(out, "hang"):  # it ran downstream
                    await anyio.sleep(0.02)
            os.kill(_proxy_pid(lines_of(out, "hang")[0]["pid"]), signal.SIGKILL)

    session(wrap_params(root, out, "--lease-ttl", "1s"), doomed)
    with fence_of(root) as fence:
        assert fence.status()["states"]["running"] == 1

    async def retry(c: Any) -> Any:
        return await c.call_tool("hang", {})  # waits for the dead proxy's lease, then refused

    err = error(session(wrap_params(root, out), retry), "intent_fenced")["error"]
    assert "reconcile" in err["message"]
    assert len(lines_of(out, "hang")) == 1


def test_a_proxy_killed_right_after_answering_keeps_the_result_replayable(
        root: str, tmp_path: Any) -> None:
    """The commit is made before the answer (its fsync may come later): a SIGKILL just after
    the answer keeps it, and a duplicate through a new proxy is replayed, not run again."""
    out = str(tmp_path / "effects.jsonl")
    fast = {"DOWNSTREAM_SLEEP_S": "0"}

    async def answered_then_killed(c: Any) -> Any:
        res = await c.call_tool("charge", {"amount": 3})
        os.kill(_proxy_pid(lines_of(out, "charge")[0]["pid"]), signal.SIGKILL)
        return res

    first = session(wrap_params(root, out, downstream_env=fast), answered_then_killed)
    assert first.structured_content == {"charge": 1} and REPLAYED not in (first.meta or {})

    async def duplicate(c: Any) -> Any:
        return await c.call_tool("charge", {"amount": 3})

    again = session(wrap_params(root, out, downstream_env=fast), duplicate)
    assert again.structured_content == {"charge": 1} and again.meta[REPLAYED]["replayed"]
    assert len(lines_of(out, "charge")) == 1


def test_an_answer_that_is_not_a_tool_result_is_an_unknown_outcome(root: str,
                                                                    tmp_path: Any) -> None:
    """The raw result is checked before it is recorded: the call ran, its answer is unreadable,
    so it is fenced rather than recorded or freed."""
    out = str(tmp_path / "effects.jsonl")

    async def body(c: Any) -> tuple[Any, Any]:
        return await c.call_tool("garbage", {}), await c.call_tool("garbage", {})

    first, again = session(wrap_params(root, out), body)
    assert "not a tool result" in error(first, "unknown_outcome")["error"]["message"]
    error(again, "intent_fenced")
    assert len(lines_of(out, "garbage")) == 1
