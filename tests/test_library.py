"""The Python library as CONTRACT.md states it: Agent2PC, transaction(), TransactionAborted."""

from __future__ import annotations

import hashlib
import os
import types

import pytest
from conftest import read, take_snapshot, write

import agent_2pc
from agent_2pc import Agent2PC, Agent2PCError, TransactionAborted

# A CLI call that hangs (a lock never released) must fail the test, not stall the run.
pytestmark = pytest.mark.timeout(60)


class Boom(Exception):
    pass


@pytest.fixture
def tree(root):
    write(root, "src/a.py", "a = 1\n")
    write(root, "src/b.py", "b = 1\n")
    return root


def test_public_names_in_all_exist_and_are_exactly_the_public_ones():
    names = agent_2pc.__all__
    assert len(names) == len(set(names)), names
    assert {"Agent2PC", "TransactionAborted"} <= set(names)  # the contract's imports
    for name in names:
        assert hasattr(agent_2pc, name), name
    public = {name for name, value in vars(agent_2pc).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert public == set(names), public ^ set(names)
    star: dict = {}
    exec("from agent_2pc import *", star)
    assert set(star) - {"__builtins__"} == set(names)


def test_error_classes_carry_the_contract_codes_and_exit_statuses():
    assert issubclass(TransactionAborted, Agent2PCError)
    assert TransactionAborted("x").exit_status == 1
    exc = TransactionAborted("why", code="timeout", tid="t")
    assert (exc.code, exc.reason, exc.tid) == ("timeout", "why", "t")


def test_init_creates_the_workspace_idempotently_and_opens_it(tmp_path):
    target = tmp_path / "ws"
    target.mkdir()
    client = Agent2PC.init(target)
    assert isinstance(client, Agent2PC)
    assert os.path.isdir(target / ".agent-tx")
    tid = client.begin().tid
    again = Agent2PC.init(target)            # idempotent: the live transaction survives
    assert again.get(tid).state() == "active"
    assert Agent2PC(target).root == client.root == os.path.realpath(target)


def test_a_client_opened_below_the_root_finds_the_workspace(tree):
    client = Agent2PC(os.path.join(tree, "src"))
    assert client.root == tree
    with client.transaction() as tx:
        tx.stage_write("src/c.py", "c = 1\n")
    assert read(tree, "src/c.py") == b"c = 1\n"


def test_transaction_commits_on_clean_exit(tree, client):
    with client.transaction(label="clean") as tx:
        tx.record_read("src/a.py")
        tx.stage_write("src/a.py", "a = 2\n")
        tx.stage_write("src/new.bin", b"\x00\xff")
        tx.stage_replace("src/b.py", "b = 1", "b = 2")
        assert read(tree, "src/a.py") == b"a = 1\n"   # nothing reaches the tree before commit
    assert tx.state() == "committed"
    assert read(tree, "src/a.py") == b"a = 2\n"
    assert read(tree, "src/new.bin") == b"\x00\xff"
    assert read(tree, "src/b.py") == b"b = 2\n"


def test_transaction_aborts_on_exception_and_leaves_the_tree_untouched(tree, client):
    before = take_snapshot(tree)
    with pytest.raises(Boom):
        with client.transaction() as tx:
            tx.stage_write("src/a.py", "a = 2\n")
            tx.stage_delete("src/b.py")
            tx.stage_write("new/dir/c.py", "c\n")
            raise Boom("stop")
    assert tx.state() == "aborted"
    after = take_snapshot(tree)
    assert after["tree"] == before["tree"]
    assert not os.path.exists(os.path.join(tree, "new"))


def test_a_conflict_at_commit_raises_transaction_aborted_with_code_and_reason(tree, client):
    with pytest.raises(TransactionAborted) as info:
        with client.transaction() as tx:
            tx.stage_write("src/a.py", "mine\n")
            tx.stage_write("src/other.py", "other\n")
            write(tree, "src/a.py", "theirs\n")      # a concurrent outside edit
    err = info.value
    assert err.code == "conflict"
    assert isinstance(err.reason, str) and "src/a.py" in err.reason
    assert err.tid == tx.tid and tx.state() == "aborted"
    assert read(tree, "src/a.py") == b"theirs\n"     # no lost update
    assert not os.path.exists(os.path.join(tree, "src/other.py"))   # nothing else applied


def test_a_recorded_read_that_changed_makes_commit_raise_conflict(tree, client):
    tx = client.begin()
    digest = tx.record_read("src/a.py")
    assert digest == hashlib.sha256(b"a = 1\n").hexdigest()
    assert tx.record_read("src/absent.py") is None
    tx.stage_write("src/b.py", "b = 2  # computed from a\n")
    write(tree, "src/a.py", "a = 99\n")
    with pytest.raises(TransactionAborted) as info:
        tx.commit()
    assert info.value.code == "conflict" and "src/a.py" in info.value.reason
    assert read(tree, "src/b.py") == b"b = 1\n"
    assert read(tree, "src/a.py") == b"a = 99\n"


def test_a_read_of_an_absent_file_that_appears_makes_commit_raise_conflict(tree, client):
    tx = client.begin()
    assert tx.record_read("src/absent.py") is None
    tx.stage_write("src/b.py", "b = 2\n")
    write(tree, "src/absent.py", "surprise\n")
    with pytest.raises(TransactionAborted) as info:
        tx.commit()
    assert info.value.code == "conflict"
    assert read(tree, "src/b.py") == b"b = 1\n"


def test_commit_and_abort_are_idempotent_and_commit_of_aborted_is_bad_state(tree, client):
    tx = client.begin()
    tx.stage_write("src/a.py", "a = 2\n")
    first = tx.commit()
    assert first["state"] == "committed" and first["tid"] == tx.tid
    assert tx.commit() == first
    other = client.begin()
    first_abort = other.abort(reason="no")
    assert first_abort["state"] == "aborted"
    assert other.abort() == first_abort
    with pytest.raises(Agent2PCError) as info:
        other.commit()
    assert info.value.code == "bad_state" and info.value.exit_status == 2


def test_committing_inside_the_block_is_not_repeated_on_exit(tree, client):
    with client.transaction() as tx:
        tx.stage_write("src/a.py", "a = 2\n")
        tx.commit()
    assert tx.state() == "committed" and read(tree, "src/a.py") == b"a = 2\n"


def test_an_exception_after_an_explicit_commit_keeps_the_commit_and_propagates(tree, client):
    with pytest.raises(Boom):
        with client.transaction() as tx:
            tx.stage_write("src/a.py", "a = 2\n")
            tx.commit()
            raise Boom()
    assert tx.state() == "committed" and read(tree, "src/a.py") == b"a = 2\n"


def test_stage_write_file_streams_from_a_path_or_a_binary_file_object(tree, client, tmp_path):
    src = tmp_path / "payload.bin"
    src.write_bytes(b"\x01\x02" * 5000)
    tx = client.begin()
    assert tx.stage_write_file("p1.bin", str(src))["bytes"] == 10000
    with open(src, "rb") as f:
        assert tx.stage_write_file("p2.bin", f)["bytes"] == 10000
    tx.commit()
    assert read(tree, "p1.bin") == read(tree, "p2.bin") == b"\x01\x02" * 5000


def test_stage_patch_accepts_text_and_bytes(tree, client):
    tx = client.begin()
    tx.stage_patch("--- a/src/a.py\n+++ b/src/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    tx.stage_patch(b"--- a/src/b.py\n+++ b/src/b.py\n@@ -1 +1 @@\n-b = 1\n+b = 2\n")
    tx.commit()
    assert read(tree, "src/a.py") == b"a = 2\n" and read(tree, "src/b.py") == b"b = 2\n"


def test_library_results_mirror_the_cli_shapes(tree, client):
    tx = client.begin(label="lib")
    assert tx.stage_write("x.txt", "x\n") == {"path": "x.txt", "op": "write", "bytes": 2}
    assert tx.savepoint("s") == {"name": "s"}
    diff = tx.diff()
    assert [f["path"] for f in diff["files"]] == ["x.txt"] and isinstance(diff["diff"], str)
    assert tx.diff(stat=True)["files"] == diff["files"]
    rows = client.transactions()
    assert {"tid", "state", "label", "created_at", "ops"} <= set(rows[0])
    assert [r["tid"] for r in client.transactions("active")] == [tx.tid]
    rec = client.recover()
    assert {"rolled_forward", "rolled_back", "truncated_bytes"} <= set(rec)
    assert tx.state() == "active"
    comp = client.compact()
    assert {"before_bytes", "after_bytes"} <= set(comp)
    assert tx.commit()["files"] == ["x.txt"]


def test_the_library_and_the_cli_share_one_workspace(tree, client, cli):
    tx = client.begin(label="shared")
    tx.stage_write("shared.txt", "from library\n")
    status, out = cli("status", "--tid", tx.tid)
    assert status == 0 and out["transactions"][0]["label"] == "shared"
    status, out = cli("commit", "--tid", tx.tid)
    assert status == 0
    assert tx.state() == "committed" and read(tree, "shared.txt") == b"from library\n"


def test_get_of_an_unknown_tid_raises_unknown_tid(tree, client):
    for tid in ("tx-20200101-000000-abcdef", "garbage"):
        with pytest.raises(Agent2PCError) as info:
            client.get(tid)
        assert info.value.code == "unknown_tid"


def test_staging_errors_are_raised_with_their_codes_and_change_nothing(tree, client):
    tx = client.begin()
    before = take_snapshot(tree)
    cases = [
        (lambda: tx.stage_write("../escape.txt", "x"), "path_outside_root"),
        (lambda: tx.stage_write(".git/config", "x"), "path_forbidden"),
        (lambda: tx.stage_delete("missing.py"), "not_found"),
        (lambda: tx.stage_replace("src/a.py", "zzz", "y"), "no_match"),
        (lambda: tx.stage_patch(""), "invalid_patch"),
        (lambda: tx.rollback_to("never"), "unknown_savepoint"),
    ]
    for call, code in cases:
        with pytest.raises(Agent2PCError) as info:
            call()
        assert info.value.code == code, (code, info.value)
        assert info.value.exit_status == 2
    assert take_snapshot(tree) == before
    assert tx.state() == "active" and tx.status()["ops"] == 0


def test_stage_write_of_neither_str_nor_bytes_is_refused_not_turned_into_zero_bytes(
        tree, client):
    """CONTRACT.md: content is "str or bytes". An int must not become that many NUL bytes."""
    tx = client.begin()
    with pytest.raises((TypeError, Agent2PCError)):
        tx.stage_write("x.txt", 12345)
    assert tx.status()["ops"] == 0


def test_errors_name_the_library_parameters_not_cli_flags(tree, client):
    tx = client.begin()
    write(tree, "src/c.py", "x = 1\nx = 1\n")
    cases = [
        (lambda: tx.stage_replace("src/a.py", "", "y"), "`old` must not be empty", ("old",)),
        (lambda: tx.stage_replace("src/c.py", "x = 1", "y"), "or set `all`", ("old", "all")),
        (lambda: tx.stage_cmd("true", network=True), "`network` only makes sense with `sandbox`",
         ("network", "sandbox")),
    ]
    for call, words, params in cases:
        with pytest.raises(Agent2PCError) as info:
            call()
        assert words in info.value.message and "--" not in info.value.message, info.value
        assert info.value.params == params
        assert "params" not in info.value.to_json()


def test_the_faces_steps_are_library_methods(tree, client):
    """What the CLI and the MCP server need beyond the contract's methods."""
    assert client.find_root(tree) == tree
    tx = client.get("tx-20200101-000000-abcdef", check=False)  # checked by each step
    with pytest.raises(Agent2PCError) as info:
        tx.commit()
    assert info.value.code == "unknown_tid"
    tx = client.begin()
    assert tx.record_read_result("./src/a.py") == {
        "path": "src/a.py", "sha256": hashlib.sha256(b"a = 1\n").hexdigest()}
    fd = os.open(os.path.join(tree, "src/b.py"), os.O_RDONLY)
    try:
        assert tx.stage_write_file("src/copy.py", fd)["bytes"] == len("b = 1\n")
    finally:
        os.close(fd)
    with pytest.raises(Agent2PCError) as info:
        tx.stage_vm()
    assert info.value.code == "isolation_unavailable"
    assert tx.commit()["state"] == "committed" and read(tree, "src/copy.py") == b"b = 1\n"
    client.close()
