"""`agent-2pc top --watch` in a real terminal (tmux: send-keys, capture-pane) while other
processes begin, commit, abort and crash transactions; and its plain-text form off a terminal."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest
from conftest import run_cli, write

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]


class Pane:
    """A tmux session running one command in a fixed-size terminal, on a tmux server of its
    own (a user's or another test's server keeps its own options and environment)."""

    def __init__(self, name: str, command: str, width: int = 160, height: int = 48) -> None:
        self.name = name
        self.tmux = ["tmux", "-L", name, "-f", "/dev/null"]
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)
        # COLUMNS/LINES (pytest-xdist's workers set 80x24) would override the pane's size.
        env = {k: v for k, v in os.environ.items() if k not in (
            "AGENT2PC_ROOT", "AGENT2PC_CRASH_AT", "COLUMNS", "LINES")}
        subprocess.run([*self.tmux, "new-session", "-d", "-s", name, "-x", str(width), "-y",
                        str(height), f"{command}; echo EXIT=$?; sleep 120"], check=True,
                       env=env)

    def text(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-t", self.name, "-p"],
                              capture_output=True, text=True, check=True).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def wait(self, predicate, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if predicate(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"the screen never showed it; it shows:\n{text}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


def cli(root: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run_cli(args, json_out=True, root=root, env=env)


def tid_of(proc: subprocess.CompletedProcess) -> str:
    import json

    return json.loads(proc.stdout)["tid"]


def test_top_shows_transactions_live_as_other_processes_commit_abort_and_crash(root):
    top = Pane(f"a2pc-top-{os.getpid()}", " ".join(shlex.quote(a) for a in [
        sys.executable, "-m", "agent_2pc", "--root", root, "top", "--watch",
        "--interval-ms", "200"]))
    try:
        top.wait(lambda t: "System state" in t and "HEALTHY" in t)
        # An agent begins and stages: it appears in flight.
        a = tid_of(cli(root, "begin", "--label", "agent-a edits"))
        assert cli(root, "stage-write", "--tid", a, "--path", "hello.py", "--content",
                   "print('hello')\n").returncode == 0
        top.wait(lambda t: a in t and "agent-a edits" in t and "active" in t)
        # Another commits and one aborts: both show as recently finished.
        b = tid_of(cli(root, "begin", "--label", "agent-b commits"))
        cli(root, "stage-write", "--tid", b, "--path", "b.txt", "--content", "b\n")
        assert cli(root, "commit", "--tid", b).returncode == 0
        c = tid_of(cli(root, "begin", "--label", "agent-c aborts"))
        assert cli(root, "abort", "--tid", c).returncode == 0
        # (A frame may be captured half drawn: wait for all of it.)
        top.wait(lambda t: all(x in t for x in ("agent-b commits", "agent-c aborts",
                                                "1 Committed", "1 Aborted", "committed",
                                                "aborted by request")))
        # One dies after its commit decision: the screen turns unhealthy and names it.
        write(root, "d.txt", "before\n")
        d = tid_of(cli(root, "begin", "--label", "agent-d crashes"))
        cli(root, "stage-write", "--tid", d, "--path", "d.txt", "--content", "after\n")
        assert cli(root, "commit", "--tid", d,
                   env={"AGENT2PC_CRASH_AT": "commit.after_decision"}).returncode == 137
        top.wait(lambda t: all(x in t for x in ("UNHEALTHY", "interrupted_commit", "STUCK",
                                                "committing", d)))
        # recover (another process) finishes it; the screen is healthy again.
        assert cli(root, "recover").returncode == 0
        top.wait(lambda t: "HEALTHY" in t and "UNHEALTHY" not in t and "2 Committed" in t)
        # Keys: change the sort, open the diff of the selected transaction, go back, quit.
        top.keys("s")
        top.wait(lambda t: "sort: state" in t)
        top.keys("Enter")
        top.wait(lambda t: all(x in t for x in (f"diff {a}", "+print('hello')",
                                                "diff --git a/hello.py b/hello.py")))
        top.keys("q")
        top.wait(lambda t: "In flight (1)" in t)
        top.keys("q")
        top.wait(lambda t: "EXIT=0" in t)
    finally:
        top.close()


def test_top_off_a_terminal_prints_the_monitor_text(root, client):
    client.begin(label="plain one").stage_write("p.txt", "p\n")
    proc = run_cli(("top",), root=root)
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr
    assert "CRC32 verified" in out and "plain one" in out and "\x1b[" not in out
    watch = subprocess.Popen([sys.executable, "-m", "agent_2pc", "--root", root, "top",
                              "--watch", "--interval-ms", "100"], stdout=subprocess.PIPE)
    time.sleep(1.5)
    watch.terminate()
    data = watch.communicate(timeout=10)[0].decode()
    assert data.count("agent-2pc monitor") >= 3  # refreshed, as text


def test_top_refuses_json_and_a_bad_interval(root):
    proc = run_cli(("top", "--interval-ms", "5"), json_out=False, root=root)
    assert proc.returncode == 2 and b"--interval-ms" in proc.stderr
    proc = run_cli(("top",), json_out=True, root=root)
    assert proc.returncode == 2 and b'"usage"' in proc.stdout
