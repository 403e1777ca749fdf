#!/usr/bin/env python3
"""What deciding a transaction from outside costs: ``vote`` then ``decide commit`` against one
``commit`` (the baseline), through the library in one process, on the same one-file change.

A commit prepares, syncs its decision and applies under one lock. vote + decide do the same
work split in two (issue 17): the vote syncs a vote record and releases the locks; decide takes
them again, syncs the decision and applies as a redo (every target looked at again). The rounds
alternate in ABBA blocks so that machine noise hits both alike; fsyncs are counted (real calls).

    python benchmarks/vote_decide.py           # 200 rounds each
    python benchmarks/vote_decide.py --smoke   # CI
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

COORDINATOR = {"gtid": "g-bench", "store": "postgresql://coordinator.example:5432/coord"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    rounds = 10 if args.smoke else args.rounds
    from agent_2pc import Agent2PC

    result: dict = {"benchmark": "vote_decide", "machine": C.machine(), "rounds": rounds}
    with C.BenchDir("vote") as bench:
        result["disk"] = bench.describe(probe=False)
        root = os.path.join(bench.path, "ws")
        os.makedirs(root)
        for j in range(8):
            with open(os.path.join(root, f"f{j}.txt"), "w") as f:
                f.write("start\n")
        client = Agent2PC.init(root)
        counter = C.FsyncCounter().install()
        samples: dict[str, list[float]] = {"commit": [], "vote": [], "decide": [],
                                           "vote_and_decide": []}
        fsyncs: dict[str, int] = {"commit": 0, "vote_and_decide": 0}
        i = 0

        def one(kind: str) -> None:
            nonlocal i
            i += 1
            tx = client.begin()
            tx.stage_write(f"f{i % 8}.txt", f"round {i}\n")
            before = counter.fsync + counter.fdatasync
            if kind == "commit":
                t = C.now()
                tx.commit()
                samples["commit"].append(C.now() - t)
            else:
                t = C.now()
                tx.vote(COORDINATOR)
                t1 = C.now()
                client.decide(tx.tid, "commit")
                t2 = C.now()
                samples["vote"].append(t1 - t)
                samples["decide"].append(t2 - t1)
                samples["vote_and_decide"].append(t2 - t)
            fsyncs[kind] += counter.fsync + counter.fdatasync - before

        for _ in range(2):  # warm-up
            one("commit")
            one("vote_and_decide")
        for key in samples:
            samples[key].clear()
        fsyncs = {"commit": 0, "vote_and_decide": 0}
        for block in range(rounds // 2 or 1):  # ABBA
            order = ("commit", "vote_and_decide") if block % 2 == 0 else (
                "vote_and_decide", "commit")
            for kind in order:
                one(kind)
        counter.uninstall()
        client.close()
        n = len(samples["commit"])
        for key, values in samples.items():
            result[f"{key}_ms"] = C.latency_ms(values)
        result["fsyncs_per_round"] = {k: round(v / max(n, 1), 2) for k, v in fsyncs.items()}
        result["vote_and_decide_over_commit_p50"] = C.ratio(
            result["vote_and_decide_ms"]["p50"], result["commit_ms"]["p50"])
    C.emit(result, smoke=args.smoke)


if __name__ == "__main__":
    main()
