"""The API participant: an HTTP call staged in a transaction runs exactly once across retries,
dropped connections, timeouts and crashes, counted from the service's real effects; an abort
after it may have happened sends its compensation, also exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_server import Service
from crashkit import cli, snapshot

from agent_2pc import Agent2PC, TransactionAborted
from agent_2pc.participants import api as api_mod

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def service():
    s = Service()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(api_mod, "TIMEOUT_S", 1.0)
    monkeypatch.setattr(api_mod, "BACKOFF_S", (0.05, 0.1, 0.2))


@pytest.fixture
def repo(tmp_path) -> Path:
    (tmp_path / "ledger.txt").write_text("balance 0\n")
    Agent2PC.init(tmp_path)
    return tmp_path


def _charge(tx, service, amount=500, **kw):
    return tx.stage_api("POST", f"{service.url}/charges", {"amount": amount}, compensate={
        "method": "POST", "url": f"{service.url}/refunds", "body": {"amount": amount}}, **kw)


def test_a_committed_call_runs_once_together_with_the_files(repo, service):
    client = Agent2PC(repo)
    tx = client.begin()
    tx.stage_write("ledger.txt", "balance 500\n")
    _charge(tx, service)
    out = tx.commit()
    assert out["state"] == "committed" and out["files"] == ["ledger.txt"]
    assert out["effects"][0]["outcome"] == "done" and out["effects"][0]["status"] == 200
    assert json.loads(out["effects"][0]["response"]["body"])["id"] == "ch_1"
    assert service.performed == {"/charges": 1}
    assert tx.commit()["state"] == "committed"  # the same answer, nothing sent again
    assert service.performed == {"/charges": 1} and len(service.requests) == 1
    key = out["effects"][0]["idempotency_key"]
    assert service.requests[0] == ("POST", "/charges", key)


def test_a_dropped_connection_is_resolved_with_the_same_key_not_a_fresh_request(repo, service):
    service.fail("/charges", "drop_after")
    tx = Agent2PC(repo).begin()
    _charge(tx, service)
    out = tx.commit()
    assert out["effects"][0]["outcome"] == "done"
    assert service.performed == {"/charges": 1}
    keys = {k for _, _, k in service.requests}
    assert len(service.requests) == 2 and len(keys) == 1  # resent, with the same key
    assert out["effects"][0]["response"]["headers"].get("idempotent-replayed") == "true"


def test_a_timeout_is_retried_with_the_same_key_and_the_effect_happens_once(repo, service,
                                                                           monkeypatch):
    monkeypatch.setattr(api_mod, "BACKOFF_S", (0.4, 0.8))
    service.fail("/charges", "delay", seconds=1.2)  # longer than the client's timeout (1 s)
    tx = Agent2PC(repo).begin()
    _charge(tx, service)
    out = tx.commit()
    assert out["effects"][0]["outcome"] == "done"
    assert service.performed == {"/charges": 1}
    assert len({k for _, _, k in service.requests}) == 1


def test_a_file_conflict_aborts_before_any_remote_call(repo, service):
    client = Agent2PC(repo)
    tx = client.begin()
    tx.stage_write("ledger.txt", "balance 500\n")
    _charge(tx, service)
    (repo / "ledger.txt").write_text("balance 7\n")  # another writer
    with pytest.raises(TransactionAborted) as info:
        tx.commit()
    assert info.value.code == "conflict"
    assert service.requests == [] and service.performed == {}


def test_a_declined_call_aborts_and_compensates_only_the_calls_that_happened(repo, service):
    before = snapshot(repo)
    tx = Agent2PC(repo).begin()
    tx.stage_write("ledger.txt", "balance 500\n")
    _charge(tx, service)
    tx.stage_api("POST", f"{service.url}/declined", {"amount": 1}, compensate={
        "method": "POST", "url": f"{service.url}/refunds", "body": {"note": "never sent"}})
    with pytest.raises(TransactionAborted) as info:
        tx.commit()
    assert info.value.code == "effect_failed" and "402" in info.value.reason
    assert snapshot(repo) == before
    assert service.performed == {"/charges": 1, "/declined": 1, "/refunds": 1}
    status = tx.status()
    assert [e["outcome"] for e in status["effects"]] == ["done", "failed"]
    assert status["effects"][0]["compensation"]["outcome"] == "done"
    assert status["effects"][1]["compensation"]["outcome"] == "skipped"


def test_an_unknown_outcome_is_asked_again_with_the_same_key_then_compensated(repo, service):
    service.fail("/charges", "error_500")  # the charge happened; the answer is a 500
    tx = Agent2PC(repo).begin()
    _charge(tx, service)
    with pytest.raises(TransactionAborted) as info:
        tx.commit()
    assert info.value.code == "effect_unknown"
    assert service.performed == {"/charges": 1, "/refunds": 1}
    charge_keys = {k for _, p, k in service.requests if p == "/charges"}
    assert len(charge_keys) == 1  # every retry used the same key


def test_a_transient_503_is_retried_and_succeeds(repo, service):
    service.fail("/charges", "reject_503")
    tx = Agent2PC(repo).begin()
    _charge(tx, service)
    assert tx.commit()["effects"][0]["outcome"] == "done"
    assert service.performed == {"/charges": 1}


def test_aborting_an_active_transaction_sends_nothing(repo, service):
    tx = Agent2PC(repo).begin()
    _charge(tx, service)
    tx.abort()
    assert service.requests == []


def test_a_key_reused_with_other_arguments_is_refused_and_sends_nothing_new(repo, service):
    client = Agent2PC(repo)
    first = client.begin()
    _charge(first, service, amount=500, idempotency_key="invoice-42")
    first.commit()
    second = client.begin()
    _charge(second, service, amount=999, idempotency_key="invoice-42")
    with pytest.raises(TransactionAborted) as info:
        second.commit()
    assert info.value.code == "intent_conflict"
    assert service.performed == {"/charges": 1}


def test_the_same_key_in_a_later_transaction_replays_the_recorded_response(repo, service):
    client = Agent2PC(repo)
    for _ in range(2):
        tx = client.begin()
        _charge(tx, service, idempotency_key="invoice-7")
        out = tx.commit()
    assert out["effects"][0]["outcome"] == "done"
    assert service.performed == {"/charges": 1} and len(service.requests) == 1


def _crash(repo: Path, tid: str, point: str) -> None:
    proc = cli(repo, "commit", "--tid", tid, env={"AGENT2PC_CRASH_AT": point,
                                                   "AGENT2PC_API_TIMEOUT_S": "1"})
    assert proc.returncode == 137, proc.stderr + proc.stdout


def test_a_crash_after_the_call_was_answered_is_compensated_once_by_recover(repo, service):
    before = snapshot(repo)
    tx = Agent2PC(repo).begin()
    tx.stage_write("ledger.txt", "balance 500\n")
    _charge(tx, service)
    _crash(repo, tx.tid, "api.after_send")
    assert service.performed == {"/charges": 1}
    out = json.loads(cli(repo, "recover").stdout)
    assert out["rolled_back"] == [tx.tid]
    assert snapshot(repo) == before
    assert service.performed == {"/charges": 1, "/refunds": 1}
    charge_keys = {k for _, p, k in service.requests if p == "/charges"}
    assert len(charge_keys) == 1  # the outcome was learnt by asking again with the same key
    assert json.loads(cli(repo, "recover").stdout)["rolled_back"] == []
    assert service.performed == {"/charges": 1, "/refunds": 1}  # and never again


def test_a_crash_before_the_request_left_is_resolved_with_the_same_key_then_undone(
        repo, service):
    # The lease was logged (synced) before sending, so recovery cannot tell "not sent" from
    # "sent, answer lost": it sends the same request with the same key to learn the outcome,
    # then compensates. Exactly one charge and one refund, never two of either.
    tx = Agent2PC(repo).begin()
    _charge(tx, service)
    _crash(repo, tx.tid, "api.before_send")
    assert service.requests == []
    out = json.loads(cli(repo, "recover").stdout)
    assert out["rolled_back"] == [tx.tid]
    assert service.performed == {"/charges": 1, "/refunds": 1}


def test_a_crash_after_the_decision_rolls_forward_without_sending_again(repo, service):
    tx = Agent2PC(repo).begin()
    tx.stage_write("ledger.txt", "balance 500\n")
    _charge(tx, service)
    _crash(repo, tx.tid, "commit.after_decision")
    assert service.performed == {"/charges": 1}
    out = json.loads(cli(repo, "recover").stdout)
    assert out["rolled_forward"] == [tx.tid]
    assert (repo / "ledger.txt").read_text() == "balance 500\n"
    assert service.performed == {"/charges": 1} and len(service.requests) == 1


@pytest.mark.parametrize("args, word", [
    (["--method", "FETCH", "--url", "http://x.test/a"], "method"),
    (["--method", "POST", "--url", "ftp://x.test/a"], "URL"),
    (["--method", "POST", "--url", "http:///nohost"], "host"),
    (["--method", "POST", "--url", "http://x.test/a", "--body", "{nope"], "JSON"),
    (["--method", "POST", "--url", "http://x.test/a", "--header", "no-colon"], "NAME:VALUE"),
    (["--method", "POST", "--url", "http://x.test/a", "--header", "Idempotency-Key: k"], "key"),
    (["--method", "POST", "--url", "http://x.test/a", "--compensate-url", "http://x.test/b"],
     "compensation"),
])
def test_a_malformed_call_is_refused_and_stages_nothing(repo, args, word):
    tid = json.loads(cli(repo, "begin").stdout)["tid"]
    proc = cli(repo, "stage-api", "--tid", tid, *args)
    out = json.loads(proc.stdout)
    assert proc.returncode == 2 and out["error"]["code"] == "usage" and word in \
        out["error"]["message"]
    status = json.loads(cli(repo, "status", "--tid", tid).stdout)["transactions"][0]
    assert status["ops"] == 0


def test_stage_api_through_the_cli_commits_once(repo, service):
    tid = json.loads(cli(repo, "begin").stdout)["tid"]
    proc = cli(repo, "stage-api", "--tid", tid, "--method", "POST", "--url",
               f"{service.url}/charges", "--body", '{"amount": 5}', "--header",
               "Authorization: Bearer t", "--compensate-method", "POST", "--compensate-url",
               f"{service.url}/refunds", "--compensate-body", '{"amount": 5}')
    assert proc.returncode == 0, proc.stdout
    out = json.loads(cli(repo, "commit", "--tid", tid).stdout)
    assert out["ok"] and out["effects"][0]["outcome"] == "done"
    assert service.performed == {"/charges": 1}


def test_an_api_step_in_a_batch_commits_with_the_files(repo, service):
    manifest = {"steps": [
        {"type": "fs_write", "path": "ledger.txt", "content": "balance 5\n"},
        {"type": "api", "method": "POST", "url": f"{service.url}/charges", "body": {"amount": 5},
         "compensate": {"method": "POST", "url": f"{service.url}/refunds"}}]}
    out = Agent2PC(repo).run_batch(manifest)
    assert out["state"] == "committed" and out["steps"][1]["result"]["n"] == 0
    assert (repo / "ledger.txt").read_text() == "balance 5\n"
    assert service.performed == {"/charges": 1}
