"""`agent-2pc session` on a terminal, as a person uses it, in tmux: a scripted agent (a small
program that asks for a word, then edits files) runs in the staged view on the terminal; when it
exits the session shows what changed and asks; each answer (commit, abort, diff, keep), --yes
with checks that pass and fail, --json, and Ctrl-C (the work kept, the terminal restored)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from agent_2pc import Agent2PC

from .tmuxkit import Tmux, have_tmux

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")]

BIN = os.path.dirname(sys.executable)
A2PC = os.path.join(BIN, "agent-2pc")
FILES = {"app.py": "def answer():\n    return 41\n", "old.txt": "to be deleted\n",
         "keep.txt": "untouched\n"}

# The scripted agent: asks "agent> " and reads a word on its terminal, then edits three files
# (a change, a new file, a delete). "edit-first" edits before asking (for Ctrl-C at the
# question); "fail" exits 3 after editing.
AGENT = textwrap.dedent("""\
    import os, sys
    mode = sys.argv[1] if len(sys.argv) > 1 else "normal"
    def edit():
        with open("app.py", "w") as f:
            f.write("def answer():\\n    return 42\\n")
        with open("new.txt", "w") as f:
            f.write("made by the agent\\n")
        os.remove("old.txt")
    assert os.isatty(0) and os.isatty(1), "the agent has no terminal"
    if mode == "edit-first":
        edit()
    word = input("agent> ")
    print("agent heard", word.upper())
    if mode != "edit-first":
        edit()
    print("agent finished")
    sys.exit(3 if mode == "fail" else 0)
""")


class Repo:
    def __init__(self, root: str) -> None:
        self.root = root
        self.client = Agent2PC(root)

    def read(self, rel: str) -> str | None:
        try:
            with open(os.path.join(self.root, rel)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def untouched(self) -> bool:
        return all(self.read(rel) == text for rel, text in FILES.items()) and \
            self.read("new.txt") is None

    def only_tx(self) -> dict:
        rows = self.client.transactions()
        assert len(rows) == 1, rows
        return rows[0]

    def staged_files(self, tid: str) -> dict[str, str]:
        return {f["path"]: f["op"] for f in self.client.get(tid).status()["files"]}


@pytest.fixture
def repo(shared_tmp: str) -> Repo:
    root = os.path.join(shared_tmp, "repo")
    os.mkdir(root)
    for rel, text in FILES.items():
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    Agent2PC.init(root)
    with open(os.path.join(shared_tmp, "agent.py"), "w") as f:
        f.write(AGENT)
    return Repo(os.path.realpath(root))


@pytest.fixture
def term(repo: Repo, shared_tmp: str):
    home = os.path.join(shared_tmp, "home")
    os.makedirs(home, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENT2PC_", "TMUX", "PYTEST_"))}
    env.update({"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": home, "PS1": "outer$ ",
                "LANG": "C.UTF-8", "TERM": "screen"})
    with Tmux(repo.root, env, ["bash", "--norc", "--noprofile"]) as t:
        t.wait_for(r"^outer\$ ")
        yield t


def _agent(shared_tmp: str, mode: str = "normal") -> str:
    return f"{sys.executable} {os.path.join(shared_tmp, 'agent.py')} {mode}"


def _session(t: Tmux, options: str, program: str) -> int:
    mark = t.mark()
    t.type(f"{A2PC} session {options} -- {program}")
    return mark


def _talk_to_agent(t: Tmux, start: int) -> None:
    """Answer the agent's own question: its terminal is the person's."""
    t.wait_for(r"agent> ", after=start)
    t.type("go")
    t.wait_for(r"agent heard GO", after=start)


def _rc(t: Tmux, last_word: str, start: int) -> int:
    """Wait for the session's last word, then ask the shell for its exit status."""
    end = t.wait_for(last_word, after=start).end()
    t.type("echo RC-$?-DONE")
    return int(t.wait_for(r"RC-(\d+)-DONE", after=end).group(1))


def _terminal_is_cooked(t: Tmux, start: int) -> None:
    t.type("stty -a; echo MODE-$((5+5))")
    mode = t.wait_for(r"([\s\S]*)MODE-10", after=start).group(1)
    assert re.search(r"(^|\s)icanon\b", mode) and re.search(r"(^|\s)echo\b", mode), mode


def test_commit_answer_applies_what_the_agent_did(repo, term, shared_tmp):
    start = _session(term, "--label demo", _agent(shared_tmp))
    _talk_to_agent(term, start)
    term.wait_for(r"\[c\]ommit, \[a\]bort, \[d\]iff, \[k\]eep", after=start)
    screen = term.screen()[start:]
    assert re.search(r"exited 0; 3 files changed", screen), screen
    assert re.search(r"M app\.py  \+1 -1", screen) and re.search(r"A new\.txt", screen) and \
        re.search(r"D old\.txt", screen), screen
    assert repo.untouched()  # nothing reached the tree before the answer
    term.type("c")
    assert _rc(term, r"committed \S+: 3 files", start) == 0
    assert repo.read("app.py") == "def answer():\n    return 42\n"
    assert repo.read("new.txt") == "made by the agent\n" and repo.read("old.txt") is None
    tx = repo.only_tx()
    assert tx["state"] == "committed" and tx["label"] == "demo"


def test_abort_answer_leaves_the_tree_untouched(repo, term, shared_tmp):
    start = _session(term, "", _agent(shared_tmp))
    _talk_to_agent(term, start)
    term.wait_for(r"\[k\]eep for later\? ", after=start)
    term.type("a")
    assert _rc(term, r"aborted \S+", start) == 0
    assert repo.untouched()
    assert repo.only_tx()["state"] == "aborted"


def test_diff_then_commit_shows_the_diff_and_asks_again(repo, term, shared_tmp):
    start = _session(term, "", _agent(shared_tmp))
    _talk_to_agent(term, start)
    first = term.wait_for(r"\[k\]eep for later\? ", after=start).end()
    term.type("d")
    term.wait_for(r"-    return 41\s+\+    return 42", after=first)
    again = term.wait_for(r"\[k\]eep for later\? ", after=first).end()
    term.type("nonsense")
    term.wait_for(r"answer c, a, d or k", after=again)
    term.type("commit")
    assert _rc(term, r"committed \S+: 3 files", again) == 0
    assert repo.read("new.txt") == "made by the agent\n"


def test_a_long_diff_is_shown_in_the_pager_and_the_question_comes_back(repo, term, shared_tmp):
    start = _session(term, "", f"sh -c '{_agent(shared_tmp)} && seq 1 300 > long.txt'")
    _talk_to_agent(term, start)
    first = term.wait_for(r"\[k\]eep for later\? ", after=start).end()
    term.type("d")
    term.wait_for(r"\+1\s+\+2\s", after=first)  # less holds the screen: the diff's top
    screen = term.screen()[first:]
    assert "+300" not in screen  # not all of it: it waits
    term.keys("q")
    term.wait_for(r"\[k\]eep for later\? ", after=first)
    term.type("a")
    assert _rc(term, r"aborted \S+", first) == 0


def test_keep_answer_leaves_the_transaction_active_with_the_work(repo, term, shared_tmp):
    start = _session(term, "", _agent(shared_tmp))
    _talk_to_agent(term, start)
    term.wait_for(r"\[k\]eep for later\? ", after=start)
    term.type("k")
    assert _rc(term, r"kept \S+ \(active\)", start) == 0
    screen = term.screen()[start:]
    tx = repo.only_tx()
    assert tx["state"] == "active"
    assert f"agent-2pc commit --tid {tx['tid']}" in screen, screen
    assert repo.staged_files(tx["tid"]) == {"app.py": "write", "new.txt": "write",
                                            "old.txt": "delete"}
    assert repo.untouched()
    repo.client.get(tx["tid"]).commit()  # and it can be finished later
    assert repo.read("new.txt") == "made by the agent\n"


def test_yes_commits_without_asking_when_the_checks_pass(repo, term, shared_tmp):
    start = _session(term, "--yes --check 'grep -q 42 app.py' --check 'test -f new.txt'",
                     _agent(shared_tmp))
    _talk_to_agent(term, start)
    assert _rc(term, r"committed \S+: 3 files", start) == 0
    screen = term.screen()[start:]
    assert "[c]ommit" not in screen
    assert screen.count("check passed") == 2, screen
    assert repo.read("app.py") == "def answer():\n    return 42\n"


def test_yes_with_a_failing_check_keeps_the_work_and_commits_nothing(repo, term, shared_tmp):
    start = _session(term, "--yes --check 'grep -q 43 app.py'", _agent(shared_tmp))
    _talk_to_agent(term, start)
    assert _rc(term, r"\[verification_failed\]", start) == 1
    screen = term.screen()[start:]
    assert "check FAILED: grep -q 43 app.py" in screen and "agent-2pc diff --tid" in screen
    assert repo.untouched()
    tx = repo.only_tx()
    assert tx["state"] == "active" and len(repo.staged_files(tx["tid"])) == 3


def test_yes_does_not_commit_a_program_that_failed(repo, term, shared_tmp):
    start = _session(term, "--yes", _agent(shared_tmp, "fail"))
    _talk_to_agent(term, start)
    assert _rc(term, r"\[command_failed\]", start) == 1
    assert repo.untouched()
    tx = repo.only_tx()
    assert tx["state"] == "active" and len(repo.staged_files(tx["tid"])) == 3


@pytest.mark.parametrize("yes", [True, False])
def test_json_answers_as_commit_or_as_kept_without_a_question(repo, term, shared_tmp, yes):
    out = os.path.join(shared_tmp, "out.json")
    # stdout is a file; the agent still has the terminal (its output goes to stderr).
    start = _session(term, "--json --check true" + (" --yes" if yes else ""),
                     _agent(shared_tmp) + f" > {out}")
    _talk_to_agent(term, start)
    # Type nothing before the session ended: keys typed while the agent runs are the agent's.
    deadline = time.monotonic() + 60
    while not (os.path.exists(out) and os.path.getsize(out)):
        assert time.monotonic() < deadline, term.screen()[start:]
        time.sleep(0.05)
    assert _rc(term, r"agent finished", start) == 0
    assert "[c]ommit" not in term.screen()[start:]
    with open(out) as f:
        answer = json.loads(f.read())
    tid = repo.only_tx()["tid"]
    assert answer["ok"] is True and answer["tid"] == tid
    assert [c["passed"] for c in answer["checks"]] == [True]
    if yes:
        assert answer["state"] == "committed"
        assert sorted(answer["files"]) == ["app.py", "new.txt", "old.txt"]
        assert repo.read("new.txt") == "made by the agent\n"
    else:
        assert answer["state"] == "active" and answer["exit_code"] == 0
        assert sorted(f["path"] for f in answer["files"]) == ["app.py", "new.txt", "old.txt"]
        assert repo.untouched() and repo.only_tx()["state"] == "active"


def test_ctrl_c_in_the_program_keeps_the_work_and_restores_the_terminal(repo, term, shared_tmp):
    start = _session(term, "--yes", _agent(shared_tmp, "edit-first"))
    term.wait_for(r"agent> ", after=start)
    term.keys("C-c")
    assert _rc(term, r"\[interrupted\]", start) == 130
    screen = term.screen()[start:]
    tx = repo.only_tx()
    assert tx["state"] == "active"
    assert f"agent-2pc diff --tid {tx['tid']}" in screen, screen
    assert f"agent-2pc commit --tid {tx['tid']}" in screen, screen
    assert repo.staged_files(tx["tid"]) == {"app.py": "write", "new.txt": "write",
                                            "old.txt": "delete"}
    assert repo.untouched()
    _terminal_is_cooked(term, len(screen) + start)
    term.type(f"{A2PC} commit --tid {tx['tid']}")  # resumed as the message says
    term.wait_for(r"committed \S+: 3 files", after=start)
    assert repo.read("new.txt") == "made by the agent\n"


def test_ctrl_c_at_the_question_keeps_the_transaction(repo, term, shared_tmp):
    start = _session(term, "", _agent(shared_tmp))
    _talk_to_agent(term, start)
    term.wait_for(r"\[k\]eep for later\? ", after=start)
    term.keys("C-c")
    assert _rc(term, r"\[interrupted\]", start) == 130
    tx = repo.only_tx()
    assert tx["state"] == "active" and len(repo.staged_files(tx["tid"])) == 3
    assert repo.untouched()


def test_session_without_a_program_is_a_usage_error(repo):
    proc = subprocess.run([A2PC, "--root", repo.root, "session", "--json"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == "usage"
    assert repo.client.transactions() == []


def test_a_session_killed_during_the_program_keeps_the_work_for_recover(repo, term, shared_tmp):
    from agent_2pc.isolation import TIERS, probe_tiers

    from .conftest import pids_matching

    if all(why is not None for tier, why in probe_tiers().items() if tier != TIERS[-1]):
        pytest.skip("only the copy tier here: its capture dies with its caller")
    start = _session(term, "", _agent(shared_tmp, "edit-first"))
    tid = term.wait_for(r"agent-2pc session (\S+):", after=start).group(1)
    term.wait_for(r"agent> ", after=start)
    pid = [p for p in pids_matching(" session -- ") if p != term.pane_pid()][0]
    os.kill(pid, signal.SIGKILL)  # the OOM killer, say
    term.wait_for(r"Killed", after=start)
    mark = term.mark()
    term.type(f"{A2PC} recover; {A2PC} stage-kept --tid {tid}; echo RC-$?-KEPT")
    term.wait_for(r"RC-0-KEPT", after=mark)
    assert repo.staged_files(tid) == {"app.py": "write", "new.txt": "write", "old.txt": "delete"}
    assert repo.untouched()
    _terminal_is_cooked(term, mark)
