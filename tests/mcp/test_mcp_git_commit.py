"""agent_2pc_git_commit: the transaction and a git commit of exactly its changes, over MCP
(results checked against the tool's outputSchema by the SDK's client on each call)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from mcpkit import error, no, ok, server_params, session

from agent_2pc import Agent2PC

pytestmark = pytest.mark.timeout(60)


def _git(root: str, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                          text=True).stdout


def _first_commit(root: str) -> None:
    _git(root, "config", "user.name", "Owner")
    _git(root, "config", "user.email", "owner@example.com")
    _git(root, "checkout", "-q", "-b", "main")
    with open(f"{root}/a.txt", "w") as f:
        f.write("a\n")
    _git(root, "add", "a.txt")
    _git(root, "commit", "-q", "-m", "init")


def test_git_commit_tool_commits_files_and_branch_together(root: str) -> None:
    _first_commit(root)
    client = Agent2PC(root)
    tx = client.begin()
    tx.stage_write("a.txt", "changed by the agent\n")
    client.close()

    async def body(c: Any) -> dict[str, Any]:
        return ok(await c.call_tool("agent_2pc_git_commit", {
            "tid": tx.tid, "message": "agent: change a", "author": "Bot <bot@example.com>"}))

    out = session(server_params(root), body)
    assert out["state"] == "committed" and out["files"] == ["a.txt"]
    assert out["branch"] == "main" and out["commit"] == _git(root, "rev-parse", "main").strip()
    assert _git(root, "log", "-1", "--format=%an|%s").strip() == "Bot|agent: change a"
    assert _git(root, "status", "--porcelain", "a.txt") == ""


def test_git_commit_tool_on_a_detached_head_is_a_usage_error(root: str) -> None:
    _first_commit(root)
    _git(root, "checkout", "-q", "--detach")
    client = Agent2PC(root)
    tx = client.begin()
    tx.stage_write("a.txt", "x\n")
    client.close()

    async def body(c: Any) -> dict[str, Any]:
        return error(await c.call_tool("agent_2pc_git_commit", {"tid": tx.tid,
                                                                "message": "m"}), "usage")

    out = session(server_params(root), body)
    assert "detached" in out["error"]["message"]
    assert Agent2PC(root).get(tx.tid).state() == "active"


def test_git_commit_tool_with_a_failing_hook_is_verification_failed_and_keeps_the_tx(
        root: str) -> None:
    import os

    _first_commit(root)
    hook = f"{root}/.git/hooks/pre-commit"
    with open(hook, "w") as f:
        f.write("#!/bin/sh\necho 'lint: trailing whitespace in a.txt' >&2\nexit 1\n")
    os.chmod(hook, 0o755)
    client = Agent2PC(root)
    tx = client.begin()
    tx.stage_write("a.txt", "x \n")
    client.close()

    async def body(c: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        refused = no(await c.call_tool("agent_2pc_git_commit", {
            "tid": tx.tid, "message": "m"}), "verification_failed")
        passed = ok(await c.call_tool("agent_2pc_git_commit", {
            "tid": tx.tid, "message": "m", "no_verify": True}))
        return refused, passed

    refused, passed = session(server_params(root), body)
    assert "trailing whitespace" in refused["error"]["message"]
    assert passed["state"] == "committed" and "hooks" not in passed
