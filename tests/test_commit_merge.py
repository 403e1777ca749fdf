"""Merge instead of abort at commit: a file another writer changed since it was staged is
merged with that change when the edits do not overlap (coordinator/rebase.py); an overlap, a
binary file, a recorded read or ``--no-merge`` is still a conflict; the checks run again on the
merged content; a crash after the decision of a merged commit rolls forward to it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import parse_one_object, read, run_cli, write

from agent_2pc import Agent2PC, TransactionAborted
from agent_2pc.core.states import COMMITTED

BASE = "".join(f"def f{i}():\n    return {i}\n\n" for i in range(1, 11))


def changed(text: str, i: int, value: str) -> str:
    """``text`` with function f<i> returning ``value``."""
    old = f"def f{i}():\n    return {i}\n"
    assert old in text
    return text.replace(old, f"def f{i}():\n    return {value}\n")


def cli_proc(root: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    full.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "agent_2pc", "--root", root, *args,
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=full)


def finished(proc: subprocess.Popen) -> tuple[int, dict]:
    out, err = proc.communicate(timeout=120)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return proc.returncode, parse_one_object(done)


def staged_edit(root: str, i: int, value: str) -> str:
    """A transaction, begun and staged by the CLI, that makes f<i> return ``value``."""
    def cli(*args: str) -> dict:
        proc = run_cli(args, json_out=True, root=root)
        assert proc.returncode == 0, proc.stderr
        return parse_one_object(proc)

    tid = cli("begin", "--label", f"edit f{i}")["tid"]
    cli("stage-replace", "--tid", tid, "--path", "lib.py", "--old",
        f"def f{i}():\n    return {i}\n", "--new", f"def f{i}():\n    return {value}\n")
    return tid


def test_agents_editing_different_functions_of_one_file_all_commit(root: str):
    """Four CLI processes race their commits on one file; every one commits and the file
    holds every edit."""
    write(root, "lib.py", BASE)
    edits = {1: "'one'", 4: "'four'", 7: "'seven'", 10: "'ten'"}
    tids = {i: staged_edit(root, i, v) for i, v in edits.items()}
    procs = [cli_proc(root, "commit", "--tid", tid) for tid in tids.values()]
    results = [finished(p) for p in procs]
    assert all(status == 0 for status, _ in results), results
    assert all(out["state"] == "committed" for _, out in results)
    merged = [out["merged"] for _, out in results]
    assert sum(1 for m in merged if m == ["lib.py"]) >= 1, merged  # the first had nothing to
    expected = BASE
    for i, v in edits.items():
        expected = changed(expected, i, v)
    assert read(root, "lib.py").decode() == expected


def test_a_commit_that_got_in_meanwhile_is_merged_under_the_commit_lock(root: str,
                                                                         tmp_path: Path):
    """A holds the commit lock (stalled before its decision) while B checks and waits: B's
    first look saw nothing to merge; under the lock it merges, runs its check again there,
    and commits. The check saw the merged content."""
    write(root, "lib.py", BASE)
    a = staged_edit(root, 2, "'two'")
    b = staged_edit(root, 9, "'nine'")
    seen = tmp_path / "seen.txt"
    proc = run_cli(("stage-cmd", "--tid", b, "--command", f"cat lib.py > {seen}"),
                   json_out=True, root=root)
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text() == changed(BASE, 9, "'nine'")
    pa = cli_proc(root, "commit", "--tid", a, env={
        "AGENT2PC_STALL_AT": "prepare.before_decision", "AGENT2PC_STALL_S": "3"})
    time.sleep(1.0)  # A is in its stall, holding the commit lock
    pb = cli_proc(root, "commit", "--tid", b)
    (sa, oa), (sb, ob) = finished(pa), finished(pb)
    assert (sa, oa["merged"]) == (0, []), oa
    assert (sb, ob["merged"]) == (0, ["lib.py"]), ob
    both = changed(changed(BASE, 2, "'two'"), 9, "'nine'")
    assert read(root, "lib.py").decode() == both
    assert seen.read_text() == both, "the check did not run again on the merged content"


def test_overlapping_edits_abort_with_conflict_and_leave_the_file_untouched(root: str):
    write(root, "lib.py", BASE)
    tid = staged_edit(root, 3, "'mine'")
    write(root, "lib.py", changed(BASE, 3, "'theirs'"))
    proc = run_cli(("commit", "--tid", tid), json_out=True, root=root)
    out = parse_one_object(proc)
    assert proc.returncode == 1 and out["error"]["code"] == "conflict"
    assert out["state"] == "aborted" and "overlap" in out["error"]["message"]
    assert read(root, "lib.py").decode() == changed(BASE, 3, "'theirs'")


def test_no_merge_keeps_the_conflict(root: str, client: Agent2PC):
    write(root, "lib.py", BASE)
    tid = staged_edit(root, 3, "'mine'")
    write(root, "lib.py", changed(BASE, 8, "'theirs'"))
    proc = run_cli(("commit", "--tid", tid, "--no-merge"), json_out=True, root=root)
    out = parse_one_object(proc)
    assert proc.returncode == 1 and out["error"]["code"] == "conflict"
    assert read(root, "lib.py").decode() == changed(BASE, 8, "'theirs'")
    tx = client.begin()
    tx.stage_replace("lib.py", "return 1\n", "return 'x'\n")
    write(root, "lib.py", changed(changed(BASE, 8, "'theirs'"), 5, "'five'"))
    with pytest.raises(TransactionAborted) as err:
        tx.commit(merge=False)
    assert err.value.code == "conflict"


def test_a_recorded_read_of_the_file_keeps_the_conflict(root: str, client: Agent2PC):
    write(root, "lib.py", BASE)
    tx = client.begin()
    tx.record_read("lib.py")
    tx.stage_replace("lib.py", "return 1\n", "return 'one'\n")
    write(root, "lib.py", changed(BASE, 9, "'nine'"))
    with pytest.raises(TransactionAborted) as err:
        tx.commit()
    assert err.value.code == "conflict" and "changed since it was read" in err.value.reason
    assert read(root, "lib.py").decode() == changed(BASE, 9, "'nine'")


def test_a_binary_file_keeps_the_conflict(root: str, client: Agent2PC):
    data = bytearray(b"\0" + b"x" * 4000)
    write(root, "blob.bin", bytes(data))
    tx = client.begin()
    mine = bytearray(data)
    mine[10] = ord("M")
    tx.stage_write("blob.bin", bytes(mine))
    theirs = bytearray(data)
    theirs[3900] = ord("T")
    write(root, "blob.bin", bytes(theirs))
    with pytest.raises(TransactionAborted) as err:
        tx.commit()
    assert err.value.code == "conflict"
    assert read(root, "blob.bin") == bytes(theirs)


def test_a_file_the_other_writer_deleted_keeps_the_conflict(root: str, client: Agent2PC):
    write(root, "lib.py", BASE)
    tx = client.begin()
    tx.stage_replace("lib.py", "return 1\n", "return 'one'\n")
    os.unlink(os.path.join(root, "lib.py"))
    with pytest.raises(TransactionAborted) as err:
        tx.commit()
    assert err.value.code == "conflict" and "deleted" in err.value.reason
    assert not os.path.exists(os.path.join(root, "lib.py"))


def test_a_check_that_fails_on_the_merged_content_aborts(root: str, client: Agent2PC):
    """The check passes on the staged content (one edit) and fails on the merged one (two):
    the commit aborts with verification_failed and the other writer's content stays."""
    write(root, "lib.py", BASE)
    tx = client.begin()
    tx.stage_replace("lib.py", "return 1\n", "return 'one'\n")
    tx.stage_cmd("test $(grep -c \"return '\" lib.py) -le 1")
    theirs = changed(BASE, 6, "'six'")
    write(root, "lib.py", theirs)
    with pytest.raises(TransactionAborted) as err:
        tx.commit()
    assert err.value.code == "verification_failed"
    assert read(root, "lib.py").decode() == theirs


def test_merged_paths_are_in_the_answer_again_and_in_the_history(root: str, client: Agent2PC):
    write(root, "lib.py", BASE)
    write(root, "other.py", "x = 1\n")
    tx = client.begin()
    tx.stage_replace("lib.py", "return 1\n", "return 'one'\n")
    tx.stage_write("other.py", "x = 2\n")
    write(root, "lib.py", changed(BASE, 10, "'ten'"))
    first = tx.commit()
    assert first["merged"] == ["lib.py"] and sorted(first["files"]) == ["lib.py", "other.py"]
    assert tx.commit() == first
    client.compact()
    assert Agent2PC(root).get(tx.tid).commit() == first
    assert tx.state() == COMMITTED


@pytest.mark.parametrize("point", ["commit.after_decision", "commit.mid_apply",
                                   "commit.before_end"])
@pytest.mark.parametrize("size", ["small", "large"])
def test_a_crash_after_the_decision_of_a_merged_commit_rolls_forward_to_the_merged_content(
        root: str, client: Agent2PC, point: str, size: str):
    """Small files travel in the decision, large ones are synced blobs: both are the merged
    content, which recovery places."""
    pad = "" if size == "small" else "# padding\n" * 3000
    base = BASE + pad
    write(root, "lib.py", base)
    write(root, "side.txt", "side\n")
    tx = client.begin()
    tx.stage_replace("lib.py", "return 2\n", "return 'two'\n")
    tx.stage_write("side.txt", "side 2\n")
    theirs = changed(base, 8, "'eight'")
    write(root, "lib.py", theirs)
    proc = run_cli(("commit", "--tid", tx.tid), json_out=False, root=root,
                   env={"AGENT2PC_CRASH_AT": point})
    assert proc.returncode == 137, proc.stderr
    out = Agent2PC(root).recover()
    assert tx.tid in out["rolled_forward"], out
    assert read(root, "lib.py").decode() == changed(theirs, 2, "'two'")
    assert read(root, "side.txt") == b"side 2\n"
    assert Agent2PC(root).get(tx.tid).commit()["merged"] == ["lib.py"]


def test_the_base_a_file_was_staged_from_is_kept_across_garbage_collection(
        root: str, client: Agent2PC, monkeypatch: pytest.MonkeyPatch):
    from agent_2pc.coordinator import compaction

    write(root, "lib.py", BASE)
    tx = client.begin()
    tx.stage_replace("lib.py", "return 1\n", "return 'one'\n")
    monkeypatch.setattr(compaction, "BLOB_GRACE_S", -1)
    client.compact()
    write(root, "lib.py", changed(BASE, 5, "'five'"))
    assert tx.commit()["merged"] == ["lib.py"]
    assert read(root, "lib.py").decode() == changed(changed(BASE, 5, "'five'"), 1, "'one'")


def test_a_stale_read_of_another_file_is_a_conflict_and_nothing_is_merged(
        root: str, client: Agent2PC):
    write(root, "lib.py", BASE)
    write(root, "config.txt", "v1\n")
    tx = client.begin()
    tx.record_read("config.txt")
    tx.stage_replace("lib.py", "return 1\n", "return 'one'\n")
    write(root, "lib.py", changed(BASE, 9, "'nine'"))
    write(root, "config.txt", "v2\n")
    with pytest.raises(TransactionAborted) as err:
        tx.commit()
    assert err.value.code == "conflict" and "config.txt" in err.value.reason
    assert [op["via"] for op in tx.status()["files"]] == ["replace"], "a merge was staged"
    assert read(root, "lib.py").decode() == changed(BASE, 9, "'nine'")


def test_a_read_recorded_after_the_other_writer_changed_the_file_keeps_the_conflict(
        root: str, client: Agent2PC):
    """The read still holds, but the transaction read the file it is merging into: its edit
    was decided on what it read, so it is not merged over."""
    write(root, "lib.py", BASE)
    tx = client.begin()
    tx.stage_replace("lib.py", "return 1\n", "return 'one'\n")
    write(root, "lib.py", changed(BASE, 9, "'nine'"))
    tx.record_read("lib.py")
    with pytest.raises(TransactionAborted) as err:
        tx.commit()
    assert err.value.code == "conflict" and "recorded a read" in err.value.reason
    assert read(root, "lib.py").decode() == changed(BASE, 9, "'nine'")
