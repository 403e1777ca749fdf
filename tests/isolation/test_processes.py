"""Nothing a command starts outlives its run: a timeout kills the whole tree (children, a
daemon that setsid()s, a double fork), processes left behind by a command that exited are
killed before capture, and no mount, process or scratch directory outlives the view."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from .conftest import pids_matching

pytestmark = pytest.mark.timeout(60)

DOUBLE_FORK = ("import os, sys, time\n"
               "if os.fork() == 0:\n"
               "    os.setsid()\n"
               "    if os.fork() == 0:\n"
               "        time.sleep(float(sys.argv[1]))\n"
               "    os._exit(0)\n"
               "os.wait()\n")


def marker() -> str:
    """A sleep duration no other process uses: its command line finds our processes."""
    return f"{random.randint(100000, 999999)}.5"


def forking_command(m: str) -> str:
    """Children in the background, a setsid() daemon, a double-forked daemon, then it waits."""
    return (f"sleep {m} & sh -c 'sleep {m}' & setsid sleep {m} & (setsid sleep {m} &); "
            f"python3 -c '{DOUBLE_FORK}' {m}; sleep {m}")


def wait_gone(m: str, budget_s: float = 2.0) -> list[int]:
    deadline = time.monotonic() + budget_s
    while True:
        left = pids_matching(f"sleep {m}") + pids_matching(f" {m}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def test_a_timeout_kills_the_whole_tree_and_is_reported(staged, tier):
    m = marker()
    with staged.view(tier) as view:
        t0 = time.monotonic()
        res = view.run(forking_command(m), timeout_s=1.0)
        elapsed = time.monotonic() - t0
        assert res.timed_out and res.exit_code is None and not res.passed
        assert res.survivors == 0
        assert 1.0 <= elapsed < 8.0
        # nothing is left, at once: the run returned only after every process was gone
        assert pids_matching(f"sleep {m}") == [] and pids_matching(f" {m}") == []


def test_processes_left_behind_are_killed_before_capture(staged, tier):
    m = marker()
    with staged.view(tier) as view:
        res = view.run(f"sleep {m} & (setsid sleep {m} &); python3 -c '{DOUBLE_FORK}' {m}; "
                       f"(sleep 0.3; echo late > late.txt) & echo started", timeout_s=30)
        assert res.exit_code == 0 and res.tail == "started\n"
        assert pids_matching(f"sleep {m}") == [] and pids_matching(f" {m}") == []
        time.sleep(0.5)
        # the background writer was killed with the rest: it never wrote late.txt
        assert [c.path for c in view.capture().changes] == []


def test_nothing_outlives_the_view(staged, tier):
    m = marker()
    scratch = staged.scratch
    with staged.view(tier) as view:
        res = view.run(f"head -c 200000 /dev/zero > big; mkdir many; for i in $(seq 300); do "
                       f"echo $i > many/$i; done; sleep {m} &", timeout_s=30)
        assert res.exit_code == 0
        view_dir, layer_dir, copy_base = view.dir, view._layer_dir, view._copy_base
        assert os.path.isdir(view_dir)
    assert not os.path.exists(view_dir)
    assert layer_dir is None or not os.path.exists(layer_dir)
    assert copy_base is None or not os.path.exists(copy_base)
    assert [n for n in os.listdir(scratch) if n.startswith("view-")] == []
    assert wait_gone(m) == []
    with open("/proc/self/mountinfo") as f:
        assert staged.root not in f.read()
    # big scratch went to the trash and is being deleted in the background
    trash = os.path.join(staged.root, ".agent-tx", "trash")
    deadline = time.monotonic() + 20
    while os.listdir(trash) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.listdir(trash) == []
    if copy_base is not None:
        parent = os.path.dirname(copy_base)
        base = os.path.basename(copy_base)
        while any(n.startswith(base) for n in os.listdir(parent)) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(n.startswith(base) for n in os.listdir(parent))
    assert staged.tree_hash() == staged.before


def test_an_exception_in_the_caller_kills_the_command(staged, tier):
    class Interrupted(Exception):
        pass

    def raise_it(signum, frame):
        raise Interrupted()

    m = marker()
    old = signal.signal(signal.SIGUSR1, raise_it)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        with staged.view(tier) as view:
            timer.start()
            with pytest.raises(Interrupted):
                view.run(forking_command(m), timeout_s=30)
            assert wait_gone(m, 5.0) == []
            res = view.run("echo still usable", timeout_s=30)
            assert res.tail == "still usable\n"
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, old)


def test_views_run_side_by_side_from_threads(staged, tier):
    results = {}

    def one(i: int) -> None:
        with staged.view(tier) as view:
            res = view.run(f"echo {i} > mine.txt; sleep 0.2; cat mine.txt", timeout_s=30)
            results[i] = (res.tail, [c.path for c in view.capture().changes])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {i: (f"{i}\n", ["mine.txt"]) for i in range(4)}
    assert staged.tree_hash() == staged.before
