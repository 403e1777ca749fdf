"""`agent-2pc mcp` driven by the SDK's own client over stdio (issue 5, item 3, first scenario).

Every non-error result below has also been checked by the SDK client against the tool's
outputSchema (the client validates structured content on each call), so these tests prove the
schemas too, for successes and for the normal "no" answers.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from conftest import read, take_snapshot, write
from mcp.shared.exceptions import MCPError
from mcpkit import error, no, ok, server_params, session, structured

pytestmark = pytest.mark.timeout(60)

CONTRACT_TOOLS = {
    "agent_2pc_begin", "agent_2pc_record_read", "agent_2pc_stage_write", "agent_2pc_stage_patch",
    "agent_2pc_stage_diff", "agent_2pc_stage_cmd", "agent_2pc_stage_api", "agent_2pc_exec",
    "agent_2pc_overlay_exec", "agent_2pc_diff", "agent_2pc_savepoint", "agent_2pc_rollback_to",
    "agent_2pc_status", "agent_2pc_commit", "agent_2pc_abort", "agent_2pc_compact",
    "agent_2pc_hook_check", "agent_2pc_git_commit", "agent_2pc_export", "agent_2pc_import",
    "agent_2pc_stage_sql", "agent_2pc_daemon_status", "agent_2pc_undo",
    "fence_prepare", "fence_commit", "fence_abort", "fence_heartbeat", "fence_reconcile",
    "fence_status",
}
PATCH = """\
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,5 @@
 def add(a, b):
     return a + b
+
+def sub(a, b):
+    return a - b
"""


def test_a_full_transaction_begins_stages_checks_and_commits(root: str) -> None:
    write(root, "calc.py", "def add(a, b):\n    return a + b\n")
    write(root, "README.md", "Adds numbers.\n")
    write(root, "VERSION", "1\n")

    async def body(c: Any) -> dict[str, Any]:
        tid = ok(await c.call_tool("agent_2pc_begin", {"label": "add sub()"}))["tid"]
        read_ = ok(await c.call_tool("agent_2pc_record_read", {"tid": tid, "path": "VERSION"}))
        assert read_["path"] == "VERSION" and len(read_["sha256"]) == 64
        assert ok(await c.call_tool("agent_2pc_stage_patch", {"tid": tid, "patch": PATCH})
                  )["files"] == ["calc.py"]
        res = ok(await c.call_tool("agent_2pc_stage_diff", {
            "tid": tid, "path": "README.md", "old": "Adds", "new": "Adds and subtracts"}))
        assert res == {"ok": True, "path": "README.md", "op": "replace", "replacements": 1}
        res = ok(await c.call_tool("agent_2pc_stage_write", {
            "tid": tid, "path": "tests/test_sub.py",
            "content": "from calc import sub\nassert sub(3, 1) == 2\n"}))
        assert res == {"ok": True, "path": "tests/test_sub.py", "op": "write", "bytes": 43}
        check = ok(await c.call_tool("agent_2pc_stage_cmd", {
            "tid": tid, "command": "PYTHONPATH=. python3 tests/test_sub.py"}))
        assert check["passed"] is True and check["exit_code"] == 0 and check["isolation"]
        ran = ok(await c.call_tool("agent_2pc_exec", {
            "tid": tid, "argv": ["sh", "-c", "echo generated > gen.txt"]}))
        assert [(x["path"], x["op"]) for x in ran["captured"]] == [("gen.txt", "write")]
        looked = ok(await c.call_tool("agent_2pc_overlay_exec", {
            "tid": tid, "command": "cat gen.txt README.md"}))
        assert looked["tail"] == "generated\nAdds and subtracts numbers.\n"
        assert not os.path.exists(os.path.join(root, "tests")), "the tree was touched"
        assert not os.path.exists(os.path.join(root, "gen.txt")), "the tree was touched"
        diff = ok(await c.call_tool("agent_2pc_diff", {"tid": tid, "stat": True}))
        assert {f["path"] for f in diff["files"]} == {"calc.py", "README.md", "gen.txt",
                                                      "tests/test_sub.py"}
        detail = ok(await c.call_tool("agent_2pc_status", {"tid": tid}))["transactions"][0]
        assert detail["state"] == "active" and detail["label"] == "add sub()"
        done = ok(await c.call_tool("agent_2pc_commit", {"tid": tid}))
        again = ok(await c.call_tool("agent_2pc_commit", {"tid": tid}))
        return {"done": done, "again": again, "tid": tid}

    out = session(server_params(root), body)
    assert out["done"]["state"] == "committed"
    assert sorted(out["done"]["files"]) == ["README.md", "calc.py", "gen.txt",
                                            "tests/test_sub.py"]
    assert out["again"] == out["done"], "commit is idempotent: the same answer again"
    assert read(root, "README.md") == b"Adds and subtracts numbers.\n"
    assert b"def sub" in read(root, "calc.py")
    assert read(root, "tests/test_sub.py").startswith(b"from calc import sub")


def test_a_conflict_aborts_the_commit_as_a_normal_result_and_keeps_the_other_write(
        root: str) -> None:
    write(root, "a.txt", "one\n")

    async def body(c: Any) -> dict[str, Any]:
        tid = ok(await c.call_tool("agent_2pc_begin", {}))["tid"]
        ok(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": "a.txt",
                                                       "content": "mine\n"}))
        write(root, "a.txt", "theirs\n")  # another writer, meanwhile
        res = no(await c.call_tool("agent_2pc_commit", {"tid": tid}), "conflict")
        assert res["tid"] == tid and res["state"] == "aborted"
        # An aborted transaction cannot be committed (bad input: isError) but aborts again.
        error(await c.call_tool("agent_2pc_commit", {"tid": tid}), "bad_state")
        again = ok(await c.call_tool("agent_2pc_abort", {"tid": tid}))
        assert again == {"ok": True, "tid": tid, "state": "aborted"}
        return res

    session(server_params(root), body)
    assert read(root, "a.txt") == b"theirs\n"


def test_a_failing_check_is_a_no_and_the_transaction_can_then_abort(root: str) -> None:
    async def body(c: Any) -> None:
        tid = ok(await c.call_tool("agent_2pc_begin", {}))["tid"]
        ok(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": "x.py",
                                                       "content": "raise SystemExit(3)\n"}))
        res = no(await c.call_tool("agent_2pc_stage_cmd", {"tid": tid,
                                                           "command": "python3 x.py"}),
                 "verification_failed")
        assert res["passed"] is False and res["exit_code"] == 3
        assert ok(await c.call_tool("agent_2pc_abort", {"tid": tid, "reason": "tests fail"})
                  )["state"] == "aborted"

    before = take_snapshot(root)["tree"]
    session(server_params(root), body)
    assert take_snapshot(root)["tree"] == before


def test_fence_prepare_commit_then_replay(root: str) -> None:
    args = {"intent": "invoice-42", "domain": "acct:7", "tool": "stripe.charge",
            "args": {"amount": 500}}

    async def body(c: Any) -> None:
        fresh = ok(await c.call_tool("fence_prepare", args))
        assert fresh["status"] == "fresh" and fresh["ticket"]["intent"] == "invoice-42"
        # A concurrent attempt while the lease is held: a normal no.
        no(await c.call_tool("fence_prepare", args), "intent_in_flight")
        ok(await c.call_tool("fence_heartbeat", {"ticket": fresh["ticket"]}))
        cert = ok(await c.call_tool("fence_commit", {"ticket": fresh["ticket"],
                                                     "result": {"charge": "ch_1"}}))["cert"]
        assert cert["result"] == {"charge": "ch_1"} and len(cert["hash"]) == 64
        replay = ok(await c.call_tool("fence_prepare", args))
        assert replay == {"ok": True, "status": "already_done", "cert": cert}
        # The same intent for another action: a bug of the caller, a normal no.
        no(await c.call_tool("fence_prepare", {**args, "args": {"amount": 501}}),
           "intent_conflict")
        # A forged ticket is a stale lease (a no), never a type error.
        forged = {**fresh["ticket"], "lease_id": "0" * 32}
        no(await c.call_tool("fence_commit", {"ticket": forged, "result": 1}), "stale_lease")
        no(await c.call_tool("fence_abort", {"ticket": "not json"}), "stale_lease")
        status = ok(await c.call_tool("fence_status", {"intent": "invoice-42"}))
        assert status["state"] == "done" and status["cert"] == cert
        ledger = ok(await c.call_tool("fence_status", {}))
        assert ledger["states"]["done"] == 1 and ledger["counters"]["committed"] == 1
        # Unknown outcome, then reconcile.
        t2 = ok(await c.call_tool("fence_prepare", {"intent": "mail-1", "tool": "mail"}))
        ok(await c.call_tool("fence_abort", {"ticket": t2["ticket"], "outcome": "unknown"}))
        no(await c.call_tool("fence_prepare", {"intent": "mail-1", "tool": "mail"}),
           "intent_fenced")
        rec = ok(await c.call_tool("fence_reconcile", {"intent": "mail-1", "action": "done",
                                                       "result": {"id": "m-1"}}))
        assert rec["state"] == "done" and rec["cert"]["result"] == {"id": "m-1"}
        error(await c.call_tool("fence_reconcile", {"intent": "mail-1", "action": "clear"}),
              "bad_state")

    session(server_params(root), body)


def test_tool_errors_are_isError_results_carrying_the_contract_code(root: str) -> None:
    write(root, "a.txt", "x x\n")

    async def body(c: Any) -> None:
        tid = ok(await c.call_tool("agent_2pc_begin", {}))["tid"]
        error(await c.call_tool("agent_2pc_stage_write", {
            "tid": "tx-20200101-000000-abcdef", "path": "b", "content": ""}), "unknown_tid")
        error(await c.call_tool("agent_2pc_stage_write", {"tid": "nope", "path": "b",
                                                          "content": ""}), "unknown_tid")
        error(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": "../out.txt",
                                                          "content": "x"}), "path_outside_root")
        error(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": "/etc/passwd",
                                                          "content": "x"}), "path_outside_root")
        error(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": ".git/config",
                                                          "content": "x"}), "path_forbidden")
        error(await c.call_tool("agent_2pc_stage_diff", {"tid": tid, "path": "a.txt",
                                                         "old": "zz", "new": "y"}), "no_match")
        res = error(await c.call_tool("agent_2pc_stage_diff", {"tid": tid, "path": "a.txt",
                                                               "old": "x", "new": "y"}),
                    "ambiguous_match")
        assert res["error"]["matches"] == 2
        error(await c.call_tool("agent_2pc_stage_delete", {"tid": tid, "path": "absent"}),
              "not_found")
        error(await c.call_tool("agent_2pc_stage_patch", {"tid": tid, "patch": "garbage"}),
              "invalid_patch")
        error(await c.call_tool("agent_2pc_rollback_to", {"tid": tid, "name": "s9"}),
              "unknown_savepoint")
        error(await c.call_tool("agent_2pc_stage_api", {"tid": tid, "method": "POST",
                                                        "url": "ftp://x"}), "usage")

    session(server_params(root), body)


def test_bad_input_gets_clear_errors_and_the_server_keeps_serving(root: str) -> None:
    outside = os.path.join(os.path.dirname(root), "outside")
    os.makedirs(outside)
    os.symlink(outside, os.path.join(root, "link"))

    async def body(c: Any) -> None:
        tid = ok(await c.call_tool("agent_2pc_begin", {}))["tid"]
        before = take_snapshot(root)
        bad: list[tuple[str, dict[str, Any]]] = [
            ("agent_2pc_stage_write", {"tid": tid, "path": "a"}),                # no content
            ("agent_2pc_stage_write", {"tid": tid, "path": "a", "content": "x",
                                       "content_base64": "eA=="}),               # both
            ("agent_2pc_stage_write", {"tid": tid, "path": "a", "content": 7}),  # wrong type
            ("agent_2pc_stage_write", {"tid": tid, "path": "a", "content": "x",
                                       "contents": "x"}),                        # unknown arg
            ("agent_2pc_stage_write", {"tid": tid, "path": "a", "content": "x",
                                       "mode": "rwx"}),                          # bad mode
            ("agent_2pc_stage_write", {"tid": tid, "path": "a",
                                       "content_base64": "%%%"}),                # bad base64
            ("agent_2pc_stage_write", {"tid": tid, "path": "",
                                       "content": "x"}),                         # empty path
            ("agent_2pc_stage_diff", {"tid": tid, "path": "a", "old": "", "new": "y"}),
            ("agent_2pc_begin", {"timeout_ms": -1}),
            ("agent_2pc_begin", {"label": "x" * 201}),
            ("fence_prepare", {"intent": "i", "args": {"n": 2 ** 60}}),         # not canonical
            ("fence_prepare", {}),
            ("agent_2pc_status", {"tid": ["not", "a", "string"]}),
        ]
        for name, args in bad:
            error(await c.call_tool(name, args), "usage")
        # Paths that lead out of the root, also through a symlink, are refused.
        error(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": "link/x.txt",
                                                          "content": "x"}), "path_outside_root")
        # A payload over the limit (16 Mi characters) is refused, not half-written.
        huge = "y" * ((16 << 20) + 1)
        error(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": "big",
                                                          "content": huge}), "usage")
        # An unknown tool is a protocol error, and the server stays up.
        with pytest.raises(MCPError, match="unknown tool"):
            await c.call_tool("agent_2pc_no_such_tool", {})
        assert take_snapshot(root) == before, "a refused step changed something"
        # Still serving: a normal step works.
        ok(await c.call_tool("agent_2pc_stage_write", {"tid": tid, "path": "a",
                                                       "content_base64": "eA==",
                                                       "mode": "0755"}))
        assert ok(await c.call_tool("agent_2pc_commit", {"tid": tid}))["files"] == ["a"]

    session(server_params(root), body)
    assert read(root, "a") == b"x" and os.stat(os.path.join(root, "a")).st_mode & 0o777 == 0o755
    assert os.listdir(outside) == []


def test_every_tool_has_typed_inputs_a_precise_output_schema_and_honest_annotations(
        root: str) -> None:
    async def body(c: Any) -> Any:
        return (await c.list_tools()).tools

    tools = {t.name: t for t in session(server_params(root), body)}
    assert CONTRACT_TOOLS <= set(tools)
    for name, t in tools.items():
        assert t.description and len(t.description) > 60, name
        assert t.input_schema["type"] == "object", name
        assert "$ref" not in json.dumps(t.input_schema) + json.dumps(t.output_schema), name
        out = t.output_schema
        assert out is not None and out["type"] == "object" and out["required"] == ["ok"], name
        assert {"ok", "error"} <= set(out["properties"]), name
        assert len(out["anyOf"]) >= 2, name
    read_only = {n for n, t in tools.items() if t.annotations.read_only_hint}
    assert read_only == {"agent_2pc_diff", "agent_2pc_status", "agent_2pc_overlay_exec",
                         "agent_2pc_hook_check", "agent_2pc_daemon_status", "agent_2pc_log",
                         "fence_status"}
    for name in ("agent_2pc_commit", "agent_2pc_abort"):
        assert tools[name].annotations.idempotent_hint is True
        assert tools[name].annotations.destructive_hint is True
    assert tools["agent_2pc_stage_write"].annotations.destructive_hint is False
    for name in [n for n in tools if n.startswith("fence_")] + ["agent_2pc_stage_api"]:
        assert tools[name].annotations.open_world_hint is True, name
    props = tools["agent_2pc_stage_write"].input_schema["properties"]
    assert {"tid", "path", "content", "content_base64", "mode"} == set(props)
    assert tools["agent_2pc_stage_write"].input_schema["required"] == ["tid", "path"]
    assert tools["agent_2pc_stage_write"].input_schema["additionalProperties"] is False
    assert set(tools["agent_2pc_stage_patch"].input_schema["properties"]) == {"tid", "patch"}
    success = tools["agent_2pc_stage_write"].output_schema["anyOf"][0]
    assert success["required"] == ["ok", "path", "op", "bytes"]
    assert success["properties"]["op"] == {"const": "write", "type": "string"}
    prepare = tools["fence_prepare"].output_schema["anyOf"]
    assert [b["properties"]["status"]["const"] for b in prepare[:2]] == ["fresh",
                                                                         "already_done"]


def test_a_server_started_before_init_serves_once_the_workspace_exists(tmp_path: Any) -> None:
    bare = str(tmp_path)

    async def body(c: Any) -> None:
        error(await c.call_tool("agent_2pc_begin", {}), "not_initialized")
        from agent_2pc import Agent2PC

        Agent2PC.init(bare)
        ok(await c.call_tool("agent_2pc_begin", {}))
        structured(await c.call_tool("agent_2pc_status", {}))

    session(server_params(bare), body)


def test_a_disk_that_refuses_is_an_io_error_result_and_the_server_keeps_serving(
        root: str) -> None:
    # The disk fills up while a blob is written (an injected ENOSPC at its write): the tool
    # answers io_error with the errno, as the CLI does, not an internal error; nothing staged.
    async def body(c: Any) -> None:
        tid = ok(await c.call_tool("agent_2pc_begin", {}))["tid"]
        res = error(await c.call_tool("agent_2pc_stage_write", {
            "tid": tid, "path": "big.txt", "content": "x" * 100_000}), "io_error")
        assert res["error"]["errno"] == "ENOSPC"
        status = ok(await c.call_tool("agent_2pc_status", {"tid": tid}))
        assert status["transactions"][0]["files"] == []
        ok(await c.call_tool("agent_2pc_abort", {"tid": tid}))

    session(server_params(root, extra_env={"AGENT2PC_FAULT_AT": "blobs.write:write=ENOSPC"}),
            body)
