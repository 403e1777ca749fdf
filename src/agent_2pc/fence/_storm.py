"""The storm: many racers hammer one intent; the side effect itself says how often it ran.

Each attempt is one ``prepare``. The racer that is admitted appends one line to the effect file
(``O_APPEND``, fsync) and commits; every other attempt is refused while that is in flight and
replays the certificate afterwards (the late retries). ``executions`` is the number of lines in the
file -- counted from the effect, not from the fence. Racers are threads (``processes=1``) or
threads spread over worker processes (``python -m agent_2pc.fence._storm WORKER-JSON``) that all
start on one signal, after their start-up and store connection, so ``elapsed_ms`` measures the
decisions and not the start-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from ..errors import FenceRefusal, UsageError
from ._fence import redact

ATTEMPTS_MAX = 1_000_000
WORKERS_MAX = 1024
PROCESSES_MAX = 64
READY_TIMEOUT_S = 60.0     # worker processes must be connected and waiting by then
RUN_TIMEOUT_S = 600.0      # and finished by then (they are killed otherwise)


def _append_line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _run_threads(fence: Any, intent: str, effect_path: str, shares: list[int],
                 hold_s: float, tag: str, start: Any) -> dict[str, Any]:
    """Run one thread per share; ``start()`` is called once every thread waits at the barrier
    and returns when they may go. Returns counts and the decision latencies."""
    from ._types import EffectRequest, Fresh

    barrier = threading.Barrier(len(shares) + 1)
    lock = threading.Lock()
    latencies: list[float] = []
    counts = {"admitted": 0, "replayed": 0, "committed": 0}
    refused_by: dict[str, int] = {}
    ends: list[float] = []
    errors: list[BaseException] = []

    def racer(i: int, n: int) -> None:
        req = EffectRequest(intent=intent, domain="storm", tool="storm.append_line",
                            args={"append_to": effect_path}, agent=f"{tag}/racer-{i}")
        mine: list[float] = []
        local = {"admitted": 0, "replayed": 0, "committed": 0}
        refused: dict[str, int] = {}
        try:
            fence.store.snapshot(intent)  # connect before the start, not on the clock
            barrier.wait()
            for _ in range(n):
                t0 = time.perf_counter()
                try:
                    adm = fence.prepare(req)
                except FenceRefusal as exc:
                    mine.append(time.perf_counter() - t0)
                    refused[exc.code] = refused.get(exc.code, 0) + 1
                    continue
                mine.append(time.perf_counter() - t0)
                if isinstance(adm, Fresh):
                    local["admitted"] += 1
                    _append_line(effect_path, f"{tag}/racer-{i} token={adm.ticket.token}")
                    if hold_s:
                        time.sleep(hold_s)
                    fence.commit(adm.ticket, {"by": f"{tag}/racer-{i}"})
                    local["committed"] += 1
                else:
                    local["replayed"] += 1
        except BaseException as exc:  # reported to the caller, who fails the storm
            with lock:
                errors.append(exc)
        finally:
            end = time.monotonic()
            with lock:
                latencies.extend(mine)
                for k, v in local.items():
                    counts[k] += v
                for k, v in refused.items():
                    refused_by[k] = refused_by.get(k, 0) + v
                ends.append(end)

    threads = [threading.Thread(target=racer, args=(i, n), daemon=True)
               for i, n in enumerate(shares)]
    for t in threads:
        t.start()
    start(barrier)
    for t in threads:
        t.join(RUN_TIMEOUT_S)
    if errors:
        raise errors[0]
    return {**counts, "refused_by": refused_by, "latencies": latencies,
            "end": max(ends) if ends else time.monotonic()}


def _shares(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    idx = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[idx]


def storm(url: str, *, attempts: int, workers: int, processes: int = 1,
          effect_path: str | None = None, intent: str | None = None, hold_s: float = 0.0,
          lease_ttl: float = 60.0) -> dict[str, Any]:
    """Hammer one intent; return ``{executions, replayed, refused, elapsed_ms, ...}``."""
    for name, value, top in (("attempts", attempts, ATTEMPTS_MAX), ("workers", workers,
                             WORKERS_MAX), ("processes", processes, PROCESSES_MAX)):
        if type(value) is not int or not 1 <= value <= top:
            raise UsageError(f"{name} must be a whole number in [1, {top}]")
    if workers < processes:
        raise UsageError("workers must be at least processes (each process runs some workers)")
    if attempts < workers:
        raise UsageError("attempts must be at least workers")
    if processes > 1 and url.startswith("memory://"):
        raise UsageError("the memory store lives in one process: `processes` must be 1",
                         params=("processes",))
    if not isinstance(hold_s, (int, float)) or not 0 <= hold_s <= 60:
        raise UsageError("hold_s must be in [0, 60]")
    intent = intent or f"storm-{uuid.uuid4().hex[:16]}"
    own_file = effect_path is None
    if effect_path is None:
        fd, effect_path = tempfile.mkstemp(prefix="fence-storm-", suffix=".effects")
        os.close(fd)
    effect_path = os.path.abspath(effect_path)
    try:
        if processes == 1:
            result = _storm_threads(url, intent, effect_path, attempts, workers, hold_s,
                                    lease_ttl)
        else:
            result = _storm_processes(url, intent, effect_path, attempts, workers, processes,
                                      hold_s, lease_ttl)
        with open(effect_path, encoding="utf-8") as f:
            executions = sum(1 for line in f if line.strip())
    finally:
        if own_file:
            try:
                os.unlink(effect_path)
            except FileNotFoundError:
                pass
    lat = sorted(result.pop("latencies"))
    elapsed_s = max(result.pop("elapsed_s"), 1e-9)
    refused_by = result["refused_by"]
    out = {"executions": executions, "attempts": attempts, "admitted": result["admitted"],
           "replayed": result["replayed"], "refused": sum(refused_by.values()),
           "refused_by": dict(sorted(refused_by.items())), "committed": result["committed"],
           "elapsed_ms": round(elapsed_s * 1000, 3),
           "decision_ms_sum": round(sum(lat) * 1000, 3),
           "attempts_per_s": round(attempts / elapsed_s, 1),
           "p50_ms": round(_percentile(lat, 0.50) * 1000, 4),
           "p99_ms": round(_percentile(lat, 0.99) * 1000, 4),
           "store": redact(url), "workers": workers, "processes": processes, "intent": intent}
    if not own_file:
        out["effect_file"] = effect_path
    return out


def _storm_threads(url: str, intent: str, effect_path: str, attempts: int, workers: int,
                   hold_s: float, lease_ttl: float) -> dict[str, Any]:
    from . import open_fence

    go: list[float] = []

    def start(barrier: threading.Barrier) -> None:
        barrier.wait()
        go.append(time.monotonic())

    with open_fence(url, lease_ttl=lease_ttl) as fence:
        res = _run_threads(fence, intent, effect_path, _shares(attempts, workers), hold_s,
                           f"p{os.getpid()}", start)
    res["elapsed_s"] = res.pop("end") - go[0]
    return res


def _storm_processes(url: str, intent: str, effect_path: str, attempts: int, workers: int,
                     processes: int, hold_s: float, lease_ttl: float) -> dict[str, Any]:
    per_proc_attempts = _shares(attempts, processes)
    per_proc_workers = _shares(workers, processes)
    procs: list[subprocess.Popen[str]] = []
    killed = threading.Event()

    def kill_all() -> None:
        killed.set()
        for p in procs:
            if p.poll() is None:
                p.kill()

    try:
        for i in range(processes):
            cfg = {"url": url, "intent": intent, "effect_path": effect_path,
                   "shares": _shares(per_proc_attempts[i], per_proc_workers[i]),
                   "hold_s": hold_s, "lease_ttl": lease_ttl, "tag": f"proc-{i}"}
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "agent_2pc.fence._storm", json.dumps(cfg)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True))
        watchdog = threading.Timer(READY_TIMEOUT_S, kill_all)
        watchdog.start()
        try:
            for p in procs:
                assert p.stdout is not None
                line = p.stdout.readline()
                if line.strip() != "ready":
                    raise RuntimeError("a storm worker did not start: "
                                       + (line + _stderr(p)).strip()[-2000:])
        finally:
            watchdog.cancel()
        watchdog = threading.Timer(RUN_TIMEOUT_S, kill_all)
        watchdog.start()
        try:
            t_go = time.monotonic()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            results = []
            for p in procs:
                assert p.stdout is not None
                out = p.stdout.read()
                p.wait()
                if p.returncode != 0 or not out.strip():
                    raise RuntimeError(f"a storm worker failed (exit {p.returncode}): "
                                       + _stderr(p)[-2000:])
                results.append(json.loads(out))
        finally:
            watchdog.cancel()
        if killed.is_set():
            raise RuntimeError("the storm's workers ran out of time and were killed")
    finally:
        kill_all()
        for p in procs:
            p.wait()
            for stream in (p.stdin, p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
    total: dict[str, Any] = {"admitted": 0, "replayed": 0, "committed": 0, "refused_by": {},
                             "latencies": []}
    for r in results:
        for k in ("admitted", "replayed", "committed"):
            total[k] += r[k]
        for k, v in r["refused_by"].items():
            total["refused_by"][k] = total["refused_by"].get(k, 0) + v
        total["latencies"].extend(r["latencies"])
    total["elapsed_s"] = max(r["end"] for r in results) - t_go
    return total


def _stderr(p: subprocess.Popen[str]) -> str:
    try:
        return p.stderr.read() if p.stderr is not None else ""
    except (OSError, ValueError):
        return ""


def _worker(cfg: dict[str, Any]) -> None:
    from . import open_fence

    def start(barrier: threading.Barrier) -> None:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        if sys.stdin.readline().strip() != "go":
            raise SystemExit(3)
        barrier.wait()

    with open_fence(cfg["url"], lease_ttl=cfg["lease_ttl"]) as fence:
        res = _run_threads(fence, cfg["intent"], cfg["effect_path"], cfg["shares"],
                           cfg["hold_s"], cfg["tag"], start)
    sys.stdout.write(json.dumps(res) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
