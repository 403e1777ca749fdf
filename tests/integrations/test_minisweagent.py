"""mini-swe-agent's own DefaultAgent, driven by its DeterministicModel (a scripted model, no
network), in a TransactionEnvironment: its commands see and change only the staged view, the
submission commits (once the checks pass), a limit or an exception aborts with the tree
untouched, and of two agents racing on one file one commits and the other is told it
conflicted."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
pytest.importorskip("minisweagent")

from conftest import read_text  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments import get_environment  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

from agent_2pc.integrations.minisweagent import (  # noqa: E402
    TransactionEnvironment,
    run_in_transaction,
)

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
AGENT_CONFIG = {"system_template": "You are a test.", "instance_template": "{{task}}",
                "step_limit": 10, "cost_limit": 100.0}



class WatchingModel(DeterministicModel):
    """The scripted model, which also notes what the real tree held at each of its turns."""

    def __init__(self, root: str, commands: list[str | BaseException]) -> None:
        outputs = [make_output(f"step {i}", [{"command": "" if isinstance(c, BaseException)
                                              else c}]) for i, c in enumerate(commands)]
        super().__init__(outputs=outputs)
        self.failures = {i: c for i, c in enumerate(commands) if isinstance(c, BaseException)}
        self.root = root
        self.seen: list[str | None] = []

    def query(self, messages, **kwargs):  # type: ignore[no-untyped-def]
        self.seen.append(read_text(self.root, "app.py"))
        if self.current_index + 1 in self.failures:  # the model's service fails mid-run
            raise self.failures[self.current_index + 1]
        return super().query(messages, **kwargs)


@pytest.fixture
def repo(root: str) -> str:
    with open(os.path.join(root, "app.py"), "w") as f:
        f.write("def answer():\n    return 41\n")
    with open(os.path.join(root, "old.txt"), "w") as f:
        f.write("old\n")
    return root


def _agent(root: str, commands: list[str | BaseException], **env_kw) -> DefaultAgent:
    return DefaultAgent(WatchingModel(root, commands),
                        TransactionEnvironment(cwd=root, **env_kw), **AGENT_CONFIG)


def test_the_submission_commits_what_the_commands_did_and_nothing_lands_before(repo):
    agent = _agent(repo, [
        "sed -i 's/41/42/' app.py && rm old.txt && mkdir -p pkg && echo new > pkg/new.txt",
        "cat app.py && ls",
        SUBMIT])
    result = run_in_transaction(agent, "make it 42")
    assert result["exit_status"] == "Submitted"
    assert result["agent_2pc"]["state"] == "committed"
    assert sorted(result["agent_2pc"]["files"]) == ["app.py", "old.txt", "pkg/new.txt"]
    # The agent saw its own edit in the staged view while the tree still held the old one.
    assert "return 42" in agent.messages[-3]["content"] and "old.txt" not in \
        agent.messages[-3]["content"]
    assert agent.model.seen == ["def answer():\n    return 41\n"] * 3
    assert read_text(repo, "app.py") == "def answer():\n    return 42\n"
    assert read_text(repo, "old.txt") is None and read_text(repo, "pkg/new.txt") == "new\n"


def test_a_failing_check_refuses_the_submission_and_the_agent_goes_on(repo):
    agent = _agent(repo, ["sed -i 's/41/43/' app.py", SUBMIT, "sed -i 's/43/42/' app.py",
                          SUBMIT], checks=["grep -q 'return 42' app.py"])
    result = run_in_transaction(agent, "make it 42")
    assert result["agent_2pc"]["state"] == "committed"
    refused = [m["content"] for m in agent.messages if "was not accepted" in
               str(m.get("content"))]
    assert len(refused) == 1 and "grep -q 'return 42' app.py" in refused[0]
    assert read_text(repo, "app.py") == "def answer():\n    return 42\n"


def test_a_step_limit_aborts_and_the_tree_is_untouched(repo, client):
    agent = _agent(repo, ["sed -i 's/41/42/' app.py"] * 5)
    agent.config.step_limit = 2
    result = run_in_transaction(agent, "never submits")
    assert result["exit_status"] == "LimitsExceeded"
    assert result["agent_2pc"]["state"] == "aborted"
    assert read_text(repo, "app.py") == "def answer():\n    return 41\n"
    assert client.get(agent.env.tid).state() == "aborted"


def test_a_run_that_raises_midway_aborts_and_the_tree_is_untouched(repo, client):
    agent = _agent(repo, ["sed -i 's/41/42/' app.py && rm old.txt", RuntimeError("model down")])
    with pytest.raises(RuntimeError, match="model down"):
        run_in_transaction(agent, "crashes")
    assert client.get(agent.env.tid).state() == "aborted"
    assert read_text(repo, "app.py") == "def answer():\n    return 41\n"
    assert read_text(repo, "old.txt") == "old\n"


def test_a_failing_command_keeps_its_changes_and_reports_its_status(repo):
    agent = _agent(repo, ["echo partial > part.txt; echo oops; exit 3", SUBMIT])
    result = run_in_transaction(agent, "x")
    assert "<returncode>3</returncode>" in agent.messages[3]["content"]
    assert "oops" in agent.messages[3]["content"]
    assert result["agent_2pc"]["files"] == ["part.txt"]


def test_two_agents_racing_on_one_line_one_commits_the_other_conflicts(repo):
    first = _agent(repo, ["sed -i 's/41/42/' app.py", SUBMIT])
    second = _agent(repo, ["sed -i 's/41/40/' app.py", SUBMIT])
    # Both work before either submits: run the first up to its submission, then the second.
    first.env.execute({"command": "sed -i 's/41/42/' app.py"})
    second.env.execute({"command": "sed -i 's/41/40/' app.py"})
    won = run_in_transaction(first, "42")
    lost = run_in_transaction(second, "40")
    assert won["agent_2pc"]["state"] == "committed"
    assert lost["exit_status"] == "TransactionAborted"
    assert lost["agent_2pc"]["state"] == "aborted" and lost["agent_2pc"]["code"] == "conflict"
    assert read_text(repo, "app.py") == "def answer():\n    return 42\n"


def test_a_mini_config_names_the_environment_in_one_line(repo):
    env = get_environment({"environment_class": "agent_2pc.integrations.minisweagent."
                           "TransactionEnvironment", "cwd": repo, "checks": ["true"]})
    assert isinstance(env, TransactionEnvironment)
    out = env.execute({"command": "echo hi > hi.txt && echo done"})
    assert out["returncode"] == 0 and out["output"] == "done\n"
    assert read_text(repo, "hi.txt") is None
    assert env.finish("LimitsExceeded")["state"] == "aborted"
