"""One transaction across workspaces (simulated hosts: a node process each), decided in
Postgres: all or nothing, and clear answers to bad input (docs/distributed.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from .conftest import NodeProc, World, wait_until

pytestmark = pytest.mark.postgres


def _read(world: World, ws: str, rel: str) -> str | None:
    path = os.path.join(world.nodes[ws].root, rel)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read()


def test_three_workspaces_commit_one_transaction_together(world: World) -> None:
    for name in ("api", "web", "docs"):
        world.workspace(name, {"README": f"{name}\n"})
    tid = world.begin("three")
    assert tid.startswith("g-")
    for name in ("api", "web", "docs"):
        status, out = world.cli("stage-write", "--tid", tid, "--workspace", name, "--path",
                                "new.txt", "--content", f"{name} v2\n")
        assert status == 0 and out["workspace"] == name and out["bytes"] > 0, out
    status, out = world.cli("stage-replace", "--tid", tid, "--workspace", "web", "--path",
                            "README", "--old", "web", "--new", "WEB")
    assert status == 0 and out["replacements"] == 1, out
    status, out = world.cli("diff", "--tid", tid, "--workspace", "web")
    assert status == 0 and {f["path"] for f in out["files"]} == {"new.txt", "README"}, out
    assert _read(world, "api", "new.txt") is None  # nothing applied before the commit

    status, out = world.cli("commit", "--tid", tid)
    assert status == 0, out
    assert out["state"] == "committed" and "pending" not in out, out
    assert sorted(out["files"]) == ["api:new.txt", "docs:new.txt", "web:README", "web:new.txt"]
    for name in ("api", "web", "docs"):
        assert _read(world, name, "new.txt") == f"{name} v2\n"
        assert world.local(name, tid)["state"] == "committed"
    assert _read(world, "web", "README") == "WEB\n"
    g = world.gtx(tid)
    assert g["state"] == "committed" and all(p["vote"] == "yes" and p["done"]
                                             for p in g["workspaces"])
    # commit again: the same answer (the contract's idempotence)
    status, again = world.cli("commit", "--tid", tid)
    assert status == 0 and again["state"] == "committed", again


def test_one_workspace_voting_no_aborts_all_and_applies_nothing(world: World) -> None:
    world.workspace("a", {"f.txt": "a1\n"})
    world.workspace("b", {"f.txt": "b1\n"})
    tid = world.begin()
    assert world.cli("stage-write", "--tid", tid, "--workspace", "a", "--path", "f.txt",
                     "--content", "a2\n")[0] == 0
    assert world.cli("stage-write", "--tid", tid, "--workspace", "b", "--path", "f.txt",
                     "--content", "b2\n")[0] == 0
    # someone else changes b's file under the transaction: b's prepare sees the conflict
    with open(os.path.join(world.nodes["b"].root, "f.txt"), "w") as f:
        f.write("changed by someone else\n")
    status, out = world.cli("commit", "--tid", tid)
    assert status == 1, out
    assert out["ok"] is False and out["state"] == "aborted" and out["tid"] == tid, out
    assert out["error"]["code"] == "conflict" and out["error"]["workspace"] == "b", out
    assert _read(world, "a", "f.txt") == "a1\n"
    assert _read(world, "b", "f.txt") == "changed by someone else\n"
    g = world.all_done(tid)
    assert g is not None and g["state"] == "aborted", world.gtx(tid)
    assert world.local("a", tid)["state"] == "aborted"
    assert world.local("b", tid)["state"] == "aborted"
    # commit again after the abort: bad_state (the contract), abort again: the same answer
    assert world.cli("commit", "--tid", tid)[1]["error"]["code"] == "bad_state"
    status, out = world.cli("abort", "--tid", tid)
    assert status == 0 and out["state"] == "aborted"


def test_abort_undoes_every_workspace(world: World) -> None:
    world.workspace("a")
    world.workspace("b")
    tid = world.begin()
    for ws in ("a", "b"):
        assert world.cli("stage-write", "--tid", tid, "--workspace", ws, "--path", "x",
                         "--content", "x")[0] == 0
    status, out = world.cli("abort", "--tid", tid, "--reason", "changed my mind")
    assert status == 0 and out == {"ok": True, "tid": tid, "state": "aborted"}, out
    assert world.all_done(tid)
    for ws in ("a", "b"):
        assert _read(world, ws, "x") is None
        assert world.local(ws, tid)["state"] == "aborted"
    assert world.cli("stage-write", "--tid", tid, "--workspace", "a", "--path", "y",
                     "--content", "y")[1]["error"]["code"] == "bad_state"


def test_a_failed_check_is_answered_then_votes_no_at_commit(world: World) -> None:
    world.workspace("a")
    world.workspace("b")
    tid = world.begin()
    assert world.cli("stage-write", "--tid", tid, "--workspace", "b", "--path", "x",
                     "--content", "x")[0] == 0
    status, out = world.cli("stage-cmd", "--tid", tid, "--workspace", "a", "--command",
                            "exit 3")
    assert status == 1 and out["error"]["code"] == "verification_failed", out
    assert out["error"]["workspace"] == "a" and out["passed"] is False
    assert world.gtx(tid)["state"] == "active"  # a failed check leaves it active
    # the check stays in the transaction: prepare runs it again, it fails, all abort
    status, out = world.cli("commit", "--tid", tid)
    assert status == 1 and out["error"]["code"] == "verification_failed", out
    assert out["error"]["workspace"] == "a"
    assert _read(world, "b", "x") is None
    assert world.all_done(tid)


def test_bad_input_gets_a_clear_error_and_changes_nothing(world: World) -> None:
    world.workspace("a")
    tid = world.begin()
    # unknown workspace: no node by that name
    status, out = world.cli("stage-write", "--tid", tid, "--workspace", "nope", "--path", "x",
                            "--content", "x")
    assert status == 2 and out["error"]["code"] == "unknown_workspace", out
    # a step of a global transaction without --workspace
    status, out = world.cli("stage-write", "--tid", tid, "--path", "x", "--content", "x")
    assert status == 2 and out["error"]["code"] == "usage" and "--workspace" in \
        out["error"]["message"], out
    # --workspace with a local tid
    status, out = world.cli("stage-delete", "--tid", "tx-20260101-120000-a1b2c3",
                            "--workspace", "a", "--path", "x")
    assert status == 2 and out["error"]["code"] in ("usage", "not_initialized"), out
    # unknown gtid
    status, out = world.cli("commit", "--tid", "g-20260101-000000-deadbeef")
    assert status == 2 and out["error"]["code"] == "unknown_tid", out
    # a path outside the workspace's root: the node's own check, with the workspace named
    status, out = world.cli("stage-write", "--tid", tid, "--workspace", "a", "--path",
                            "../escape", "--content", "x")
    assert status == 2 and out["error"]["code"] == "path_outside_root", out
    assert out["error"]["workspace"] == "a"
    # store unreachable, malformed URL, no store at all
    status, out = world.cli("begin", "--global", "--store",
                            "postgresql://postgres@127.0.0.1:1/test")
    assert status == 2 and out["error"]["code"] == "store_unavailable", out
    status, out = world.cli("begin", "--global", "--store", "postgresql://[::1/x")
    assert status == 2 and out["error"]["code"] == "usage", out
    status, out = world.cli("begin", "--global", "--store", "mysql://h/db")
    assert status == 2 and out["error"]["code"] == "usage", out
    status, out = world.cli("begin", "--global", env={"AGENT2PC_STORE": ""})
    assert status == 2 and out["error"]["code"] == "usage" and "--store" in \
        out["error"]["message"], out
    # a node that is not alive
    world.nodes["a"].stop()
    status, out = world.cli("stage-write", "--tid", tid, "--workspace", "a", "--path", "x",
                            "--content", "x")
    assert status == 2 and out["error"]["code"] == "node_unavailable", out
    # nothing was staged by any of it
    assert world.gtx(tid)["workspaces"] == []


def test_a_second_node_for_the_same_name_is_refused(world: World) -> None:
    node = world.workspace("a")
    twin = NodeProc(world, "a", node.root)
    with pytest.raises(AssertionError, match="already served"):
        twin.start()
    twin.close()
    assert node.stop() == 0  # SIGTERM stops it cleanly


def test_a_node_busy_with_a_long_step_stays_alive_and_serves_the_next(world: World) -> None:
    """The heartbeat does not wait for the request queue: a check that runs longer than the
    liveness window (3 polls, at least 2 s) does not make the node look dead."""
    world.workspace("a")
    world.workspace("b")
    tid = world.begin()
    slow = subprocess.Popen(
        [sys.executable, "-m", "agent_2pc", "stage-cmd", "--tid", tid, "--workspace", "a",
         "--command", "sleep 4", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=world.env())
    time.sleep(3)  # a is running the check; b is idle
    status, out = world.cli("nodes")
    assert status == 0 and all(n["alive"] for n in out["nodes"]), out
    # a second step for a waits behind the first and is answered, not refused as dead
    status, out = world.cli("stage-write", "--tid", tid, "--workspace", "a", "--path", "x",
                            "--content", "x")
    assert status == 0, out
    stdout, stderr = slow.communicate(timeout=60)
    assert slow.returncode == 0, (stdout, stderr)
    assert world.cli("commit", "--tid", tid)[0] == 0
    assert _read(world, "a", "x") == "x"


def test_a_second_commit_while_one_holds_the_lease_is_refused(world: World) -> None:
    world.workspace("a")
    tid = world.begin()
    assert world.cli("stage-cmd", "--tid", tid, "--workspace", "a", "--command",
                     "sleep 3 && test -f README")[0] == 0
    assert world.cli("stage-write", "--tid", tid, "--workspace", "a", "--path", "x",
                     "--content", "changed since the check")[0] == 0
    # the first commit re-runs the check at prepare (the content changed): 3 s holding the lease
    first = subprocess.Popen([sys.executable, "-m", "agent_2pc", "commit", "--tid", tid,
                              "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=world.env({"AGENT2PC_GLOBAL_LEASE_MS": "5000"}))
    wait_until(lambda: world.gtx(tid)["state"] == "preparing", 30)
    status, out = world.cli("commit", "--tid", tid)
    assert status == 2 and out["error"]["code"] == "bad_state", out
    status, out = world.cli("abort", "--tid", tid)
    assert status == 2 and out["error"]["code"] == "bad_state", out
    stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 0, (stdout, stderr)
    assert world.gtx(tid)["state"] == "committed"
