#!/usr/bin/env python3
"""Staged view: the overhead of running ``true`` in the view, per tier, on repos of 1k and 20k
files, side by side with ``git worktree add`` and a plain copy of the same repo, in one run.

For each repo size a git repository is built (files of ~300 bytes, 50 per directory, two levels
deep), committed, made a workspace, and given an active transaction that stages 10 writes
(one in a new directory) and 2 deletes. Then, interleaved (the order rotates every iteration):

  <tier>            StagedView(...) + run(["true"]) + capture()       (the critical path)
                    and close() timed on its own (it is off the critical path: large scratch
                    goes to the trash and is deleted in the background)
  true              subprocess.run(["true"]) -- the command itself, subtracted as the baseline
  git_worktree_add  git worktree add --detach DIR HEAD  (its removal timed on its own)
  plain_copy        copying the work tree (.git and .agent-tx left out), shutil.copytree

``overhead_ms`` = a tier's critical path minus the median of ``true``.

Targets (issue 4): overlay overhead <= 20 ms median; growing <= 1.5x from 1k to 20k files;
>= 10x faster than git worktree add on 20k files.

    python benchmarks/staged_view.py                 # 1k and 20k files, 30 runs (slow ones fewer)
    python benchmarks/staged_view.py --smoke         # CI: small repos, few runs
    python benchmarks/staged_view.py --sizes 1000,20000,100000 --runs 50
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

TARGET_OVERLAY_MS = 20.0
TARGET_GROWTH = 1.5
TARGET_VS_WORKTREE = 10.0
FILES_PER_DIR = 50
FILE_BYTES = 300
STAGED_WRITES = 10
STAGED_DELETES = 2
GIT_TIMEOUT_S = 600


def git(repo: str, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    subprocess.run(["git", "-C", repo, "-c", "user.email=bench@example.com",
                    "-c", "user.name=bench", *args], check=True, capture_output=True, env=env,
                   timeout=GIT_TIMEOUT_S)


def build_repo(root: str, files: int) -> dict:
    """A committed git repo of ``files`` files, a workspace, and a transaction staged in it."""
    from agent_2pc import Agent2PC

    t0 = C.now()
    os.makedirs(root)
    line = ("x" * 59 + "\n").encode()
    body = line * (FILE_BYTES // len(line))
    paths = []
    for n in range(files):
        d = n // FILES_PER_DIR
        rel = f"pkg{d // FILES_PER_DIR:03d}/mod{d % FILES_PER_DIR:03d}/f{n:06d}.txt"
        path = os.path.join(root, rel)
        if n % FILES_PER_DIR == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(f"{n}\n".encode() + body)
        paths.append(rel)
    written = C.now() - t0
    subprocess.run(["git", "init", "-q", root], check=True, capture_output=True)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "bench")
    committed = C.now() - t0
    client = Agent2PC.init(root)
    tx = client.begin(label="staged view bench")
    step = max(1, files // (STAGED_WRITES + STAGED_DELETES))
    picks = paths[::step]
    for rel in picks[:STAGED_WRITES - 1]:
        tx.stage_write(rel, f"staged {rel}\n")
    tx.stage_write("newdir/new_file.txt", "a new file in a new directory\n")
    for rel in picks[STAGED_WRITES - 1:STAGED_WRITES - 1 + STAGED_DELETES]:
        tx.stage_delete(rel)
    # Let the writeback of all that finish: the figures are the view's, not this setup's.
    os.sync()
    return {"client": client, "tid": tx.tid, "paths": paths,
            "info": {"files": files, "write_s": round(written, 2),
                     "git_commit_s": round(committed - written, 2),
                     "staged_ops": len(client.engine.txs[tx.tid].changes())}}


def summary_ms(samples_s: list[float]) -> dict:
    s = sorted(x * 1000 for x in samples_s)
    return {"n": len(s), "median_ms": C.r3(statistics.median(s)), "p90_ms": C.r3(C.pct(s, 0.9)),
            "min_ms": C.r3(s[0]), "max_ms": C.r3(s[-1])}


def time_tier(repo: dict, root: str, tier: str) -> tuple[float, float, float]:
    """(critical path, close, setup inside run) in seconds for one view running ``true``."""
    from agent_2pc.isolation import StagedView

    engine = repo["client"].engine
    t0 = C.now()
    view = StagedView(root, engine.txs[repo["tid"]].changes(), engine.blobs, tier=tier)
    res = view.run(["true"], timeout_s=600)
    view.capture()
    t1 = C.now()
    view.close()
    t2 = C.now()
    if res.exit_code != 0 or res.tier != tier:
        raise SystemExit(f"{tier}: `true` failed in the view: {res!r} {res.tail!r}")
    return t1 - t0, t2 - t1, (res.setup_ms or 0.0) / 1000


def time_true() -> float:
    t0 = C.now()
    subprocess.run(["true"], check=True)
    return C.now() - t0


def time_worktree(root: str, scratch: str, i: int) -> tuple[float, float]:
    dest = os.path.join(scratch, f"wt-{i}")
    t0 = C.now()
    git(root, "worktree", "add", "-q", "--detach", dest, "HEAD")
    t1 = C.now()
    git(root, "worktree", "remove", "--force", dest)
    t2 = C.now()
    return t1 - t0, t2 - t1


def time_plain_copy(root: str, scratch: str, i: int) -> tuple[float, float]:
    dest = os.path.join(scratch, f"copy-{i}")
    skip = {os.path.join(root, ".git"), os.path.join(root, ".agent-tx")}

    def ignore(d: str, names: list[str]) -> list[str]:
        return [n for n in names if os.path.join(d, n) in skip]

    t0 = C.now()
    shutil.copytree(root, dest, symlinks=True, ignore=ignore)
    t1 = C.now()
    shutil.rmtree(dest)
    t2 = C.now()
    return t1 - t0, t2 - t1


def wait_for_background_deletes(root: str, budget_s: float = 600.0) -> float:
    """Wait until the scratch that views sent to be deleted in the background is gone (the
    workspace's trash, and copies renamed aside in the temp dir); return the seconds waited.
    Keeps one phase's deletes from slowing the next phase down."""
    import glob
    import tempfile
    import time

    t0 = C.now()
    pattern = os.path.join(tempfile.gettempdir(), f"agent-2pc-{os.getuid()}-copy-*.trash-*")
    trash = os.path.join(root, ".agent-tx", "trash")
    deadline = time.monotonic() + budget_s
    while (glob.glob(pattern) or (os.path.isdir(trash) and os.listdir(trash))) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    return C.now() - t0


def bench_size(files: int, runs: int, slow_runs: int, tiers: list[str]) -> dict:
    with C.BenchDir(f"view{files}") as d:
        root = os.path.join(d.path, "repo")
        scratch = os.path.join(d.path, "scratch")
        os.makedirs(scratch)
        C.log(f"building a repo of {files} files")
        repo = build_repo(root, files)
        root = os.path.realpath(root)
        samples: dict[str, dict[str, list[float]]] = {}
        slow = {"copy", "git_worktree_add", "plain_copy"}
        fast = [m for m in [*tiers, "true"] if m not in slow]
        slower = [m for m in [*tiers, "git_worktree_add", "plain_copy"] if m in slow]
        waited = 0.0
        # Two phases, each interleaved (the order rotates every iteration): the fast ones,
        # then the slow ones (whose large deletes run in the background and would otherwise
        # slow the fast ones down); every method once untimed first.
        for phase, methods, n in (("fast", fast, runs), ("slow", slower, slow_runs)):
            for m in methods:
                run_one(m, repo, root, scratch, -1, samples, record=False)
            waited += wait_for_background_deletes(root)
            os.sync()
            for i in range(n):
                order = methods[i % len(methods):] + methods[:i % len(methods)]
                for m in order:
                    run_one(m, repo, root, scratch, i, samples, record=True)
                if i and i % 10 == 0:
                    C.log(f"  {files} files, {phase}: {i}/{n}")
            waited += wait_for_background_deletes(root)
        base = statistics.median(samples["true"]["critical"])
        out: dict = {"repo": repo["info"], "dir": d.describe(),
                     "waited_for_background_deletes_s": round(waited, 2),
                     "true": summary_ms(samples["true"]["critical"])}
        for m in [*tiers, "git_worktree_add", "plain_copy"]:
            crit = samples[m]["critical"]
            row = summary_ms(crit)
            if m in tiers:
                row["overhead_ms"] = C.r3((statistics.median(crit) - base) * 1000)
                row["close"] = summary_ms(samples[m]["close"])
                row["setup_in_run_median_ms"] = C.r3(statistics.median(samples[m]["setup"])
                                                     * 1000)
            else:
                row["cleanup"] = summary_ms(samples[m]["close"])
            out[m] = row
        repo["client"].engine.log.close()
        return out


def run_one(m: str, repo: dict, root: str, scratch: str, i: int, samples: dict,
            record: bool) -> None:
    if m == "true":
        vals = {"critical": time_true()}
    elif m == "git_worktree_add":
        a, b = time_worktree(root, scratch, i)
        vals = {"critical": a, "close": b}
    elif m == "plain_copy":
        a, b = time_plain_copy(root, scratch, i)
        vals = {"critical": a, "close": b}
    else:
        a, b, s = time_tier(repo, root, m)
        vals = {"critical": a, "close": b, "setup": s}
    if record:
        row = samples.setdefault(m, {})
        for k, v in vals.items():
            row.setdefault(k, []).append(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,20000", help="repo sizes in files, comma-separated")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--slow-runs", type=int, default=5,
                    help="runs of the slow methods (copy tier, worktree, plain copy)")
    ap.add_argument("--tiers", default="", help="tiers to time (default: all the host has)")
    ap.add_argument("--smoke", action="store_true", help="CI: small repos, few runs")
    args = ap.parse_args()
    from agent_2pc.isolation import TIERS, probe_tiers

    probe = probe_tiers()
    tiers = [t for t in (args.tiers.split(",") if args.tiers else TIERS) if probe[t] is None]
    sizes = [int(x) for x in args.sizes.split(",")]
    runs, slow_runs = args.runs, args.slow_runs
    if args.smoke:
        sizes, runs, slow_runs = [200, 2000], 5, 2
    result: dict = {"benchmark": "staged_view", "smoke": args.smoke,
                    "machine": C.machine(), "tiers_available": probe, "runs": runs,
                    "slow_runs": slow_runs, "staged": {"writes": STAGED_WRITES,
                                                       "deletes": STAGED_DELETES},
                    "sizes": {}}
    for n in sizes:
        result["sizes"][str(n)] = bench_size(n, runs, slow_runs, tiers)
    result["targets"] = targets(result["sizes"], sizes)
    C.emit(result)


def targets(by_size: dict, sizes: list[int]) -> dict:
    out: dict = {}
    small, large = str(min(sizes)), str(max(sizes))
    if "overlay" not in by_size[large]:
        return {"skipped": "no overlay tier on this host"}
    o_small, o_large = by_size[small]["overlay"], by_size[large]["overlay"]
    worst = max(o_small["overhead_ms"], o_large["overhead_ms"])
    out["overlay_overhead_median_ms"] = {"target_max": TARGET_OVERLAY_MS, "value": worst,
                                         "met": worst <= TARGET_OVERLAY_MS}
    growth = C.ratio(o_large["overhead_ms"], o_small["overhead_ms"])
    out[f"overlay_growth_{small}_to_{large}"] = {
        "target_max": TARGET_GROWTH, "value": growth,
        "met": growth is not None and growth <= TARGET_GROWTH}
    speedup = C.ratio(by_size[large]["git_worktree_add"]["median_ms"], o_large["median_ms"])
    out[f"overlay_vs_git_worktree_add_{large}"] = {
        "target_min": TARGET_VS_WORKTREE, "value": speedup,
        "met": speedup is not None and speedup >= TARGET_VS_WORKTREE,
        "note": "the view's whole critical path (true included) against worktree add alone"}
    return out


if __name__ == "__main__":
    main()
