"""A caller killed outright (SIGKILL) takes everything it started in the view with it, and
`recover` removes what it left on disk (the staged layer in /dev/shm, the copy, the view's
scratch) and kills a run whose caller died before it could hand down its death signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from agent_2pc.isolation._owner import owner_tag

from .conftest import pids_matching

pytestmark = pytest.mark.timeout(120)

A2PC = [sys.executable, "-m", "agent_2pc"]


def _env(tier: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    env["AGENT2PC_ISOLATION"] = tier
    return env


def _start(staged, tier: str, how: str, script: str) -> subprocess.Popen[bytes]:
    tid = staged.tx.tid
    if how == "stage-cmd":
        args = ["stage-cmd", "--tid", tid, "--command", script]
    else:
        args = ["exec", "--tid", tid, "--", "sh", "-c", script]
    return subprocess.Popen([*A2PC, "--json", "--root", staged.root, *args], env=_env(tier),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _wait_file(path: str, budget_s: float = 30.0) -> None:
    deadline = time.monotonic() + budget_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _ours() -> set[str]:
    """This user's staged layers and copies (in /dev/shm and the temp dir)."""
    out = set()
    for parent in {"/dev/shm", tempfile.gettempdir()}:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        out |= {os.path.join(parent, n) for n in names
                if n.startswith(f"agent-2pc-{os.getuid()}-")}
    return out


def _holding(paths: set[str], name: str) -> set[str]:
    """Those of ``paths`` that hold a file called ``name`` (at any depth)."""
    out = set()
    for p in paths:
        for _, _, files in os.walk(p):
            if name in files:
                out.add(p)
                break
    return out


@pytest.mark.parametrize("how", ["stage-cmd", "exec"])
def test_a_killed_caller_takes_every_process_of_its_run_with_it(staged, tier, shared_tmp, how):
    m = f"{os.getpid()}{time.monotonic_ns() % 100000}.25"
    started = os.path.join(shared_tmp, "started")
    escaped = os.path.join(shared_tmp, "escaped")
    # writes outside the repo: nothing would capture them; a surviving command would make them
    script = (f"echo up > {started}; (setsid sleep {m} &); sleep {m}; "
              f"echo escaped > {escaped}")
    caller = _start(staged, tier, how, script)
    try:
        _wait_file(started)
        caller.kill()  # SIGKILL: no cleanup of ours runs
        caller.wait()
        deadline = time.monotonic() + 5
        while pids_matching(f"sleep {m}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids_matching(f"sleep {m}") == [], "the run outlived its caller"
        time.sleep(1.0)
        assert not os.path.exists(escaped)
    finally:
        for pid in pids_matching(f"sleep {m}"):
            os.kill(pid, signal.SIGKILL)


def test_recover_removes_the_layer_and_scratch_a_killed_caller_left(staged, tier, shared_tmp):
    name = f"big-{os.urandom(4).hex()}.bin"
    staged.tx.stage_write(name, os.urandom(4 << 20))  # the layer (or the copy) holds it
    started = os.path.join(shared_tmp, "started")
    caller = _start(staged, tier, "stage-cmd", f"echo up > {started}; sleep 60")
    try:
        _wait_file(started)
        left = _holding(_ours(), name)
        assert left, "no staged layer or copy holds the staged file"
        caller.kill()
        caller.wait()
        time.sleep(0.5)
        # The caller is dead and cleaned up nothing: its scratch is still there. (Its layer
        # may already be gone: any workspace's recover sweeps the layers of dead callers, and
        # in a parallel run another test's recover can come first.)
        scratch = os.path.join(staged.root, ".agent-tx", "tx", staged.tx.tid)
        assert [n for n in os.listdir(scratch) if n.startswith("view-")]
        out = subprocess.run([*A2PC, "--json", "--root", staged.root, "recover"],
                             env=_env(tier), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert _holding(_ours(), name) == set()
        assert [n for n in os.listdir(scratch) if n.startswith("view-")] == []
    finally:
        caller.kill()


def test_recover_kills_a_run_whose_caller_died_before_handing_down_its_death_signal(staged):
    # What a caller killed between spawning its helper and the helper's prctl leaves: a view
    # whose owner is gone, and the helper (its arguments name the view's scratch) still running.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    ns = owner_tag().split(".")[0]
    tag = f"{ns}.{dead.stdout.strip()}.1"
    view = os.path.join(staged.root, ".agent-tx", "tx", staged.tx.tid, f"view-{tag}-orphan1")
    os.makedirs(os.path.join(view, "upper"))
    m = f"{os.getpid()}{time.monotonic_ns() % 100000}.75"
    helper = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--", "sh", "-c",
                               f"sleep {m}", "agent-2pc-view", os.path.join(view, "upper")],
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not pids_matching(f"sleep {m}"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        out = subprocess.run([*A2PC, "--json", "--root", staged.root, "recover"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert helper.wait(10) is not None
        assert pids_matching(f"sleep {m}") == []
        assert not os.path.exists(view)
    finally:
        helper.kill()
        helper.wait()


def test_a_recover_run_inside_a_view_never_takes_the_live_views_layer(staged, tier):
    # Inside the view, the caller's process is not visible (another PID namespace): its layer
    # must not look like a leftover of a dead caller.
    res = subprocess.run([*A2PC, "--json", "--root", staged.root, "stage-cmd", "--tid",
                          staged.tx.tid, "--command",
                          f"{sys.executable} -m agent_2pc recover; sleep 0.2; "
                          "cat src/app.py new/deep/made.txt"],
                         env=_env(tier), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "return 42" in res.stdout and "created by the transaction" in res.stdout
