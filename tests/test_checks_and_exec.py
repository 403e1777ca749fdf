"""Verification in the staged view: checks bound to the exact staged content, and exec that
stages what a command changed. The real tree is byte-for-byte unchanged throughout."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crashkit import snapshot

from agent_2pc import Agent2PC, TransactionAborted
from agent_2pc.errors import CheckFailed

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "test_calc.py").write_text(
        "from calc import add\nassert add(2, 3) == 5, 'add is broken'\nprint('ok')\n")
    (root / "old.txt").write_text("to delete\n")
    Agent2PC.init(root)
    return root


def cli(root: Path, *args: str, stdin: str | None = None) -> tuple[int, dict, str]:
    # --json goes first: after "--", everything belongs to the command being run.
    proc = subprocess.run([sys.executable, "-m", "agent_2pc", "--json", "--root", str(root),
                           *args], input=stdin, capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


CHECK = "python3 test_calc.py"


def test_a_failing_check_keeps_the_transaction_active_and_aborts_the_commit(repo):
    before = snapshot(repo)
    tx = Agent2PC(repo).begin()
    tx.stage_replace("calc.py", "a + b", "a - b")
    with pytest.raises(CheckFailed) as info:
        tx.stage_cmd(CHECK)
    assert info.value.code == "verification_failed"
    assert info.value.details["result"]["exit_code"] == 1
    assert "add is broken" in Path(info.value.details["result"]["log"]).read_text()
    assert tx.state() == "active" and snapshot(repo) == before
    with pytest.raises(TransactionAborted) as aborted:
        tx.commit()
    assert aborted.value.code == "verification_failed"
    assert snapshot(repo) == before


def test_a_fixed_change_passes_the_check_again_and_commits(repo):
    tx = Agent2PC(repo).begin()
    tx.stage_replace("calc.py", "a + b", "a - b")
    with pytest.raises(CheckFailed):
        tx.stage_cmd(CHECK)
    tx.stage_replace("calc.py", "a - b", "b + a")
    assert tx.stage_cmd(CHECK)["passed"]
    assert tx.commit()["state"] == "committed"
    assert "b + a" in (repo / "calc.py").read_text()


def test_a_check_runs_again_at_commit_when_the_staged_content_changed(repo, tmp_path):
    runs = tmp_path / "runs.log"  # outside the repo: not captured, a plain probe
    check = f"echo run >> {runs}; python3 test_calc.py"
    tx = Agent2PC(repo).begin()
    tx.stage_write("notes.txt", "one\n")
    tx.stage_cmd(check)
    assert runs.read_text().count("run") == 1
    tx.stage_replace("calc.py", "a + b", "a * b")  # breaks add(2, 3) == 5
    with pytest.raises(TransactionAborted) as info:
        tx.commit()
    assert info.value.code == "verification_failed"
    assert runs.read_text().count("run") == 2
    assert "a + b" in (repo / "calc.py").read_text() and not (repo / "notes.txt").exists()


def test_an_unchanged_check_is_not_run_again_at_commit(repo, tmp_path):
    runs = tmp_path / "runs.log"
    tx = Agent2PC(repo).begin()
    tx.stage_write("notes.txt", "one\n")
    tx.stage_cmd(f"echo run >> {runs}; {CHECK}")
    tx.commit()
    assert runs.read_text().count("run") == 1


def test_the_check_sees_the_staged_view_and_the_tree_never_changes(repo):
    before = snapshot(repo)
    tx = Agent2PC(repo).begin()
    tx.stage_write("calc.py", "def add(a, b):\n    return 5\n")
    tx.stage_delete("old.txt")
    out = tx.stage_cmd("grep -q 'return 5' calc.py && test ! -e old.txt && touch junk.txt")
    assert out["passed"] and out["isolation"] in ("overlay", "fuse-overlayfs", "copy")
    assert snapshot(repo) == before  # junk.txt was thrown away, nothing else moved
    assert [f["path"] for f in tx.status()["files"]] == ["calc.py", "old.txt"]


def test_promoted_outputs_of_a_check_become_staged_writes(repo):
    tx = Agent2PC(repo).begin()
    out = tx.stage_cmd("echo locked > deps.lock; echo scratch > build.tmp", promote=["*.lock"])
    assert out["promoted"] == ["deps.lock"]
    assert [f["path"] for f in tx.status()["files"]] == ["deps.lock"]
    tx.commit()
    assert (repo / "deps.lock").read_text() == "locked\n" and not (repo / "build.tmp").exists()


def test_a_check_that_hangs_is_killed_and_reported_as_a_timeout(repo):
    tx = Agent2PC(repo).begin()
    t0 = time.monotonic()
    with pytest.raises(CheckFailed) as info:
        tx.stage_cmd("sleep 30", timeout_ms=500)
    assert info.value.code == "timeout" and time.monotonic() - t0 < 10
    assert info.value.details["result"]["timed_out"] is True


def test_exec_stages_what_the_command_created_modified_and_deleted(repo):
    before = snapshot(repo)
    tx = Agent2PC(repo).begin()
    out = tx.exec(["sh", "-c", "echo new > made.txt && sed -i s/a+b/x/ calc.py && "
                   "echo 'def add(a, b): return 0' > calc.py && rm old.txt && "
                   "mkdir -p pkg && echo 1 > pkg/m.py && chmod 755 pkg/m.py"])
    assert snapshot(repo) == before
    captured = {c["path"]: c["op"] for c in out["captured"]}
    assert captured == {"made.txt": "write", "calc.py": "write", "old.txt": "delete",
                        "pkg/m.py": "write"}
    tx.commit()
    assert (repo / "made.txt").read_text() == "new\n"
    assert not (repo / "old.txt").exists()
    assert os.stat(repo / "pkg" / "m.py").st_mode & 0o777 == 0o755


def test_a_failing_exec_stages_nothing_and_keeps_the_transaction(repo):
    tx = Agent2PC(repo).begin()
    with pytest.raises(CheckFailed) as info:
        tx.exec(["sh", "-c", "echo partial > made.txt; exit 3"])
    assert info.value.code == "command_failed"
    assert tx.status()["files"] == [] and tx.state() == "active"


def test_keep_on_failure_stages_what_a_failing_command_changed(repo):
    _, begun, _ = cli(repo, "begin")
    status, out, _ = cli(repo, "exec", "--tid", begun["tid"], "--keep-on-failure", "--", "sh",
                         "-c", "echo partial > made.txt; rm old.txt; exit 3")
    assert status == 1 and out["error"]["code"] == "command_failed" and out["exit_code"] == 3
    assert out["captured"] == [{"path": "old.txt", "op": "delete"},
                               {"path": "made.txt", "op": "write", "mode": 0o644, "bytes": 8}]
    status, shown, _ = cli(repo, "status", "--tid", begun["tid"])
    assert {f["path"] for f in shown["transactions"][0]["files"]} == {"made.txt", "old.txt"}
    assert (repo / "old.txt").exists() and not (repo / "made.txt").exists()


def test_a_failing_exec_off_a_terminal_keeps_nothing_aside(repo):
    _, begun, _ = cli(repo, "begin")
    status, out, _ = cli(repo, "exec", "--tid", begun["tid"], "--", "sh", "-c",
                         "echo partial > made.txt; exit 3")
    assert status == 1 and out["captured"] == [] and "kept" not in out
    status, out, _ = cli(repo, "stage-kept", "--tid", begun["tid"])
    assert status == 2 and out["error"]["code"] == "not_found"


def _on_a_terminal(argv: list[str], script: list[bytes], until: bytes) -> bytes:
    """Run ``argv`` on a pty, typing each line of ``script`` in turn; return the transcript
    once ``until`` shows."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(argv[0], argv)
    transcript = b""
    end = time.monotonic() + 60
    for line in script:
        os.write(fd, line)
        time.sleep(0.3)
    while until not in transcript and time.monotonic() < end:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                transcript += os.read(fd, 4096)
            except OSError:
                break
    os.waitpid(pid, 0)
    os.close(fd)
    assert until in transcript, transcript
    return transcript


def test_stage_kept_refuses_a_path_staged_again_since_the_session(repo):
    tx = Agent2PC(repo).begin()
    _on_a_terminal([sys.executable, "-m", "agent_2pc", "--root", str(repo), "exec", "--tid",
                    tx.tid, "--", "sh", "-i"],
                   [b"echo session > kept.txt; echo other > other.txt; exit 3\n"],
                   b"[command_failed]")
    assert tx.status()["files"] == []
    tx.stage_write("kept.txt", "staged since\n")
    status, out, _ = cli(repo, "stage-kept", "--tid", tx.tid)
    assert status == 2 and out["error"]["code"] == "bad_state" and "kept.txt" in \
        out["error"]["message"]
    assert [f["path"] for f in tx.status()["files"]] == ["kept.txt"]
    assert tx.read("kept.txt") == b"staged since\n"
    kept = repo / ".agent-tx" / "tx" / tx.tid / "kept" / "files"  # still there, by hand
    assert sorted(p.read_bytes() for p in kept.iterdir()) == [b"other\n", b"session\n"]


def test_exec_json_keeps_stdout_for_the_json_alone(repo):
    _, begun, _ = cli(repo, "begin")
    status, out, err = cli(repo, "exec", "--tid", begun["tid"], "--", "sh", "-c",
                           "echo chatter; echo x > f.txt")
    assert status == 0 and out["ok"] and out["captured"] == [
        {"path": "f.txt", "op": "write", "mode": 0o644, "bytes": 2}]
    assert "chatter" in err


def test_a_long_running_shell_session_is_captured_through_a_pty(repo):
    tid = Agent2PC(repo).begin().tid
    pid, fd = pty.fork()
    if pid == 0:  # the child: agent-2pc exec -- sh, on a terminal
        # bash here; tests/isolation/test_terminal_sessions.py drives dash, zsh and others.
        os.execv(sys.executable, [sys.executable, "-m", "agent_2pc", "--root", str(repo),
                                  "exec", "--tid", tid, "--", "bash", "--norc", "-i"])
    transcript = b""

    def until(token: bytes, deadline_s: float = 30) -> None:
        nonlocal transcript
        end = time.monotonic() + deadline_s
        while token not in transcript:
            assert time.monotonic() < end, transcript
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    transcript += os.read(fd, 4096)
                except OSError:  # the child is gone
                    break
        assert token in transcript, transcript

    os.write(fd, b"test -t 0 && echo IS-A-$((1+1))-TTY\n")  # differs from its own echo
    until(b"IS-A-2-TTY")
    os.write(fd, b"echo typed > session.txt; rm old.txt; exit\n")
    until(b"staged 2 changes")
    os.waitpid(pid, 0)
    os.close(fd)
    status = Agent2PC(repo).get(tid).status()
    assert {f["path"]: f["op"] for f in status["files"]} == {"session.txt": "write",
                                                             "old.txt": "delete"}
    assert (repo / "old.txt").exists()  # nothing reached the tree yet


def test_a_batch_whose_test_fails_never_writes_its_file(repo):
    before = snapshot(repo)
    manifest = {"steps": [
        {"type": "fs_write", "path": "calc.py", "content": "def add(a, b):\n    return 0\n"},
        {"type": "command", "command": CHECK}]}
    status, out, _ = cli(repo, "run-batch", "--file", "-", stdin=json.dumps(manifest))
    assert status == 1 and out["error"]["code"] == "verification_failed"
    assert out["state"] == "aborted" and snapshot(repo) == before
    manifest["steps"][0]["content"] = "def add(a, b):\n    return b + a\n"
    status, out, _ = cli(repo, "run-batch", "--file", "-", stdin=json.dumps(manifest))
    assert status == 0 and out["state"] == "committed"


def test_stage_vm_says_what_the_host_lacks(repo):
    _, begun, _ = cli(repo, "begin")
    status, out, _ = cli(repo, "stage-vm", "--tid", begun["tid"])
    assert status == 2 and out["error"]["code"] == "isolation_unavailable"
    assert "VM monitor" in out["error"]["message"] or "KVM" in out["error"]["message"]


def test_no_view_scratch_outlives_a_run(repo):
    tx = Agent2PC(repo).begin()
    tx.stage_cmd("true")
    tx.exec(["true"])
    scratch = repo / ".agent-tx" / "tx" / tx.tid
    leftovers = [p.name for p in scratch.iterdir() if p.name != "logs"]
    assert leftovers == []
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(repo) not in mounts


WASM_WRITER = """(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "out.txt")
  (data (i32.const 200) "written by wasm\\n")
  (func (export "_start")
    (drop (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 7) (i32.const 9)
                      (i64.const 0x1FFFFFFF) (i64.const 0x1FFFFFFF) (i32.const 0) (i32.const 300)))
    (i32.store (i32.const 400) (i32.const 200))
    (i32.store (i32.const 404) (i32.const 16))
    (drop (call $write (i32.load (i32.const 300)) (i32.const 400) (i32.const 1) (i32.const 500)))))
"""
WASM_LOOP = """(module (memory (export "memory") 1)
  (func (export "_start") (loop $l (br $l))))"""


def _wasm(tmp_path: Path, wat: str) -> str:
    import wasmtime

    path = tmp_path / "m.wasm"
    path.write_bytes(wasmtime.wat2wasm(wat))
    return str(path)


def test_stage_wasm_stages_what_the_module_wrote(repo, tmp_path):
    module = _wasm(tmp_path, WASM_WRITER)
    _, begun, _ = cli(repo, "begin")
    status, out, _ = cli(repo, "stage-wasm", "--tid", begun["tid"], "--module", module,
                         "--fuel", "100000")
    assert status == 0 and [c["path"] for c in out["captured"]] == ["out.txt"]
    assert not (repo / "out.txt").exists()
    cli(repo, "commit", "--tid", begun["tid"])
    assert (repo / "out.txt").read_text() == "written by wasm\n"


def test_a_wasm_module_that_runs_out_of_fuel_trips_and_stages_nothing(repo, tmp_path):
    module = _wasm(tmp_path, WASM_LOOP)
    _, begun, _ = cli(repo, "begin")
    status, out, _ = cli(repo, "stage-wasm", "--tid", begun["tid"], "--module", module,
                         "--fuel", "10000")
    assert status == 1 and out["error"]["code"] == "limit_exceeded"
    assert out["tripped"] == "fuel" and out["captured"] == []


def test_a_sandboxed_check_has_no_network_unless_asked(repo):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    probe = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), "
             "timeout=2)\"")
    try:
        _, begun, _ = cli(repo, "begin")
        status, out, _ = cli(repo, "stage-cmd", "--tid", begun["tid"], "--command", probe,
                             "--sandbox")
        assert status == 1 and out["error"]["code"] == "verification_failed"
        assert out["sandbox"]["network"] is False and out["sandbox"]["readonly_host"] is True
        status, out, _ = cli(repo, "stage-cmd", "--tid", begun["tid"], "--command", probe,
                             "--sandbox", "--network")
        assert status == 0 and out["passed"]
    finally:
        listener.close()


def test_exec_takes_the_sandbox_of_stage_cmd(repo):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    probe = (f"echo made > made.txt; touch /etc/agent2pc-probe 2>/dev/null && echo HOST-W; "
             f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), "
             "timeout=2)\" 2>/dev/null && echo NET-$((1+1)); true")
    try:
        _, begun, _ = cli(repo, "begin")
        status, out, err = cli(repo, "exec", "--tid", begun["tid"], "--sandbox", "--", "sh",
                               "-c", probe)
        assert status == 0 and [c["path"] for c in out["captured"]] == ["made.txt"]
        assert out["sandbox"]["network"] is False and out["sandbox"]["readonly_host"] is True
        assert "HOST-W" not in err and "NET-2" not in err
        status, out, err = cli(repo, "exec", "--tid", begun["tid"], "--sandbox", "--network",
                               "--", "sh", "-c", probe)
        assert status == 0 and out["sandbox"]["network"] is True and "NET-2" in err
        status, out, _ = cli(repo, "exec", "--tid", begun["tid"], "--network", "--", "true")
        assert status == 2 and out["error"]["code"] == "usage"
    finally:
        listener.close()
    assert not os.path.exists("/etc/agent2pc-probe")


def test_a_fork_bomb_trips_max_procs_and_the_tree_is_untouched(repo):
    before = snapshot(repo)
    _, begun, _ = cli(repo, "begin")
    bomb = "bomb() { bomb | bomb & }; bomb; sleep 20"
    status, out, _ = cli(repo, "stage-governed", "--tid", begun["tid"], "--command", bomb,
                         "--max-procs", "40", "--max-runtime-ms", "15000")
    assert status == 1 and out["error"]["code"] == "limit_exceeded"
    assert out["tripped"] == "max_procs" and snapshot(repo) == before


def test_a_memory_hog_trips_max_memory_mb(repo):
    _, begun, _ = cli(repo, "begin")
    hog = "python3 -c \"x = bytearray(400 * 1024 * 1024); import time; time.sleep(5)\""
    status, out, _ = cli(repo, "stage-governed", "--tid", begun["tid"], "--command", hog,
                         "--max-memory-mb", "100")
    assert status == 1 and out["error"]["code"] == "limit_exceeded"
    assert out["tripped"] == "max_memory_mb"


def test_a_plain_timeout_is_reported_as_tripped_timeout(repo):
    _, begun, _ = cli(repo, "begin")
    status, out, _ = cli(repo, "stage-cmd", "--tid", begun["tid"], "--command", "sleep 30",
                         "--timeout-ms", "300")
    assert status == 1 and out["error"]["code"] == "timeout" and out["tripped"] == "timeout_ms"


def test_ignore_rules_keep_build_output_out_of_the_capture(repo, monkeypatch):
    (repo / ".agent-tx" / "ignore").write_text("# build output\nbuild\n")
    monkeypatch.setenv("AGENT2PC_IGNORE", "*.log")
    tx = Agent2PC(repo).begin()
    out = tx.exec(["sh", "-c", "mkdir -p build && echo o > build/a.o && echo l > run.log && "
                   "mkdir -p __pycache__ && echo c > __pycache__/x.pyc && echo k > kept.txt"])
    assert [c["path"] for c in out["captured"]] == ["kept.txt"]


def test_deleting_a_symlink_in_exec_stages_the_links_deletion_never_its_target(repo):
    (repo / "real.txt").write_text("precious\n")
    os.symlink("real.txt", repo / "link.txt")
    os.mkdir(repo / "realdir")
    (repo / "realdir" / "f.txt").write_text("inner\n")
    os.symlink("realdir", repo / "dirlink")
    tx = Agent2PC(repo).begin()
    out = tx.exec(["sh", "-c", "rm link.txt && rm dirlink && echo x > other.txt"])
    assert [(c["path"], c["op"]) for c in out["captured"]] == [
        ("dirlink", "delete"), ("link.txt", "delete"), ("other.txt", "write")]
    assert out["skipped"] == []
    tx.commit()
    assert not os.path.lexists(repo / "link.txt") and not os.path.lexists(repo / "dirlink")
    assert (repo / "real.txt").read_text() == "precious\n"
    assert (repo / "realdir" / "f.txt").read_text() == "inner\n"
