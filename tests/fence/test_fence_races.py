"""Races with real threads and real processes; every execution is counted from the side effect."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from agent_2pc.errors import FenceRefusal
from agent_2pc.fence import EffectRequest, Fresh, Replay, open_fence
from agent_2pc.fence._storm import storm

pytestmark = pytest.mark.timeout(90)

WORKER = os.path.join(os.path.dirname(__file__), "fence_worker.py")


def _req(intent: str, agent: str, **kw: Any) -> EffectRequest:
    return EffectRequest(intent=intent, domain="pay", tool="charge", args={"amount": 5},
                         agent=agent, **kw)


def test_racing_threads_execute_effect_exactly_once(open_store: Any, effect: Any) -> None:
    fence = open_store(lease_ttl=10.0)
    n = 16
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def racer(i: int) -> None:
        try:
            req = _req("pay-1", f"t{i}")
            barrier.wait()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    adm = fence.prepare(req)
                except FenceRefusal as exc:
                    assert exc.code == "intent_in_flight", exc.code
                    time.sleep(0.001)
                    continue
                if isinstance(adm, Fresh):
                    effect.run(f"t{i}")
                    results[i] = fence.commit(adm.ticket, {"by": i}).result
                else:
                    results[i] = adm.result
                return
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert effect.count == 1
    assert all(r == results[0] for r in results) and results[0] is not None
    c = fence.counters()
    assert c["admitted"] == 1 and c["attempts"] == c["admitted"] + c["replayed"] + c["refused"]


def test_racing_threads_take_over_an_expired_lease_exactly_once(open_store: Any) -> None:
    crashed = open_store(lease_ttl=0.2)
    crashed.prepare(_req("pay-2", "crashed"))
    time.sleep(0.3)
    # The racers' own leases are long: with the crashed holder's 0.2 s, a racer that a loaded
    # machine held back 0.2 s found the winner's lease expired too, and took over in its turn
    # (rightly: 3 generations in one CI run). One expiry, one takeover, is what is tested here.
    fence = open_store(lease_ttl=30.0)
    n = 12
    barrier = threading.Barrier(n)
    fresh: list[Any] = []
    codes: list[str] = []
    lock = threading.Lock()

    def racer(i: int) -> None:
        barrier.wait()
        try:
            adm = fence.prepare(_req("pay-2", f"t{i}"), takeover=True)
            with lock:
                fresh.append(adm)
        except FenceRefusal as exc:
            with lock:
                codes.append(exc.code)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(fresh) == 1 and fresh[0].ticket.generation == 2
    assert codes == ["intent_in_flight"] * (n - 1)


def test_compare_and_set_on_a_domain_admits_one_writer_per_seq(open_store: Any,
                                                                effect: Any) -> None:
    # Many intents each read "acct" at seq 0 and write it: one wins, the rest race or go stale.
    fence = open_store(lease_ttl=10.0)
    n = 12
    barrier = threading.Barrier(n)
    outcomes: list[str] = []
    lock = threading.Lock()

    def racer(i: int) -> None:
        req = EffectRequest(intent=f"cas-{i}", domain="acct", tool="debit", args={"n": i},
                            agent=f"t{i}", read_set=[("acct", 0)])
        barrier.wait()
        try:
            adm = fence.prepare(req)
        except FenceRefusal as exc:
            with lock:
                outcomes.append(exc.code)
            return
        effect.run(f"t{i}")
        fence.commit(adm.ticket, "debited")
        with lock:
            outcomes.append("fresh")

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes.count("fresh") == 1 and effect.count == 1
    assert set(outcomes) <= {"fresh", "domain_race", "read_set_stale"}
    assert fence.status()["counters"]["committed"] == 1


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, WORKER, *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_racing_processes_execute_effect_exactly_once(shared_store_url: str, effect: Any,
                                                      tmp_path: Any) -> None:
    go = str(tmp_path / "go")
    procs = [_spawn("race", shared_store_url, "pay-3", effect.path, go, "5000")
             for _ in range(6)]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        open(go, "w").close()  # the start signal, seen by all at once
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            outs.append(json.loads(out))
    finally:
        for p in procs:  # a worker that failed early leaves its pipes open otherwise
            if p.poll() is None:
                p.kill()
            for stream in (p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
            p.wait()
    assert effect.count == 1
    assert sum(o["fresh"] for o in outs) == 1
    results = [o["result"] for o in outs if o["fresh"] == 0]
    assert results and all(r == results[0] for r in results)


def test_storm_across_processes_executes_once(shared_store_url: str) -> None:
    res = storm(shared_store_url, attempts=300, workers=8, processes=4)
    assert res["executions"] == 1 and res["admitted"] == 1 and res["committed"] == 1
    assert res["admitted"] + res["replayed"] + res["refused"] == 300
    assert res["replayed"] > 0  # the late retries learned the outcome


def test_storm_on_threads_executes_once(open_store: Any, store_url: str) -> None:
    open_store()  # creates the store (and keeps a memory store alive for the storm)
    res = storm(store_url, attempts=400, workers=8, processes=1, hold_s=0.01)
    assert res["executions"] == 1 and res["refused"] > 0 and res["replayed"] > 0


def test_crash_between_effect_and_commit_is_fenced_until_reconciled(
        shared_store_url: str, effect: Any) -> None:
    lease_ttl = 0.5
    p = _spawn("crash", shared_store_url, "pay-4", effect.path, str(lease_ttl))
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("effect-done"), p.stderr.read() if p.stderr else line
        os.kill(p.pid, signal.SIGKILL)  # between the effect and the commit
        p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == -signal.SIGKILL and effect.count == 1
    with open_fence(shared_store_url, lease_ttl=lease_ttl) as fence:
        try:
            fence.prepare(_req("pay-4", "retrier"))
            raise AssertionError("the crashed holder's intent was admitted again")
        except FenceRefusal as exc:
            assert exc.code in ("intent_in_flight", "intent_fenced")
        time.sleep(lease_ttl + 0.2)
        for _ in range(3):  # however often it is retried, it stays fenced: never re-run
            with pytest.raises(FenceRefusal) as info:
                fence.prepare(_req("pay-4", "retrier"))
            assert info.value.code == "intent_fenced"
            assert info.value.details["reason"] == "lease_expired"
        assert effect.count == 1
        cert = fence.reconcile("pay-4", "done", {"charged": True}, reason="found the charge")
        assert cert is not None and cert.verify()
        replay = fence.prepare(_req("pay-4", "retrier"))
        assert isinstance(replay, Replay) and replay.result == {"charged": True}
    assert effect.count == 1


_OPEN_WHEN_TOLD = """
import os, sys, time
from agent_2pc.fence import open_fence
go = sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.001)
with open_fence(sys.argv[1]) as fence:
    print("opened", flush=True)
"""


def test_processes_opening_a_new_sqlite_store_at_once_all_get_it(tmp_path: Any) -> None:
    # The first opening makes the schema and switches the journal to WAL, which takes the
    # database exclusively; SQLite refuses some racing openers at once ("database is locked",
    # no busy wait). Each must wait its turn. (Seen once, under a full suite's load: 1 of 6 racing
    # workers of test_racing_processes_execute_effect_exactly_once failed so; not reproduced
    # alone.)
    for round_ in range(3):
        url = f"sqlite:///{tmp_path}/fence-{round_}.db"
        go = str(tmp_path / f"go-{round_}")
        procs = [subprocess.Popen([sys.executable, "-c", _OPEN_WHEN_TOLD, url, go],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(12)]
        time.sleep(0.5)
        with open(go, "w"):
            pass
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert (p.returncode, out.strip()) == (0, "opened"), err[-2000:]
