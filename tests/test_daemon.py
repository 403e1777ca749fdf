"""The daemon (docs/daemon.md): one per workspace, the same answers as in-process, peers checked,
a dead daemon's work recovered, and the TTL reaper."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from typing import Any

import pytest
from conftest import parse_one_object, run_cli, write
from daemonkit import DaemonProc, wait_for

from agent_2pc import Agent2PC
from agent_2pc.daemon import protocol
from agent_2pc.errors import DaemonUnavailable, TransactionAborted, UnknownTid, UsageError

TID = re.compile(r"tx-\d{8}-\d{6}-[0-9a-f]{6}")


def cli(root: str, *args: Any, input: str | None = None, env: dict[str, str] | None = None
        ) -> tuple[int, dict[str, Any]]:
    proc = run_cli(args, input=input, json_out=True, root=root, env=env)
    return proc.returncode, parse_one_object(proc)


def _script(root: str) -> list[tuple[int, dict[str, Any]]]:
    """Every kind of step, good and bad, through the CLI; the answers with ids masked."""
    write(root, "src/app.py", "x = 1\n")
    write(root, "old.txt", "old\n")
    out = []

    def step(*args: Any, input: str | None = None) -> str | None:
        status, obj = cli(root, *args, input=input)
        text = TID.sub("TID", json.dumps(obj, sort_keys=True)).replace(root, "ROOT")
        out.append((status, json.loads(text)))
        return obj.get("tid")

    tid = step("begin", "--label", "same")
    assert tid
    step("record-read", "--tid", tid, "--path", "src/app.py")
    step("stage-write", "--tid", tid, "--path", "new/a.txt", "--content", "hello\n")
    step("stage-write", "--tid", tid, "--path", "bin.dat", "--stdin", input="from stdin\n")
    step("stage-replace", "--tid", tid, "--path", "src/app.py", "--old", "x = 1", "--new",
         "x = 2")
    step("stage-replace", "--tid", tid, "--path", "src/app.py", "--old", "absent", "--new", "y")
    step("stage-delete", "--tid", tid, "--path", "old.txt")
    step("stage-write", "--tid", tid, "--path", "../escape.txt", "--content", "no")
    step("savepoint", "--tid", tid, "--name", "sp")
    step("stage-write", "--tid", tid, "--path", "later.txt", "--content", "later\n")
    step("rollback-to", "--tid", tid, "--name", "sp")
    step("rollback-to", "--tid", tid, "--name", "nope")
    step("diff", "--tid", tid, "--stat")
    step("status", "--tid", tid)
    step("commit", "--tid", tid)
    step("commit", "--tid", tid)
    step("stage-write", "--tid", tid, "--path", "x", "--content", "y")
    step("commit", "--tid", "tx-20260101-000000-abcdef")
    step("commit", "--tid", "not-a-tid")
    # a conflict: the file read changes before commit
    t2 = step("begin")
    step("record-read", "--tid", t2, "--path", "src/app.py")
    step("stage-write", "--tid", t2, "--path", "c.txt", "--content", "c\n")
    write(root, "src/app.py", "x = 3\n")
    step("commit", "--tid", t2)
    t3 = step("begin", "--timeout-ms", "-1")
    assert t3 is None
    t3 = step("begin")
    step("abort", "--tid", t3, "--reason", "changed my mind")
    step("abort", "--tid", t3)
    step("list")
    return out


def test_cli_answers_the_same_with_and_without_a_daemon(tmp_path: Any) -> None:
    a, b = str(tmp_path / "direct"), str(tmp_path / "daemon")
    for r in (a, b):
        os.makedirs(r)
        Agent2PC.init(r).close()
    direct = _script(a)
    with DaemonProc(b):
        through = _script(b)
        status, st = cli(b, "daemon", "status")
        assert status == 0 and st["running"] and st["requests"] >= len(through)
    assert [s for s, _ in direct] == [s for s, _ in through]
    for (_, x), (_, y) in zip(direct, through, strict=True):
        for obj in (x, y):  # timestamps differ; everything else must not
            for row in obj.get("transactions", []):
                row.pop("created_at", None)
                for k in ("age_s", "expires_at", "ended_at", "updated_at"):
                    row.pop(k, None)
        assert x == y
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))


def test_library_goes_through_the_daemon_and_in_process_once_it_stops(root: str) -> None:
    with DaemonProc(root) as d:
        client = Agent2PC(root)
        assert client.via_daemon
        assert not Agent2PC(root, daemon=False).via_daemon
        tx = client.begin(label="lib")
        tx.stage_write("f.txt", b"\x00\xffbinary")
        assert tx.read("f.txt") == b"\x00\xffbinary"
        assert tx.read("absent.txt") is None
        assert tx.commit()["state"] == "committed"
        with pytest.raises(TransactionAborted):
            t = client.begin()
            t.record_read("f.txt")
            t.stage_write("g.txt", "g")
            write(root, "f.txt", "changed")
            t.commit()
        requests = json.loads(subprocess.run(
            [sys.executable, "-m", "agent_2pc", "--root", root, "daemon", "status", "--json"],
            capture_output=True, check=True).stdout)["requests"]
        assert requests >= 6
        d.stop()
    tx = client.begin()  # the daemon is gone: the same client goes on in-process
    tx.stage_write("h.txt", "h")
    assert tx.commit()["state"] == "committed"
    with open(os.path.join(root, "h.txt")) as f:
        assert f.read() == "h"
    client.close()


def test_no_daemon_flag_and_env_bypass_it(root: str) -> None:
    with DaemonProc(root):
        status, out = cli(root, "--no-daemon", "begin")
        assert status == 0
        status, st = cli(root, "daemon", "status")
        assert st["requests"] == 1  # the status request itself only
        status, out = cli(root, "begin", env={"AGENT2PC_NO_DAEMON": "1"})
        assert status == 0
        assert cli(root, "daemon", "status")[1]["requests"] == 2


def test_second_daemon_is_refused_and_stale_socket_replaced(root: str) -> None:
    status, out = cli(root, "daemon", "start")
    assert status == 0, out
    pid = out["pid"]
    try:
        sock = out["socket"]
        assert sock == os.path.join(root, ".agent-tx", "daemon.sock")
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        status, again = cli(root, "daemon", "start")
        assert status == 1 and again["error"]["code"] == "busy"
        assert again["error"]["pid"] == pid
        os.kill(pid, 9)
        wait_for(lambda: _dead(pid), what="the daemon's death")
        assert os.path.exists(sock)  # stale: nobody listens
        status, st = cli(root, "daemon", "status")
        assert status == 0 and st["running"] is False and st["pid"] is None
        status, out2 = cli(root, "begin")  # in-process: the stale socket is no daemon
        assert status == 0
        status, started = cli(root, "daemon", "start")
        assert status == 0 and started["pid"] != pid
        pid = started["pid"]
        assert cli(root, "daemon", "status")[1]["running"] is True
    finally:
        status, stopped = cli(root, "daemon", "stop")
    assert status == 0 and stopped == {"ok": True, "stopped": True, "pid": pid}
    assert not os.path.exists(os.path.join(root, ".agent-tx", "daemon.sock"))
    assert cli(root, "daemon", "stop") == (0, {"ok": True, "stopped": False, "pid": None})


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_a_peer_of_another_user_is_refused(root: str) -> None:
    with DaemonProc(root):
        import tempfile

        open_dir = tempfile.mkdtemp(dir="/tmp")
        os.chmod(open_dir, 0o755)
        path = os.path.join(open_dir, "s")
        os.link(protocol.socket_path(root), path)  # reachable by another user ...
        os.chmod(path, 0o666)  # ... past the file mode: SO_PEERCRED still says no
        code = (
            "import os, socket, sys\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
            "print(s.makefile('rb').readline().decode())\n")
        out = subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        answer = json.loads(out.stdout)
        assert answer["error"]["data"]["code"] == "daemon_unavailable"
        assert "uid 65534" in answer["error"]["message"]


def test_protocol_errors_carry_json_rpc_and_contract_codes(root: str) -> None:
    with DaemonProc(root):
        raw = protocol.connect(root)
        assert raw is not None
        sock = socket.socket(fileno=raw.detach())
        f = sock.makefile("rwb")

        def ask(raw: bytes) -> dict[str, Any]:
            f.write(raw + b"\n")
            f.flush()
            return json.loads(f.readline())  # type: ignore[no-any-return]

        hello = ask(b'{"jsonrpc":"2.0","id":1,"method":"hello"}')["result"]
        assert hello["protocol"] == protocol.PROTOCOL_VERSION and "stage_write" in hello[
            "methods"]
        assert ask(b"not json")["error"]["code"] == protocol.PARSE_ERROR
        assert ask(b"[1]")["error"]["code"] == protocol.INVALID_REQUEST
        assert ask(b'{"jsonrpc":"2.0","id":2,"method":"nope"}')["error"]["code"] == (
            protocol.METHOD_NOT_FOUND)
        bad = ask(b'{"jsonrpc":"2.0","id":3,"method":"begin","params":{"timeout_ms":"x"}}')
        assert bad["id"] == 3 and bad["error"]["data"]["code"] == "usage"
        assert bad["error"]["data"]["exit_status"] == 2
        unknown = ask(b'{"jsonrpc":"2.0","id":4,"method":"commit","params":'
                      b'{"tid":"tx-20260101-000000-abcdef"}}')
        assert unknown["error"]["data"]["code"] == "unknown_tid"
        tid = ask(b'{"jsonrpc":"2.0","id":5,"method":"begin","params":{}}')["result"]["tid"]
        staged = ask(json.dumps({"jsonrpc": "2.0", "id": 6, "method": "stage_write", "params": {
            "tid": tid, "path": "t.txt", "content": "text"}}).encode())
        assert staged["result"]["bytes"] == 4
        done = ask(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "commit",
                               "params": {"tid": tid}}).encode())
        assert done["result"]["state"] == "committed"
        f.close()
        sock.close()


def test_daemon_killed_mid_commit_gives_daemon_unavailable_and_next_call_recovers(
        root: str) -> None:
    with DaemonProc(root, {"AGENT2PC_CRASH_AT": "commit.after_decision"}) as d:
        status, out = cli(root, "begin")
        tid = out["tid"]
        cli(root, "stage-write", "--tid", tid, "--path", "a.txt", "--content", "A")
        status, out = cli(root, "commit", "--tid", tid)
        assert status == 2 and out["error"]["code"] == "daemon_unavailable", out
        assert d.wait_dead() == 137
    status, out = cli(root, "status", "--tid", tid)  # in-process: the decision rolls forward
    assert status == 0 and out["transactions"][0]["state"] == "committed", out
    with open(os.path.join(root, "a.txt")) as f:
        assert f.read() == "A"
    with DaemonProc(root):  # and a restarted daemon serves on
        client = Agent2PC(root)
        assert client.via_daemon and client.begin().commit()["state"] == "committed"
        client.close()


def test_library_raises_daemon_unavailable_when_the_daemon_dies_mid_request(root: str
                                                                           ) -> None:
    with DaemonProc(root, {"AGENT2PC_CRASH_AT": "commit.after_decision"}) as d:
        client = Agent2PC(root)
        tx = client.begin()
        tx.stage_write("b.txt", "B")
        with pytest.raises(DaemonUnavailable) as info:
            tx.commit()
        assert info.value.code == "daemon_unavailable" and info.value.exit_status == 2
        d.wait_dead()
    assert tx.state() == "committed"  # the next call, in-process, rolled it forward
    client.close()


def test_reaper_aborts_expired_transactions_without_a_client_call(root: str) -> None:
    with DaemonProc(root, None, "--reap-interval-ms", "50"):
        client = Agent2PC(root)
        tx = client.begin(timeout_ms=200)
        tx.stage_write("late.txt", "never")
        keep = client.begin()  # no timeout reached: left alone
        keep.stage_write("kept.txt", "k")
        time.sleep(0.6)
        direct = Agent2PC(root, daemon=False)
        rows = {r["tid"]: r for r in direct.transactions()}
        assert rows[tx.tid]["state"] == "aborted"
        assert rows[keep.tid]["state"] == "active"
        status, st = cli(root, "daemon", "status")
        assert st["reaper"]["reaped"] == 1 and st["transactions"].get("active") == 1
        assert not os.path.exists(os.path.join(root, "late.txt"))
        direct.close()
        client.close()


@pytest.mark.parametrize("with_daemon", [True, False])
def test_daemon_reap_runs_the_reaper_once(root: str, with_daemon: bool) -> None:
    client = Agent2PC(root, daemon=False)
    tx = client.begin(timeout_ms=1)
    time.sleep(0.05)
    if with_daemon:
        with DaemonProc(root, None, "--reap-interval-ms", "0"):
            status, out = cli(root, "daemon", "reap")
    else:
        status, out = cli(root, "daemon", "reap")
    assert status == 0 and out["reaped"] == [tx.tid] and out["daemon"] is with_daemon
    assert client.transactions(state="aborted")[0]["tid"] == tx.tid
    assert cli(root, "daemon", "reap")[1]["reaped"] == []
    client.close()


def test_daemon_status_without_daemon_has_the_contract_shape(root: str) -> None:
    status, out = cli(root, "daemon", "status")
    assert status == 0
    assert out == {"ok": True, "running": False, "pid": None, "socket": None, "uptime_s": None,
                   "clients": 0, "requests": 0, "commits": 0, "fsyncs": 0}


def test_socket_path_too_long_for_sun_path_still_works(tmp_path: Any) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    root = str(deep)
    Agent2PC.init(root).close()
    assert len(protocol.socket_path(root)) > 108
    with DaemonProc(root):
        client = Agent2PC(root)
        assert client.via_daemon
        assert client.begin().commit()["state"] == "committed"
        client.close()


def test_many_clients_at_once_all_commit(root: str) -> None:
    import threading

    errors: list[BaseException] = []
    with DaemonProc(root):
        def agent(i: int) -> None:
            try:
                c = Agent2PC(root)
                for n in range(5):
                    tx = c.begin()
                    tx.stage_write(f"f{i}.txt", f"{i}-{n}\n")
                    assert tx.commit()["state"] == "committed"
                c.close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        st = cli(root, "daemon", "status")[1]
    assert not errors, errors
    for i in range(8):
        with open(os.path.join(root, f"f{i}.txt")) as f:
            assert f.read() == f"{i}-4\n"
    assert st["commits"] == 40 and st["fsyncs"] <= 40


def test_socket_is_unix_stream(root: str) -> None:
    with DaemonProc(root):
        sock = protocol.connect(root)
        assert sock is not None and sock.family == socket.AF_UNIX
        sock.close()


def test_steps_that_run_commands_work_beside_the_daemon(root: str, tmp_path: Any) -> None:
    # stage-cmd, exec and stage-write --from-file run in the calling process (its terminal,
    # environment and files); the daemon sees what they staged, and commits it
    src = tmp_path / "src.bin"
    src.write_bytes(b"\x00from a file\xff")
    manifest = json.dumps({"label": "batch", "steps": [{"participant_id": "fs", "intent": {
        "type": "fs_write", "path": "batch.txt", "content": "from a manifest\n"}}]})
    with DaemonProc(root):
        tid = cli(root, "begin")[1]["tid"]
        assert cli(root, "stage-write", "--tid", tid, "--path", "f.bin", "--from-file",
                   str(src))[0] == 0
        status, out = cli(root, "stage-cmd", "--tid", tid, "--command", "test -f f.bin")
        assert status == 0 and out["passed"] is True, out
        proc = run_cli(("exec", "--tid", tid, "--json", "--", "sh", "-c",
                        "echo made > made.txt"), root=root)
        assert proc.returncode == 0, proc.stderr
        status, out = cli(root, "commit", "--tid", tid)
        assert status == 0 and sorted(out["files"]) == ["f.bin", "made.txt"], out
        status, out = cli(root, "run-batch", "--file", "-", input=manifest)
        assert status == 0 and out["state"] == "committed", out
        st = cli(root, "daemon", "status")[1]
    assert st["commits"] == 2
    with open(os.path.join(root, "f.bin"), "rb") as f:
        assert f.read() == b"\x00from a file\xff"
    with open(os.path.join(root, "batch.txt")) as f:
        assert f.read() == "from a manifest\n"


def test_a_big_daemon_log_is_set_aside_at_start_so_it_stays_bounded(root: str) -> None:
    log = os.path.join(root, ".agent-tx", "daemon.log")
    old = b"an old line\n" * (200_000)  # 2.4 MiB, over the 1 MiB bound
    with open(log, "wb") as f:
        f.write(old)
    with open(log + ".1", "wb") as f:
        f.write(b"the one before\n")
    status, _ = cli(root, "daemon", "start")
    try:
        assert status == 0
        with open(log + ".1", "rb") as f:
            assert f.read() == old  # the previous .1 replaced
        assert os.path.getsize(log) < 1 << 20
    finally:
        assert cli(root, "daemon", "stop")[0] == 0


def test_the_daemon_pages_the_list_as_the_library_does(root: str) -> None:
    direct = Agent2PC(root, daemon=False)
    tids = []
    for i in range(3):
        tx = direct.begin(label=f"p{i}")
        tx.commit()
        tids.append(tx.tid)
    with DaemonProc(root):
        client = Agent2PC(root)
        assert client.via_daemon
        assert [r["tid"] for r in client.transactions(limit=2)] == tids[1:]
        assert [r["tid"] for r in client.transactions(limit=2, before=tids[1])] == tids[:1]
        with pytest.raises(UnknownTid):
            client.transactions(before="tx-20000101-000000-abcdef")
        with pytest.raises(UsageError):
            client.transactions(limit=0)
        client.close()
    direct.close()


@pytest.mark.parametrize("how", ["removed", "moved"])
def test_a_daemon_whose_workspace_is_removed_or_moved_stops_by_itself(tmp_path: Any,
                                                                       how: str) -> None:
    """Nobody can reach a daemon whose socket is no longer at its path, and its engine's root
    may be gone: it stops (within a poll of its listener) instead of running on until the
    machine stops (seen: daemons of deleted test workspaces, still waking 6 times a second)."""
    import shutil

    root = tmp_path / "ws"
    root.mkdir()
    Agent2PC.init(root).close()
    daemon = DaemonProc(str(root))
    try:
        assert daemon.proc.poll() is None
        if how == "removed":
            shutil.rmtree(root)
        else:
            root.rename(tmp_path / "elsewhere")
        assert daemon.wait_dead(timeout=10) == 0
        assert daemon.proc.stderr is not None
        assert "its socket is gone" in daemon.proc.stderr.read().decode()
    finally:
        daemon.stop()
