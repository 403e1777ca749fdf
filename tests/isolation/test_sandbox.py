"""The sandbox: a sandboxed run sees the host read-only, a private /tmp, no network unless it
is asked for, no privileges, and only the staged view writable (capture still works); it says
what confined it; when it cannot be had, nothing runs."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from agent_2pc.errors import IsolationUnavailable, UsageError
from agent_2pc.isolation import _sandbox, probe_sandbox

from .conftest import PYTHON, SANDBOX_PYTHON, pids_matching

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(probe_sandbox() is not None,
                                 reason=f"no sandbox here: {probe_sandbox()}")]

CONNECT = ("import socket, sys\n"
           "try:\n"
           "    s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5)\n"
           "    print('got', s.recv(5).decode())\n"
           "except OSError as exc:\n"
           "    print('refused', type(exc).__name__)\n")


def test_a_sandboxed_run_says_what_confined_it_and_its_writes_are_captured(staged, tier):
    with staged.view(tier) as view:
        res = view.run("cat src/app.py; echo made > made.txt; rm docs/guide.txt", timeout_s=30,
                       sandbox=True)
        assert res.exit_code == 0, res.tail
        assert "return 42" in res.tail  # the staged view, not the tree
        box = res.sandbox
        assert box["tool"] == "bwrap" and box["network"] is False
        assert box["readonly_host"] and box["private_tmp"] and box["no_new_privs"]
        assert box["writable"] == [view.view_root]
        assert "net" in box["namespaces"] and box["capabilities"] == []
        assert res.to_json()["sandbox"] == box
        assert [(c.path, c.op) for c in view.capture().changes] == \
            [("docs/guide.txt", "delete"), ("made.txt", "write")]
    assert staged.tree_hash() == staged.before


def test_the_sandbox_refuses_writes_outside_the_view(staged, tier, shared_tmp):
    outside = os.path.join(shared_tmp, "outside")
    os.mkdir(outside)
    home_file = os.path.join(outside, "escape.txt")
    real_repo_file = os.path.join(staged.root, "escape.txt")
    with staged.view(tier) as view:
        res = view.run(f"echo x > {home_file}; echo a=$?; echo x > {real_repo_file}; echo b=$?; "
                       "echo x > /etc/agent-2pc-escape; echo c=$?; "
                       "echo x > .agent-tx/escape; echo d=$?", timeout_s=30, sandbox=True)
        lines = res.tail.splitlines()
        assert "a=2" in lines and "c=2" in lines and "d=2" in lines, res.tail
        if tier == "copy":  # the real repo is elsewhere, and read-only too
            assert "b=2" in lines, res.tail
        assert "Read-only file system" in res.tail
    assert os.listdir(outside) == []
    assert not os.path.exists("/etc/agent-2pc-escape")
    assert not os.path.exists(os.path.join(staged.root, ".agent-tx", "escape"))
    assert staged.tree_hash() == staged.before


def test_the_sandbox_has_a_private_tmp(staged, overlay_tier):
    marker = os.path.join("/tmp", f"a2pc-sandbox-{os.getpid()}-{os.urandom(3).hex()}")
    with open(marker + ".host", "w") as f:
        f.write("host")
    try:
        with staged.view(overlay_tier) as view:
            res = view.run(f"test -e {marker}.host && echo sees-host; echo x > {marker}; "
                           f"cat {marker}", timeout_s=30, sandbox=True)
            assert res.exit_code == 0 and res.tail == "x\n", res.tail
        assert not os.path.exists(marker)
    finally:
        os.unlink(marker + ".host")


def test_the_sandbox_has_no_privileges_and_sees_only_its_own_processes(staged, tier):
    with staged.view(tier) as view:
        res = view.run("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; "
                       "mount -t tmpfs x /mnt 2>/dev/null; echo mount=$?; "
                       "ls /proc | grep -c '^[0-9]'; ls /dev | tr '\\n' ' '", timeout_s=30,
                       sandbox=True)
        lines = res.tail.splitlines()
        assert lines[0].split() == ["CapEff:", "0000000000000000"]
        assert lines[1].split() == ["NoNewPrivs:", "1"]
        assert lines[2] != "mount=0"
        assert int(lines[3]) <= 8  # bwrap's two, the shell, ls, grep
        devices = set(lines[4].split())
        assert {"null", "zero", "urandom"} <= devices
        assert not {"vda", "sda", "nvme0n1", "kmsg", "mem"} & devices
        # the run's status file never reaches the command
        res = view.run("readlink /proc/$$/fd/3 || echo closed; echo $TMPDIR", timeout_s=30,
                       sandbox=True)
        assert res.tail.splitlines()[-2:] == ["closed", "/tmp"], res.tail


@pytest.fixture
def listener():
    """A TCP server on 127.0.0.1 of the host's network namespace that says hello."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"hello")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(5)
    srv.close()


def test_the_sandbox_has_no_network_unless_asked(staged, overlay_tier, listener):
    with staged.view(overlay_tier) as view:
        res = view.run([SANDBOX_PYTHON, "-c", CONNECT, str(listener)], timeout_s=30, sandbox=True)
        assert res.tail.split() == ["refused", "ConnectionRefusedError"], res.tail
        assert res.sandbox["network"] is False
        res = view.run([SANDBOX_PYTHON, "-c", CONNECT, str(listener)], timeout_s=30, sandbox=True,
                       network=True)
        assert res.tail.split() == ["got", "hello"], res.tail
        assert res.sandbox["network"] is True and "net" not in res.sandbox["namespaces"]
        # and without the sandbox the network is the host's (the sandbox made the difference)
        res = view.run([PYTHON, "-c", CONNECT, str(listener)], timeout_s=30)
        assert res.tail.split() == ["got", "hello"] and res.sandbox is None


def test_network_without_the_sandbox_is_a_usage_error(staged):
    with staged.view("copy") as view:
        with pytest.raises(UsageError):
            view.run("true", network=True)


def test_no_sandbox_here_means_nothing_runs(staged, tier, monkeypatch, shared_tmp):
    monkeypatch.setattr(_sandbox, "_probe", (None, None, "simulated: bwrap is not installed"))
    marker = os.path.join(shared_tmp, "ran")
    with staged.view(tier) as view:
        with pytest.raises(IsolationUnavailable) as err:
            view.run(f"touch {marker}", timeout_s=30, sandbox=True)
        assert err.value.code == "isolation_unavailable"
        assert "simulated: bwrap is not installed" in err.value.message
        assert view.capture().changes == []
    assert not os.path.exists(marker)


def test_a_sandbox_that_fails_to_start_runs_nothing(staged, tier, monkeypatch, shared_tmp):
    fake = os.path.join(shared_tmp, "bwrap")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\necho \"bwrap: Creating new namespace failed: simulated\" >&2\n"
                "exit 1\n")
    os.chmod(fake, 0o755)
    monkeypatch.setattr(_sandbox, "_probe", (fake, "0.0", None))
    marker = os.path.join(shared_tmp, "ran")
    with staged.view(tier) as view:
        with pytest.raises(IsolationUnavailable) as err:
            view.run(f"touch {marker}; touch in-view", timeout_s=30, sandbox=True)
        assert "Creating new namespace failed: simulated" in err.value.message
        assert view.capture().changes == []
        assert view.run("echo usable", timeout_s=30).tail == "usable\n"
    assert not os.path.exists(marker)


def test_a_sandboxed_timeout_kills_every_process(staged, tier):
    m = f"{os.getpid() % 1000}{os.urandom(2).hex()}"
    m = str(int(m, 16) % 900000 + 100000) + ".25"
    with staged.view(tier) as view:
        res = view.run(f"sleep {m} & (setsid sleep {m} &); sleep {m}", timeout_s=0.5,
                       sandbox=True)
        assert res.timed_out and res.tripped == "timeout_ms" and res.survivors == 0
    assert pids_matching(f"sleep {m}") == []
    with open("/proc/self/mountinfo") as f:
        assert staged.root not in f.read()


def test_a_missing_command_in_the_sandbox_is_exit_127_not_a_sandbox_failure(staged, tier):
    with staged.view(tier) as view:
        res = view.run(["a2pc-no-such-command"], timeout_s=30, sandbox=True)
        assert res.exit_code == 127 and res.sandbox is not None and not res.passed
        res = view.run("a2pc-no-such-command", timeout_s=30, sandbox=True)
        assert res.exit_code == 127 and "not found" in res.tail
