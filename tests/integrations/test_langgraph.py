"""LangGraph's own StateGraph and ToolNode, with LangChain's scripted GenericFakeChatModel (no
network): a graph run is one transaction (committed at the end, aborted when the run raises);
a fenced tool acts once when LangGraph retries its node, and when a crashed process's thread is
resumed from its checkpoint (SIGKILL mid-step, a new process resumes: the charge is not made
twice, the transaction the crashed run began is the one that commits)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage  # noqa: E402
from langgraph.types import RetryPolicy  # noqa: E402

from agent_2pc import Agent2PC  # noqa: E402
from agent_2pc.integrations.langgraph import transactional  # noqa: E402

from .langgraph_app import build  # noqa: E402

APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "langgraph_app.py")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _script(*calls: dict) -> list[AIMessage]:
    return [AIMessage("", tool_calls=list(calls)), AIMessage("done")]


CHARGE = {"name": "charge", "args": {"customer": "c7", "cents": 500}, "id": "call-charge"}


def test_a_graph_run_is_one_transaction_committed_at_the_end(root, tmp_path):
    effects = str(tmp_path / "effects")
    seen: list[str | None] = []

    def look() -> str:
        """Look at the tree (outside the transaction) while the run goes on."""
        seen.append(_read(os.path.join(root, "invoice.txt")))
        return "looked"

    script = [
        AIMessage("", tool_calls=[CHARGE, {"name": "write_file", "args": {
            "path": "invoice.txt", "content": "c7\n"}, "id": "w1"}]),
        AIMessage("", tool_calls=[{"name": "look", "args": {}, "id": "l1"}]),
        AIMessage("end")]
    graph = transactional(build(effects, script=script, extra_tools=[_tool(look)]), root=root)
    out = graph.invoke({"messages": [("user", "bill c7")]})
    assert out["messages"][-1].content == "end"
    assert seen == [None]  # staged, not in the tree, while the run went on
    assert graph.last["state"] == "committed" and graph.last["files"] == ["invoice.txt"]
    assert _read(os.path.join(root, "invoice.txt")) == "c7\n"
    assert _read(effects) == "charge c7 500\n"


def _tool(fn):  # type: ignore[no-untyped-def]
    from langchain_core.tools import tool

    return tool(fn)


def test_a_run_that_raises_aborts_and_the_tree_is_untouched(root, tmp_path):
    def explode() -> str:
        """Fail."""
        raise RuntimeError("tool broke")

    graph = transactional(build(str(tmp_path / "e"), script=_script(
        {"name": "write_file", "args": {"path": "half.txt", "content": "half"}, "id": "w1"},
        {"name": "explode", "args": {}, "id": "x1"}), extra_tools=[_tool(explode)]),
        root=root)
    with pytest.raises(RuntimeError, match="tool broke"):
        graph.invoke({"messages": [("user", "go")]})
    assert graph.last["state"] == "aborted"
    assert _read(os.path.join(root, "half.txt")) is None


def test_a_node_retried_by_langgraph_does_not_charge_twice(root, tmp_path):
    effects = str(tmp_path / "effects")
    attempts: list[int] = []

    def slow_lookup() -> str:
        """Times out the first time."""
        attempts.append(1)
        if len(attempts) == 1:
            raise TimeoutError("lookup timed out")
        return "found"

    graph = transactional(build(effects, script=_script(
        CHARGE, {"name": "slow_lookup", "args": {}, "id": "s1"}),
        extra_tools=[_tool(slow_lookup)],
        retry_policy=RetryPolicy(retry_on=TimeoutError, initial_interval=0.01, jitter=False)),
        root=root)
    graph.invoke({"messages": [("user", "go")]})
    assert len(attempts) == 2  # the whole tools node ran twice
    assert _read(effects) == "charge c7 500\n"
    assert graph.last["state"] == "committed"


def test_a_crashed_run_resumes_its_transaction_and_replays_the_fenced_tool(root, tmp_path):
    db, effects = str(tmp_path / "checkpoints.db"), str(tmp_path / "effects")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    first = subprocess.run([sys.executable, APP, root, db, effects], capture_output=True,
                           text=True, timeout=120, env=env)
    assert first.returncode == -9, first.stderr  # killed mid-step, after the charge
    client = Agent2PC(root)
    [tx] = client.transactions()
    assert tx["state"] == "active" and tx["label"] == "langgraph thread t1"
    assert _read(os.path.join(root, "invoice.txt")) is None
    second = subprocess.run([sys.executable, APP, root, db, effects], capture_output=True,
                            text=True, timeout=120, env=env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split()[0] == "committed"
    assert _read(effects) == "charge c7 500\n"  # replayed, not charged again
    assert _read(os.path.join(root, "invoice.txt")) == "c7 500\n"
    assert [t["tid"] for t in client.transactions()] == [tx["tid"]]
