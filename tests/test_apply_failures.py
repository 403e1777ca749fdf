"""A commit whose apply fails after the decision still answers as the contract says, and the
workspace stays usable: the transaction is committed, what the apply could not do is named,
and recover finishes it once the cause is gone.

The commit runs as a real CLI process that stalls right after its decision
(AGENT2PC_STALL_AT=commit.after_decision); the test changes the tree meanwhile.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from typing import Any

import pytest
from conftest import CLI_TIMEOUT, _env, parse_one_object, read, run_cli, write

from agent_2pc import Agent2PC

pytestmark = pytest.mark.timeout(180)
STALL_S = 4.0


def records(wal: str) -> list[dict[str, Any]]:
    with open(wal, "rb") as f:
        data = f.read()
    out, at = [], 0
    while at + 13 <= len(data):
        _, _, size, _ = struct.unpack_from("<4sBII", data, at)
        if at + 13 + size > len(data):
            break
        out.append(json.loads(data[at + 13: at + 13 + size]))
        at += 13 + size
    return out


class StalledCommit:
    """``agent-2pc commit --tid T --json`` stalled just after its decision is durable."""

    def __init__(self, root: str, tid: str) -> None:
        self.root, self.tid = root, tid
        env = _env({"AGENT2PC_STALL_AT": "commit.after_decision",
                    "AGENT2PC_STALL_S": str(STALL_S)})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent_2pc", "--root", root, "commit", "--tid", tid,
             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        wal = os.path.join(root, ".agent-tx", "wal.bin")
        deadline = time.monotonic() + STALL_S
        while not any(r["type"] == "decision" and r["tid"] == tid for r in records(wal)):
            assert time.monotonic() < deadline and self.proc.poll() is None, \
                "the commit did not reach its decision"
            time.sleep(0.01)

    def answer(self) -> tuple[int, dict[str, Any]]:
        out, err = self.proc.communicate(timeout=CLI_TIMEOUT)
        return self.proc.returncode, parse_one_object(
            subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err))


def cli_json(root: str, *args: str) -> tuple[int, dict[str, Any]]:
    proc = run_cli(args, json_out=True, root=root)
    return proc.returncode, parse_one_object(proc)


def test_a_directory_swapped_for_a_link_after_the_decision_is_diverged_not_a_traceback(
        root: str, tmp_path: Any) -> None:
    write(root, "a/keep.txt", "keep\n")
    client = Agent2PC(root)
    tx = client.begin()
    tx.stage_write("a/x.txt", "new\n")
    tx.stage_write("b.txt", "b\n")
    client.engine.close()
    commit = StalledCommit(root, tx.tid)
    elsewhere = str(tmp_path / "elsewhere")
    os.rename(os.path.join(root, "a"), elsewhere)  # the directory goes, a link comes
    os.symlink(elsewhere, os.path.join(root, "a"))
    status, out = commit.answer()
    assert status == 0 and out["state"] == "committed", out
    assert out["diverged"] == ["a/x.txt"] and out["files"] == ["b.txt"], out
    assert not os.path.exists(os.path.join(elsewhere, "x.txt"))  # never through the link
    assert read(root, "b.txt") == b"b\n"
    # The same answer again; the workspace goes on.
    assert cli_json(root, "commit", "--tid", tx.tid) == (status, out)
    assert cli_json(root, "status")[0] == 0


def _chattr(flag: str, path: str) -> bool:
    proc = subprocess.run(["chattr", flag, path], capture_output=True, timeout=30, check=False)
    return proc.returncode == 0


def test_a_directory_made_immutable_during_the_apply_answers_apply_incomplete_and_the_workspace_goes_on(  # noqa: E501
        root: str) -> None:
    write(root, "d/old.txt", "old\n")
    d = os.path.join(root, "d")
    if not _chattr("+i", d) or not _chattr("-i", d):
        pytest.skip("chattr +i is not available here (needs root and a file system with it)")
    client = Agent2PC(root)
    tx = client.begin()
    tx.stage_write("d/x.txt", "x\n")
    tx.stage_write("e.txt", "e\n")
    client.engine.close()
    try:
        commit = StalledCommit(root, tx.tid)
        assert _chattr("+i", d)
        status, out = commit.answer()
        assert status == 2 and out["error"]["code"] == "apply_incomplete", out
        err = out["error"]
        assert err["tid"] == tx.tid and err["state"] == "committing", err
        assert "d/x.txt" in err["not_applied"] and "Operation not permitted" in err["error"]
        # Every other command works meanwhile.
        status, out = cli_json(root, "status")
        assert status == 0 and [(t["tid"], t["state"]) for t in out["transactions"]] == [
            (tx.tid, "committing")], out
        assert cli_json(root, "list")[0] == 0
        status, out = cli_json(root, "begin")
        assert status == 0
        other = out["tid"]
        assert cli_json(root, "stage-write", "--tid", other, "--path", "f.txt",
                        "--content", "f\n")[0] == 0
        status, out = cli_json(root, "commit", "--tid", other)
        assert status == 0 and out["state"] == "committed", out
        # A commit of a path the stuck one changes waits for it: a conflict, nothing applied.
        status, out = cli_json(root, "begin")
        clash = out["tid"]
        assert cli_json(root, "stage-write", "--tid", clash, "--path", "d/x.txt",
                        "--content", "clash\n")[0] == 0
        status, out = cli_json(root, "commit", "--tid", clash)
        assert status == 1 and out["error"]["code"] == "conflict", out
        assert tx.tid in out["error"]["message"]
        # recover retries and says what is still not applied.
        status, out = cli_json(root, "recover")
        assert status == 2 and out["error"]["code"] == "apply_incomplete", out
        assert [t["tid"] for t in out["error"]["transactions"]] == [tx.tid], out
        # Asking for the stuck transaction itself names what is left.
        status, out = cli_json(root, "commit", "--tid", tx.tid)
        assert status == 2 and out["error"]["code"] == "apply_incomplete", out
    finally:
        _chattr("-i", d)
    status, out = cli_json(root, "recover")
    assert status == 0 and out["rolled_forward"] == [tx.tid], out
    assert read(root, "d/x.txt") == b"x\n" and read(root, "e.txt") == b"e\n"
    status, out = cli_json(root, "commit", "--tid", tx.tid)
    assert status == 0 and out["state"] == "committed", out
