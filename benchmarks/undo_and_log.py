#!/usr/bin/env python3
"""What undo and the chained history cost, through the library in one process.

- undo: a transaction of K files (modified, created, deleted in equal parts) is committed, then
  undone; the undo's time is set against the commit's (the baseline: an undo is a commit of
  the inverse change, plus reading the pre-images).
- log: N transactions committed and compacted into the history, then ``log()`` (every entry,
  hashes included) and ``log(verify=True)`` (the whole chain re-hashed) are timed, against
  ``transactions()`` (the rows ``list`` reads from the same history: the baseline), with the
  history's size per line.

    python benchmarks/undo_and_log.py          # K = 10, 100, 1000; N = 10,000
    python benchmarks/undo_and_log.py --smoke  # CI
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def bench_undo(bench: C.BenchDir, k: int, reps: int) -> dict:
    from agent_2pc import Agent2PC

    commit_s, undo_s = [], []
    for rep in range(reps):
        root = os.path.join(bench.path, f"undo-{k}-{rep}")
        os.makedirs(root)
        client = Agent2PC.init(root)
        third = max(1, k // 3)
        for j in range(2 * third):  # the files to modify and to delete
            with open(os.path.join(root, f"f{j:05d}.txt"), "w") as f:
                f.write(f"before {j}\n" * 20)
        tx = client.begin()
        for j in range(third):
            tx.stage_write(f"f{j:05d}.txt", f"after {j}\n" * 20)
            tx.stage_delete(f"f{third + j:05d}.txt")
            tx.stage_write(f"new/n{j:05d}.txt", f"new {j}\n")
        t = C.now()
        tx.commit()
        commit_s.append(C.now() - t)
        t = C.now()
        out = client.undo(tx.tid)
        undo_s.append(C.now() - t)
        assert len(out["files"]) == 3 * third, out
        client.close()
    commit, undo = C.latency_ms(commit_s), C.latency_ms(undo_s)
    return {"files": 3 * max(1, k // 3), "commit_ms": commit, "undo_ms": undo,
            "undo_over_commit_p50": C.ratio(undo["p50"], commit["p50"])}


def bench_log(bench: C.BenchDir, n: int) -> dict:
    from agent_2pc import Agent2PC

    root = os.path.join(bench.path, "log")
    os.makedirs(root)
    client = Agent2PC.init(root)
    for i in range(n):
        tx = client.begin(label=f"n{i}")
        tx.stage_write(f"f{i % 100}.txt", f"{i}\n")
        tx.commit()
    client.compact()
    size = os.path.getsize(os.path.join(root, ".agent-tx", "history.jsonl"))
    fresh = Agent2PC(root)
    out: dict = {"transactions": n, "history_bytes": size,
                 "history_bytes_per_line": round(size / n, 1)}
    for name, call in (("list", lambda: fresh.transactions()),
                       ("log", lambda: fresh.log()),
                       ("log_verify", lambda: fresh.log(verify=True))):
        samples = []
        for _ in range(3):
            t = C.now()
            call()
            samples.append(C.now() - t)
        out[f"{name}_ms"] = C.latency_ms(samples)
    assert fresh.log(verify=True)["verified"] == n
    out["log_over_list_p50"] = C.ratio(out["log_ms"]["p50"], out["list_ms"]["p50"])
    out["verify_us_per_line_p50"] = round(out["log_verify_ms"]["p50"] * 1000 / n, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    ks, reps, n = ([3, 30], 2, 200) if args.smoke else ([10, 100, 1000], 5, 10_000)
    result: dict = {"benchmark": "undo_and_log", "machine": C.machine()}
    with C.BenchDir("undo") as bench:
        result["disk"] = bench.describe(probe=False)
        result["undo"] = []
        for k in ks:
            C.log(f"undo of {k} files")
            result["undo"].append(bench_undo(bench, k, reps))
        C.log(f"log of {n} transactions")
        result["log"] = bench_log(bench, n)
    C.emit(result, smoke=args.smoke)


if __name__ == "__main__":
    main()
