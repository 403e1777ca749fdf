"""Crashes and cut connections in a global transaction: whoever dies, and whenever a
connection to the store is cut, every workspace ends the same way (all committed or all
aborted), and none waits on a dead coordinator once the decision is in the store
(docs/distributed.md, "What holds when a process dies").

Processes are killed at the named crash points (src/agent_2pc/crashpoints.py): the
coordinator (``agent-2pc commit``) at "global.after_votes" and "global.after_decision", a node at
"node.after_vote", "node.before_decide" and "node.after_decide".
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from agent_2pc import Agent2PC

from .conftest import World, wait_until

pytestmark = pytest.mark.postgres


def _staged(world: World, names: tuple[str, ...] = ("a", "b")) -> str:
    for name in names:
        world.workspace(name, {"f.txt": f"{name} old\n"})
    tid = world.begin()
    for name in names:
        status, out = world.cli("stage-write", "--tid", tid, "--workspace", name, "--path",
                                "f.txt", "--content", f"{name} new\n")
        assert status == 0, out
    return tid


def _content(world: World, name: str) -> str:
    with open(os.path.join(world.nodes[name].root, "f.txt")) as f:
        return f.read()


def _all_or_nothing(world: World, tid: str, names: tuple[str, ...] = ("a", "b")) -> str:
    """Wait until every workspace finished; check they all ended as the store decided."""
    g = wait_until(lambda: world.all_done(tid), 60, "every workspace to finish")
    want = "new" if g["state"] == "committed" else "old"
    for name in names:
        assert _content(world, name) == f"{name} {want}\n", (name, g)
        assert world.local(name, tid)["state"] == g["state"], name
        c = Agent2PC(world.nodes[name].root, daemon=False)
        try:
            assert c.in_doubt() == [], name  # nothing left waiting
        finally:
            c.close()
    return str(g["state"])


def _commit_process(world: World, tid: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "agent_2pc", "commit", "--tid", tid,
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=world.env(env))


@pytest.mark.parametrize("point,outcome", [("global.after_votes", "aborted"),
                                           ("global.after_decision", "committed")])
def test_coordinator_killed_the_nodes_finish_on_their_own(world: World, point: str,
                                                          outcome: str) -> None:
    tid = _staged(world)
    proc = _commit_process(world, tid, {"AGENT2PC_CRASH_AT": point})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 137, (out, err)
    # no coordinator any more: before the decision its lease expires and a node aborts;
    # after it, the nodes read the decision and commit
    assert _all_or_nothing(world, tid) == outcome
    if outcome == "aborted":
        assert world.gtx(tid)["code"] == "timeout"


def test_a_node_killed_after_voting_yes_aborts_when_restarted(world: World) -> None:
    tid = _staged(world)
    world.nodes["a"].stop()
    world.nodes["a"].start(AGENT2PC_CRASH_AT="node.after_vote")
    status, out = world.cli("commit", "--tid", tid)
    assert world.nodes["a"].wait_exit() == 137
    # a's vote never reached the store and a is gone: the coordinator aborts
    assert status == 1 and out["error"]["code"] == "node_unavailable", out
    assert out["error"]["workspace"] == "a"
    c = Agent2PC(world.nodes["a"].root, daemon=False)
    try:
        assert [d["tid"] for d in c.in_doubt()] == [world.gtx(tid)["workspaces"][0]
                                                     ["local_tid"]]  # prepared, in doubt
    finally:
        c.close()
    world.nodes["a"].start()  # restarted: finds the abort in the store and finishes it
    assert _all_or_nothing(world, tid) == "aborted"


@pytest.mark.parametrize("point", ["node.before_decide", "node.after_decide"])
def test_a_node_killed_around_the_decision_commits_when_restarted(world: World,
                                                                  point: str) -> None:
    tid = _staged(world)
    world.nodes["a"].stop()
    world.nodes["a"].start(AGENT2PC_CRASH_AT=point)
    status, out = world.cli("commit", "--tid", tid)
    assert world.nodes["a"].wait_exit() == 137
    # the decision is in the store: commit answers committed, a is left to finish on its own
    assert status == 0 and out["state"] == "committed", out
    assert out["pending"] == ["a"], out
    assert _content(world, "b") == "b new\n"
    world.nodes["a"].start()
    assert _all_or_nothing(world, tid) == "committed"


def _prepared_in(world: World, name: str) -> bool:
    c = Agent2PC(world.nodes[name].root, daemon=False)
    try:
        return bool(c.in_doubt())
    finally:
        c.close()


# (who stalls at which point, what to wait for before cutting every connection of the test)
CUTS = {
    "coordinator:global.after_votes": lambda w, tid: all(
        p["vote"] == "yes" for p in w.gtx(tid)["workspaces"]),
    "coordinator:global.after_decision": lambda w, tid: w.gtx(tid)["state"] == "committed",
    "node:node.after_vote": lambda w, tid: _prepared_in(w, "a"),
    "node:node.before_decide": lambda w, tid: w.gtx(tid)["state"] == "committed",
    "node:node.after_decide": lambda w, tid: w.local("a", tid)["state"] == "committed",
    "both:start": lambda w, tid: w.gtx(tid)["state"] != "active",
}


@pytest.mark.parametrize("where", sorted(CUTS))
def test_connections_cut_at_each_step_leave_nothing_torn(world: World, where: str) -> None:
    """Every connection of the coordinator and the nodes to the store is terminated
    (pg_terminate_backend) while one of them stands at the step named: they reconnect and
    the transaction ends all committed or all aborted, every workspace finished."""
    tid = _staged(world)
    who, _, point = where.partition(":")
    stall = {"AGENT2PC_STALL_AT": point, "AGENT2PC_STALL_S": "1.5"}
    if who == "node":
        world.nodes["a"].stop()
        world.nodes["a"].start(**stall)
    env = {"AGENT2PC_GLOBAL_LEASE_MS": "6000"}
    if who == "coordinator":
        env.update(stall)
    proc = _commit_process(world, tid, env)
    cut = threading.Event()

    def cutter() -> None:
        try:
            wait_until(lambda: CUTS[where](world, tid), 60, where)
            assert world.cut_connections() >= 1
            time.sleep(0.3)
            world.cut_connections()  # and again, while they reconnect
        finally:
            cut.set()

    t = threading.Thread(target=cutter)
    t.start()
    out, err = proc.communicate(timeout=120)
    t.join(70)
    assert cut.is_set()
    assert proc.returncode in (0, 1), (proc.returncode, out, err)
    state = _all_or_nothing(world, tid)
    assert state == ("committed" if proc.returncode == 0 else "aborted"), (out, err)


def test_a_transaction_left_active_past_its_timeout_is_aborted_by_the_nodes(
        world: World) -> None:
    """No coordinator ever commits (the agent went away while staging): once the global
    timeout passes, a node aborts it in the store and every workspace aborts its part."""
    world.workspace("a", {"f.txt": "a old\n"})
    world.workspace("b", {"f.txt": "b old\n"})
    status, out = world.cli("begin", "--global", "--timeout-ms", "5000")
    assert status == 0, out
    tid = out["tid"]
    for name in ("a", "b"):
        assert world.cli("stage-write", "--tid", tid, "--workspace", name, "--path", "f.txt",
                         "--content", f"{name} new\n")[0] == 0
    assert _all_or_nothing(world, tid) == "aborted"
    assert world.gtx(tid)["code"] == "timeout"
    status, out = world.cli("commit", "--tid", tid)
    assert status == 2 and out["error"]["code"] == "bad_state", out
