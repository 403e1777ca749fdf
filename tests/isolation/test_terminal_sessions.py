"""`agent-2pc exec` on a terminal, as a person uses it, in tmux, on every tier: the program gets
a pseudo-terminal of its own, so shells have job control and exit cleanly, full-screen programs
draw and follow the window's size, ^Z suspends a program that is not a shell together with
agent-2pc, the caller's terminal mode comes back however agent-2pc ends, and a session that
fails or is cut off never loses its work silently (it is kept for `stage-kept`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from .conftest import pids_matching
from .tmuxkit import Tmux, have_tmux

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not have_tmux(), reason="tmux is not installed")]

BIN = os.path.dirname(sys.executable)
A2PC = os.path.join(BIN, "agent-2pc")
OUTER_BASH = ["bash", "--norc", "--noprofile"]
SHELLS = {
    "dash": ["sh", "-i"],  # Debian's sh: the shell of the issue
    "bash": ["bash", "--norc", "--noprofile", "-i"],
    "zsh": ["zsh", "-f", "-i"],
}


def _need(program: str) -> None:
    if shutil.which(program) is None:
        pytest.skip(f"{program} is not installed (.ci/run installs it)")


def _env(tier: str, home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENT2PC_", "TMUX", "PYTEST_"))}
    env.update({"PATH": f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": home, "AGENT2PC_ISOLATION": tier, "PS1": "outer$ ",
                "LANG": "C.UTF-8", "TERM": "screen"})
    return env


@pytest.fixture
def term(staged, tier, shared_tmp):
    """A tmux window whose shell (bash, with job control) is in the staged repo."""
    home = os.path.join(shared_tmp, "home")
    os.makedirs(home, exist_ok=True)
    with Tmux(staged.root, _env(tier, home), OUTER_BASH) as t:
        t.wait_for(r"^outer\$ ")
        yield t


def _exec(t: Tmux, tid: str, program: list[str]) -> int:
    """Start ``agent-2pc exec`` in the window; return where its output starts."""
    mark = t.mark()
    t.type(f"{A2PC} exec --tid {tid} -- {' '.join(program)}")
    return mark


def _done(t: Tmux, start: int) -> re.Match[str]:
    """Wait for exec's last word, then ask the shell for its exit status (not on the same
    command line: a job that stops would let the shell go on to the next command)."""
    t.wait_for(r"agent-2pc: ", after=start)
    t.type("echo RC-$?-DONE")
    return t.wait_for(r"RC-(\d+)-DONE", after=start)


def _staged(staged) -> dict[str, str]:
    return {f["path"]: f["op"] for f in staged.client.get(staged.tx.tid).status()["files"]}


def _caller(tid: str) -> int:
    deadline = time.monotonic() + 15
    while True:
        pids = pids_matching(f"exec --tid {tid}")
        if pids:
            return pids[0]
        assert time.monotonic() < deadline, "agent-2pc exec never started"
        time.sleep(0.05)


def _gone(tid: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while pids_matching(f"exec --tid {tid}"):
        assert time.monotonic() < deadline, "agent-2pc exec did not end"
        time.sleep(0.1)


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_a_shell_session_has_job_control_follows_the_window_and_stages_its_work(
        staged, term, shell):
    _need(SHELLS[shell][0])
    tid = staged.tx.tid
    start = _exec(term, tid, SHELLS[shell])
    term.type("echo UP-$((1+1))")
    term.wait_for(r"UP-2", after=start)
    term.type("sleep 30")
    time.sleep(0.5)
    term.keys("C-z")  # stops the sleep; the shell in the view takes the terminal back
    term.wait_for(r"Stopped|suspended", after=start)
    term.type("jobs; echo JOBS-$((2+3))")
    term.wait_for(r"sleep 30[\s\S]*JOBS-5", after=start)
    term.type("fg")
    time.sleep(0.5)
    term.keys("C-c")  # for the sleep, in the foreground again
    term.type("echo BACK-$((3+4))")
    term.wait_for(r"BACK-7", after=start)
    term.resize(90, 20)
    time.sleep(0.3)
    term.type("stty size; echo SIZE-$((4+4))")
    term.wait_for(r"20 90\s+SIZE-8", after=start)
    term.type("echo typed > term.txt; rm docs/guide.txt; exit")
    done = _done(term, start)
    screen = term.screen()[start:]
    assert done.group(1) == "0", screen
    assert "Cannot set tty process group" not in screen
    assert re.search(r"staged 2 changes.*overlay|staged 2 changes", screen), screen
    files = _staged(staged)
    assert files["term.txt"] == "write" and files["docs/guide.txt"] == "delete"
    assert staged.tree_hash() == staged.before
    term.type("stty -a; echo MODE-$((5+5))")  # our terminal is back in its cooked mode
    mode = term.wait_for(r"([\s\S]*)MODE-10", after=done.end()).group(1)
    assert re.search(r"(^|\s)icanon\b", mode) and re.search(r"(^|\s)echo\b", mode), mode


def test_a_python_repl_suspends_with_agent_2pc_and_resumes_with_fg(staged, term):
    tid = staged.tx.tid
    start = _exec(term, tid, ["python3", "-q"])
    term.wait_for(r"^>>> ", after=start)
    term.type("open('repl.txt', 'w').write('from the repl\\n')")
    term.wait_for(r"\b14\s", after=start)
    term.keys("C-z")  # the REPL stops; agent-2pc stops with it: our shell has the terminal
    term.wait_for(r"Stopped\s+.*agent-2pc exec", after=start)
    term.type("echo OUTER-$((6+6))")
    term.wait_for(r"OUTER-12", after=start)
    term.type("fg")
    time.sleep(0.5)
    term.type("print(6 * 7)")
    term.wait_for(r"\b42\s", after=start)
    term.keys("C-d")
    done = _done(term, start)
    assert done.group(1) == "0", term.screen()[start:]
    assert _staged(staged)["repl.txt"] == "write"


def test_vim_draws_full_screen_follows_the_window_and_its_edit_is_staged(staged, term):
    _need("vim")
    tid = staged.tx.tid
    start = _exec(term, tid, ["vim", "-u", "NONE", "-N", "-i", "NONE", "docs/guide.txt"])
    term.wait_for(r"^guide$")  # the file, drawn full screen
    term.resize(90, 20)
    time.sleep(0.5)
    term.type(":echo 'SIZE' &lines &columns")
    term.wait_for(r"SIZE 20 90")
    term.keys("C-z")  # vim suspends itself: agent-2pc is suspended with it
    term.wait_for(r"Stopped\s+.*agent-2pc exec", after=start)
    term.type("fg")
    term.wait_for(r"^guide$")
    term.keys("g", "g", "O")
    term.keys("-l", "edited in vim")
    term.keys("Escape")
    term.type(":wq")
    done = _done(term, start)
    assert done.group(1) == "0", term.screen()[start:]
    assert _staged(staged)["docs/guide.txt"] == "write"
    assert staged.client.get(tid).read("docs/guide.txt") == b"edited in vim\nguide\n"


@pytest.mark.parametrize("program", ["less", "top"])
def test_less_and_top_draw_full_screen_and_quit_cleanly(staged, term, program):
    _need(program)
    tid = staged.tx.tid
    argv = ["less", "src/app.py"] if program == "less" else ["top", "-d", "0.5"]
    start = _exec(term, tid, argv)
    if program == "less":
        term.wait_for(r"return 42")  # the staged content
        term.keys("G")
        term.wait_for(r"\(END\)")
    else:
        term.wait_for(r"PID\s+USER")  # its header: it drew the screen
        term.wait_for(r"Tasks:\s+\d+ total")
    term.keys("q")
    done = _done(term, start)
    assert done.group(1) == "0", term.screen()[start:]
    term.type("stty -a; echo MODE-$((5+5))")
    mode = term.wait_for(r"([\s\S]*)MODE-10", after=done.end()).group(1)
    assert re.search(r"(^|\s)icanon\b", mode) and re.search(r"(^|\s)echo\b", mode), mode


def test_a_failed_session_keeps_its_work_and_stage_kept_stages_it(staged, term):
    tid = staged.tx.tid
    start = _exec(term, tid, ["sh", "-i"])
    term.type("echo kept > kept.txt; rm docs/guide.txt; false; exit 3")
    done = _done(term, start)
    screen = term.screen()[start:]
    assert done.group(1) == "1" and "[command_failed]" in screen, screen
    assert "2 changes are kept" in screen and f"stage-kept --tid {tid}" in screen
    assert "kept.txt" not in _staged(staged)  # not staged unless the user says so
    mark = term.mark()
    term.type(f"{A2PC} stage-kept --tid {tid}; echo RC-$?-KEPT")
    term.wait_for(r"RC-0-KEPT", after=mark)
    files = _staged(staged)
    assert files["kept.txt"] == "write" and files["docs/guide.txt"] == "delete"
    assert staged.client.get(tid).read("kept.txt") == b"kept\n"
    assert staged.tree_hash() == staged.before


def test_a_session_cut_off_by_closing_its_terminal_keeps_its_work(staged, term):
    tid = staged.tx.tid
    start = _exec(term, tid, ["bash", "--norc", "--noprofile", "-i"])
    term.type("echo cut > cut.txt; echo WROTE-$((1+2))")
    term.wait_for(r"WROTE-3", after=start)
    term.kill()  # the window goes: a hangup for everything on it
    _gone(tid)
    out = subprocess.run([A2PC, "--json", "--root", staged.root, "stage-kept", "--tid", tid],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["captured"] == [
        {"path": "cut.txt", "op": "write", "mode": 0o644, "bytes": 4}]


def test_the_terminal_mode_comes_back_when_agent_2pc_is_killed(staged, tier, shared_tmp):
    # dash as the caller's shell: it does not restore the terminal after a job dies.
    home = os.path.join(shared_tmp, "home")
    os.makedirs(home, exist_ok=True)
    with Tmux(staged.root, _env(tier, home), ["dash"]) as t:
        t.wait_for(r"[#$] $")
        tid = staged.tx.tid
        start = _exec(t, tid, ["sh", "-i"])
        t.type("echo IN-$((2+2))")
        t.wait_for(r"IN-4", after=start)
        os.kill(_caller(tid), signal.SIGKILL)
        done = t.wait_for(r"Killed[\s\S]*[#$] $", after=start)
        time.sleep(0.3)
        t.type("stty -a; echo MODE-$((5+5))")
        mode = t.wait_for(r"([\s\S]*)MODE-10", after=done.end()).group(1)
        assert re.search(r"(^|\s)icanon\b", mode) and re.search(r"(^|\s)echo\b", mode), mode


def test_signals_sent_to_agent_2pc_reach_the_session(staged, term):
    tid = staged.tx.tid
    start = _exec(term, tid, ["sh", "-i"])
    term.type("echo UP-$((1+1))")
    term.wait_for(r"UP-2", after=start)
    caller = _caller(tid)
    term.type("sleep 100")
    time.sleep(0.5)
    os.kill(caller, signal.SIGINT)  # as ^C would: the foreground job
    term.type("echo SLEPT-$((64*2))")
    term.wait_for(r"SLEPT-128", after=start, timeout_s=15)
    term.type("exit")
    done = _done(term, start)
    assert done.group(1) == "0", term.screen()[start:]
    program = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: "
               "(print('GOT', 7 * 2), sys.exit(0))); print('READY', 3 * 3, flush=True); "
               "time.sleep(100)")
    start = _exec(term, tid, ["python3", "-c", f'"{program}"'])
    term.wait_for(r"READY 9", after=start)
    os.kill(_caller(tid), signal.SIGTERM)  # to the program
    term.wait_for(r"GOT 14", after=start)
    done = _done(term, start)
    assert done.group(1) == "0", term.screen()[start:]


def test_a_session_whose_caller_is_killed_is_kept_by_recover(staged, term, tier, tmp_path):
    if tier == "copy":
        pytest.skip("the copy tier's capture needs the caller's picture of the copy: lost")
    tid = staged.tx.tid
    start = _exec(term, tid, ["bash", "--norc", "--noprofile", "-i"])
    term.type("echo salvaged > salvaged.txt; rm docs/guide.txt; echo WROTE-$((1+2))")
    term.wait_for(r"WROTE-3", after=start)
    os.kill(_caller(tid), signal.SIGKILL)  # the OOM killer, say
    term.wait_for(r"Killed", after=start)
    # Another workspace's recover comes first: it sweeps this user's leftovers in the temp dir,
    # and must leave the session's fuse-overlayfs upper to its own workspace.
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run([A2PC, "--root", str(other), "init"], check=True, capture_output=True)
    subprocess.run([A2PC, "--root", str(other), "recover"], check=True, capture_output=True)
    mark = term.mark()
    term.type(f"{A2PC} recover; {A2PC} stage-kept --tid {tid}; echo RC-$?-KEPT")
    term.wait_for(r"RC-0-KEPT", after=mark)
    files = _staged(staged)
    assert files["salvaged.txt"] == "write" and files["docs/guide.txt"] == "delete"
    assert staged.client.get(tid).read("salvaged.txt") == b"salvaged\n"
    assert staged.tree_hash() == staged.before
