"""The ledger's guarantees, each proved against every store (memory, SQLite, Postgres)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from agent_2pc.errors import BadState, FenceRefusal, UsageError
from agent_2pc.fence import (
    EffectRequest,
    Fresh,
    Replay,
    Ticket,
    compare,
    happened_before,
    verify_chain,
)

pytestmark = pytest.mark.timeout(60)


def req(intent: str = "charge-1", **kw: Any) -> EffectRequest:
    fields: dict[str, Any] = {"domain": "acct:7", "tool": "stripe.charge",
                              "args": {"amount": 500, "currency": "eur"}, "agent": "agent-a"}
    fields.update(kw)
    return EffectRequest(intent=intent, **fields)


def refused(code: str, fn: Any, *a: Any, **kw: Any) -> FenceRefusal:
    with pytest.raises(FenceRefusal) as info:
        fn(*a, **kw)
    assert info.value.code == code, (info.value.code, info.value.message)
    assert info.value.exit_status == 1
    return info.value


# -- admission ----------------------------------------------------------------------------------


def test_first_attempt_is_fresh_and_a_retry_replays_the_certificate(fence: Any) -> None:
    adm = fence.prepare(req())
    assert isinstance(adm, Fresh) and adm.status == "fresh"
    assert adm.ticket.generation == 1 and not adm.takeover
    cert = fence.commit(adm.ticket, {"charge": "ch_1"})
    assert cert.verify() and cert.seq == 1 and cert.result == {"charge": "ch_1"}
    again = fence.prepare(req())
    assert isinstance(again, Replay) and again.status == "already_done"
    assert again.cert == cert and again.result == {"charge": "ch_1"}


def test_live_lease_refuses_a_second_attempt_with_intent_in_flight(fence: Any) -> None:
    fence.prepare(req())
    err = refused("intent_in_flight", fence.prepare, req(agent="agent-b"))
    assert err.details["generation"] == 1
    refused("intent_in_flight", fence.prepare, req(agent="agent-b"), takeover=True)


def test_duplicate_from_another_agent_read_set_and_parent_is_a_replay(fence: Any) -> None:
    first = fence.prepare(req(read_set=[{"domain": "acct:7", "seq": 0}]))
    cert = fence.commit(first.ticket, "ok")
    # Another agent, another (now stale) read-set, a parent that does not exist: still a replay.
    dup = fence.prepare(req(agent="agent-b", read_set=[{"domain": "acct:7", "seq": 0}],
                            parent="no-such-parent", known_clock={"x": 3}))
    assert isinstance(dup, Replay) and dup.cert == cert


def test_same_intent_with_different_args_is_refused_as_conflict(fence: Any) -> None:
    adm = fence.prepare(req())
    refused("intent_conflict", fence.prepare, req(args={"amount": 501, "currency": "eur"}))
    fence.commit(adm.ticket, "ok")
    refused("intent_conflict", fence.prepare, req(args={"amount": 501, "currency": "eur"}))
    refused("intent_conflict", fence.prepare, req(tool="stripe.refund"))
    refused("intent_conflict", fence.prepare, req(domain="acct:8"))
    # The same JSON spelled differently is the same request: 500 == 500.0, keys in any order.
    same = fence.prepare(req(args={"currency": "eur", "amount": 500.0}))
    assert isinstance(same, Replay)


# -- tickets ------------------------------------------------------------------------------------


def _forgeries(t: dict[str, Any]) -> list[Any]:
    out: list[Any] = [None, 5, "garbage", "{}", [], [t], {}, {**t, "extra": 1}]
    for k in t:
        out.append({x: v for x, v in t.items() if x != k})           # a field missing
        for bad in (None, True, 1.5, "1", [], {}, -1, 0, "", "x" * 600):
            if bad != t[k]:
                out.append({**t, k: bad})                              # a field of another kind
    out.append({**t, "generation": t["generation"] + 1})
    out.append({**t, "token": t["token"] + 1})
    out.append({**t, "lease_id": "0" * 32})
    out.append({**t, "lease_id": t["lease_id"].upper()})
    out.append({**t, "fingerprint": "f" * 64})
    out.append({**t, "intent": t["intent"] + "x"})
    out.append({**t, "intent": "\udce9"})  # not Unicode (a non-UTF-8 command line argument)
    return out


def test_forged_ticket_in_any_field_is_refused_with_stale_lease(fence: Any) -> None:
    adm = fence.prepare(req())
    good = adm.ticket.to_json()
    for forged in _forgeries(good):
        for call in (lambda t: fence.commit(t, "x"), fence.heartbeat,
                     lambda t: fence.abort(t, "x"), lambda t: fence.abort(t, "x", "unknown")):
            refused("stale_lease", call, forged)
    # The real lease is untouched by all of that.
    assert fence.status(good["intent"])["state"] == "running"
    assert fence.commit(good, "ok").verify()


def test_ticket_travels_as_json_text(fence: Any) -> None:
    import json

    adm = fence.prepare(req())
    text = json.dumps(adm.ticket.to_json())
    assert Ticket.parse(text) == adm.ticket
    fence.heartbeat(text)
    assert fence.commit(text, 1).result == 1


def test_abort_after_commit_changes_nothing(fence: Any) -> None:
    adm = fence.prepare(req())
    cert = fence.commit(adm.ticket, "ok")
    for outcome in ("failed", "unknown"):
        res = fence.abort(adm.ticket, "too late", outcome)
        assert (res.state, res.changed) == ("done", False)
    replay = fence.prepare(req())
    assert isinstance(replay, Replay) and replay.cert == cert
    assert fence.status("charge-1")["state"] == "done"


def test_commit_is_idempotent_for_the_same_result_and_refuses_another(fence: Any) -> None:
    adm = fence.prepare(req())
    cert = fence.commit(adm.ticket, {"id": 1})
    assert fence.commit(adm.ticket, {"id": 1.0}) == cert
    refused("intent_conflict", fence.commit, adm.ticket, {"id": 2})
    refused("stale_lease", fence.heartbeat, adm.ticket)


# -- failure, unknown outcome, reconcile ----------------------------------------------------------


def test_definite_failure_frees_the_intent_for_a_retry(fence: Any) -> None:
    first = fence.prepare(req())
    res = fence.abort(first.ticket, "card declined", "failed")
    assert (res.state, res.changed) == ("failed", True)
    assert fence.abort(first.ticket, "again", "failed").changed is False
    retry = fence.prepare(req(agent="agent-b"))
    assert isinstance(retry, Fresh) and retry.ticket.generation == 2 and not retry.takeover
    assert retry.ticket.token > first.ticket.token
    refused("stale_lease", fence.commit, first.ticket, "late")
    assert fence.commit(retry.ticket, "ok").agent == "agent-b"


def test_unknown_outcome_fences_until_reconciled_clear(fence: Any) -> None:
    first = fence.prepare(req())
    assert fence.abort(first.ticket, "timeout", "unknown").state == "fenced"
    err = refused("intent_fenced", fence.prepare, req(agent="agent-b"))
    assert err.details["reason"] == "timeout"
    refused("stale_lease", fence.commit, first.ticket, "late")  # settle it with reconcile
    assert fence.status()["fenced"] == ["charge-1"]
    assert fence.reconcile("charge-1", "clear") is None
    retry = fence.prepare(req())
    assert isinstance(retry, Fresh) and retry.ticket.generation == 3


def test_unknown_outcome_reconciled_done_replays_the_real_result(fence: Any) -> None:
    first = fence.prepare(req())
    fence.abort(first.ticket, "connection reset", "unknown")
    cert = fence.reconcile("charge-1", "done", {"charge": "ch_9"}, reason="seen in dashboard")
    assert cert is not None and cert.verify() and cert.result == {"charge": "ch_9"}
    assert cert.agent == "agent-a"  # the holder whose outcome it was
    replay = fence.prepare(req(agent="agent-b"))
    assert isinstance(replay, Replay) and replay.cert == cert
    refused("stale_lease", fence.commit, first.ticket, {"charge": "ch_9"})
    assert fence.reconcile("charge-1", "done", {"charge": "ch_9"}) == cert  # idempotent
    with pytest.raises(BadState):
        fence.reconcile("charge-1", "clear")


def test_reconcile_refuses_a_live_lease_and_an_unknown_intent(fence: Any) -> None:
    fence.prepare(req())
    refused("intent_in_flight", fence.reconcile, "charge-1", "clear")
    with pytest.raises(UsageError) as info:
        fence.reconcile("nobody", "clear")
    assert info.value.code == "unknown_intent"


# -- leases ---------------------------------------------------------------------------------------


def test_expired_lease_is_fenced_not_silently_rerun(open_store: Any) -> None:
    fence = open_store(lease_ttl=0.3)
    fence.prepare(req())
    time.sleep(0.45)
    err = refused("intent_fenced", fence.prepare, req(agent="agent-b"))
    assert err.details["reason"] == "lease_expired"


def test_expired_lease_takeover_refuses_old_holders_commit(open_store: Any) -> None:
    fence = open_store(lease_ttl=0.3)
    old = fence.prepare(req())
    time.sleep(0.45)
    new = fence.prepare(req(agent="agent-b"), takeover=True)
    assert isinstance(new, Fresh) and new.takeover and new.previous == "lease_expired"
    assert new.ticket.generation == old.ticket.generation + 1
    assert new.ticket.token > old.ticket.token  # downstream can refuse the stale worker
    refused("stale_lease", fence.commit, old.ticket, "slow holder's result")
    refused("stale_lease", fence.heartbeat, old.ticket)
    refused("stale_lease", fence.abort, old.ticket, "x")
    cert = fence.commit(new.ticket, "new holder's result")
    assert cert.agent == "agent-b" and cert.result == "new holder's result"
    assert fence.counters()["takeovers"] == 1


def test_heartbeats_keep_a_slow_holders_lease(open_store: Any) -> None:
    fence = open_store(lease_ttl=0.4)
    adm = fence.prepare(req())
    deadline = time.monotonic() + 1.2  # three lease lengths
    while time.monotonic() < deadline:
        time.sleep(0.1)
        expires = fence.heartbeat(adm.ticket)
        assert expires > adm.lease_expires_at
        refused("intent_in_flight", fence.prepare, req(agent="agent-b"), takeover=True)
    assert fence.commit(adm.ticket, "slow but alive").result == "slow but alive"


def test_late_commit_of_an_expired_lease_that_nobody_took_over_counts(open_store: Any) -> None:
    # Nobody else ran the effect, so the holder's word is the truth: it is recorded.
    fence = open_store(lease_ttl=0.2)
    adm = fence.prepare(req())
    time.sleep(0.3)
    assert fence.commit(adm.ticket, "late").result == "late"
    assert isinstance(fence.prepare(req()), Replay)


def test_takeover_of_an_unknown_outcome_is_explicit(fence: Any) -> None:
    first = fence.prepare(req())
    fence.abort(first.ticket, "timeout", "unknown")
    new = fence.prepare(req(), takeover=True)
    assert new.takeover and new.previous == "unknown" and new.ticket.generation == 2
    assert fence.commit(new.ticket, "retried with the same key").verify()


# -- domains and read-sets ------------------------------------------------------------------------


def test_own_domain_in_read_set_replays_instead_of_going_stale(fence: Any) -> None:
    r = req(read_set=[{"domain": "acct:7", "seq": 0}])
    adm = fence.prepare(r)
    cert = fence.commit(adm.ticket, "ok")
    assert cert.seq == 1 and cert.read_set == [{"domain": "acct:7", "seq": 0}]
    retry = fence.prepare(r)  # its own commit moved acct:7; a retry is still the same effect
    assert isinstance(retry, Replay) and retry.cert == cert
    refused("read_set_stale", fence.prepare, req("charge-2", read_set=[("acct:7", 0)]))
    nxt = fence.prepare(req("charge-2", read_set=[("acct:7", 1)]))
    assert fence.commit(nxt.ticket, "ok").seq == 2


def test_stale_read_set_is_refused_with_where_it_moved(fence: Any) -> None:
    fence.commit(fence.prepare(req("a", domain="inventory")).ticket, "ok")
    err = refused("read_set_stale", fence.prepare,
                  req("b", read_set=[{"domain": "inventory", "seq": 0}]))
    assert (err.details["domain"], err.details["expected"], err.details["actual"]) == \
        ("inventory", 0, 1)


def test_in_flight_writer_and_reader_of_a_domain_race(fence: Any) -> None:
    writer = fence.prepare(req("w", domain="stock"))
    err = refused("domain_race", fence.prepare, req("r", read_set=[("stock", 0)]))
    assert err.details["holder"] == "w"
    # Two writers that read nothing commute: both may run.
    other = fence.prepare(req("w2", domain="stock"))
    fence.commit(other.ticket, "ok")
    fence.commit(writer.ticket, "ok")
    reader = fence.prepare(req("r2", read_set=[("stock", 2)]))
    refused("domain_race", fence.prepare, req("w3", domain="stock"))
    fence.commit(reader.ticket, "ok")
    assert isinstance(fence.prepare(req("w3", domain="stock")), Fresh)


def test_read_set_is_checked_and_claimed_in_one_step_over_many_domains(fence: Any) -> None:
    names = [f"d{i}" for i in range(6)]
    blocker = fence.prepare(req("blocker", domain="d3"))
    refused("domain_race", fence.prepare, req("wide", read_set=[(d, 0) for d in names]))
    # The refused prepare left no claim behind: a writer of d0 is not blocked by it.
    w0 = fence.prepare(req("w0", domain="d0"))
    fence.commit(w0.ticket, "ok")
    fence.abort(blocker.ticket, "gave up", "failed")
    refused("read_set_stale", fence.prepare, req("wide", read_set=[(d, 0) for d in names]))
    wide = fence.prepare(req("wide", read_set=[(d, 1 if d == "d0" else 0) for d in names]))
    for d in names:
        refused("domain_race", fence.prepare, req(f"w-{d}", domain=d))
    cert = fence.commit(wide.ticket, "ok")
    assert cert.read_set == [{"domain": d, "seq": 1 if d == "d0" else 0} for d in names]


def test_fenced_writer_keeps_its_domain_claim_until_reconciled(fence: Any) -> None:
    w = fence.prepare(req("w", domain="ledger"))
    fence.abort(w.ticket, "timeout", "unknown")
    refused("domain_race", fence.prepare, req("r", read_set=[("ledger", 0)]))
    fence.reconcile("w", "done", "it happened")
    refused("read_set_stale", fence.prepare, req("r", read_set=[("ledger", 0)]))
    assert isinstance(fence.prepare(req("r", read_set=[("ledger", 1)])), Fresh)


def test_domain_sequence_advances_once_per_commit_and_orders_certificates(fence: Any) -> None:
    certs = []
    for i in range(5):
        adm = fence.prepare(req(f"e{i}", domain="orders"))
        fence.prepare(req(f"x{i}", domain="other"))  # in flight elsewhere: not counted
        certs.append(fence.commit(adm.ticket, i))
    assert [c.seq for c in certs] == [1, 2, 3, 4, 5]
    for a, b in zip(certs, certs[1:], strict=False):
        assert happened_before(a, b) and compare(b, a) == "after"


# -- parents, chains, vector clocks ------------------------------------------------------------


def test_parent_must_be_done_and_certificates_chain_to_it(fence: Any) -> None:
    with pytest.raises(UsageError) as info:
        fence.prepare(req("child", parent="root"))
    assert info.value.code == "unknown_parent"
    root = fence.prepare(req("root", domain="a"))
    with pytest.raises(UsageError):
        fence.prepare(req("child", parent="root"))  # in flight is not done
    root_cert = fence.commit(root.ticket, "r")
    child = fence.prepare(req("child", domain="b", parent="root"))
    child_cert = fence.commit(child.ticket, "c")
    grand = fence.prepare(req("grandchild", domain="c", parent="child"))
    grand_cert = fence.commit(grand.ticket, "g")
    assert child_cert.parent == root_cert.hash and grand_cert.parent == child_cert.hash
    chain = fence.chain("grandchild")
    assert chain == [root_cert, child_cert, grand_cert]
    assert verify_chain(chain)
    assert happened_before(root_cert, grand_cert)


def test_vector_clocks_tell_happened_before_from_concurrent(fence: Any) -> None:
    a = fence.commit(fence.prepare(req("a", domain="A")).ticket, 1)
    b = fence.commit(fence.prepare(req("b", domain="B")).ticket, 2)
    assert compare(a, b) == "concurrent" and not happened_before(a, b)
    # c saw a (known_clock) and reads B: it comes after both.
    c = fence.commit(fence.prepare(req("c", domain="C", known_clock=a.vector_clock,
                                       read_set=[("B", 1)])).ticket, 3)
    assert happened_before(a, c) and happened_before(b, c)
    assert c.vector_clock == {"A": 1, "B": 1, "C": 1}
    d = fence.commit(fence.prepare(req("d", domain="A")).ticket, 4)  # the next in domain A
    assert happened_before(a, d) and compare(c, d) == "concurrent"
    with pytest.raises(UsageError):  # a clock from the future of a domain is bad input
        fence.prepare(req("e", known_clock={"A": 99}))


# -- counters, retention, status ----------------------------------------------------------------


def test_counters_add_up_per_attempt(open_store: Any) -> None:
    one, two = open_store(lease_ttl=5.0), open_store(lease_ttl=5.0)
    seen = {"admitted": 0, "replayed": 0, "refused": 0}
    adm = one.prepare(req())
    seen["admitted"] += 1
    for f in (one, two, two):
        refused("intent_in_flight", f.prepare, req())
        seen["refused"] += 1
    refused("intent_conflict", two.prepare, req(args={}))
    seen["refused"] += 1
    one.commit(adm.ticket, "ok")
    for f in (one, two):
        f.prepare(req())
        seen["replayed"] += 1
    two.flush()
    c = one.counters()
    assert c["attempts"] == c["admitted"] + c["replayed"] + c["refused"] == sum(seen.values())
    assert (c["admitted"], c["replayed"], c["refused"]) == \
        (seen["admitted"], seen["replayed"], seen["refused"])
    assert c["refused_by"] == {"intent_conflict": 1, "intent_in_flight": 3}
    assert c["committed"] == 1


def test_retention_forgets_finished_outcomes_after_result_ttl(open_store: Any) -> None:
    fence = open_store(lease_ttl=5.0, result_ttl=0.3)
    done = fence.prepare(req("done", domain="d-done"))
    fence.commit(done.ticket, "ok")
    failed = fence.prepare(req("failed", domain="d-failed"))
    fence.abort(failed.ticket, "no", "failed")
    fenced = fence.prepare(req("fenced", domain="d-fenced"))
    fence.abort(fenced.ticket, "?", "unknown")
    fence.prepare(req("running", domain="d-running"))
    time.sleep(0.45)
    assert fence.status("done")["state"] == "absent"  # forgotten even before the sweep
    deleted = fence.sweep()
    assert deleted == 4  # 2 entries + 2 idle domains (d-done, d-failed)
    st = fence.status()
    assert st["states"] == {"running": 1, "done": 0, "failed": 0, "fenced": 1}
    assert st["domains"] == 2  # d-fenced and d-running are claimed: kept
    assert fence.sweep() == 0
    # A forgotten intent starts a new period: fresh, with a fencing token that still only grows.
    again = fence.prepare(req("done", domain="d-done"))
    assert isinstance(again, Fresh) and again.ticket.token > fenced.ticket.token


def test_status_shows_an_intent_but_never_its_lease_secret(fence: Any) -> None:
    adm = fence.prepare(req())
    st = fence.status("charge-1")
    assert st["state"] == "running" and st["lease_live"] is True
    assert adm.ticket.lease_id not in repr(st)
    assert fence.status("nope") == {"intent": "nope", "state": "absent"}
    whole = fence.status()
    assert whole["running"] == ["charge-1"] and whole["clock"] in ("host", "database")


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [
    {"intent": ""}, {"intent": 5}, {"intent": "x" * 600}, {"domain": ""},
    {"args": {"a": float("nan")}}, {"args": {"a": float("inf")}}, {"args": {"a": 2**60}},
    {"args": {1: "non-string key"}}, {"args": {"s": "\ud800"}}, {"args": object()},
    {"read_set": [("d", 1), ("d", 2)]}, {"read_set": [("d", -1)]}, {"read_set": "d@1"},
    {"read_set": [{"domain": "d"}]}, {"known_clock": {"d": "1"}}, {"parent": "x"},
    {"tool": None}, {"agent": 3},
])
def test_bad_requests_are_usage_errors(fields: dict[str, Any]) -> None:
    base: dict[str, Any] = {"intent": "x", "domain": "d", "tool": "t", "args": {}}
    base.update(fields)
    with pytest.raises(UsageError) as info:
        EffectRequest(**base)
    assert info.value.exit_status == 2


def test_bad_calls_are_usage_errors(fence: Any) -> None:
    with pytest.raises(UsageError):
        fence.prepare({"intent": "x"})
    for call in (fence.status, fence.certificate, fence.chain,
                 lambda i: fence.reconcile(i, "clear")):
        for intent in ("", "\udce9", 5):
            with pytest.raises(UsageError):
                call(intent)
    adm = fence.prepare(req())
    with pytest.raises(UsageError):
        fence.commit(adm.ticket, float("nan"))  # nothing recorded: the lease still holds
    with pytest.raises(UsageError):
        fence.abort(adm.ticket, "x", outcome="maybe")
    with pytest.raises(UsageError):
        fence.reconcile("charge-1", "undo")
    assert fence.commit(adm.ticket, "ok").result == "ok"


def test_signed_certificates_use_the_key_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, open_store: Any) -> None:
    monkeypatch.setenv("AGENT2PC_FENCE_HMAC_KEY", "s3cret")
    fence = open_store(lease_ttl=5.0)
    cert = fence.commit(fence.prepare(req(intent=f"signed-{uuid.uuid4().hex}")).ticket, "ok")
    assert cert.signature and cert.signature.startswith("hmac-sha256:")
    assert cert.verify()
    assert not cert.verify(key="wrong")
    monkeypatch.delenv("AGENT2PC_FENCE_HMAC_KEY")
    assert not cert.verify()  # signed, and no key to vouch for it
    assert cert.verify(key="s3cret")
