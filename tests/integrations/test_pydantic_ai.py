"""PydanticAI's own Agent, driven by its FunctionModel (a scripted model, no network): the
TransactionToolset stages, runs commands in the staged view and commits; FencedToolset runs
another toolset's tools that are not read-only once per tool call (a replayed call gets the
recorded result, a ModelRetry frees the intent, read-only tools are never fenced); a run that
raises aborts; two agents racing on one file: one commits, the other is told it conflicted."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("pydantic_ai")

from conftest import read_text  # noqa: E402
from pydantic_ai import Agent, ModelRetry  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.toolsets import FunctionToolset  # noqa: E402

from agent_2pc import Agent2PC  # noqa: E402
from agent_2pc.integrations.pydantic_ai import FencedToolset, TransactionToolset  # noqa: E402


@pytest.fixture(autouse=True)
def _close_the_loop_run_sync_leaves() -> object:
    """pydantic-ai's ``run_sync`` runs on an event loop it sets for the thread and never closes:
    close it here, or the garbage collector reports it (and its sockets) in a later test."""
    yield
    import asyncio

    loop = asyncio.get_event_loop_policy()._local._loop  # type: ignore[attr-defined]
    if loop is not None and not loop.is_running():
        loop.close()
        asyncio.set_event_loop(None)



class Script:
    """A FunctionModel's function: each turn, the next list of tool calls (name, args, id);
    then a final text. ``returns`` collects what the tools answered, by call id."""

    def __init__(self, turns: list[list[tuple[str, dict, str]]]) -> None:
        self.turns = list(turns)
        self.returns: dict[str, object] = {}

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for part in messages[-1].parts if isinstance(messages[-1], ModelRequest) else []:
            if isinstance(part, ToolReturnPart):
                self.returns[part.tool_call_id] = part.content
            elif getattr(part, "tool_call_id", None) and part.part_kind == "retry-prompt":
                self.returns[part.tool_call_id] = f"retry: {part.content}"
        if not self.turns:
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=cid)
                                    for name, args, cid in self.turns.pop(0)])


def _answer(script: Script, cid: str) -> dict:
    value = script.returns[cid]
    return value if isinstance(value, dict) else json.loads(str(value))


def test_the_transaction_toolset_stages_runs_and_commits(root, client):
    with open(os.path.join(root, "app.py"), "w") as f:
        f.write("x = 41\n")
    tx = client.begin(label="pydantic-ai")
    script = Script([
        [("replace_in_file", {"path": "app.py", "old": "41", "new": "42"}, "c1")],
        [("run_command", {"command": "cat app.py; echo n > n.txt"}, "c2"),
         ("read_file", {"path": "n.txt"}, "c3")],
        [("commit", {}, "c4")]])
    out = Agent(FunctionModel(script), toolsets=[TransactionToolset(tx)]).run_sync("go")
    assert out.output == "done"
    assert _answer(script, "c2")["output"] == "x = 42\n"
    assert _answer(script, "c3")["content"] is None  # run_command's file: staged after it ran
    assert _answer(script, "c4")["state"] == "committed"
    assert read_text(root, "app.py") == "x = 42\n" and read_text(root, "n.txt") == "n\n"


def test_fenced_tools_run_once_per_call_and_read_only_ones_are_left_alone(root):
    effects: list[str] = []
    looks: list[str] = []
    flaky = {"left": 1}
    billing = FunctionToolset()

    @billing.tool_plain
    def charge(customer: str, cents: int) -> dict:
        """Charge a customer."""
        effects.append(f"charge {customer} {cents}")
        return {"charge": f"ch_{len(effects)}"}

    @billing.tool_plain
    def refund(charge: str) -> str:
        """Refund a charge (the provider is flaky: the first try asks for a retry)."""
        if flaky["left"]:
            flaky["left"] -= 1
            raise ModelRetry("provider busy, try again")
        effects.append(f"refund {charge}")
        return "refunded"

    @billing.tool_plain(metadata={"read_only": True})
    def balance(customer: str) -> int:
        """Look at a balance."""
        looks.append(customer)
        return 100

    fenced = FencedToolset(billing, root=root, namespace="run-1")
    turns = [[("charge", {"customer": "c7", "cents": 500}, "k1"),
              ("balance", {"customer": "c7"}, "b1")],
             [("refund", {"charge": "ch_1"}, "r1")],
             [("refund", {"charge": "ch_1"}, "r2")]]
    first = Script(turns)
    Agent(FunctionModel(first), toolsets=[fenced]).run_sync("go")
    assert effects == ["charge c7 500", "refund ch_1"]
    assert "provider busy" in str(first.returns["r1"])
    # The same run replayed (durable execution re-running its steps with the same call ids):
    # the recorded results, no second effect; the read-only tool runs again. (r1 did nothing
    # the first time -- ModelRetry -- so it is tried again, and the provider is busy again.)
    flaky["left"] = 1
    again = Script(turns)
    Agent(FunctionModel(again), toolsets=[fenced]).run_sync("go")
    assert effects == ["charge c7 500", "refund ch_1"]
    assert again.returns["k1"] == first.returns["k1"] == {"charge": "ch_1"}
    assert again.returns["r2"] == "refunded"
    assert looks == ["c7", "c7"]


def test_a_run_that_raises_midway_aborts_and_the_tree_is_untouched(root):
    client = Agent2PC(root)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) > 1:
            raise RuntimeError("model service down")
        return ModelResponse(parts=[ToolCallPart("write_file", {"path": "half.txt",
                                                                "content": "half"}, "c1")])

    with pytest.raises(RuntimeError, match="model service down"):
        with client.transaction(label="agent") as tx:
            Agent(FunctionModel(model), toolsets=[TransactionToolset(tx)]).run_sync("go")
    assert read_text(root, "half.txt") is None
    assert [t["state"] for t in client.transactions()] == ["aborted"]


def test_two_agents_racing_on_one_file_one_commits_the_other_conflicts(root, client):
    with open(os.path.join(root, "app.py"), "w") as f:
        f.write("x = 41\n")
    a, b = client.begin(label="a"), client.begin(label="b")
    scripts = {}
    for name, tx, value in (("a", a, "42"), ("b", b, "40")):
        scripts[name] = Script([[("replace_in_file", {"path": "app.py", "old": "41",
                                                      "new": value}, f"{name}1")]])
        Agent(FunctionModel(scripts[name]), toolsets=[TransactionToolset(tx)]).run_sync("edit")
    for name, tx in (("a", a), ("b", b)):
        scripts[name] = Script([[("commit", {}, f"{name}2")]])
        Agent(FunctionModel(scripts[name]), toolsets=[TransactionToolset(tx)]).run_sync("go")
    assert _answer(scripts["a"], "a2")["state"] == "committed"
    lost = _answer(scripts["b"], "b2")
    assert lost["ok"] is False and lost["state"] == "aborted"
    assert lost["error"]["code"] == "conflict"
    assert read_text(root, "app.py") == "x = 42\n"
