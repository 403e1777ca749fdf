#!/usr/bin/env python3
"""Commit-time merge overhead: a commit that must merge another writer's edit vs a clean commit.

One round stages one edit (``stage_replace`` of one function) of a Python file of ``--lines``
lines through the library, then commits it. In a *clean* round nobody else touched the file; in
a *merged* round another writer (this process, outside any transaction, as an editor would) has
rewritten another function of the file between staging and commit, so the commit merges
(three-way, coordinator/rebase.py) and commits both edits. Only ``commit()`` is timed; the two
kinds alternate in ABBA blocks so that machine noise hits both alike. The baseline is the clean
commit, measured in the same run.

``--with-check`` adds a check (``stage_cmd("true")``) to every transaction: a merged commit runs
it again on the merged content (a staged view and a process), a clean one does not. Also
reported: the three-way merge alone (core/merge3way.py) on the same texts, and the staging cost
(which now keeps each file's base as a blob; the same in both kinds of round).

    python benchmarks/merge_commit.py                # 100, 2,000 and 20,000 lines
    python benchmarks/merge_commit.py --smoke        # a few seconds, for CI
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def source(lines: int) -> str:
    """A Python file of about ``lines`` lines: functions of 4 lines each."""
    return "".join(f"def f{i}(x):\n    y = x + {i}\n    return y\n\n"
                   for i in range(max(lines // 4, 4)))


def one_round(client, path: str, full: str, text: str, k: int, merged: bool,
              check: bool) -> tuple[float, float]:
    """(staging seconds, commit seconds) of one round; ``k`` picks the functions edited."""
    n = text.count("def f")
    mine, theirs = k % (n // 2), n // 2 + k % (n // 2)
    with open(full, "w", encoding="utf-8") as f:  # every round starts from the same text
        f.write(text)
    t0 = C.now()
    tx = client.begin()
    tx.stage_replace(path, f"    y = x + {mine}\n", f"    y = x * {mine}\n")
    if check:
        tx.stage_cmd("true")
    t1 = C.now()
    if merged:  # another writer, meanwhile
        with open(full, "w", encoding="utf-8") as f:
            f.write(text.replace(f"    y = x + {theirs}\n", f"    y = x - {theirs}\n"))
    t2 = C.now()
    out = tx.commit()
    t3 = C.now()
    assert out["merged"] == ([path] if merged else []), out
    return t1 - t0, t3 - t2


def bench_size(bench_dir: str, lines: int, rounds: int, check: bool) -> dict:
    from agent_2pc import Agent2PC
    from agent_2pc.core.merge3way import merge

    root = os.path.join(bench_dir, f"lines-{lines}-{'check' if check else 'plain'}")
    os.makedirs(root)
    client = Agent2PC.init(root)
    text = source(lines)
    path = "lib.py"
    full = os.path.join(root, path)
    stage: dict[str, list[float]] = {"clean": [], "merged": []}
    commit: dict[str, list[float]] = {"clean": [], "merged": []}
    for kind in ("clean", "merged"):  # warm-up, not counted
        one_round(client, path, full, text, 1, kind == "merged", check)
    k = 0
    for block in range(rounds):
        order = ("clean", "merged") if block % 2 == 0 else ("merged", "clean")
        for kind in order:
            k += 1
            s, c = one_round(client, path, full, text, k, kind == "merged", check)
            stage[kind].append(s)
            commit[kind].append(c)
    client.close()
    n = text.count("def f")
    base = text.encode()
    ours = text.replace(f"    y = x + {n - 1}\n", f"    y = x - {n - 1}\n").encode()
    theirs = text.replace("    y = x + 1\n", "    y = x * 1\n").encode()
    alone = []
    for _ in range(max(3, rounds // 4)):
        t0 = C.now()
        assert merge(base, ours, theirs).clean
        alone.append(C.now() - t0)
    clean_ms = C.latency_ms(commit["clean"])
    merged_ms = C.latency_ms(commit["merged"])
    return {"lines": text.count("\n"), "bytes": len(base), "rounds_each": len(commit["clean"]),
            "check": check,
            "commit_clean_ms": clean_ms, "commit_merged_ms": merged_ms,
            "overhead_p50_ms": C.r3(merged_ms["p50"] - clean_ms["p50"]),
            "ratio_p50": C.ratio(merged_ms["p50"], clean_ms["p50"]),
            "merge_alone_ms": C.latency_ms(alone),
            "stage_clean_ms": C.latency_ms(stage["clean"]),
            "stage_merged_ms": C.latency_ms(stage["merged"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, nargs="+", default=[100, 2000, 20000])
    ap.add_argument("--rounds", type=int, default=40, help="rounds of each kind")
    ap.add_argument("--check-rounds", type=int, default=16,
                    help="rounds of each kind with a check (0: none)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.lines, args.rounds, args.check_rounds = [100], 3, 1
    result: dict = {"benchmark": "merge_commit", "machine": C.machine()}
    with C.BenchDir("merge") as bench:
        result["dir"] = bench.describe(probe=not args.smoke)
        result["params"] = {"lines": args.lines, "rounds": args.rounds,
                            "check_rounds": args.check_rounds, "smoke": args.smoke}
        sizes = []
        for lines in args.lines:
            C.log(f"merge_commit: {lines} lines")
            sizes.append(bench_size(bench.path, lines, args.rounds, False))
        if args.check_rounds:
            C.log(f"merge_commit: {args.lines[0]} lines, with a check")
            sizes.append(bench_size(bench.path, args.lines[0], args.check_rounds, True))
        result["by_size"] = sizes
    C.emit(result, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
