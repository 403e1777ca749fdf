"""``@fence.once``: a fenced function runs once per intent, heartbeating while it runs."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from agent_2pc.errors import FenceRefusal, UsageError

pytestmark = pytest.mark.timeout(60)


def test_once_runs_a_function_once_and_replays_its_result(fence: Any, effect: Any) -> None:
    @fence.once(intent="send-invoice-{invoice}", domain="billing")
    def send_invoice(invoice: int, to: str = "a@example.com") -> dict[str, Any]:
        effect.run(f"invoice {invoice}")
        return {"sent": invoice, "to": to}

    assert send_invoice(7) == {"sent": 7, "to": "a@example.com"}
    assert send_invoice(7) == {"sent": 7, "to": "a@example.com"}
    assert send_invoice(invoice=7, to="a@example.com")["sent"] == 7
    assert effect.count == 1
    assert send_invoice(8)["sent"] == 8 and effect.count == 2
    with pytest.raises(FenceRefusal) as info:  # same intent, other arguments
        send_invoice(7, to="b@example.com")
    assert info.value.code == "intent_conflict"
    cert = fence.certificate("send-invoice-7")
    assert cert.tool.endswith("send_invoice") and cert.args == {"invoice": 7,
                                                                 "to": "a@example.com"}


def test_once_runs_a_coroutine_once_and_replays_its_result(fence: Any, effect: Any) -> None:
    @fence.once(intent=lambda order: f"ship-{order}", domain="shipping")
    async def ship(order: str) -> str:
        await asyncio.sleep(0.01)
        effect.run(order)
        return f"shipped {order}"

    async def main() -> list[str]:
        return [await ship("o1"), await ship("o1")]

    assert asyncio.run(main()) == ["shipped o1", "shipped o1"]
    assert effect.count == 1


def test_once_heartbeats_keep_the_lease_while_a_slow_function_runs(open_store: Any,
                                                                   effect: Any) -> None:
    fence = open_store(lease_ttl=0.3)
    other = open_store(lease_ttl=0.3)
    seen: list[str] = []

    @fence.once(intent="slow-job", domain="jobs")
    def slow_job() -> str:
        effect.run()
        for _ in range(8):  # 0.8 s: well past the 0.3 s lease, which heartbeats renew
            time.sleep(0.1)
            try:
                other.prepare(slow_job.request(), takeover=True)
                seen.append("admitted")
            except FenceRefusal as exc:
                seen.append(exc.code)
        return "finished"

    assert slow_job() == "finished"
    assert seen == ["intent_in_flight"] * 8
    assert slow_job() == "finished" and effect.count == 1


def test_once_async_heartbeats_keep_the_lease(open_store: Any) -> None:
    fence = open_store(lease_ttl=0.3)
    other = open_store(lease_ttl=0.3)
    seen: list[str] = []

    @fence.once(intent="slow-async", domain="jobs")
    async def slow() -> int:
        for _ in range(6):
            await asyncio.sleep(0.1)
            try:
                other.prepare(slow.request(), takeover=True)
                seen.append("admitted")
            except FenceRefusal as exc:
                seen.append(exc.code)
        return 42

    assert asyncio.run(slow()) == 42
    assert seen == ["intent_in_flight"] * 6


def test_once_definite_failure_frees_the_intent_and_other_errors_fence_it(
        fence: Any, effect: Any) -> None:
    calls = {"n": 0}

    class Declined(Exception):
        pass

    @fence.once(intent="charge-{n}", domain="pay", failed_on=(Declined,))
    def charge(n: int, fail: str = "") -> str:
        calls["n"] += 1
        if fail == "declined":
            raise Declined("card declined")
        if fail == "timeout":
            effect.run()  # the effect happened, then the answer was lost
            raise TimeoutError("read timed out")
        return "charged"

    with pytest.raises(Declined):
        charge(1, "declined")
    assert fence.status("charge-1")["state"] == "failed"
    with pytest.raises(FenceRefusal):  # other args under the same intent: still a conflict
        charge(1)
    with pytest.raises(TimeoutError):
        charge(2, "timeout")
    st = fence.status("charge-2")
    assert st["state"] == "fenced" and "TimeoutError" in st["reason"]
    with pytest.raises(FenceRefusal) as info:
        charge(2, "timeout")
    assert info.value.code == "intent_fenced" and effect.count == 1


def test_once_racing_threads_call_the_function_once_and_all_get_its_result(
        fence: Any, effect: Any) -> None:
    @fence.once(intent="report", domain="reports", wait_s=10.0)
    def report() -> str:
        effect.run()
        time.sleep(0.1)
        return "the report"

    n = 10
    barrier = threading.Barrier(n)
    out: list[str] = []
    lock = threading.Lock()

    def call() -> None:
        barrier.wait()
        r = report()
        with lock:
            out.append(r)

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == ["the report"] * n and effect.count == 1


def test_once_result_that_is_not_json_fences_the_intent(fence: Any) -> None:
    @fence.once(intent="odd", domain="d")
    def odd() -> object:
        return object()

    with pytest.raises(UsageError):
        odd()
    assert fence.status("odd")["state"] == "fenced"


def test_once_arguments_that_are_not_json_are_refused_before_running(fence: Any) -> None:
    ran = []

    @fence.once(intent="m", domain="d")
    def m(x: object) -> None:
        ran.append(x)

    with pytest.raises(UsageError):
        m(object())
    assert not ran
