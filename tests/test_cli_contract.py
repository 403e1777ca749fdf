"""The CLI as CONTRACT.md states it: one JSON object with --json, exit 0/1/2, result shapes,
idempotent commit/abort, option placement, root discovery, and readable text without --json.

Shapes are checked as the contract's table lists them: every listed field is there with the
right type (the contract allows fields to be added, never removed or renamed).
"""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest
from conftest import parse_one_object, read, write

# A CLI call that hangs (a lock never released) must fail the test, not stall the run.
pytestmark = pytest.mark.timeout(60)

TID_LIKE = re.compile(r"^\S+$")


def shape(obj, **fields):
    """Assert that ``obj`` has every field, of the given type (or types) or with the given
    value. An int field must not be a bool."""
    for name, want in fields.items():
        assert name in obj, f"{name!r} missing from {obj!r}"
        value = obj[name]
        if isinstance(want, (type, tuple)):
            assert isinstance(value, want), (name, value, obj)
            assert not (want is int and isinstance(value, bool)), (name, value, obj)
        else:
            assert value == want, (name, value, obj)


def begin(cli, *args):
    status, out = cli("begin", *args)
    assert status == 0, out
    return out["tid"]


@pytest.fixture
def files(root):
    write(root, "a.txt", "one\ntwo\nthree\n")
    write(root, "b.txt", "bee\n")
    write(root, "gone.txt", "bye\nnow\n")
    return root


# -- one JSON object, exit statuses ----------------------------------------------------------


def test_json_prints_exactly_one_object_on_success_and_on_failure(files, cli_raw):
    procs = [
        cli_raw("begin", json=True),                                         # success
        cli_raw("status", json=True),                                        # success
        cli_raw("commit", "--tid", "tx-20200101-000000-abcdef", json=True),  # exit 2
        cli_raw("frobnicate", json=True),                                    # usage
    ]
    for proc in procs:
        obj = parse_one_object(proc)   # exactly one JSON object, and nothing else, on stdout
        assert proc.stdout.decode().count("\n") == 1, proc.stdout
        assert obj["ok"] is (proc.returncode == 0), (proc.returncode, obj)


def test_exit_status_is_0_on_success_1_on_a_no_and_2_on_bad_input(files, cli):
    tid = begin(cli)
    status, out = cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "new\n")
    assert status == 0 and out["ok"] is True
    write(files, "a.txt", "someone else\n")
    status, out = cli("commit", "--tid", tid)                  # answer is no: conflict
    assert status == 1 and out["ok"] is False and out["error"]["code"] == "conflict", out
    status, out = cli("stage-write", "--tid", tid, "--path", "../x", "--content", "x")
    assert status == 2 and out["ok"] is False                  # bad input


def test_commit_of_a_committed_transaction_answers_the_same_again(files, cli):
    tid = begin(cli)
    cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "new\n")
    first = cli("commit", "--tid", tid)
    assert first[0] == 0 and first[1]["state"] == "committed"
    assert cli("commit", "--tid", tid) == first
    assert cli("commit", "--tid", tid) == first
    assert read(files, "a.txt") == b"new\n"


def test_abort_of_an_aborted_transaction_answers_the_same_again(files, cli, snapshot):
    tid = begin(cli)
    cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "new\n")
    first = cli("abort", "--tid", tid, "--reason", "changed my mind")
    assert first[0] == 0
    shape(first[1], ok=True, tid=tid, state="aborted")
    assert cli("abort", "--tid", tid) == first
    assert read(files, "a.txt") == b"one\ntwo\nthree\n"


def test_commit_of_an_aborted_transaction_is_bad_state_and_changes_nothing(files, cli, snapshot):
    tid = begin(cli)
    cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "new\n")
    assert cli("abort", "--tid", tid)[0] == 0
    before = snapshot()
    status, out = cli("commit", "--tid", tid)
    assert (status, out["ok"], out["error"]["code"]) == (2, False, "bad_state"), out
    assert snapshot() == before


def test_abort_of_a_committed_transaction_is_refused_and_keeps_the_commit(files, cli, snapshot):
    tid = begin(cli)
    cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "new\n")
    assert cli("commit", "--tid", tid)[0] == 0
    before = snapshot()
    status, out = cli("abort", "--tid", tid)
    assert (status, out["ok"], out["error"]["code"]) == (2, False, "bad_state"), out
    assert snapshot() == before and read(files, "a.txt") == b"new\n"


def test_commit_after_a_refused_commit_is_bad_state_and_the_other_writer_keeps_the_file(
        files, cli):
    """After a commit aborts (exit 1), the transaction is aborted: committing again is
    bad_state (CONTRACT: commit on an aborted transaction)."""
    tid = begin(cli)
    cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "new\n")
    write(files, "a.txt", "theirs\n")
    status, out = cli("commit", "--tid", tid)
    assert status == 1
    shape(out, ok=False, tid=tid, state="aborted", error=dict)
    status, out = cli("commit", "--tid", tid)
    assert (status, out["error"]["code"]) == (2, "bad_state"), out
    assert read(files, "a.txt") == b"theirs\n"


# -- result shapes ---------------------------------------------------------------------------


def test_init_result_shape_and_idempotence(tmp_path, cli_raw):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    first = cli_raw("init", json=True, root=str(fresh))
    out = parse_one_object(first)
    assert first.returncode == 0
    shape(out, ok=True, root=os.path.realpath(fresh))
    again = cli_raw("init", json=True, root=str(fresh))
    assert again.returncode == 0 and parse_one_object(again) == out
    # init from the working directory, without --root
    other = tmp_path / "other"
    other.mkdir()
    proc = cli_raw("init", json=True, root=None, cwd=str(other))
    assert proc.returncode == 0
    assert parse_one_object(proc)["root"] == os.path.realpath(other)


def test_init_again_keeps_live_transactions(files, cli):
    tid = begin(cli)
    cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "new\n")
    assert cli("init")[0] == 0
    status, out = cli("commit", "--tid", tid)
    assert status == 0 and read(files, "a.txt") == b"new\n", out


def test_begin_result_shape(files, cli):
    status, out = cli("begin", "--label", "my label", "--timeout-ms", "60000")
    assert status == 0
    shape(out, ok=True, tid=str)
    assert TID_LIKE.match(out["tid"])
    status, other = cli("begin")
    assert other["tid"] != out["tid"]


def test_record_read_result_shape_with_hash_and_null_for_absent(files, cli):
    tid = begin(cli)
    status, out = cli("record-read", "--tid", tid, "--path", "a.txt")
    assert status == 0
    shape(out, ok=True, path="a.txt", sha256=hashlib.sha256(b"one\ntwo\nthree\n").hexdigest())
    status, out = cli("record-read", "--tid", tid, "--path", "no/such.txt")
    assert status == 0
    shape(out, ok=True, path="no/such.txt", sha256=None)


def test_staging_result_shapes(files, cli, tmp_path):
    tid = begin(cli)
    status, out = cli("stage-write", "--tid", tid, "--path", "new.txt", "--content", "héllo\n")
    assert status == 0
    shape(out, ok=True, path="new.txt", op="write", bytes=len("héllo\n".encode()))
    src = tmp_path / "src.bin"
    src.write_bytes(b"\x00" * 1000)
    status, out = cli("stage-write", "--tid", tid, "--path", "f.bin", "--from-file", str(src))
    shape(out, ok=True, path="f.bin", op="write", bytes=1000)
    status, out = cli("stage-write", "--tid", tid, "--path", "s.txt", "--stdin", input=b"abc")
    shape(out, ok=True, path="s.txt", op="write", bytes=3)
    status, out = cli("stage-delete", "--tid", tid, "--path", "gone.txt")
    assert status == 0
    shape(out, ok=True, path="gone.txt", op="delete")
    status, out = cli("stage-replace", "--tid", tid, "--path", "a.txt", "--old", "two",
                      "--new", "TWO")
    assert status == 0
    shape(out, ok=True, path="a.txt", op="replace", replacements=1)
    patch = ("diff --git a/b.txt b/b.txt\n--- a/b.txt\n+++ b/b.txt\n@@ -1 +1,2 @@\n bee\n"
             "+wasp\n--- /dev/null\n+++ b/c.txt\n@@ -0,0 +1 @@\n+sea\n")
    status, out = cli("stage-patch", "--tid", tid, "--stdin", input=patch)
    assert status == 0, out
    shape(out, ok=True, files=list)
    assert sorted(out["files"]) == ["b.txt", "c.txt"]


def test_diff_result_shape_lists_each_file_with_status_and_counts(files, cli):
    tid = begin(cli)
    cli("stage-write", "--tid", tid, "--path", "added.txt", "--content", "1\n2\n3\n")
    cli("stage-replace", "--tid", tid, "--path", "a.txt", "--old", "two\n", "--new", "2\n2b\n")
    cli("stage-delete", "--tid", tid, "--path", "gone.txt")
    for extra in ((), ("--stat",)):
        status, out = cli("diff", "--tid", tid, *extra)
        assert status == 0, out
        shape(out, ok=True, files=list, diff=str)
        by_path = {f["path"]: f for f in out["files"]}
        assert set(by_path) == {"added.txt", "a.txt", "gone.txt"}
        for f in out["files"]:
            assert set(f) >= {"path", "status", "additions", "deletions"}, f
        assert {k: by_path["added.txt"][k] for k in ("status", "additions", "deletions")} == {
            "status": "added", "additions": 3, "deletions": 0}
        assert {k: by_path["a.txt"][k] for k in ("status", "additions", "deletions")} == {
            "status": "modified", "additions": 2, "deletions": 1}
        assert {k: by_path["gone.txt"][k] for k in ("status", "additions", "deletions")} == {
            "status": "deleted", "additions": 0, "deletions": 2}
        for path in by_path:
            assert path in out["diff"]
    status, full = cli("diff", "--tid", tid)
    assert "+2b" in full["diff"] and "-two" in full["diff"]


def test_status_and_list_result_shapes(files, cli):
    tid = begin(cli, "--label", "shape check")
    cli("stage-write", "--tid", tid, "--path", "x.txt", "--content", "x\n")
    cli("stage-write", "--tid", tid, "--path", "y.txt", "--content", "y\n")
    done = begin(cli)
    cli("commit", "--tid", done)
    for args in (("status",), ("status", "--tid", tid), ("list",), ("list", "--state", "active")):
        status, out = cli(*args)
        assert status == 0, out
        shape(out, ok=True, transactions=list)
        for row in out["transactions"]:
            shape(row, tid=str, state=str, label=(str, type(None)), created_at=str, ops=int)
        mine = [row for row in out["transactions"] if row["tid"] == tid]
        assert len(mine) == 1, out
        shape(mine[0], state="active", label="shape check", ops=2)
    status, out = cli("list")
    assert {row["tid"]: row["state"] for row in out["transactions"]} == {
        tid: "active", done: "committed"}
    status, out = cli("list", "--state", "committed")
    assert [row["tid"] for row in out["transactions"]] == [done]
    status, out = cli("status")
    assert done not in [row["tid"] for row in out["transactions"]]  # status: live ones


def test_savepoint_and_rollback_to_result_shapes(files, cli):
    tid = begin(cli)
    status, out = cli("savepoint", "--tid", tid, "--name", "s1")
    assert status == 0
    shape(out, ok=True, name="s1")
    status, out = cli("rollback-to", "--tid", tid, "--name", "s1")
    assert status == 0
    shape(out, ok=True, name="s1")


def test_commit_and_abort_result_shapes(files, cli):
    tid = begin(cli)
    cli("stage-write", "--tid", tid, "--path", "n/new.txt", "--content", "x\n")
    cli("stage-delete", "--tid", tid, "--path", "gone.txt")
    status, out = cli("commit", "--tid", tid)
    assert status == 0
    shape(out, ok=True, tid=tid, state="committed", files=list)
    assert sorted(out["files"]) == ["gone.txt", "n/new.txt"]
    tid = begin(cli)
    status, out = cli("abort", "--tid", tid)
    assert status == 0
    shape(out, ok=True, tid=tid, state="aborted")


def test_refused_commit_result_shape(files, cli):
    tid = begin(cli)
    cli("record-read", "--tid", tid, "--path", "b.txt")
    cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "new\n")
    write(files, "b.txt", "changed under us\n")
    status, out = cli("commit", "--tid", tid)
    assert status == 1
    shape(out, ok=False, tid=tid, state="aborted", error=dict)
    shape(out["error"], code="conflict", message=str)


def test_recover_and_compact_result_shapes(files, cli):
    tid = begin(cli)
    cli("commit", "--tid", tid)
    status, out = cli("recover")
    assert status == 0
    shape(out, ok=True, rolled_forward=list, rolled_back=list, truncated_bytes=int)
    assert out["rolled_forward"] == [] and out["rolled_back"] == []
    status, out = cli("compact")
    assert status == 0
    shape(out, ok=True, before_bytes=int, after_bytes=int)
    assert out["after_bytes"] <= out["before_bytes"]
    # A compacted transaction is still known, and still answers the same.
    status, again = cli("commit", "--tid", tid)
    assert status == 0 and again["state"] == "committed", again
    assert tid in [row["tid"] for row in cli("list")[1]["transactions"]]


def test_run_batch_result_shape(files, cli, tmp_path):
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"steps": [
        {"participant_id": "fs", "intent": {"type": "fs_write", "path": "n.txt",
                                            "content": "n\n"}}]}))
    status, out = cli("run-batch", "--file", str(manifest))
    assert status == 0, out
    shape(out, ok=True, tid=str, state="committed", steps=list)
    assert len(out["steps"]) == 1


# -- option placement and root discovery -----------------------------------------------------


@pytest.mark.parametrize("layout", [
    ["--json", "--root", "{root}", "status"],
    ["--root", "{root}", "status", "--json"],
    ["status", "--json", "--root", "{root}"],
    ["--json", "status", "--root", "{root}"],
    ["--root={root}", "status", "--json"],
    ["status", "--root={root}", "--json"],
])
def test_json_and_root_are_accepted_before_or_after_the_command(files, cli_raw, layout):
    args = [a.replace("{root}", files) for a in layout]
    proc = cli_raw(*args, root=None, cwd="/")
    assert proc.returncode == 0, proc.stderr
    shape(parse_one_object(proc), ok=True, transactions=list)


def test_root_is_found_from_environment_then_nearest_ancestor(files, cli_raw):
    os.makedirs(os.path.join(files, "deep/er"))
    proc = cli_raw("status", json=True, root=None, cwd=os.path.join(files, "deep/er"))
    assert proc.returncode == 0, proc.stderr
    proc = cli_raw("status", json=True, root=None, cwd="/", env={"AGENT2PC_ROOT": files})
    assert proc.returncode == 0, proc.stderr
    # Paths stay relative to the root, not to the working directory.
    tid = parse_one_object(cli_raw("begin", json=True))["tid"]
    proc = cli_raw("stage-write", "--tid", tid, "--path", "deep/x.txt", "--content", "x",
                   json=True, root=None, cwd=os.path.join(files, "deep/er"))
    assert parse_one_object(proc)["path"] == "deep/x.txt"


def test_root_option_wins_over_the_environment(files, cli_raw, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    proc = cli_raw("status", json=True, env={"AGENT2PC_ROOT": str(bare)})
    assert proc.returncode == 0, proc.stdout


# -- text mode -------------------------------------------------------------------------------


def test_begin_without_json_prints_just_the_tid(files, cli_raw, cli):
    proc = cli_raw("begin")
    assert proc.returncode == 0
    text = proc.stdout.decode()
    assert text.endswith("\n") and text.count("\n") == 1, text
    tid = text.strip()
    assert TID_LIKE.match(tid)
    status, out = cli("status", "--tid", tid)
    assert status == 0 and out["transactions"][0]["tid"] == tid


def test_text_mode_prints_readable_output_not_json(files, cli_raw):
    tid = cli_raw("begin").stdout.decode().strip()
    steps = [
        ("stage-write", "--tid", tid, "--path", "a.txt", "--content", "one\n2\nthree\n"),
        ("diff", "--tid", tid),
        ("diff", "--tid", tid, "--stat"),
        ("status",),
        ("list",),
        ("commit", "--tid", tid),
    ]
    outputs = []
    for args in steps:
        proc = cli_raw(*args)
        assert proc.returncode == 0, (args, proc.stderr)
        text = proc.stdout.decode()
        assert text.strip(), args
        with pytest.raises(ValueError):
            json.loads(text)
        outputs.append(text)
    staged, diff, stat, status, listed, committed = outputs
    assert "a.txt" in staged
    assert "-two" in diff and "+2" in diff
    assert "a.txt" in stat
    assert tid in status and tid in listed
    assert tid in committed


def test_text_mode_errors_go_to_stderr_with_the_same_exit_status(files, cli_raw):
    proc = cli_raw("commit", "--tid", "tx-20200101-000000-abcdef")
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert b"tx-20200101-000000-abcdef" in proc.stderr
    tid = cli_raw("begin").stdout.decode().strip()
    cli_raw("stage-write", "--tid", tid, "--path", "a.txt", "--content", "mine\n")
    write(files, "a.txt", "theirs\n")
    proc = cli_raw("commit", "--tid", tid)
    assert proc.returncode == 1
    assert proc.stdout == b""
    assert proc.stderr.strip() and not proc.stderr.lstrip().startswith(b"{")


def test_help_is_available_and_succeeds(files, cli_raw):
    proc = cli_raw("--help", root=None)
    assert proc.returncode == 0 and b"begin" in proc.stdout
    proc = cli_raw("stage-write", "--help", root=None)
    assert proc.returncode == 0 and b"--tid" in proc.stdout


def test_an_error_that_names_a_parameter_shows_it_as_the_cli_flag(files, cli):
    tid = begin(cli)
    status, out = cli("stage-replace", "--tid", tid, "--path", "a.txt", "--old", "", "--new", "x")
    assert status == 2 and out["error"]["message"] == "--old must not be empty", out
    status, out = cli("stage-cmd", "--tid", tid, "--command", "true", "--network")
    assert out["error"]["message"] == "--network only makes sense with --sandbox", out
    write(files, "all", "two\ntwo\n")
    status, out = cli("stage-replace", "--tid", tid, "--path", "all", "--old", "two", "--new",
                      "x")
    assert out["error"]["code"] == "ambiguous_match", out
    assert out["error"]["message"] == ("--old occurs 2 times in all; make it unique with more "
                                       "context, or set --all"), out  # the path stays a path
