#!/usr/bin/env python3
"""Abort time per staged file, and recovery time of a write-ahead log of 100k records.

Abort: stage K new files in one transaction through the library, then abort it, for several
K, each in a fresh workspace, repeated. Three ways of aborting are timed:
  warm  ``tx.abort()`` on the client that staged (a library user);
  cold  ``Agent2PC(root).engine.abort(tid)`` on a newly opened client (reads the log first);
  cli   ``agent-2pc --root R abort --tid T`` in a child process (bytecode cached).
Per file is reported both as total/K and as the marginal cost (slope between the smallest and
the largest K), which separates the fixed cost of a call from the cost per staged file.

Recovery: a log of --records records (default 100,000) written directly with
agent_2pc.storage.wal_format.encode (through the library it would take minutes; the rate is
measured and reported), describing what a crash can leave behind:
  - ~1,000 active transactions of 1 begin + 99 stage records each (their blobs exist), of which
    10% are past their timeout (recover aborts them) and the rest are alive (kept);
  - one transaction left 'committing' by a dead process (decision commit, its blobs synced as
    prepare leaves them, no end): it must be rolled forward;
  - one left 'preparing' (no decision): it must be aborted;
  - 60 committed transactions not yet compacted.
Then, in a fresh child process (bytecode cached), ``Agent2PC(root)`` (open: reads and folds the
log, and finishes the dead committing transaction) and ``recover()`` are timed separately, and
the rolled-forward files are checked. Each repetition runs on a fresh copy of the workspace.

Targets (issue 2): abort under 1 ms per staged file; recovery of 100k records under 1 s.

    python benchmarks/abort_recovery.py          # K = 1, 100, 1000; 100k records
    python benchmarks/abort_recovery.py --smoke  # CI
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

TARGET_ABORT_MS_PER_FILE = 1.0
TARGET_RECOVERY_S = 1.0


# -- abort ------------------------------------------------------------------------------------


def staged_workspace(root: str, k: int):
    from agent_2pc import Agent2PC

    os.makedirs(root)
    client = Agent2PC.init(root)
    tx = client.begin(label=f"abort {k}")
    for j in range(k):
        tx.stage_write(f"dir{j % 20:02d}/file{j:05d}.txt", f"staged content {j}\n")
    return client, tx


def bench_abort(bench: C.BenchDir, ks: list[int], reps: int, python: str, console: str,
                env: dict, counter: C.FsyncCounter) -> dict:
    from agent_2pc import Agent2PC

    rows = []
    for k in ks:
        samples: dict[str, list[float]] = {"warm": [], "cold": [], "cli": []}
        fsyncs = []
        stage_s = []
        for rep in range(reps):
            base = os.path.join(bench.path, f"abort-{k}-{rep}")
            # warm: the staging client aborts
            t = C.now()
            client, tx = staged_workspace(base + "-warm", k)
            stage_s.append(C.now() - t)
            f0 = counter.total
            t = C.now()
            out = tx.abort()
            samples["warm"].append(C.now() - t)
            fsyncs.append(counter.total - f0)
            assert out["state"] == "aborted", out
            client.engine.log.close()
            # cold: a newly opened client aborts (what one CLI call does, minus the interpreter)
            client, tx = staged_workspace(base + "-cold", k)
            client.engine.log.close()
            t = C.now()
            out = Agent2PC(base + "-cold").engine.abort(tx.tid)
            samples["cold"].append(C.now() - t)
            assert out["state"] == "aborted", out
            # cli: a child process aborts
            client, tx = staged_workspace(base + "-cli", k)
            client.engine.log.close()
            t = C.now()
            proc = subprocess.run([console, "--root", base + "-cli", "abort", "--tid", tx.tid,
                                   "--json"], env=env, capture_output=True, text=True)
            samples["cli"].append(C.now() - t)
            assert proc.returncode == 0 and json.loads(proc.stdout)["state"] == "aborted", \
                proc.stderr
            for suffix in ("-warm", "-cold", "-cli"):
                shutil.rmtree(base + suffix, ignore_errors=True)
        row: dict = {"staged_files": k, "reps": reps,
                     "staging_s_median": round(statistics.median(stage_s), 3),
                     "fsyncs_per_abort": statistics.median(fsyncs)}
        for how, v in samples.items():
            med = statistics.median(v)
            row[how] = {"median_ms": C.r3(med * 1000), "per_file_ms": C.r3(med * 1000 / k),
                        "all_ms": [C.r3(x * 1000) for x in v]}
        rows.append(row)
        C.log(f"  abort K={k}: warm {row['warm']['median_ms']} ms, cold "
              f"{row['cold']['median_ms']} ms, cli {row['cli']['median_ms']} ms")
    lo, hi = rows[0], rows[-1]
    marginal = {}
    if hi["staged_files"] > lo["staged_files"]:
        for how in ("warm", "cold", "cli"):
            marginal[how] = C.r3((hi[how]["median_ms"] - lo[how]["median_ms"])
                                 / (hi["staged_files"] - lo["staged_files"]))
    return {"by_staged_files": rows, "marginal_ms_per_file": marginal}


# -- recovery ---------------------------------------------------------------------------------


def boot_id() -> str | None:
    from agent_2pc.coordinator.engine import boot_id as engine_boot_id

    return engine_boot_id()


def build_crashed_workspace(root: str, records: int, stages_per_tx: int = 99) -> dict:
    """A workspace whose log holds ``records`` records, as a crash could leave it.

    Written from the on-disk format (docs/format.md): frames by wal_format.encode, blobs as
    read-only files ``objects/<first two hex>/<sha256>``, synced like prepare syncs them.
    """
    from agent_2pc.storage import wal_format
    from agent_2pc.storage.durable import fsync_dir, fsync_fd
    from agent_2pc.storage.hashing import sha256_bytes
    from agent_2pc.storage.workspace import Layout, init

    t_start = C.now()
    os.makedirs(root)
    init(root)
    lay = Layout(root)
    boot = boot_id()
    now = time.time_ns() // 1_000_000
    dead_pid = 2 ** 22 + 7  # above the default pid_max; never alive
    ts = [now - 600_000]  # ten minutes ago, 1 ms per record

    def tick() -> int:
        ts[0] += 1
        return ts[0]

    fans: set[str] = set()

    def put_blob(data: bytes) -> tuple[str, int]:
        digest = sha256_bytes(data)
        fan = os.path.join(lay.objects, digest[:2])
        os.makedirs(fan, exist_ok=True)
        path = os.path.join(fan, digest)
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
            try:
                os.write(fd, data)
                fsync_fd(fd)
            finally:
                os.close(fd)
            fans.add(fan)
        return digest, len(data)

    pool = [put_blob(f"blob {b}\n".encode() * 8) for b in range(100)]

    def begin(tid: str, timeout_ms: int | None, at: int | None = None) -> dict:
        return {"type": "begin", "tid": tid, "ts": at if at is not None else tick(),
                "label": None, "timeout_ms": timeout_ms, "boot": boot, "pid": dead_pid}

    def stage(tid: str, path: str, blob: tuple[str, int], pre: str | None = None) -> dict:
        return {"type": "stage", "tid": tid, "ts": tick(), "path": path, "op": "write",
                "via": "write", "blob": blob[0], "size": blob[1], "mode": None, "pre": pre}

    txs: list[list[dict]] = []
    kinds = {"committed": 0, "committing": 0, "preparing": 0, "active_expired": 0,
             "active_live": 0}
    serial = [0]

    def new_tid() -> str:
        serial[0] += 1
        return f"tx-20260101-000000-{serial[0]:06x}"

    # 60 committed transactions, not yet compacted (the automatic threshold is 64).
    for n in range(60):
        tid = new_tid()
        path = f"done/file{n:03d}.txt"
        txs.append([begin(tid, 86_400_000), stage(tid, path, pool[n % 100]),
                    {"type": "prepare", "tid": tid, "ts": tick(), "pid": dead_pid},
                    {"type": "decision", "tid": tid, "ts": tick(), "outcome": "commit",
                     "modes": {"0": 0o644}},
                    {"type": "end", "tid": tid, "ts": tick(), "state": "committed",
                     "files": [path]}])
        kinds["committed"] += 1
    # One left committing by a dead process: decision durable, blobs synced, no end.
    committing_tid = new_tid()
    committing_files = {}
    recs = [begin(committing_tid, 86_400_000)]
    for j in range(20):
        path = f"app/module{j:02d}.py"
        data = f"# rolled forward {j}\n".encode()
        committing_files[path] = data
        recs.append(stage(committing_tid, path, put_blob(data)))
    recs.append({"type": "prepare", "tid": committing_tid, "ts": tick(), "pid": dead_pid})
    recs.append({"type": "decision", "tid": committing_tid, "ts": tick(), "outcome": "commit",
                 "modes": {str(k): 0o644 for k in range(len(committing_files))}})
    txs.append(recs)
    kinds["committing"] = 1
    # One left preparing (no decision): recovery aborts it.
    tid = new_tid()
    recs = [begin(tid, 86_400_000)] + [stage(tid, f"half/file{j}.txt", pool[j]) for j in
                                       range(10)]
    recs.append({"type": "prepare", "tid": tid, "ts": tick(), "pid": dead_pid})
    txs.append(recs)
    kinds["preparing"] = 1
    # Active transactions fill the rest: 10% expired.
    used = sum(len(r) for r in txs)
    n_active = max(1, (records - used) // (stages_per_tx + 1))
    for a in range(n_active):
        tid = new_tid()
        expired = a % 10 == 0
        at = now - 3_600_000 if expired else None
        recs = [begin(tid, 60_000 if expired else 86_400_000, at)]
        for j in range(stages_per_tx):
            recs.append(stage(tid, f"work{a % 50:02d}/t{a:04d}_f{j:02d}.py", pool[(a + j) % 100]))
        txs.append(recs)
        kinds["active_expired" if expired else "active_live"] += 1
    # Top up with stage records on the last active transaction to hit the count exactly.
    short = records - sum(len(r) for r in txs)
    last = txs[-1]
    for j in range(max(0, short)):
        last.append(stage(last[0]["tid"], f"extra/f{j:05d}.py", pool[j % 100]))
    # Interleave transactions the way concurrent agents do: round-robin, order kept per tx.
    ordered: list[dict] = []
    depth = max(len(r) for r in txs)
    for i in range(depth):
        for r in txs:
            if i < len(r):
                ordered.append(r[i])
    t_enc = C.now()
    data = b"".join(wal_format.encode(r) for r in ordered)
    encode_s = C.now() - t_enc
    fd = os.open(lay.wal, os.O_WRONLY | os.O_APPEND)  # after the header init wrote, if any
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fsync_fd(fd)
    finally:
        os.close(fd)
    for fan in sorted(fans):
        fsync_dir(fan)
    return {"records": len(ordered), "wal_bytes": len(data), "transactions": kinds,
            "build_s": round(C.now() - t_start, 3), "encode_s": round(encode_s, 3),
            "committing_tid": committing_tid, "committing_files": {
                p: d.decode() for p, d in committing_files.items()}}


def library_stage_rate(bench: C.BenchDir, n: int) -> float:
    """Records per second when the same kind of log is built through the library."""
    from agent_2pc import Agent2PC

    root = os.path.join(bench.path, "rate")
    os.makedirs(root)
    client = Agent2PC.init(root)
    t = C.now()
    written = 0
    while written < n:
        tx = client.begin()
        written += 1
        for j in range(min(99, n - written)):
            tx.stage_write(f"w/f{written}_{j}.py", f"x{j}\n")
            written += 1
    rate = written / (C.now() - t)
    client.engine.log.close()
    shutil.rmtree(root, ignore_errors=True)
    return rate


CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
from agent_2pc import Agent2PC
t1 = time.perf_counter()
root = sys.argv[1]
c1 = time.process_time()
client = Agent2PC(root)
t2 = time.perf_counter()
c2 = time.process_time()
states_at_open = {}
for tx in client.engine.txs.values():
    states_at_open[tx.state] = states_at_open.get(tx.state, 0) + 1
c3 = time.process_time()
t3a = time.perf_counter()
out = client.recover()
t3 = time.perf_counter()
c4 = time.process_time()
client.engine.log.close()
t4 = time.perf_counter()
again = Agent2PC(root)
t5 = time.perf_counter()
states = {}
for tx in again.engine.txs.values():
    states[tx.state] = states.get(tx.state, 0) + 1
print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "recover_s": t3 - t3a,
                  "open_cpu_s": c2 - c1, "recover_cpu_s": c4 - c3,
                  "open_after_recovery_s": t5 - t4, "states_at_open": states_at_open,
                  "rolled_forward": len(out["rolled_forward"]),
                  "rolled_back": len(out["rolled_back"]),
                  "states_after": states, "wal_bytes_after": os.path.getsize(
                      os.path.join(root, ".agent-tx", "wal.bin"))}))
"""


def in_process_breakdown(wal_path: str) -> dict:
    """Where the time of reading the log goes: decode (frames -> dicts) and fold (-> states),
    with the garbage collector paused as the engine pauses it (this process holds a bigger
    heap than a fresh one, which made every collection dearer before the pause)."""
    from agent_2pc.core.states import apply_record
    from agent_2pc.storage import wal_format

    try:
        from agent_2pc.storage.log import PausedGc
    except ImportError:  # a commit before the pause (to compare with it)
        from contextlib import nullcontext as PausedGc

    t = C.now()
    with open(wal_path, "rb") as f:
        buf = f.read()
    t_read = C.now() - t
    with PausedGc():
        t = C.now()
        decoded = wal_format.decode(buf)
        t_decode = C.now() - t
        t = C.now()
        txs: dict = {}
        for rec, frame in zip(decoded.records, decoded.frames, strict=True):
            if rec["type"] != "log":  # the log's header (the log consumes it at open)
                apply_record(txs, rec, frame)
        t_fold = C.now() - t
    t = C.now()
    b"".join(f for tx in txs.values() for f in tx.frames)  # what compaction writes
    t_copy = C.now() - t
    return {"read_ms": C.r3(t_read * 1000), "decode_ms": C.r3(t_decode * 1000),
            "fold_ms": C.r3(t_fold * 1000), "copy_live_frames_ms": C.r3(t_copy * 1000),
            "records": len(decoded.records),
            "decode_us_per_record": round(t_decode / max(1, len(decoded.records)) * 1e6, 2)}


def trust_copy(copy: str) -> None:
    """A copy is not the workspace init made: say it is ours (agent-2pc trust), as a user who
    copies one does. (Versions without trust have nothing to say.)"""
    from agent_2pc.storage import workspace

    if hasattr(workspace, "trust"):
        workspace.trust(copy)


def bench_recovery(bench: C.BenchDir, records: int, reps: int, python: str, env: dict,
                   rate_sample: int) -> dict:
    C.log(f"  building a crashed workspace with {records} log records")
    master = os.path.join(bench.path, "crashed")
    built = build_crashed_workspace(master, records)
    C.log(f"  built in {built['build_s']} s; measuring the library's staging rate")
    rate = library_stage_rate(bench, rate_sample)
    breakdown = in_process_breakdown(os.path.join(master, ".agent-tx", "wal.bin"))
    runs = []
    for rep in range(reps):
        copy = os.path.join(bench.path, f"recover-{rep}")
        shutil.copytree(master, copy, symlinks=True)
        trust_copy(copy)
        subprocess.run(["sync"], check=False)  # keep the copy's writeback out of the timing
        t = C.now()
        proc = subprocess.run([python, "-c", CHILD, copy], env=env, capture_output=True,
                              text=True)
        wall = C.now() - t
        if proc.returncode != 0:
            raise SystemExit(f"recovery child failed: {proc.stderr[-3000:]}")
        r = json.loads(proc.stdout)
        r["process_wall_s"] = wall
        # The dead committing transaction was rolled forward: every file has its new content.
        for path, content in built["committing_files"].items():
            with open(os.path.join(copy, path), encoding="utf-8") as f:
                assert f.read() == content, path
        r["committing_rolled_forward_checked"] = True
        runs.append(r)
        C.log(f"  recovery run {rep + 1}: open {r['open_s']:.3f} s, recover "
              f"{r['recover_s']:.3f} s (CPU {r['open_cpu_s']:.3f} + {r['recover_cpu_s']:.3f} s), "
              f"process {wall:.3f} s")
        shutil.rmtree(copy, ignore_errors=True)

    def med(key: str) -> float:
        return round(statistics.median(x[key] for x in runs), 3)

    last = runs[-1]
    built.pop("committing_files")
    return {
        "log": built,
        "library_build_rate_records_per_s": round(rate, 1),
        "library_build_estimate_s": round(records / rate, 1),
        "reps": reps,
        "median_s": {"open": med("open_s"), "recover": med("recover_s"),
                     "open_plus_recover": round(statistics.median(
                         x["open_s"] + x["recover_s"] for x in runs), 3),
                     # CPU time of the child: what other processes on the machine move least
                     "open_cpu": med("open_cpu_s"), "recover_cpu": med("recover_cpu_s"),
                     "open_plus_recover_cpu": round(statistics.median(
                         x["open_cpu_s"] + x["recover_cpu_s"] for x in runs), 3),
                     "import": med("import_s"), "process_wall": med("process_wall_s"),
                     "open_after_recovery": med("open_after_recovery_s")},
        "runs": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                 for r in runs],
        "outcome": {"states_at_open": last["states_at_open"],
                    "rolled_forward": last["rolled_forward"],
                    "rolled_back": last["rolled_back"], "states_after": last["states_after"],
                    "wal_bytes_after": last["wal_bytes_after"]},
        "in_process_breakdown": breakdown,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--staged", type=int, nargs="+", default=[1, 100, 1000],
                    help="files staged before the abort (several values)")
    ap.add_argument("--abort-reps", type=int, default=5)
    ap.add_argument("--records", type=int, default=100_000, help="log records to recover")
    ap.add_argument("--recovery-reps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.staged, args.abort_reps, args.records, args.recovery_reps = [1, 10], 1, 2000, 1
    args.staged = sorted(set(args.staged))

    python = C.venv_python()
    console = os.path.join(os.path.dirname(python), "agent-2pc")
    env = C.bytecode_env(python)
    C.warm_bytecode(python, env)
    result: dict = {"benchmark": "abort_recovery", "machine": C.machine(),
                    "interpreter": python, "bytecode": "cached"}
    counter = C.FsyncCounter().install()
    try:
        with C.BenchDir("abort") as bench:
            result["dir"] = bench.describe()
            result["params"] = {"staged": args.staged, "abort_reps": args.abort_reps,
                                "records": args.records, "recovery_reps": args.recovery_reps,
                                "smoke": args.smoke}
            C.log("abort_recovery: abort")
            result["abort"] = bench_abort(bench, args.staged, args.abort_reps, python, console,
                                          env, counter)
            C.log("abort_recovery: recovery")
            result["recovery"] = bench_recovery(bench, args.records, args.recovery_reps,
                                                python, env,
                                                rate_sample=500 if args.smoke else 3000)
            result["dir"]["probe_after"] = C.fs_probe(bench.path)
    finally:
        counter.uninstall()
    biggest = result["abort"]["by_staged_files"][-1]
    rec = result["recovery"]["median_s"]
    result["targets"] = {
        "abort_under_1ms_per_file": {
            "limit_ms": TARGET_ABORT_MS_PER_FILE, "staged_files": biggest["staged_files"],
            "measured_warm_ms_per_file": biggest["warm"]["per_file_ms"],
            "measured_cold_ms_per_file": biggest["cold"]["per_file_ms"],
            "measured_cli_ms_per_file": biggest["cli"]["per_file_ms"],
            "marginal_ms_per_file": result["abort"]["marginal_ms_per_file"],
            "met": max(biggest[h]["per_file_ms"] for h in ("warm", "cold", "cli"))
            < TARGET_ABORT_MS_PER_FILE
            and all(v < TARGET_ABORT_MS_PER_FILE
                    for v in result["abort"]["marginal_ms_per_file"].values())},
        "recovery_100k_under_1s": {
            "limit_s": TARGET_RECOVERY_S, "records": args.records,
            "measured_open_s": rec["open"], "measured_recover_s": rec["recover"],
            "measured_open_plus_recover_s": rec["open_plus_recover"],
            "met": rec["open_plus_recover"] < TARGET_RECOVERY_S},
    }
    C.emit(result, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
