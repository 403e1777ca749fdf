"""Every MCP protocol revision the pinned SDK speaks (mcpkit.REVISIONS: 2024-11-05, 2025-03-26,
2025-06-18, 2025-11-25 by the initialize handshake; 2026-07-28 by discovery and the per-request
envelope), on both sides of ``mcp wrap`` and on ``agent-2pc mcp`` (issue 9, item 1).

The two sides of the proxy negotiate separately, so a result that came in the downstream's
revision must reach the client in the client's: the matrix crosses every client revision with
every downstream revision (the stdlib downstream_server.py at each handshake revision, the
SDK's MCPServer, sdk_downstream.py, at 2026-07-28). The clients are the SDK's own, which
validate each result at their revision and check structured content against the tool's output
schema; the raw-wire tests check the exact shape on the wire.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from mcpkit import (
    REVISIONS,
    RawClient,
    connect,
    effects,
    error,
    no,
    ok,
    server_params,
    session,
    wrap_params,
)

pytestmark = pytest.mark.timeout(120)
REPLAYED = "agent-2pc/fence"
RESERVED = "io.modelcontextprotocol/"
DUPLICATES = 12


def _meta(res: Any) -> dict[str, Any]:
    return dict(res.meta or {})


async def _cell(c: Any, client_rev: str, down_rev: str, out: str) -> None:
    """One client revision x one downstream revision: every kind of result, and 12 identical
    calls at once."""
    tools = {t.name: t for t in (await c.list_tools()).tools}
    assert {"charge", "plain", "flaky", "tagged", "count"} <= set(tools), tools
    assert tools["charge"].output_schema["properties"]["charge"]["type"] == "integer"
    cell = f"{client_rev}/{down_rev}"

    # Structured content with an output schema, 12 identical calls at once: one execution.
    got: list[Any] = []

    async def charge() -> None:
        got.append(await c.call_tool("charge", {"amount": 7, "note": cell}))

    async with anyio.create_task_group() as tg:
        for _ in range(DUPLICATES):
            tg.start_soon(charge)
    assert len({json.dumps(r.structured_content, sort_keys=True) for r in got}) == 1, got
    assert got[0].structured_content == {"charge": 1}
    assert all(r.is_error is False for r in got)
    assert sum(REPLAYED in _meta(r) for r in got) == DUPLICATES - 1
    assert len({r.content[0].text for r in got}) == 1

    # Plain content only.
    plain = await c.call_tool("plain", {"text": f"hello {cell}"})
    assert plain.is_error is False and plain.structured_content is None
    assert [b.text for b in plain.content] == [f"hello {cell}"]

    # isError: passed on, and the intent is freed (the retry runs, its retry is replayed).
    first = await c.call_tool("flaky", {"label": cell})
    assert first.is_error is True and first.content[0].text == "try again"
    second = await c.call_tool("flaky", {"label": cell})
    assert second.is_error is False and second.structured_content == {"n": 3}
    third = await c.call_tool("flaky", {"label": cell})
    assert third.structured_content == {"n": 3} and _meta(third)[REPLAYED]["replayed"]

    # _meta: the tool's own keys are passed on, fresh and replayed.
    tagged = await c.call_tool("tagged", {"tag": cell})
    again = await c.call_tool("tagged", {"tag": cell})
    assert _meta(tagged)["example.com/tag"] == cell and REPLAYED not in _meta(tagged)
    assert _meta(again)["example.com/tag"] == cell and _meta(again)[REPLAYED]["replayed"]
    for res in (*got, plain, first, second, third, tagged, again):
        reserved = {k for k in _meta(res) if k.startswith(RESERVED)}
        # The protocol's own keys are the client revision's (the SDK server's serverInfo stamp
        # at 2026-07-28), never the downstream hop's.
        assert reserved == ({RESERVED + "serverInfo"} if client_rev in MODERN_PROTOCOL_VERSIONS
                            else set()), (cell, res)

    # Read-only: passed through, not fenced.
    assert (await c.call_tool("count", {})).structured_content == {"lines": 4}
    ran = effects(out)
    assert [e["tool"] for e in ran] == ["charge", "plain", "flaky", "tagged"], ran
    assert {e["protocol"] for e in ran} == {down_rev}, ran


@pytest.mark.parametrize("client_rev", REVISIONS)
def test_wrap_answers_in_the_clients_revision_whatever_the_downstream_speaks(
        root: str, tmp_path: Any, client_rev: str) -> None:
    """A client at ``client_rev`` through one proxy per downstream revision, all at once."""
    outs = {d: str(tmp_path / f"effects-{d}.jsonl") for d in REVISIONS}
    slow = {"DOWNSTREAM_SLEEP_S": "0.3"}  # the 12 duplicates overlap the first call

    async def main() -> None:
        async def one(down_rev: str) -> None:
            params = wrap_params(root, outs[down_rev], downstream=down_rev, downstream_env=slow)
            async with connect(params, client_rev) as c:
                await _cell(c, client_rev, down_rev, outs[down_rev])

        with anyio.fail_after(100):
            async with anyio.create_task_group() as tg:
                for down_rev in REVISIONS:
                    tg.start_soon(one, down_rev)

    anyio.run(main)


@pytest.mark.parametrize("first, then", [
    (("2026-07-28", "2025-11-25"), ("2024-11-05", "2026-07-28")),
    (("2025-06-18", "2026-07-28"), ("2026-07-28", "2025-03-26")),
], ids=["recorded-modern-client-replayed-handshake-client",
        "recorded-modern-downstream-replayed-handshake-downstream"])
def test_a_result_recorded_at_one_pair_of_revisions_is_replayed_at_another(
        root: str, tmp_path: Any, first: tuple[str, str], then: tuple[str, str]) -> None:
    """(client revision, downstream revision) of the call that ran, then of its duplicate
    through another proxy on the same store: the recorded result is revision-neutral."""
    out = str(tmp_path / "effects.jsonl")

    async def body(c: Any) -> list[Any]:
        return [await c.call_tool("charge", {"amount": 3}),
                await c.call_tool("tagged", {"tag": "x"})]

    fresh = session(wrap_params(root, out, downstream=first[1],
                                downstream_env={"DOWNSTREAM_SLEEP_S": "0"}),
                    body, revision=first[0])
    replayed = session(wrap_params(root, out, downstream=then[1]), body, revision=then[0])
    assert [r.structured_content for r in replayed] == [r.structured_content for r in fresh]
    assert [r.content[0].text for r in replayed] == [r.content[0].text for r in fresh]
    assert all(_meta(r)[REPLAYED]["replayed"] for r in replayed)
    assert _meta(replayed[1])["example.com/tag"] == "x"
    assert [e["tool"] for e in effects(out)] == ["charge", "tagged"]


@pytest.mark.parametrize("client_rev, down_rev", [("2025-06-18", "2026-07-28"),
                                                  ("2026-07-28", "2025-11-25")])
def test_the_wire_shape_is_the_clients_revision(root: str, tmp_path: Any, client_rev: str,
                                                down_rev: str) -> None:
    """Byte level: a 2026-07-28 client gets ``resultType`` and the proxy's own ``serverInfo``
    stamp from a 2025-11-25 downstream; a 2025-06-18 client gets neither from a 2026-07-28
    downstream (which sends both)."""
    out = str(tmp_path / "effects.jsonl")
    with RawClient(wrap_params(root, out, downstream=down_rev,
                               downstream_env={"DOWNSTREAM_SLEEP_S": "0"})) as raw:
        raw.initialize(client_rev)
        raw.request("tools/list")
        result = raw.request("tools/call", {"name": "tagged", "arguments": {"tag": "w"}}
                             )["result"]
        charged = raw.request("tools/call", {"name": "charge", "arguments": {"amount": 1}}
                              )["result"]
        assert raw.close() == 0
    modern = client_rev in MODERN_PROTOCOL_VERSIONS
    for res in (result, charged):
        assert ("resultType" in res) is modern, res
        assert res.get("resultType", "complete") == "complete"
        assert {k for k in res.get("_meta", {}) if k.startswith(RESERVED)} == \
            ({RESERVED + "serverInfo"} if modern else set()), res
    assert result["_meta"]["example.com/tag"] == "w"
    assert result["content"] == [{"type": "text", "text": "tagged 1"}]
    assert charged["structuredContent"] == {"charge": 2} and charged["isError"] is False
    assert {e["protocol"] for e in effects(out)} == {down_rev}


@pytest.mark.parametrize("revision", REVISIONS)
def test_agent_2pc_mcp_serves_its_tools_at_every_revision(root: str, revision: str) -> None:
    """Its instructions, its tools, their output schemas (the client validates every non-error
    result against them), a success, a "no" and isError results, each carrying {ok: false,
    error: {code}}."""

    async def body(c: Any) -> None:
        assert c.instructions.startswith("agent-2pc gives you database-grade transactions")
        tools = (await c.list_tools()).tools
        assert len(tools) >= 20
        assert all(t.output_schema and t.output_schema["type"] == "object" for t in tools)
        tid = ok(await c.call_tool("agent_2pc_begin", {"label": revision}))["tid"]
        staged = ok(await c.call_tool("agent_2pc_stage_write", {
            "tid": tid, "path": "a.txt", "content": revision}))
        assert staged == {"ok": True, "path": "a.txt", "op": "write", "bytes": len(revision)}
        first = ok(await c.call_tool("fence_prepare", {"intent": "pay-" + revision}))
        assert first["status"] == "fresh"
        no(await c.call_tool("fence_prepare", {"intent": "pay-" + revision}),
           "intent_in_flight")
        error(await c.call_tool("agent_2pc_status", {"tid": "tx-nope"}), "unknown_tid")
        error(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": 5}), "usage")
        with pytest.raises(MCPError) as raised:
            await c.call_tool("no_such_tool", {})
        assert raised.value.error.code == -32602
        done = ok(await c.call_tool("agent_2pc_commit", {"tid": tid}))
        assert done["state"] == "committed"

    session(server_params(root), body, revision=revision)
    with open(os.path.join(root, "a.txt")) as f:
        assert f.read() == revision


@pytest.mark.parametrize("raw, expected", [
    # a handshake-era result, as downstream_server.py sends it
    ({"content": [{"type": "text", "text": "t"}], "structuredContent": {"a": None},
      "isError": False},
     {"content": [{"type": "text", "text": "t"}], "structuredContent": {"a": None},
      "isError": False, "resultType": "complete"}),
    # a 2026-07-28 one: the downstream's serverInfo stamp stays behind, the tool's _meta not
    ({"content": [], "resultType": "complete",
      "_meta": {RESERVED + "serverInfo": {"name": "d", "version": "1"}, "x.io/k": 1}},
     {"content": [], "isError": False, "resultType": "complete", "_meta": {"x.io/k": 1}}),
    # what `fence reconcile --action done --result` records
    ({"content": [{"type": "text", "text": "done by hand"}]},
     {"content": [{"type": "text", "text": "done by hand"}], "isError": False,
      "resultType": "complete"}),
])
def test_a_downstream_result_is_made_revision_neutral(raw: dict[str, Any],
                                                      expected: dict[str, Any]) -> None:
    from agent_2pc.mcp._forwarded import neutral

    assert neutral(raw) == expected


@pytest.mark.parametrize("raw", [
    {"resultType": "input_required", "inputRequests": {}},              # an interim result
    {"content": [], "resultType": "com.example/deferred"},              # an extension's shape
    {"content": "not a list of blocks"},
    {"structuredContent": {}},
])
def test_what_is_not_a_complete_tool_result_is_refused(raw: dict[str, Any]) -> None:
    from agent_2pc.mcp._forwarded import NotAToolResult, neutral

    with pytest.raises(NotAToolResult):
        neutral(raw)
