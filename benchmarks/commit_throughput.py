#!/usr/bin/env python3
"""Commit throughput: full transactions through the library vs a minimal durable commit loop.

One round of the library is what an agent does for a one-file change:
``tx = client.begin(); tx.stage_write(path, content); tx.commit()`` (fsync on; the library has
no switch to turn it off). One round of the minimal loop is the least a durable redo-logged
commit of one file can do, written by hand on the same file system:

  1. append begin + stage (content inline) + commit-decision frames to a WAL, fsync;
  2. write a temp file next to the target, fsync it, rename it over the target, fsync the
     directory;
  3. append an end frame, fsync.

Both run in the same process, alternating in blocks (ABBA order) so that machine noise hits
both alike. Both overwrite one of ``--files`` existing small files, with new content each round.
fsyncs are counted by wrapping os.fsync/os.fdatasync (real calls, not assumed), and the time
spent inside them is measured, so "time outside fsync" shows the software overhead.

Target (issue 2): library latency within 1.5x of the minimal loop.

    python benchmarks/commit_throughput.py            # 200 rounds each
    python benchmarks/commit_throughput.py --smoke    # a few seconds, for CI
    python benchmarks/commit_throughput.py --only library --rounds 500   # e.g. under strace -c -f
    python benchmarks/commit_throughput.py --profile  # + cProfile of extra library rounds
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

TARGET_RATIO = 1.5
# The issue's reading of the ratio target: "that loop reaches about 1,000 tx/s here, so roughly
# >= 650 committed tx/s". Reported for reference; the ratio measured side by side is the target.
ABSOLUTE_FLOOR_TX_S = 650


# -- the minimal durable commit loop (hand-written; same frame format as the library's WAL) ----

_HEADER = struct.Struct("<4sBII")
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def frame(record: dict) -> bytes:
    payload = _dumps(record).encode("utf-8")
    return _HEADER.pack(b"A2PC", 1, len(payload), zlib.crc32(payload)) + payload


class MinimalLoop:
    """The least work that makes one file change durable and atomic with a redo log."""

    def __init__(self, tree: str, meta: str) -> None:
        self.tree = tree
        os.makedirs(meta, exist_ok=True)
        self.wal = os.open(os.path.join(meta, "wal.bin"),
                           os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.dir_fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)

    def commit(self, n: int, name: str, content: bytes) -> None:
        tid = f"m-{n}"
        ts = 0
        recs = (frame({"type": "begin", "tid": tid, "ts": ts})
                + frame({"type": "stage", "tid": tid, "ts": ts, "path": name,
                         "content": content.decode("utf-8")})
                + frame({"type": "decision", "tid": tid, "ts": ts, "outcome": "commit"}))
        os.write(self.wal, recs)
        os.fsync(self.wal)
        tmp = f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=self.dir_fd)
        try:
            os.write(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        os.fsync(self.dir_fd)
        os.write(self.wal, frame({"type": "end", "tid": tid, "ts": ts}))
        os.fsync(self.wal)

    def close(self) -> None:
        os.close(self.wal)
        os.close(self.dir_fd)


# -- the library round ----------------------------------------------------------------------


class LibraryLoop:
    def __init__(self, root: str) -> None:
        from agent_2pc import Agent2PC

        self.client = Agent2PC.init(root)
        self.compactions: list[float] = []
        part = self.client.engine.compaction  # the part that compacts (automatic or asked)
        compact = part.compact

        def timed_compact(*a: object, **k: object) -> dict:  # instrumentation: count and time
            t = C.now()                                        # automatic compaction
            try:
                return compact(*a, **k)
            finally:
                self.compactions.append(C.now() - t)

        part.compact = timed_compact  # type: ignore[method-assign]
        self.phases: dict[str, list[float]] = {"begin": [], "stage_write": [], "commit": []}

    def commit(self, n: int, name: str, content: bytes) -> None:
        t0 = C.now()
        tx = self.client.begin()
        t1 = C.now()
        tx.stage_write(name, content)
        t2 = C.now()
        out = tx.commit()
        t3 = C.now()
        assert out["state"] == "committed", out
        self.phases["begin"].append(t1 - t0)
        self.phases["stage_write"].append(t2 - t1)
        self.phases["commit"].append(t3 - t2)


def content_for(n: int, size: int) -> bytes:
    head = f"round {n}\n".encode()
    return head + b"x" * max(0, size - len(head) - 1) + b"\n"


def seed_files(tree: str, files: int, size: int) -> list[str]:
    names = [f"file{k:02d}.txt" for k in range(files)]
    for name in names:
        with open(os.path.join(tree, name), "wb") as f:
            f.write(content_for(-1, size))
    return names


def run_side(loop, counter: C.FsyncCounter, n0: int, count: int, names: list[str], size: int,
             lat: list[float], fs: list[int], fs_time: list[float]) -> None:
    for n in range(n0, n0 + count):
        name = names[n % len(names)]
        content = content_for(n, size)
        f0, s0 = counter.snapshot()
        t = C.now()
        loop.commit(n, name, content)
        lat.append(C.now() - t)
        f1, s1 = counter.snapshot()
        fs.append(f1 - f0)
        fs_time.append(s1 - s0)


def summarize(lat: list[float], fs: list[int], fs_time: list[float]) -> dict:
    total = sum(lat)
    n = len(lat)
    return {
        "rounds": n,
        "tx_per_s": round(n / total, 1) if total else None,
        "latency_ms": C.latency_ms(lat),
        "fsyncs_per_tx": round(sum(fs) / n, 3) if n else None,
        "fsyncs_per_tx_min_max": [min(fs), max(fs)] if fs else None,
        "fsync_ms_per_tx": C.r3(sum(fs_time) / n * 1000) if n else None,
        "non_fsync_ms_per_tx": C.r3((total - sum(fs_time)) / n * 1000) if n else None,
    }


def profile_library(args: argparse.Namespace, bench: C.BenchDir) -> list[dict]:
    import cProfile
    import pstats

    root = os.path.join(bench.path, "profile")
    os.makedirs(root)
    names = seed_files(root, args.files, args.size)
    loop = LibraryLoop(root)
    for n in range(10):
        loop.commit(n, names[n % len(names)], content_for(n, args.size))
    prof = cProfile.Profile()
    rounds = args.rounds
    prof.enable()
    for n in range(10, 10 + rounds):
        loop.commit(n, names[n % len(names)], content_for(n, args.size))
    prof.disable()
    stats = pstats.Stats(prof, stream=sys.stderr)
    stats.sort_stats("tottime").print_stats(30)
    rows = []
    table = stats.stats  # type: ignore[attr-defined]
    for (file, line, func), (_cc, nc, tt, ct, _callers) in table.items():
        rows.append({"function": f"{os.path.basename(file)}:{line}({func})",
                     "calls_per_tx": round(nc / rounds, 2),
                     "self_ms_per_tx": C.r3(tt / rounds * 1000),
                     "cumulative_ms_per_tx": C.r3(ct / rounds * 1000)})
    rows.sort(key=lambda r: -r["self_ms_per_tx"])
    return rows[:20]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200, help="timed rounds per side")
    ap.add_argument("--warmup", type=int, default=20, help="untimed rounds per side first")
    ap.add_argument("--block", type=int, default=10, help="rounds per block (sides alternate)")
    ap.add_argument("--files", type=int, default=10, help="files cycled through")
    ap.add_argument("--size", type=int, default=200, help="bytes per file")
    ap.add_argument("--only", choices=("library", "minimal"), help="run one side only")
    ap.add_argument("--profile", action="store_true",
                    help="also cProfile --rounds extra library rounds (table on stderr)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.warmup, args.block = 20, 2, 5

    result: dict = {"benchmark": "commit_throughput", "machine": C.machine()}
    counter = C.FsyncCounter().install()
    try:
        with C.BenchDir("commit") as bench:
            result["dir"] = bench.describe()
            lib_root = os.path.join(bench.path, "lib")
            min_root = os.path.join(bench.path, "minimal")
            os.makedirs(lib_root)
            os.makedirs(os.path.join(min_root, "tree"))
            lib_names = seed_files(lib_root, args.files, args.size)
            min_names = seed_files(os.path.join(min_root, "tree"), args.files, args.size)
            sides = {}
            if args.only != "minimal":
                sides["library"] = (LibraryLoop(lib_root), lib_names)
            if args.only != "library":
                sides["minimal"] = (MinimalLoop(os.path.join(min_root, "tree"),
                                                os.path.join(min_root, "meta")), min_names)
            data = {k: ([], [], []) for k in sides}
            n_next = {k: 0 for k in sides}
            scratch = ([], [], [])
            for name, (loop, names) in sides.items():  # warm-up, not recorded
                run_side(loop, counter, 0, args.warmup, names, args.size, *scratch)
                n_next[name] = args.warmup
            if "library" in sides:
                sides["library"][0].compactions.clear()
                for v in sides["library"][0].phases.values():
                    v.clear()
            order = list(sides)
            done = 0
            block_no = 0
            C.log(f"commit_throughput: {args.rounds} rounds per side, blocks of {args.block}")
            while done < args.rounds:
                count = min(args.block, args.rounds - done)
                seq = order if block_no % 2 == 0 else order[::-1]  # ABBA
                for name in seq:
                    loop, names = sides[name]
                    run_side(loop, counter, n_next[name], count, names, args.size, *data[name])
                    n_next[name] += count
                done += count
                block_no += 1
            result["params"] = {"rounds": args.rounds, "warmup": args.warmup,
                                "block": args.block, "files": args.files,
                                "file_bytes": args.size, "smoke": args.smoke,
                                "order": "alternating blocks, ABBA",
                                "library_fsync": "always on (the library has no switch)"}
            for name in sides:
                result[name] = summarize(*data[name])
            if "library" in sides:
                lib = sides["library"][0]
                result["library"]["phase_p50_ms"] = {
                    k: C.latency_ms(v)["p50"] for k, v in lib.phases.items()}
                result["library"]["auto_compactions"] = {
                    "count": len(lib.compactions),
                    "ms_each": [C.r3(x * 1000) for x in lib.compactions]}
            if len(sides) == 2:
                L, M = result["library"], result["minimal"]
                comp = {q: C.ratio(L["latency_ms"][q], M["latency_ms"][q])
                        for q in ("p50", "p95", "p99", "mean")}
                result["library_vs_minimal"] = {
                    "latency_ratio": comp,
                    "throughput_ratio_minimal_over_library": C.ratio(M["tx_per_s"],
                                                                     L["tx_per_s"]),
                    "extra_fsyncs_per_tx": C.r3(L["fsyncs_per_tx"] - M["fsyncs_per_tx"]),
                }
                result["target"] = {
                    "what": "library commit latency within 1.5x of the minimal durable loop",
                    "limit_ratio": TARGET_RATIO, "measured_ratio_p50": comp["p50"],
                    "measured_ratio_mean": comp["mean"],
                    "met": comp["p50"] is not None and comp["p50"] <= TARGET_RATIO,
                    "issue_floor_tx_per_s": ABSOLUTE_FLOOR_TX_S,
                    "library_tx_per_s": L["tx_per_s"],
                    "floor_met": L["tx_per_s"] >= ABSOLUTE_FLOOR_TX_S}
            # Untimed accounting pass: os-level calls (system calls) per transaction.
            acct = min(args.rounds, 100)
            counter.active = False
            for name, (loop, names) in sides.items():
                acct_lat: list[float] = []
                with C.OsCallCounter() as oc:
                    run_side(loop, counter, n_next[name], acct, names, args.size, acct_lat,
                             [], [])
                n_next[name] += acct
                result[name]["os_calls_per_tx"] = oc.per(acct)
                in_os = oc.ms_per(acct)
                result[name]["accounting_pass"] = {
                    "rounds": acct, "ms_per_tx": C.r3(sum(acct_lat) / acct * 1000),
                    "ms_in_os_calls_per_tx": in_os,
                    "ms_outside_os_calls_per_tx": C.r3(sum(acct_lat) / acct * 1000
                                                       - in_os["total"])}
            counter.active = True
            for loop, _ in sides.values():
                if isinstance(loop, MinimalLoop):
                    loop.close()
            if args.profile:
                counter.active = False
                result["profile_top_self_time"] = profile_library(args, bench)
            result["dir"]["probe_after"] = C.fs_probe(bench.path)
    finally:
        counter.uninstall()
    C.emit(result, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
