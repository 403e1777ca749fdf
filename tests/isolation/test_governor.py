"""The governor: every limit trips as named, the tripped run is stopped as a whole and leaves
nothing behind (no process, cgroup, mount or scratch directory), the output so far is kept,
and a run within its limits passes and says what enforced each limit."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time

import pytest

from agent_2pc.errors import UsageError
from agent_2pc.isolation import Limits, probe_sandbox
from agent_2pc.isolation import _cgroups as cgroups_module
from agent_2pc.isolation import _view as view_module
from agent_2pc.isolation._cgroups import PREFIX, find_parents
from agent_2pc.isolation._governor import Governor, Window

from .conftest import (
    NOBODY,
    PYTHON,
    SANDBOX_PYTHON,
    SRC,
    hand_to_nobody,
    nobody_can_run,
    pids_matching,
)

pytestmark = pytest.mark.timeout(60)

ROOT = os.geteuid() == 0
HAS_PIDS_CGROUP = "pids" in find_parents(("pids",))[0]
HAS_MEMORY_CGROUP = "memory" in find_parents(("memory",))[0]


def marker() -> str:
    return f"a2pc-gov-{random.randint(100000, 999999)}"


def our_cgroups() -> list[str]:
    found, _ = find_parents(("pids", "memory", "cpu"))
    out = []
    for _, parent in found.values():
        out += [n for n in os.listdir(parent) if n.startswith(f"{PREFIX}{os.getpid()}-")]
    return out


def assert_nothing_left(staged, m: str | None = None) -> None:
    if m is not None:
        deadline = time.monotonic() + 2
        while pids_matching(m) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pids_matching(m) == []
    assert our_cgroups() == []
    with open("/proc/self/mountinfo") as f:
        assert staged.root not in f.read()
    if os.path.isdir(staged.scratch):
        assert [n for n in os.listdir(staged.scratch) if n.startswith("view-")] == []
    assert staged.tree_hash() == staged.before


def kernel_bounds_procs(tier: str) -> bool:
    """Is a fork bomb bounded by the kernel (not only by our sampler) for this tier?"""
    return HAS_PIDS_CGROUP or (not ROOT and tier != "copy")


FORK_BOMB = ("import os, sys, time\n"
             "print('bomb', flush=True)\n"
             "while True:\n"
             "    try:\n"
             "        os.fork()\n"
             "    except OSError:\n"
             "        time.sleep(0.001)\n")


def test_fork_bomb_trips_max_procs_and_leaves_no_process(staged, tier):
    if not kernel_bounds_procs(tier):
        pytest.skip("no pids cgroup and RLIMIT_NPROC does not bind here: a real fork bomb "
                    "would only be bounded by sampling")
    m = marker()
    with staged.view(tier) as view:
        res = view.run([PYTHON, "-c", FORK_BOMB, m], timeout_s=30, limits=Limits(procs=16))
        assert res.tripped == "max_procs", res
        assert not res.timed_out and res.exit_code is None and not res.passed
        assert res.tail == "bomb\n"  # the output so far
        gov = res.governor
        assert gov["limits"] == {"max_procs": 16}
        assert gov["usage"]["peak_procs"] <= 16
        assert gov["enforced"]["max_procs"][0] in ("cgroup-v1:pids", "cgroup-v2:pids",
                                                   "rlimit:RLIMIT_NPROC")
        assert res.to_json()["tripped"] == "max_procs"
        view_dir = view.dir
    assert not os.path.exists(view_dir)
    assert_nothing_left(staged, m)


def test_governed_views_side_by_side_trip_each_on_its_own(staged, overlay_tier):
    if not kernel_bounds_procs(overlay_tier):
        pytest.skip("no kernel bound on processes here")
    m = marker()
    results: dict[int, object] = {}

    def one(i: int) -> None:
        with staged.view(overlay_tier) as view:
            if i == 0:
                res = view.run("echo calm", timeout_s=30, limits=Limits(procs=4))
            else:
                res = view.run([PYTHON, "-c", FORK_BOMB, m], timeout_s=30,
                               limits=Limits(procs=8 * i))
            results[i] = (res.tripped, res.tail)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {0: (None, "calm\n"), 1: ("max_procs", "bomb\n"),
                       2: ("max_procs", "bomb\n")}
    assert_nothing_left(staged, m)


MEMORY_HOG = ("import sys, time\n"
              "print('allocating', flush=True)\n"
              "chunks = []\n"
              "for _ in range(256):\n"
              "    chunks.append(bytearray(8 << 20))\n"
              "    time.sleep(0.002)\n"
              "print('survived', flush=True)\n")


@pytest.fixture(params=["host", "no-cgroups"])
def cgroups(request, monkeypatch) -> str:
    """As the host allows, and as on a host without cgroup controllers (rlimits and
    sampling only), which is what an unprivileged CI runner has."""
    if request.param == "no-cgroups":
        monkeypatch.setattr(cgroups_module, "find_parents",
                            lambda want=(): ({}, {c: "simulated: none" for c in want}))
    return str(request.param)


def test_memory_hog_trips_max_memory_mb(staged, tier, cgroups):
    m = marker()
    with staged.view(tier) as view:
        res = view.run([PYTHON, "-c", MEMORY_HOG, m], timeout_s=30,
                       limits=Limits(memory_mb=96))
        assert res.tripped == "max_memory_mb", res
        assert "survived" not in res.tail and res.tail.startswith("allocating")
        enforced = res.governor["enforced"]["max_memory_mb"]
        if cgroups == "host" and HAS_MEMORY_CGROUP:
            assert enforced[0].endswith(":memory")
            assert res.governor["usage"]["peak_memory_mb"] <= 96 + 16
        else:
            assert enforced[0] == "sample:/proc resident size"
    assert_nothing_left(staged, m)


def test_cpu_spin_trips_max_cpu_ms(staged, overlay_tier, cgroups):
    m = marker()
    with staged.view(overlay_tier) as view:
        res = view.run([PYTHON, "-c", "while True: pass", m], timeout_s=30,
                       limits=Limits(cpu_ms=300))
        assert res.tripped == "max_cpu_ms", res
        assert 300 <= res.governor["usage"]["cpu_ms"] < 300 + 1500
        assert "rlimit:RLIMIT_CPU" in res.governor["enforced"]["max_cpu_ms"]
        if cgroups == "no-cgroups":
            assert res.governor["enforced"]["max_cpu_ms"][0] == "sample:/proc cpu times"
    assert_nothing_left(staged, m)


def test_a_process_storm_trips_max_procs_by_sampling_without_cgroups(staged, tier, monkeypatch):
    monkeypatch.setattr(cgroups_module, "find_parents",
                        lambda want=(): ({}, {c: "simulated: none" for c in want}))
    m = f"{random.randint(100000, 999999)}.5"
    with staged.view(tier) as view:  # a bounded storm: 40 sleepers, one every 10 ms
        res = view.run(f"for i in $(seq 40); do sleep {m} & sleep 0.01; done; wait",
                       timeout_s=30, limits=Limits(procs=10))
        assert res.tripped == "max_procs", res
        assert res.governor["enforced"]["max_procs"][-1] == "sample:/proc tasks"
        assert res.governor["usage"]["peak_procs"] > 10
    assert_nothing_left(staged, f"sleep {m}")


def test_a_hanging_command_trips_max_runtime_ms_not_the_timeout(staged, tier):
    m = f"{random.randint(100000, 999999)}.5"
    with staged.view(tier) as view:
        t0 = time.monotonic()
        res = view.run(f"echo started; sleep {m} & (setsid sleep {m} &); sleep {m}",
                       timeout_s=30, limits=Limits(runtime_ms=400))
        elapsed = time.monotonic() - t0
        assert res.tripped == "max_runtime_ms" and not res.timed_out, res
        assert res.exit_code is None and res.tail == "started\n"
        assert 0.4 <= elapsed < 5
    assert_nothing_left(staged, f"sleep {m}")


def test_a_plain_timeout_is_named_timeout_ms(staged):
    with staged.view(None) as view:
        res = view.run("sleep 10", timeout_s=0.3)
        assert res.timed_out and res.tripped == "timeout_ms"
        assert res.to_json()["tripped"] == "timeout_ms"
        assert view.run("true", timeout_s=30).tripped is None


def test_writing_many_files_trips_max_files_written(staged, tier):
    with staged.view(tier) as view:
        res = view.run("mkdir out; for i in $(seq 400); do echo $i > out/$i; done; echo done",
                       timeout_s=30, limits=Limits(files_written=50))
        assert res.tripped == "max_files_written", res
        assert res.governor["usage"]["files_written"] > 50
    assert_nothing_left(staged)


def test_a_mass_delete_trips_max_deletes_per_s(staged, tier):
    for i in range(300):
        staged.write(f"bulk/{i:03}.txt", b"x\n")
    staged.before = staged.tree_hash()
    with staged.view(tier) as view:
        res = view.run("rm -rf bulk; sleep 0.3; echo after", timeout_s=30,
                       limits=Limits(deletes_per_s=100))
        assert res.tripped == "max_deletes_per_s", res
        assert res.governor["usage"]["peak_deletes_per_s"] > 100
    assert_nothing_left(staged)
    assert len(os.listdir(os.path.join(staged.root, "bulk"))) == 300


def test_a_slow_delete_stays_under_max_deletes_per_s(staged, overlay_tier):
    for i in range(12):
        staged.write(f"bulk/{i:03}.txt", b"x\n")
    with staged.view(overlay_tier) as view:
        res = view.run("for f in bulk/*; do rm $f; sleep 0.1; done", timeout_s=30,
                       limits=Limits(deletes_per_s=20))
        assert res.passed and res.tripped is None, res
        assert res.governor["usage"]["deletes"] == 12
        assert res.governor["usage"]["peak_deletes_per_s"] <= 20


def test_filling_the_disk_trips_max_disk_mb(staged, tier):
    with staged.view(tier) as view:
        res = view.run("head -c 200000000 /dev/zero > big; echo wrote", timeout_s=30,
                       limits=Limits(disk_mb=8))
        assert res.tripped == "max_disk_mb", res
        size = os.path.getsize(os.path.join(view.view_root if tier == "copy" else
                                            view._upper, "big"))
        assert size <= 8 * 2**20 + 1
        # a flood on stdout fills the log: the log counts too
        res = view.run("yes", timeout_s=30, limits=Limits(disk_mb=4))
        assert res.tripped == "max_disk_mb", res
        # (plus the helper's "File size limit exceeded": it is ours, outside the limit)
        assert os.path.getsize(res.log_path) <= 4 * 2**20 + 256
    assert_nothing_left(staged)


def test_a_fork_storm_trips_max_forks_per_s(staged, tier):
    if tier == "copy" and not ROOT:
        pytest.skip("without a PID namespace the copy tier only sees a lower bound of forks")
    with staged.view(tier) as view:
        res = view.run("for i in $(seq 3000); do /bin/true; done", timeout_s=30,
                       limits=Limits(forks_per_s=100))
        assert res.tripped == "max_forks_per_s", res
        assert res.governor["usage"]["peak_forks_per_s"] > 100
    assert_nothing_left(staged)


def test_a_run_within_its_limits_passes_and_says_what_enforced_each(staged, tier):
    limits = Limits(runtime_ms=20_000, cpu_ms=10_000, procs=64, memory_mb=512,
                    files_written=10, forks_per_s=1000, deletes_per_s=100, disk_mb=64)
    with staged.view(tier) as view:
        res = view.run("echo ok > ok.txt; rm gone.txt 2>/dev/null; cat ok.txt", timeout_s=30,
                       limits=limits)
        assert res.passed and res.tripped is None and res.tail == "ok\n", res
        gov = res.governor
        assert gov["limits"] == limits.to_json()
        assert set(gov["enforced"]) == set(limits.to_json())
        assert all(gov["enforced"].values())
        assert gov["usage"]["files_written"] == 1
        assert gov["sampling"]["detection_latency_ms_max"] <= 1000
        assert "tripped" not in res.to_json() and res.to_json()["governor"] == gov
        assert [(c.path, c.op) for c in view.capture().changes] == [("ok.txt", "write")]
        # the run's status file never reaches the command
        res = view.run("readlink /proc/$$/fd/3 || echo closed", timeout_s=30, limits=limits)
        assert res.tail.splitlines()[-1] == "closed", res.tail
        # counts are per run: a second run does not inherit the first one's files
        res = view.run("echo again > again.txt", timeout_s=30, limits=Limits(files_written=1))
        assert res.passed and res.governor["usage"]["files_written"] == 1, res
    assert_nothing_left(staged)


def test_a_command_that_does_not_exist_is_reported_not_tripped(staged, tier):
    with staged.view(tier) as view:
        res = view.run(["a2pc-no-such-command"], timeout_s=30,
                       limits=Limits(procs=8, runtime_ms=10_000))
        assert res.exit_code == 127 and res.tripped is None and not res.passed
    assert_nothing_left(staged)


def test_daemons_left_behind_are_killed_under_the_governor(staged, tier):
    m = f"{random.randint(100000, 999999)}.5"
    with staged.view(tier) as view:
        res = view.run(f"sleep {m} & (setsid sleep {m} &); echo started", timeout_s=30,
                       limits=Limits(procs=16))
        assert res.exit_code == 0 and res.tripped is None
    assert_nothing_left(staged, f"sleep {m}")


@pytest.mark.skipif(probe_sandbox() is not None, reason="no sandbox here")
def test_a_fork_bomb_in_the_sandbox_trips_max_procs(staged, tier):
    if not kernel_bounds_procs(tier):
        pytest.skip("no kernel bound on processes here")
    m = marker()
    with staged.view(tier) as view:
        res = view.run([SANDBOX_PYTHON, "-c", FORK_BOMB, m], timeout_s=30, sandbox=True,
                       limits=Limits(procs=16, disk_mb=16))
        assert res.tripped == "max_procs" and res.sandbox["tmp_size_bytes"] == 16 << 20, res
        assert "tmpfs-size:/tmp" in res.governor["enforced"]["max_disk_mb"]
    assert_nothing_left(staged, m)


@pytest.mark.skipif(not HAS_PIDS_CGROUP, reason="no pids cgroup here")
def test_cgroups_of_a_dead_caller_are_swept(staged):
    dead = subprocess.Popen(["true"])
    dead.wait()
    parent = find_parents(("pids",))[0]["pids"][1]
    stale = os.path.join(parent, f"{PREFIX}{dead.pid}-feedbeef")
    os.mkdir(stale)
    try:
        with staged.view(None) as view:
            res = view.run("true", timeout_s=30, limits=Limits(procs=4))
            assert res.passed
        assert not os.path.exists(stale)
    finally:
        if os.path.exists(stale):
            os.rmdir(stale)


def test_stop_tree_stops_every_process_before_the_kill():
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 30 & sleep 30 & sh -c 'sleep 30'"],
                            start_new_session=True)
    try:
        time.sleep(0.3)
        gov = Governor(Limits(procs=10), pid_ns=False, own_userns=False, sandboxed=False,
                       fs=None, log_path=None)
        gov.start(proc.pid, time.monotonic())
        stopped = gov.stop_tree()
        assert len(stopped) >= 3
        def state(pid: int) -> bytes:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read()
            return data[data.rfind(b")") + 2:][:1]

        deadline = time.monotonic() + 2  # a signal is delivered, not awaited
        while any(state(p) != b"T" for p in stopped) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [state(p) for p in stopped] == [b"T"] * len(stopped)
        gov.kill(stopped)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_limits_are_checked_and_take_either_name():
    assert Limits(procs=5) == Limits(max_procs=5)
    assert Limits(max_runtime_ms=10, max_disk_mb=1).to_json() == \
        {"max_runtime_ms": 10, "max_disk_mb": 1}
    assert Limits.coerce({"max_procs": 3}) == Limits(procs=3)
    for bad in ({"procs": 0}, {"procs": -1}, {"memory_mb": True}, {"cpu_ms": 1.5},
                {"max_nope": 1}, {"procs": 1, "max_procs": 2}, {"disk_mb": 1 << 40}):
        with pytest.raises(UsageError):
            Limits(**bad)


def test_the_window_measures_the_largest_rise_within_a_second():
    w = Window(0.0)
    assert w.add(0.1, 50) == 50
    assert w.add(0.5, 120) == 120
    assert w.add(1.2, 130) == 80  # 0.1 s fell out: the rise since 50
    assert w.add(2.6, 130) == 0
    assert w.peak == 120


UNPRIVILEGED = r"""
import json, shutil, sys
sys.path.insert(0, sys.argv[1])
from agent_2pc.isolation import Limits, StagedView
root, scratch, bomb = sys.argv[2], sys.argv[3], sys.argv[4]
python = shutil.which("python3")  # ours may live where nobody may not enter
out = {}
with StagedView(root, [], None, tier="overlay", scratch_dir=scratch) as view:
    res = view.run([python, "-c", bomb, sys.argv[5]], timeout_s=30, sandbox=True,
                   limits=Limits(procs=16))
    out["bomb"] = res.to_json()
    res = view.run("id -u; echo x > mine.txt", timeout_s=30, sandbox=True,
                   limits=Limits(procs=16, memory_mb=256, cpu_ms=5000))
    out["plain"] = res.to_json()
    out["captured"] = view.capture().to_json()["captured"]
print(json.dumps(out))
"""


@pytest.mark.skipif(not ROOT or not shutil.which("setpriv") or probe_sandbox() is not None,
                    reason="needs root to become an unprivileged user, and bwrap")
def test_an_unprivileged_run_is_sandboxed_and_its_fork_bomb_bounded_by_rlimit(staged,
                                                                              shared_tmp):
    nobody_can_run(PYTHON)
    nobody = NOBODY
    scratch = hand_to_nobody(staged.root, shared_tmp)
    before = staged.tree_hash()
    m = marker()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"}
    proc = subprocess.run(["setpriv", f"--reuid={nobody}", f"--regid={nobody}",
                           "--clear-groups", PYTHON, "-c", UNPRIVILEGED, SRC, staged.root,
                           scratch, FORK_BOMB, m], capture_output=True, text=True, env=env,
                          timeout=60)
    if "Operation not permitted" in proc.stderr and view_module._userns_refusal() is not None:
        pytest.skip("no user namespaces for unprivileged users here")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    bomb = out["bomb"]
    assert bomb["tripped"] == "max_procs", bomb
    assert bomb["governor"]["enforced"]["max_procs"][0] == "rlimit:RLIMIT_NPROC"
    assert bomb["sandbox"]["tool"] == "bwrap"
    plain = out["plain"]
    assert plain["passed"] and plain["tail"] == f"{nobody}\n", plain
    assert out["captured"] == [{"path": "mine.txt", "op": "write", "mode": 0o644, "bytes": 2}]
    assert pids_matching(m) == []
    assert staged.tree_hash() == before
    assert os.listdir(scratch) == []
