"""The real Claude Code CLI with agent-2pc, end to end, no network and no model (issue 5, item
3): Claude Code talks to a scripted stand-in for the Anthropic Messages API on 127.0.0.1
(fake_anthropic.py), whose "model" answers each turn with a tool call from a script.

- Scenario A: agent-2pc is an MCP server in the repository's ``.mcp.json``. The model stages a
  change through the tools, runs a check that fails, aborts; begins again, stages a passing
  change, checks it and commits.
- Scenario B: the model edits with Claude Code's own Write/Edit/Bash tools inside
  ``agent-2pc exec --tid T -- claude -p ...``: everything it changes lands in T, nothing in the
  tree until ``commit``.

(tests/e2e has no __init__.py and no conftest.py, like tests/mcp; tests/conftest.py's fixtures
apply.)
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Any

import pytest
from claudekit import (
    DUMMY_KEY,
    agent_2pc_exe,
    claude_argv,
    claude_env,
    claude_exe,
    claude_result,
    keep_log,
    run,
)
from conftest import parse_one_object, read, run_cli, take_snapshot, write
from fake_anthropic import Conversation, FakeAnthropic, Say, ToolResult, ToolUse

pytestmark = pytest.mark.timeout(90)

SERVER = "agent-2pc"
P = f"mcp__{SERVER}__"  # Claude Code names an MCP tool mcp__<server>__<tool>
CALC = "def add(a, b):\n    return a + b\n"
README = "Adds numbers.\n"
TEST = "from calc import add, sub\n\nassert add(2, 1) == 3\nassert sub(3, 1) == 2, sub(3, 1)\n"


def repo_files(root: str) -> None:
    write(root, "calc.py", CALC)
    write(root, "README.md", README)


def mcp_json(root: str) -> None:
    """The project-scope config, as ``claude mcp add --scope project`` writes it, with --root."""
    argv = agent_2pc_exe()
    write(root, ".mcp.json", json.dumps({"mcpServers": {SERVER: {
        "type": "stdio", "command": argv[0], "args": [*argv[1:], "mcp", "--root", root],
        "env": {}}}}, indent=2) + "\n")


def cli_json(root: str, *args: str) -> tuple[int, dict[str, Any]]:
    proc = run_cli(args, json_out=True, root=root)
    return proc.returncode, parse_one_object(proc)


def tid_of(conv: Conversation) -> str:
    """The tid of the transaction the model began last."""
    return str(conv.result_of(P + "agent_2pc_begin").json()["tid"])


def assert_api_traffic(api: FakeAnthropic, tools: list[str]) -> list[dict[str, Any]]:
    """What Claude Code asked the stand-in: Messages API calls only, authenticated with the
    dummy key, streamed, with a system prompt and the tools the script uses."""
    assert api.errors == [], api.errors
    assert api.requests, "Claude Code made no request to the stand-in"
    for req in api.requests:
        assert req["method"] == "POST" and req["path"] in (
            "/v1/messages", "/v1/messages/count_tokens"), (req["method"], req["path"])
        assert req["headers"].get("x-api-key") == DUMMY_KEY, req["headers"]
        assert req["headers"].get("anthropic-version"), req["headers"]
    turns = api.message_requests()
    assert turns, "no main-loop request"
    for body in turns:
        assert body["stream"] is True and body["model"] and body["max_tokens"] > 0
        assert body["system"], "no system prompt"
        offered = {t["name"] for t in body["tools"]}
        assert set(tools) <= offered, sorted(set(tools) - offered)
    return turns


def results_by_tool(results: list[ToolResult]) -> list[tuple[str, bool, dict[str, Any]]]:
    """(tool without the mcp prefix, is_error, parsed JSON) for each tool result."""
    return [((r.name or "").removeprefix(P), r.is_error, r.json()) for r in results]


# -- Scenario A: agent-2pc as an MCP server ------------------------------------------------

def test_claude_code_stages_through_the_mcp_tools_aborts_a_failing_check_then_commits(
        root: str, tmp_path: Any) -> None:
    exe = claude_exe()
    pytest.importorskip("mcp", reason="agent-2pc mcp needs the mcp extra")
    repo_files(root)
    mcp_json(root)
    home = str(tmp_path / "home")
    check = f"{shlex.quote(sys.executable)} test_calc.py"
    before = take_snapshot(root)["tree"]
    seen: dict[str, Any] = {}

    def stage_sub(body: str) -> Any:
        return lambda c: ToolUse(P + "agent_2pc_stage_diff", {
            "tid": tid_of(c), "path": "calc.py", "old": "    return a + b\n",
            "new": "    return a + b\n\n\ndef sub(a, b):\n" + body})

    def after_abort(c: Conversation) -> ToolUse:
        # Claude Code waits for this answer: the tree as the aborted transaction left it.
        seen["after_abort"] = take_snapshot(root)["tree"]
        return ToolUse(P + "agent_2pc_begin", {"label": "add sub(), second try"})

    def before_commit(c: Conversation) -> ToolUse:
        seen["before_commit"] = take_snapshot(root)["tree"]
        return ToolUse(P + "agent_2pc_commit", {"tid": tid_of(c)})

    script = [
        ToolUse(P + "agent_2pc_begin", {"label": "add sub()"}, text="I'll use a transaction."),
        lambda c: ToolUse(P + "agent_2pc_stage_write", {
            "tid": tid_of(c), "path": "test_calc.py", "content": TEST}),
        lambda c: ToolUse(P + "agent_2pc_stage_diff", {  # a snippet that is not there
            "tid": tid_of(c), "path": "calc.py", "old": "def mul(", "new": "def sub("}),
        stage_sub("    return a + b\n"),  # wrong
        lambda c: ToolUse(P + "agent_2pc_stage_cmd", {"tid": tid_of(c), "command": check}),
        lambda c: ToolUse(P + "agent_2pc_abort", {"tid": tid_of(c),
                                                  "reason": "the check fails"}),
        after_abort,
        lambda c: ToolUse(P + "agent_2pc_stage_write", {
            "tid": tid_of(c), "path": "test_calc.py", "content": TEST}),
        stage_sub("    return a - b\n"),
        lambda c: ToolUse(P + "agent_2pc_stage_cmd", {"tid": tid_of(c), "command": check}),
        lambda c: ToolUse(P + "agent_2pc_diff", {"tid": tid_of(c), "stat": True}),
        before_commit,
        Say("Committed sub() with a passing test."),
    ]
    with FakeAnthropic(script) as api:
        proc = run(claude_argv(exe, "Add a sub() function to calc.py, with a test.",
                               [f"mcp__{SERVER}"]),
                   cwd=root, env=claude_env(api, home))
    keep_log(api, "scenario_a_mcp")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:], api.errors)
    result = claude_result(proc.stdout)
    assert result["is_error"] is False and result["subtype"] == "success", result
    assert result["result"] == "Committed sub() with a passing test.", result
    assert result["num_turns"] == len(script), result
    assert result["permission_denials"] == [], result["permission_denials"]

    turns = assert_api_traffic(api, [P + "agent_2pc_begin", P + "agent_2pc_stage_cmd",
                                     P + "agent_2pc_commit", P + "agent_2pc_abort"])
    assert len(turns) == len(script)
    # The model was told the protocol: the server's instructions are in its context.
    from agent_2pc.mcp._tools import INSTRUCTIONS

    first_line = INSTRUCTIONS.strip().splitlines()[0]
    assert first_line in json.dumps([turns[0]["system"], turns[0]["messages"]],
                                    ensure_ascii=False)
    got = results_by_tool(api.final_results())
    assert [name for name, _, _ in got] == [
        "agent_2pc_begin", "agent_2pc_stage_write", "agent_2pc_stage_diff",
        "agent_2pc_stage_diff", "agent_2pc_stage_cmd", "agent_2pc_abort",
        "agent_2pc_begin", "agent_2pc_stage_write", "agent_2pc_stage_diff",
        "agent_2pc_stage_cmd", "agent_2pc_diff", "agent_2pc_commit"]
    (_, begun), (_, _), (missed_err, missed), (_, _), (failed_err, failed), (_, aborted), \
        (_, begun2), (_, _), (_, _), (passed_err, passed), (_, diff), (_, committed) = \
        [(is_error, obj) for _, is_error, obj in got]
    first, second = begun["tid"], begun2["tid"]
    assert first != second
    for i in (0, 1, 3, 5, 6, 7, 8, 10, 11):
        assert got[i][1] is False and got[i][2]["ok"] is True, got[i]

    # Bad input (a snippet that is not in the file): an isError result that still carries
    # the contract's JSON, so the model can read the code.
    assert missed_err is True
    assert missed["ok"] is False and missed["error"]["code"] == "no_match", missed
    # The failing check: a normal result (not isError) saying no, with the contract's code.
    assert failed_err is False
    assert failed["ok"] is False and failed["error"]["code"] == "verification_failed", failed
    assert failed["passed"] is False and failed["exit_code"] == 1, failed
    assert "AssertionError" in failed["tail"], failed
    assert aborted == {"ok": True, "tid": first, "state": "aborted"}
    assert seen["after_abort"] == before, "the aborted transaction touched the tree"

    assert passed_err is False
    assert passed["ok"] is True and passed["passed"] is True and passed["exit_code"] == 0
    assert {f["path"]: f["status"] for f in diff["files"]} == {
        "calc.py": "modified", "test_calc.py": "added"}
    assert seen["before_commit"] == before, "staging touched the tree before the commit"
    assert committed["ok"] is True and committed["tid"] == second
    assert committed["state"] == "committed"
    assert sorted(committed["files"]) == ["calc.py", "test_calc.py"]

    # The tree has the second transaction's change, and only it.
    assert read(root, "calc.py") == (CALC + "\n\ndef sub(a, b):\n    return a - b\n").encode()
    assert read(root, "test_calc.py") == TEST.encode()
    after = take_snapshot(root)["tree"]
    assert set(after) - set(before) == {"test_calc.py"}
    assert {k for k in before if before[k] != after[k]} == {"calc.py"}
    status, listed = cli_json(root, "list")
    assert status == 0
    states = {t["tid"]: t["state"] for t in listed["transactions"]}
    assert states == {first: "aborted", second: "committed"}


def test_the_config_claude_mcp_add_writes_serves_the_project_without_root(
        root: str, tmp_path: Any) -> None:
    """docs/mcp.md's one-liner: ``claude mcp add --scope project agent-2pc -- agent-2pc mcp``
    writes .mcp.json; Claude Code starts the server in the project, which finds the workspace
    without --root."""
    exe = claude_exe()
    pytest.importorskip("mcp", reason="agent-2pc mcp needs the mcp extra")
    home = str(tmp_path / "home")
    script = [
        ToolUse(P + "agent_2pc_begin", {}),
        lambda c: ToolUse(P + "agent_2pc_stage_write", {
            "tid": tid_of(c), "path": "hello.txt", "content": "hello\n"}),
        lambda c: ToolUse(P + "agent_2pc_commit", {"tid": tid_of(c)}),
        Say("Done."),
    ]
    with FakeAnthropic(script) as api:
        env = claude_env(api, home)
        added = run([exe, "mcp", "add", "--scope", "project", SERVER, "--",
                     *agent_2pc_exe(), "mcp"], cwd=root, env=env)
        assert added.returncode == 0, (added.stdout, added.stderr)
        proc = run(claude_argv(exe, "Say hello in hello.txt.", [f"mcp__{SERVER}"]),
                   cwd=root, env=env)
    keep_log(api, "mcp_add")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:], api.errors)
    assert claude_result(proc.stdout)["result"] == "Done."
    assert_api_traffic(api, [P + "agent_2pc_commit"])
    config = json.loads(read(root, ".mcp.json"))["mcpServers"][SERVER]
    assert config["args"][-1] == "mcp" and "--root" not in config["args"], config
    got = results_by_tool(api.final_results())
    assert [(name, is_error, obj["ok"]) for name, is_error, obj in got] == [
        ("agent_2pc_begin", False, True), ("agent_2pc_stage_write", False, True),
        ("agent_2pc_commit", False, True)]
    assert got[2][2]["files"] == ["hello.txt"]
    assert read(root, "hello.txt") == b"hello\n"


# -- Scenario B: Claude Code's own tools inside agent-2pc exec -----------------------------

def test_claude_code_inside_exec_stages_its_write_edit_and_bash_changes_into_the_transaction(
        root: str, tmp_path: Any) -> None:
    exe = claude_exe()
    repo_files(root)
    home = str(tmp_path / "home")
    status, begun = cli_json(root, "begin", "--label", "claude: add sub()")
    assert status == 0
    tid = begun["tid"]
    before = take_snapshot(root)
    sub_py = "def sub(a, b):\n    return a - b\n"
    # Bash sees the files Write made (the staged view) and writes one more.
    bash = "mkdir -p out && python3 -c 'from sub import sub; print(sub(5, 3))' > out/answer.txt"
    seen: dict[str, Any] = {}

    def look(c: Conversation) -> ToolUse:
        seen["during"] = take_snapshot(root)["tree"]
        seen["cwd"] = c.working_directory()
        return ToolUse("Bash", {"command": "cat out/answer.txt README.md && ls",
                                "description": "Show the results"})

    script = [
        lambda c: ToolUse("Write", {"file_path": os.path.join(c.working_directory(), "sub.py"),
                                    "content": sub_py}, text="Creating sub.py."),
        lambda c: ToolUse("Read", {"file_path": os.path.join(c.working_directory(),
                                                             "README.md")}),
        lambda c: ToolUse("Edit", {"file_path": os.path.join(c.working_directory(),
                                                             "README.md"),
                                   "old_string": "Adds numbers.",
                                   "new_string": "Adds and subtracts numbers."}),
        ToolUse("Bash", {"command": bash, "description": "Compute an answer"}),
        look,
        Say("Done: sub.py, README.md and out/answer.txt."),
    ]
    tools = ["Write", "Read", "Edit", "Bash"]
    with FakeAnthropic(script) as api:
        argv = [*agent_2pc_exe(), "--root", root, "exec", "--tid", tid, "--json", "--",
                *claude_argv(exe, "Add sub.py with sub(), mention it in README.md, and "
                             "compute sub(5, 3) into out/answer.txt.", tools)]
        proc = run(argv, cwd=root, env=claude_env(api, home))
    keep_log(api, "scenario_b_exec")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:], api.errors)
    ran = json.loads(proc.stdout)  # exec --json: one object on stdout; claude's went to stderr
    assert ran["ok"] is True and ran["exit_code"] == 0, ran
    result = claude_result(proc.stderr)
    assert result["is_error"] is False and result["subtype"] == "success", result
    assert result["permission_denials"] == [], result["permission_denials"]
    assert result["num_turns"] == len(script), result

    assert_api_traffic(api, tools)
    got = api.final_results()
    assert [r.name for r in got] == ["Write", "Read", "Edit", "Bash", "Bash"]
    assert not any(r.is_error for r in got), got
    assert got[4].text.splitlines()[:2] == ["2", "Adds and subtracts numbers."], got[4].text

    # Everything landed in the transaction, and only there: exactly these files.
    captured = {c["path"]: c["op"] for c in ran["captured"]}
    assert captured == {"sub.py": "write", "README.md": "write", "out/answer.txt": "write"}, \
        ran["captured"]
    assert ran.get("skipped", []) == [], ran["skipped"]
    if ran["isolation"] in ("overlay", "fuse-overlayfs"):  # the view is over the repo's path
        assert seen["cwd"] == root, seen["cwd"]
    assert seen["during"] == before["tree"], "Claude Code wrote into the real tree"
    assert take_snapshot(root)["tree"] == before["tree"], "the tree changed before commit"
    assert not os.path.exists(os.path.join(root, "out"))

    status, detail = cli_json(root, "status", "--tid", tid)
    assert status == 0
    tx = detail["transactions"][0]
    assert tx["state"] == "active"
    assert {f["path"] for f in tx["files"]} == {"sub.py", "README.md", "out/answer.txt"}
    status, diff = cli_json(root, "diff", "--tid", tid)
    assert status == 0
    assert {f["path"]: f["status"] for f in diff["files"]} == {
        "sub.py": "added", "README.md": "modified", "out/answer.txt": "added"}
    assert "+def sub(a, b):" in diff["diff"] and "+Adds and subtracts numbers." in diff["diff"]
    assert "+2" in diff["diff"]

    status, done = cli_json(root, "commit", "--tid", tid)
    assert status == 0 and done["state"] == "committed", done
    assert read(root, "sub.py") == sub_py.encode()
    assert read(root, "README.md") == b"Adds and subtracts numbers.\n"
    assert read(root, "out/answer.txt") == b"2\n"
    assert read(root, "calc.py") == CALC.encode()
    # Claude Code kept its state in the throwaway home, never in the repository.
    assert os.path.isdir(os.path.join(home, ".claude"))
    assert not os.path.exists(os.path.join(root, ".claude"))


def test_the_stand_in_frames_a_tool_call_as_the_messages_api_streams_it() -> None:
    """fake_anthropic itself, without Claude Code: SSE framing of a tool_use turn."""
    import urllib.request

    with FakeAnthropic([ToolUse("Bash", {"command": "echo hi"}, text="ok"), Say("bye")]) as api:
        body = {"model": "m", "max_tokens": 10, "stream": True, "tools": [{"name": "Bash"}],
                "messages": [{"role": "user", "content": "go"}]}
        req = urllib.request.Request(api.url + "/v1/messages?beta=true",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["content-type"] == "text/event-stream"
            text = resp.read().decode()
    frames = [f for f in text.split("\n\n") if f]
    events = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    datas = [json.loads(f.split("\n")[1].removeprefix("data: ")) for f in frames]
    assert [e for e in events if e != "content_block_delta"] == [
        "message_start", "ping", "content_block_start", "content_block_stop",
        "content_block_start", "content_block_stop", "message_delta", "message_stop"]
    assert all(d["type"] == e for e, d in zip(events, datas, strict=True))
    tool_json = "".join(d["delta"]["partial_json"] for d in datas
                        if d["type"] == "content_block_delta" and d["index"] == 1)
    assert json.loads(tool_json) == {"command": "echo hi"}
    assert datas[-2]["delta"]["stop_reason"] == "tool_use"
    assert api.errors == [] and len(api.requests) == 1
