"""The OpenAI Agents SDK's own Runner, driven by its ScriptedModel (no network): the
transaction's tools stage, check and commit; a fenced tool's effect happens once per call --
across a re-run of the same tool call (as after a crash, resumed from saved state), and across a
retry with a new call id after the SDK timed the first attempt out, when the calls share an
idempotency key; a run that raises leaves the tree untouched."""

from __future__ import annotations

import asyncio
import json
import os
import threading

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner  # noqa: E402
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call  # noqa: E402
from conftest import read_text  # noqa: E402

from agent_2pc import Agent2PC  # noqa: E402
from agent_2pc.integrations.openai_agents import fenced_tool, transaction_tools  # noqa: E402


def _outputs(model: ScriptedModel) -> dict[str, str]:
    """The tool outputs the model was given, by call id (from its last call's input)."""
    items = model.last_call.input if model.last_call else []
    return {i["call_id"]: i["output"] for i in items
            if isinstance(i, dict) and i.get("type") == "function_call_output"}


def _run(agent: Agent, model: ScriptedModel) -> object:
    return asyncio.run(Runner.run(agent.clone(model=model), "go"))


def test_the_transaction_tools_stage_check_and_commit(root, client):
    with open(os.path.join(root, "app.py"), "w") as f:
        f.write("x = 41\n")
    tx = client.begin(label="openai-agents")
    agent = Agent(name="dev", tools=transaction_tools(tx))
    # One call per turn: the SDK runs the calls of one turn concurrently, in no set order.
    model = ScriptedModel([
        [function_call("replace_in_file", {"path": "app.py", "old": "41", "new": "42"},
                       call_id="c1")],
        [function_call("run_command", {"command": "echo made > made.txt; cat app.py"},
                       call_id="c2")],
        [function_call("run_check", {"command": "grep -q 42 app.py"}, call_id="c3")],
        [function_call("commit", {}, call_id="c4")],
        [assistant_message("done")]])
    result = _run(agent, model)
    assert result.final_output == "done"
    out = _outputs(model)
    ran = json.loads(out["c2"])
    assert ran["ok"] and ran["output"] == "x = 42\n" and ran["captured"] == [
        {"path": "made.txt", "op": "write"}]
    assert json.loads(out["c3"])["passed"] is True
    assert json.loads(out["c4"])["state"] == "committed"
    assert read_text(root, "app.py") == "x = 42\n" and read_text(root, "made.txt") == "made\n"


def test_a_refused_step_is_an_answer_the_model_reads(root, client):
    tx = client.begin()
    agent = Agent(name="dev", tools=transaction_tools(tx, allow_commit=False))
    model = ScriptedModel([[function_call("write_file", {"path": "../out.txt", "content": "x"},
                                          call_id="c1")], [assistant_message("ok")]])
    _run(agent, model)
    answer = json.loads(_outputs(model)["c1"])
    assert answer["ok"] is False and answer["error"]["code"] == "path_outside_root"
    assert "commit" not in [t.name for t in agent.tools]


def test_a_fenced_tool_runs_once_when_its_call_is_run_again(root):
    charges: list[tuple[str, int]] = []

    @fenced_tool(root=root)
    def charge(customer: str, cents: int) -> dict:
        """Charge a customer."""
        charges.append((customer, cents))
        return {"charge": f"ch_{len(charges)}"}

    agent = Agent(name="billing", tools=[charge])
    steps = [[function_call("charge", {"customer": "c7", "cents": 500}, call_id="call-1")],
             [assistant_message("charged")]]
    first = ScriptedModel(steps)
    _run(agent, first)
    # The same tool call again: a run resumed from its saved state after a crash.
    again = ScriptedModel(steps)
    _run(agent, again)
    assert charges == [("c7", 500)]
    assert _outputs(first)["call-1"] == _outputs(again)["call-1"] == str({"charge": "ch_1"})
    # A new call (another id) is a new charge.
    _run(agent, ScriptedModel([[function_call("charge", {"customer": "c7", "cents": 500},
                                              call_id="call-2")], [assistant_message("ok")]]))
    assert len(charges) == 2


def test_a_retry_after_a_timeout_with_the_same_key_is_one_effect(root):
    sent: list[str] = []
    release = threading.Event()

    @fenced_tool(root=root, timeout=0.3)
    def send_mail(to: str, idempotency_key: str) -> str:
        """Send a mail."""
        release.wait(5)  # slower than the SDK's timeout
        sent.append(to)
        return f"sent to {to}"

    agent = Agent(name="mailer", tools=[send_mail])

    async def retry_once_the_first_finished(call: object) -> list:
        # The model saw the timeout and retries (a new call id, the same key), by which time
        # the first attempt, still running when the SDK gave up on it, has sent the mail.
        release.set()
        while not sent:
            await asyncio.sleep(0.01)
        return [function_call("send_mail", {"to": "a@x", "idempotency_key": "welcome-a"},
                              call_id="try-2")]

    model = ScriptedModel([
        [function_call("send_mail", {"to": "a@x", "idempotency_key": "welcome-a"},
                       call_id="try-1")],
        ModelStep.respond(retry_once_the_first_finished),
        [assistant_message("done")]])
    _run(agent, model)
    out = _outputs(model)
    assert "timed out" in out["try-1"].lower()
    assert out["try-2"] == "sent to a@x"
    assert sent == ["a@x"]


def test_a_fenced_tool_that_failed_midway_is_not_run_again(root):
    calls: list[int] = []

    @fenced_tool(root=root)
    def transfer(cents: int) -> str:
        """Move money."""
        calls.append(cents)
        raise ConnectionError("the bank hung up")  # it may have happened

    agent = Agent(name="bank", tools=[transfer])
    steps = [[function_call("transfer", {"cents": 9}, call_id="t-1")], [assistant_message("?")]]
    first, again = ScriptedModel(steps), ScriptedModel(steps)
    _run(agent, first)
    _run(agent, again)
    assert calls == [9]
    assert "error" in _outputs(first)["t-1"] and "error" in _outputs(again)["t-1"]
    # The outcome is unknown (it may have happened): fenced until someone reconciles it.
    status = transfer.fence.fence.status("transfer:call:t-1")
    assert status["state"] == "fenced", status


def test_a_run_that_raises_midway_aborts_its_transaction(root):
    client = Agent2PC(root)
    model = ScriptedModel([
        [function_call("write_file", {"path": "half.txt", "content": "half"}, call_id="c1")],
        RuntimeError("model service down")])
    with pytest.raises(RuntimeError, match="model service down"):
        with client.transaction(label="agent") as tx:
            _run(Agent(name="dev", tools=transaction_tools(tx)), model)
    assert read_text(root, "half.txt") is None
    assert [t["state"] for t in client.transactions()] == ["aborted"]
