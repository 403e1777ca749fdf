"""Transaction timeouts: an expired transaction refuses staging and commit with code timeout
(exit 1) and is aborted; recover aborts expired active transactions and reports them; one
without a timeout survives."""

from __future__ import annotations

import time

import pytest
from conftest import read, write

from agent_2pc import TransactionAborted

# A CLI call that hangs (a lock never released) must fail the test, not stall the run.
pytestmark = pytest.mark.timeout(60)

SHORT_MS = 200
PAST_IT = 0.3  # seconds: comfortably past SHORT_MS


@pytest.fixture
def tree(root):
    write(root, "a.txt", "original\n")
    return root


def begin(cli, *args):
    status, out = cli("begin", *args)
    assert status == 0, out
    return out["tid"]


def staged_then_expired(client, path="a.txt", content="staged\n"):
    """A transaction with SHORT_MS to live, something staged in it at once (in-process, so a
    loaded machine does not make the staging itself late), and its time then run out."""
    tx = client.begin(timeout_ms=SHORT_MS)
    tx.stage_write(path, content)
    time.sleep(PAST_IT)
    return tx.tid


def state_of(cli, tid):
    status, out = cli("status", "--tid", tid)
    assert status == 0, out
    return out["transactions"][0]["state"]


@pytest.mark.timeout(30)
def test_staging_after_the_timeout_is_refused_with_timeout_and_aborts_it(tree, cli, snapshot):
    tid = begin(cli, "--timeout-ms", str(SHORT_MS))
    time.sleep(PAST_IT)
    tree_before = snapshot()["tree"]
    status, out = cli("stage-write", "--tid", tid, "--path", "b.txt", "--content", "late\n")
    assert (status, out["ok"], out["error"]["code"]) == (1, False, "timeout"), out
    assert state_of(cli, tid) == "aborted"
    assert snapshot()["tree"] == tree_before
    # Aborted now: a later step is bad_state, a commit of it is bad_state, nothing applies.
    status, out = cli("stage-write", "--tid", tid, "--path", "b.txt", "--content", "late\n")
    assert (status, out["error"]["code"]) == (2, "bad_state"), out
    status, out = cli("commit", "--tid", tid)
    assert (status, out["error"]["code"]) == (2, "bad_state"), out
    assert read(tree, "a.txt") == b"original\n"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cmd", [
    ["stage-delete", "--path", "a.txt"],
    ["stage-replace", "--path", "a.txt", "--old", "original", "--new", "x"],
    ["record-read", "--path", "a.txt"],
    ["savepoint", "--name", "s"],
], ids=["delete", "replace", "record-read", "savepoint"])
def test_every_staging_step_after_the_timeout_is_refused_with_timeout(tree, cli, cmd):
    tid = begin(cli, "--timeout-ms", str(SHORT_MS))
    time.sleep(PAST_IT)
    status, out = cli(cmd[0], "--tid", tid, *cmd[1:])
    assert (status, out["error"]["code"]) == (1, "timeout"), out
    assert state_of(cli, tid) == "aborted"


@pytest.mark.timeout(30)
def test_commit_after_the_timeout_is_refused_with_timeout_and_applies_nothing(tree, cli,
                                                                             client):
    tid = staged_then_expired(client)
    status, out = cli("commit", "--tid", tid)
    assert status == 1 and out["ok"] is False, out
    assert out["error"]["code"] == "timeout" and out["state"] == "aborted", out
    assert read(tree, "a.txt") == b"original\n"


@pytest.mark.timeout(30)
def test_recover_aborts_an_expired_active_transaction_and_reports_it(tree, cli, client):
    expired = staged_then_expired(client)
    status, out = cli("recover")
    assert status == 0, out
    assert out["rolled_back"] == [expired], out
    assert out["rolled_forward"] == []
    assert state_of(cli, expired) == "aborted"
    assert read(tree, "a.txt") == b"original\n"
    # Reported once: the next recover has nothing to do.
    status, out = cli("recover")
    assert out["rolled_back"] == [] and out["rolled_forward"] == [], out


@pytest.mark.timeout(30)
def test_transactions_without_timeout_or_not_yet_expired_survive_recover(tree, cli, client):
    no_timeout = client.begin(timeout_ms=0)
    default = client.begin()
    long = client.begin(timeout_ms=600_000)
    expired = begin(cli, "--timeout-ms", str(SHORT_MS))
    no_timeout.stage_write("one.txt", "1\n")
    default.stage_write("two.txt", "2\n")
    long.stage_write("three.txt", "3\n")
    time.sleep(PAST_IT)
    status, out = cli("recover")
    assert status == 0 and out["rolled_back"] == [expired], out
    status, out = cli("list", "--state", "active")
    assert {row["tid"] for row in out["transactions"]} == {no_timeout.tid, default.tid, long.tid}
    for tx in (no_timeout, default, long):
        assert tx.commit()["state"] == "committed"
    assert read(tree, "one.txt") + read(tree, "two.txt") + read(tree, "three.txt") == b"1\n2\n3\n"


@pytest.mark.timeout(30)
def test_a_timeout_in_the_library_raises_transaction_aborted_with_code_timeout(tree, client):
    with pytest.raises(TransactionAborted) as info:
        with client.transaction(timeout_ms=SHORT_MS) as tx:
            tx.stage_write("a.txt", "mine\n")
            time.sleep(PAST_IT)
    assert info.value.code == "timeout" and info.value.tid == tx.tid
    assert tx.state() == "aborted"
    assert read(tree, "a.txt") == b"original\n"


@pytest.mark.timeout(30)
def test_a_transaction_used_before_its_timeout_commits(tree, cli):
    tid = begin(cli, "--timeout-ms", "30000")
    assert cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "in time\n")[0] == 0
    status, out = cli("commit", "--tid", tid)
    assert status == 0 and out["state"] == "committed", out
    assert read(tree, "a.txt") == b"in time\n"
