"""A separate process for the fence tests (run as a script, never imported by pytest).

    fence_worker.py crash URL INTENT EFFECT_FILE LEASE_TTL
        prepare, run the effect, print "effect-done", then hang until killed (the crash between
        effect and commit).
    fence_worker.py race URL INTENT EFFECT_FILE GO_FILE ATTEMPTS
        wait for GO_FILE, then attempt the intent until it is done; print a JSON summary.
    fence_worker.py skewed URL INTENT OFFSET_S
        with time.time() off by OFFSET_S seconds in this process, try to take the intent over;
        print a JSON summary of what the store answered.
"""

from __future__ import annotations

import json
import os
import sys
import time


def effect(path: str, tag: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (tag + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def request(intent: str, agent: str) -> object:
    from agent_2pc.fence import EffectRequest

    return EffectRequest(intent=intent, domain="pay", tool="charge", args={"amount": 5},
                         agent=agent)


def crash(url: str, intent: str, path: str, lease_ttl: str) -> None:
    from agent_2pc.fence import open_fence

    fence = open_fence(url, lease_ttl=float(lease_ttl))
    adm = fence.prepare(request(intent, f"crasher-{os.getpid()}"))
    effect(path, f"crasher {os.getpid()}")
    print("effect-done", json.dumps(adm.ticket.to_json()), flush=True)
    time.sleep(120)  # killed here, between the effect and the commit


def race(url: str, intent: str, path: str, go_file: str, attempts: str) -> None:
    from agent_2pc.errors import FenceRefusal
    from agent_2pc.fence import Fresh, open_fence

    out = {"fresh": 0, "replayed": 0, "refused": 0, "result": None}
    with open_fence(url) as fence:
        req = request(intent, f"racer-{os.getpid()}")
        fence.store.snapshot(intent)  # connect before the start
        print("ready", flush=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(go_file):
            if time.monotonic() > deadline:
                raise SystemExit("no go")
            time.sleep(0.001)
        for _ in range(int(attempts)):
            try:
                adm = fence.prepare(req)
            except FenceRefusal:
                out["refused"] += 1
                time.sleep(0.001)
                continue
            if isinstance(adm, Fresh):
                out["fresh"] += 1
                effect(path, f"racer {os.getpid()}")
                fence.commit(adm.ticket, {"by": os.getpid()})
            else:
                out["replayed"] += 1
                out["result"] = adm.result
                break
    print(json.dumps(out), flush=True)


def skewed(url: str, intent: str, offset_s: str) -> None:
    real = time.time
    offset = float(offset_s)
    time.time = lambda: real() + offset  # this client's clock is off
    from agent_2pc.errors import FenceRefusal
    from agent_2pc.fence import open_fence

    with open_fence(url, lease_ttl=60.0) as fence:
        try:
            adm = fence.prepare(request(intent, f"skewed-{os.getpid()}"), takeover=True)
            out = {"answer": adm.status, "lease_expires_at": getattr(adm, "lease_expires_at",
                                                                     None)}
        except FenceRefusal as exc:
            out = {"answer": exc.code, **exc.details}
        out["client_time"] = time.time()
        out["store_time"] = fence.store.now()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    {"crash": crash, "race": race, "skewed": skewed}[sys.argv[1]](*sys.argv[2:])
