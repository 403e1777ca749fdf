#!/usr/bin/env python3
"""WAL append + fsync latency: agent_2pc.storage.log.Log.append vs raw os.write + os.fsync.

The library side calls ``Log.append(records, sync=True)`` on a log of its own: it encodes the
frames (storage/wal_format.py), takes the log's flock, checks whether the file was replaced or
grew (another process's appends), writes and fsyncs. The raw side writes pre-encoded frames of
the same size with one ``os.write`` and one ``os.fsync`` on an O_APPEND descriptor held open, in
the same directory. The two alternate in blocks (ABBA) so machine noise hits both.

Two shapes: one record per append (a staging step; the target figure) and a group of four
records per append (a step that writes several records in one fsync).

Target (issue 2): the library's append within 1.2x of raw.

    python benchmarks/wal_append.py            # 2000 appends per side and shape
    python benchmarks/wal_append.py --smoke    # CI
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

TARGET_RATIO = 1.2


def stage_record(n: int) -> dict:
    """A realistic ``stage`` record (what most appends carry), about 300 bytes framed."""
    return {"type": "stage", "tid": "tx-20260101-120000-a1b2c3", "ts": 1767268800000 + n,
            "path": f"src/package/module_{n % 100:02d}.py", "op": "write", "via": "write",
            "blob": f"{n:064x}", "size": 1234, "mode": None,
            "pre": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}


def run_shape(bench: C.BenchDir, group: int, appends: int, warmup: int, block: int,
              counter: C.FsyncCounter) -> dict:
    from agent_2pc.storage import wal_format
    from agent_2pc.storage.log import Log

    d = os.path.join(bench.path, f"group{group}")
    os.makedirs(d)
    open(os.path.join(d, "wal.bin"), "xb").close()  # init makes it; the log never does
    log = Log(os.path.join(d, "wal.bin"), os.path.join(d, "lock"))
    raw_fd = os.open(os.path.join(d, "raw.bin"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    # The same bytes for both sides: the library encodes them itself, raw gets them ready-made.
    batches = [[stage_record(n * group + k) for k in range(group)]
               for n in range(appends + warmup)]
    frames = [b"".join(wal_format.encode(r) for r in b) for b in batches]
    lat: dict[str, list[float]] = {"library": [], "raw": []}
    fs: dict[str, list[int]] = {"library": [], "raw": []}
    fs_time: dict[str, float] = {"library": 0.0, "raw": 0.0}
    clock = C.now

    def lib_one(i: int, keep: bool) -> None:
        f0, s0 = counter.snapshot()
        t = clock()
        log.append(batches[i], sync=True)
        dt = clock() - t
        if keep:
            f1, s1 = counter.snapshot()
            lat["library"].append(dt)
            fs["library"].append(f1 - f0)
            fs_time["library"] += s1 - s0

    def raw_one(i: int, keep: bool) -> None:
        f0, s0 = counter.snapshot()
        t = clock()
        os.write(raw_fd, frames[i])
        os.fsync(raw_fd)  # the counting wrapper, as for the library
        dt = clock() - t
        if keep:
            f1, s1 = counter.snapshot()
            lat["raw"].append(dt)
            fs["raw"].append(f1 - f0)
            fs_time["raw"] += s1 - s0

    for i in range(warmup):
        lib_one(i, False)
        raw_one(i, False)
    i = warmup
    block_no = 0
    end = warmup + appends
    while i < end:
        n = min(block, end - i)
        order = (lib_one, raw_one) if block_no % 2 == 0 else (raw_one, lib_one)
        for side in order:
            for j in range(i, i + n):
                side(j, True)
        i += n
        block_no += 1
    # Untimed accounting pass: os-level calls (system calls) per append, each side.
    acct = min(appends, 100)
    counter.active = False
    os_calls = {}
    for side, one in (("library", lib_one), ("raw", raw_one)):
        t = clock()
        with C.OsCallCounter() as oc:
            for j in range(acct):
                one(j, False)
        total_us = (clock() - t) / acct * 1e6
        in_os = oc.ms_per(acct)
        os_calls[side] = {"calls_per_append": oc.per(acct),
                          "us_in_os_calls_per_append": {k: round(v * 1000, 1)
                                                        for k, v in in_os.items()},
                          "us_outside_os_calls_per_append": round(total_us
                                                                  - in_os["total"] * 1000, 1)}
    counter.active = True
    log.close()
    os.close(raw_fd)
    sizes = {"library_file_bytes": os.path.getsize(os.path.join(d, "wal.bin")),
             "raw_file_bytes": os.path.getsize(os.path.join(d, "raw.bin"))}
    assert sizes["library_file_bytes"] == sizes["raw_file_bytes"], sizes  # same bytes written
    out: dict = {"records_per_append": group, "bytes_per_append": len(frames[0]),
                 "appends": appends, **sizes}
    for side in ("library", "raw"):
        n = len(lat[side])
        out[side] = {"latency_ms": C.latency_ms(lat[side]),
                     "fsyncs_per_append": round(sum(fs[side]) / n, 3),
                     "fsync_ms_per_append": C.r3(fs_time[side] / n * 1000),
                     "non_fsync_us_per_append": round((sum(lat[side]) - fs_time[side]) / n * 1e6,
                                                      1),
                     "accounting_pass": os_calls[side]}
    L, R = out["library"]["latency_ms"], out["raw"]["latency_ms"]
    out["ratio"] = {q: C.ratio(L[q], R[q]) for q in ("p50", "p95", "p99", "mean")}
    out["overhead_us_p50"] = round((L["p50"] - R["p50"]) * 1000, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--appends", type=int, default=2000, help="timed appends per side and shape")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--block", type=int, default=50, help="appends per block (sides alternate)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.appends, args.warmup, args.block = 40, 5, 10

    result: dict = {"benchmark": "wal_append", "machine": C.machine()}
    counter = C.FsyncCounter().install()
    try:
        with C.BenchDir("wal") as bench:
            result["dir"] = bench.describe()
            result["params"] = {"appends": args.appends, "warmup": args.warmup,
                                "block": args.block, "smoke": args.smoke,
                                "order": "alternating blocks, ABBA"}
            shapes = {}
            for group in (1, 4):
                C.log(f"wal_append: {args.appends} appends per side, {group} record(s) each")
                shapes[f"records_{group}"] = run_shape(bench, group, args.appends, args.warmup,
                                                       args.block, counter)
            result["shapes"] = shapes
            result["dir"]["probe_after"] = C.fs_probe(bench.path)
    finally:
        counter.uninstall()
    one = result["shapes"]["records_1"]["ratio"]
    result["target"] = {"what": "Log.append(sync=True) within 1.2x of raw os.write + os.fsync",
                        "limit_ratio": TARGET_RATIO, "measured_ratio_p50": one["p50"],
                        "measured_ratio_p95": one["p95"], "measured_ratio_p99": one["p99"],
                        "met": one["p50"] is not None and one["p50"] <= TARGET_RATIO}
    C.emit(result, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
