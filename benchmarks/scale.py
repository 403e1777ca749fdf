#!/usr/bin/env python3
"""Scale (issue 19): big files, big trees, long histories, many agents, huge repositories;
every figure next to a baseline measured in the same run, and the growth factors.

  a  large_file   one file of 64 MiB / 256 MiB / 1 GiB staged and committed, through the library
                  (``tx.stage_write_file(path, src)``, and ``tx.stage_write(path, bytes)``) and
                  through the CLI (``begin`` + ``stage-write --from-file`` + ``commit``, and
                  one ``run-batch`` of an ``fs_write`` with ``content_file``), against ``cp`` +
                  ``sync FILE`` (an fsync) of the same file: wall time and the peak RSS of the
                  process doing it, each variant in a child process of its own.
  b  big_tree     ``exec`` of a command creating 1k / 20k / 50k small files (100 per directory,
                  the same 121 bytes each, or with ``--distinct`` each its own)
                  plus ``commit``, against the same command run on disk followed by
                  ``sync -f`` (one syncfs) and by ``sync FILES...`` (an fsync per file); and
                  the same exec + commit with the batched durability off
                  (``AGENT2PC_SYNCFS_MIN=0``: an fsync per file, as before issue 19 item 2)
                  up to ``--unbatched-max`` files.
  c  history      step latency (CLI ``begin`` + ``stage-write`` + ``commit``; ``compact``;
                  ``status``; ``list``; ``status --tid`` and ``diff --tid`` of the transaction
                  just committed, of the oldest and of the middle one) at 0 / 10k / 1M
                  finished transactions (the history generated from real compacted lines, as
                  compaction leaves it); an old transaction's steps are compared with the
                  same steps on the new one in the empty workspace.
  d  agents       1 / 10 / 50 agent processes on one workspace, each staging and committing one
                  file per transaction through the library: throughput and latency p50/p99.
  e  view         the staged view on trees of 20k and 200k files, per tier (overlay,
                  fuse-overlayfs): ``StagedView.run(["true"])`` + capture and the ``setup_ms``
                  it reports; the CLI's ``stage-cmd`` and ``exec`` of ``true`` against its
                  ``status`` (one process start).

    python benchmarks/scale.py            # everything, full sizes (past 15 min where a file
                                          # commit costs 10 ms, as in docs/benchmarks.md)
    python benchmarks/scale.py --quick    # smaller sizes (14 min on a loaded 2-CPU host)
    python benchmarks/scale.py --smoke    # CI: tiny sizes, a few seconds
    python benchmarks/scale.py --sections b --tree 1000,5000   # (b) at these sizes only
    python benchmarks/scale.py --sections a,d --save   # some sections; --save writes the JSON
                                                       # to benchmarks/results/ (clean src only)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

MIB = 1 << 20
FILES_PER_DIR = 100

# sizes per mode: (large file MiB, big-tree files, history lengths, agents, view files)
MODES = {
    "full": {"large_mib": [64, 256, 1024], "tree": [1000, 20000, 50000],
             "history": [0, 10000, 1000000], "agents": [1, 10, 50],
             "view": [20000, 200000], "runs": 3, "agent_rounds": 6, "agent_total": 300,
             "step_runs": 7},
    "quick": {"large_mib": [64, 256], "tree": [1000, 20000], "history": [0, 10000, 100000],
              "agents": [1, 10, 50], "view": [20000, 200000], "runs": 2, "agent_rounds": 4,
              "agent_total": 200, "step_runs": 5},
    "smoke": {"large_mib": [4], "tree": [200], "history": [0, 500], "agents": [1, 3],
              "view": [300], "runs": 1, "agent_rounds": 1, "step_runs": 1},
}


def sh(argv: list[str], env: dict | None = None, cwd: str | None = None) -> str:
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:6]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


_DELETERS: list[subprocess.Popen] = []


def delete_later(path: str) -> None:
    """Remove a big tree in a background ``rm -rf`` (on a file system mounted ``discard``
    an unlink of many files takes minutes): the next figures run beside it, both sides of
    each comparison alike; ``wait_deletes`` waits for them all at the end, untimed."""
    if os.path.exists(path):
        _DELETERS.append(subprocess.Popen(["rm", "-rf", path], stderr=subprocess.DEVNULL))


def wait_deletes() -> float:
    t0 = C.now()
    for p in _DELETERS:
        p.wait()
    _DELETERS.clear()
    return round(C.now() - t0, 1)


class Scratch(C.BenchDir):
    """A BenchDir removed in the background (delete_later) rather than on the way out."""

    def __exit__(self, *exc: object) -> None:
        delete_later(self.path)


def median_ms(samples: list[float]) -> float:
    return C.r3(statistics.median(samples) * 1000)


# --- children: each variant of (a) runs in a process of its own --------------------------------

def child_main(argv: list[str]) -> None:
    """``scale.py --child VARIANT ROOT SRC DEST [CONSOLE]``: do one large-file variant, print
    {seconds, maxrss_kib, base_rss_kib}: the peak RSS of this process (library variants) or of
    the largest of its children (cp, the CLI)."""
    variant, root, src, dest = argv[:4]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if variant == "cp_fsync":
        t = time.perf_counter()
        subprocess.run(["cp", src, dest], check=True)
        subprocess.run(["sync", dest], check=True)  # coreutils sync FILE: fsync(FILE)
        dt = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        base = 0
    elif variant == "cli":
        console = argv[4]
        env = dict(os.environ, AGENT2PC_ROOT=root)
        t = time.perf_counter()
        tid = subprocess.run([console, "begin"], env=env, check=True, capture_output=True,
                             text=True).stdout.strip()
        subprocess.run([console, "stage-write", "--tid", tid, "--path", dest, "--from-file",
                        src], env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run([console, "commit", "--tid", tid], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        dt = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        base = 0
    elif variant == "cli_batch":  # one process: run-batch of an fs_write with content_file
        console = argv[4]
        env = dict(os.environ, AGENT2PC_ROOT=root)
        manifest = os.path.join(os.path.dirname(src), "batch.json")
        with open(manifest, "w") as f:
            json.dump({"steps": [{"type": "fs_write", "path": dest, "content_file": src}]}, f)
        t = time.perf_counter()
        subprocess.run([console, "run-batch", "--file", manifest], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        dt = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        base = 0
    else:
        from agent_2pc import Agent2PC

        client = Agent2PC(root)
        data = None
        if variant == "lib_bytes":
            with open(src, "rb") as f:
                data = f.read()  # the caller's content, in memory before the clock starts
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.perf_counter()
        tx = client.begin()
        if data is not None:
            tx.stage_write(dest, data)
        else:
            tx.stage_write_file(dest, src)
        tx.commit()
        dt = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        client.close()
    print(json.dumps({"seconds": dt, "maxrss_kib": rss, "base_rss_kib": base}))


# --- (a) one large file -------------------------------------------------------------------------

def make_file(path: str, size: int) -> None:
    block = os.urandom(MIB)
    with open(path, "wb") as f:
        for i in range(size // MIB):
            f.write(block[:8] + i.to_bytes(8, "little") + block[16:])
        f.write(block[:size % MIB])


def section_large(mode: dict, python: str, env: dict, console: str) -> dict:
    out: dict = {"sizes": {}}
    with Scratch("large") as d:
        root = os.path.join(d.path, "ws")
        os.makedirs(root)
        sh([console, "--root", root, "init"], env=env)
        out["dir"] = d.describe(probe=False)
        for mib in mode["large_mib"]:
            src = os.path.join(d.path, f"src-{mib}.bin")
            make_file(src, mib * MIB)
            variants = ["cp_fsync", "lib_path", "cli", "cli_batch"] + (
                ["lib_bytes"] if mib <= 256 else [])
            samples: dict[str, list[dict]] = {v: [] for v in variants}
            C.log(f"(a) {mib} MiB: {mode['runs']} runs of {variants}")
            for i in range(mode["runs"]):
                order = variants[i % len(variants):] + variants[:i % len(variants)]
                for v in order:
                    rel = f"out/{v}-{mib}-{i}.bin"
                    dest = os.path.join(root, rel) if v == "cp_fsync" else rel
                    os.makedirs(os.path.join(root, "out"), exist_ok=True)
                    os.sync()  # the previous variant's writeback is not this one's cost
                    res = json.loads(sh([python, os.path.abspath(__file__), "--child", v, root,
                                         src, dest, console], env=env))
                    samples[v].append(res)
                    os.unlink(os.path.join(root, rel))  # keep the disk use flat
            row: dict = {}
            for v in variants:
                secs = [s["seconds"] for s in samples[v]]
                peak = max(s["maxrss_kib"] for s in samples[v]) / 1024
                base = max(s["base_rss_kib"] for s in samples[v]) / 1024
                row[v] = {"median_s": C.r3(statistics.median(secs)),
                          "min_s": C.r3(min(secs)),
                          "mib_per_s": C.r3(mib / statistics.median(secs)),
                          "peak_rss_mib": round(peak, 1),
                          "peak_rss_over_start_mib": round(peak - base, 1)}
            cp = row["cp_fsync"]["median_s"]
            for v in variants:
                if v != "cp_fsync":
                    row[v]["x_cp_fsync"] = C.ratio(row[v]["median_s"], cp)
            out["sizes"][f"{mib}MiB"] = row
            os.unlink(src)
    sizes = list(out["sizes"])
    if len(sizes) > 1:
        first, last = out["sizes"][sizes[0]], out["sizes"][sizes[-1]]
        out["growth"] = {f"{v}_time_{sizes[0]}_to_{sizes[-1]}": C.ratio(last[v]["median_s"],
                                                                        first[v]["median_s"])
                         for v in ("cp_fsync", "lib_path", "cli", "cli_batch")}
        out["growth"]["size_ratio"] = C.ratio(mode["large_mib"][-1], mode["large_mib"][0])
    return out


# --- (b) exec creating many small files ---------------------------------------------------------

MAKER = """
import os, sys
top, n, distinct = sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["distinct"]
body = b"x" * 120 + b"\\n"
for i in range(n):
    d = os.path.join(top, f"d{i // %d:04d}")
    if i %% %d == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:06d}.txt"), "wb") as f:
        f.write(b"x" * 114 + b"%%06d\\n" %% i if distinct else body)
""" % (FILES_PER_DIR, FILES_PER_DIR)


def section_tree(mode: dict, python: str, env: dict, console: str) -> dict:
    out: dict = {"files_per_dir": FILES_PER_DIR, "sizes": {},
                 "content": "distinct" if mode.get("distinct") else "the same 121 bytes"}
    maker_cmd = [python, "-c", MAKER]
    tail = ["distinct"] if mode.get("distinct") else []
    with Scratch("tree") as d:
        out["dir"] = d.describe(probe=False)
        for n in mode["tree"]:
            runs = mode["tree_runs"] or (1 if n >= 20000 else mode["runs"])
            rows: dict[str, list[float]] = {k: [] for k in (
                "on_disk_cmd", "on_disk_cmd_syncfs", "on_disk_cmd_fsync_each",
                "tx_exec", "tx_commit", "tx_exec_commit", "unbatched_exec",
                "unbatched_commit", "unbatched_exec_commit")}
            sides = ["disk", "tx"] + (["unbatched"] if n <= mode["unbatched_max"] else [])
            C.log(f"(b) {n} files: {runs} runs, {' '.join(sides)}")
            for i in range(runs):
                for side in (sides if i % 2 == 0 else sides[::-1]):
                    os.sync()
                    if side == "disk":
                        top = os.path.join(d.path, f"disk-{n}-{i}")
                        os.makedirs(top)
                        t0 = C.now()
                        sh([*maker_cmd, os.path.join(top, "out"), str(n), *tail])
                        t1 = C.now()
                        sh(["sync", "-f", top])
                        t2 = C.now()
                        rows["on_disk_cmd"].append(t1 - t0)
                        rows["on_disk_cmd_syncfs"].append(t2 - t0)
                        # the same files made durable one by one (files, then directories)
                        top2 = os.path.join(d.path, f"disk2-{n}-{i}")
                        os.makedirs(top2)
                        os.sync()
                        t0 = C.now()
                        sh([*maker_cmd, os.path.join(top2, "out"), str(n), *tail])
                        sh(["sh", "-c", 'find "$1" -print0 | xargs -0 sync', "sh", top2])
                        rows["on_disk_cmd_fsync_each"].append(C.now() - t0)
                    else:
                        root = os.path.join(d.path, f"ws-{side}-{n}-{i}")
                        os.makedirs(root)
                        sh([console, "--root", root, "init"], env=env)
                        os.sync()
                        wenv = dict(env, AGENT2PC_ROOT=root)
                        if side == "unbatched":
                            wenv["AGENT2PC_SYNCFS_MIN"] = "0"
                        pre = "tx" if side == "tx" else "unbatched"
                        tid = sh([console, "begin"], env=wenv).strip()
                        t0 = C.now()
                        sh([console, "exec", "--tid", tid, "--json", "--", *maker_cmd, "out",
                            str(n), *tail], env=wenv, cwd=root)
                        t1 = C.now()
                        sh([console, "commit", "--tid", tid], env=wenv)
                        t2 = C.now()
                        rows[f"{pre}_exec"].append(t1 - t0)
                        rows[f"{pre}_commit"].append(t2 - t1)
                        rows[f"{pre}_exec_commit"].append(t2 - t0)
            row = {k: median_ms(v) for k, v in rows.items() if v}
            row["load_after"] = os.getloadavg()[0]
            row["runs"] = runs
            row["x_on_disk_syncfs"] = C.ratio(row["tx_exec_commit"], row["on_disk_cmd_syncfs"])
            row["x_on_disk_fsync_each"] = C.ratio(row["tx_exec_commit"],
                                                  row["on_disk_cmd_fsync_each"])
            row["tx_ms_per_file"] = C.r3(row["tx_exec_commit"] / n)
            if "unbatched_exec_commit" in row:
                row["x_unbatched_on_disk_syncfs"] = C.ratio(row["unbatched_exec_commit"],
                                                            row["on_disk_cmd_syncfs"])
                row["unbatched_commit_over_batched"] = C.ratio(row["unbatched_commit"],
                                                               row["tx_commit"])
            out["sizes"][str(n)] = row
            for name in os.listdir(d.path):
                delete_later(os.path.join(d.path, name))
    sizes = list(out["sizes"])
    if len(sizes) > 1:
        a, b = out["sizes"][sizes[0]], out["sizes"][sizes[-1]]
        out["growth"] = {"files_ratio": C.ratio(int(sizes[-1]), int(sizes[0])),
                         "tx_exec_commit": C.ratio(b["tx_exec_commit"], a["tx_exec_commit"]),
                         "on_disk_cmd_syncfs": C.ratio(b["on_disk_cmd_syncfs"],
                                                       a["on_disk_cmd_syncfs"])}
    return out


# --- (c) long histories -------------------------------------------------------------------------

def grow_history(root: str, n: int, templates: list[bytes]) -> None:
    """Give the workspace ``n`` finished transactions, as compaction would have left them:
    real compacted lines with fresh tids, chained (storage/history.py ``seal``), in sealed
    segments of the default size plus the open history.jsonl (storage/history_store.py). The
    tids grow with time as real ones do: 50 transactions a second from 2026-01-01."""
    if n <= 0:
        return
    from agent_2pc.storage import history, history_store

    path = os.path.join(root, ".agent-tx", "history.jsonl")
    store = history_store.Store(path, os.path.join(root, ".agent-tx", "history.head"))
    lines = [json.loads(t) for t in templates]
    prev = store.start_hash() or history.GENESIS
    size, batch = 0, []
    for i in range(n):
        line = dict(lines[i % len(lines)])
        line["tid"] = time.strftime("tx-%Y%m%d-%H%M%S-", time.gmtime(T0 + i // 50)) + (
            f"{i:06x}")  # tx-YYYYMMDD-HHMMSS-hex6
        batch.append(line)
        if len(batch) >= 2000 or i == n - 1:
            sealed = history.seal(batch, prev)
            prev = sealed[-1]["hash"]
            data = "".join(json.dumps(x, ensure_ascii=False, separators=(",", ":")) + "\n"
                           for x in sealed).encode()
            with open(path, "ab") as f:
                f.write(data)
            size += len(data)
            batch = []
            if size >= history_store.SEGMENT_BYTES:
                store.seal(keep=0)
                size = 0


T0 = 1767225600  # 2026-01-01T00:00:00Z


def _oldest_tid(root: str) -> str:
    from agent_2pc.storage import history_store

    store = history_store.Store(os.path.join(root, ".agent-tx", "history.jsonl"))
    segments = store.index()["segments"]
    path = store.segment_path(segments[0]["seq"]) if segments else store.current
    with open(path, "rb") as f:
        return str(json.loads(f.readline())["tid"])


def _history_bytes(root: str) -> int:
    d = os.path.join(root, ".agent-tx")
    total = os.path.getsize(os.path.join(d, "history.jsonl")) if os.path.exists(
        os.path.join(d, "history.jsonl")) else 0
    if os.path.isdir(os.path.join(d, "history")):
        total += sum(e.stat().st_size for e in os.scandir(os.path.join(d, "history")))
    return total


def section_history(mode: dict, python: str, env: dict, console: str) -> dict:
    from agent_2pc import Agent2PC

    out: dict = {"levels": {}}
    with Scratch("history") as d:
        # real history lines to copy: 64 small transactions, compacted
        seed = os.path.join(d.path, "seed")
        os.makedirs(seed)
        client = Agent2PC.init(seed)
        for i in range(8 if mode["name"] == "smoke" else 64):
            tx = client.begin(label=f"seed {i}")
            tx.stage_write(f"src/mod{i % 8}.py", f"x = {i}\n")
            tx.commit()
        client.compact()
        client.close()
        with open(os.path.join(seed, ".agent-tx", "history.jsonl"), "rb") as f:
            templates = [line + b"\n" for line in f.read().splitlines() if line.strip()]
        out["history_line_bytes_mean"] = round(sum(map(len, templates)) / len(templates))
        spaces: dict[int, dict] = {}
        for level in mode["history"]:
            root = os.path.join(d.path, f"ws-{level}")
            os.makedirs(root)
            Agent2PC.init(root).close()
            t0 = C.now()
            grow_history(root, level, templates)
            gen_s = C.now() - t0
            oldest = _oldest_tid(root) if level else None
            C.log(f"(c) {level} finished transactions (generated in {gen_s:.1f} s)")
            # Keep the whole history (no retention): the cost of a step whatever its length.
            spaces[level] = {"root": root, "env": dict(env, AGENT2PC_ROOT=root,
                                                       AGENT2PC_HISTORY_KEEP="0"),
                             "oldest": oldest, "gen_s": gen_s,
                             "middle": time.strftime("tx-%Y%m%d-%H%M%S-", time.gmtime(
                                 T0 + level // 2 // 50)) + f"{level // 2:06x}",
                             "s": {}}
        os.sync()
        runs = mode["step_runs"]
        levels = list(spaces)
        # Interleaved: every round visits every level (in a rotating order), so that the load
        # of the moment weighs on all levels alike; the first round only warms up, untimed
        # (none in a smoke run).
        warm = 0 if mode["name"] == "smoke" else 1
        for i in range(runs + warm):
            for level in levels[i % len(levels):] + levels[:i % len(levels)]:
                sp = spaces[level]
                times = _history_round(console, sp, i, old=bool(level))
                if i >= warm:
                    for k, v in times.items():
                        sp["s"].setdefault(k, []).append(v)
        for level, sp in spaces.items():
            out["levels"][str(level)] = {
                "generate_s": round(sp["gen_s"], 2), "runs": runs,
                "history_mib": round(_history_bytes(sp["root"]) / MIB, 1),
                **{f"{k}_ms": median_ms(v) for k, v in sp["s"].items() if v}}
            delete_later(sp["root"])
    levels = list(out["levels"])
    base = out["levels"][levels[0]]
    out["growth_vs_empty"] = {
        lv: {k: C.ratio(row[k], base[k]) for k in (
            "begin_stage_commit_ms", "status_ms", "list_ms", "compact_ms", "status_new_tid_ms",
            "diff_new_tid_ms") if k in row and k in base}
        for lv, row in out["levels"].items() if lv != levels[0]}
    # An old transaction's status and diff, against the same step on the transaction just
    # committed in the empty workspace.
    for lv, row in out["levels"].items():
        for step in ("status", "diff"):
            for which in ("old", "mid"):
                k = f"{step}_{which}_tid_ms"
                if k in row and f"{step}_new_tid_ms" in base:
                    out["growth_vs_empty"][lv][k] = C.ratio(row[k], base[f"{step}_new_tid_ms"])
    return out


def _history_round(console: str, sp: dict, i: int, old: bool) -> dict[str, float]:
    """One round of CLI steps on one level's workspace: begin, stage-write, commit, compact,
    status, list, then status and diff of the transaction just committed and (``old``: the
    history is not empty) of the oldest and the middle one. Their times, in seconds."""
    wenv = sp["env"]
    marks = [("start", C.now())]
    tid = sh([console, "begin"], env=wenv).strip()
    marks.append(("begin", C.now()))
    sh([console, "stage-write", "--tid", tid, "--path", f"f{i}.txt", "--content", f"{i}\n"],
       env=wenv)
    marks.append(("stage_write", C.now()))
    sh([console, "commit", "--tid", tid], env=wenv)
    marks.append(("commit", C.now()))
    sh([console, "compact"], env=wenv)
    marks.append(("compact", C.now()))
    sh([console, "status"], env=wenv)
    marks.append(("status", C.now()))
    sh([console, "list"], env=wenv)
    marks.append(("list", C.now()))
    for which, about in (("new", tid), ("old", sp["oldest"]), ("mid", sp["middle"])):
        if which != "new" and not old:
            continue
        for step in ("status", "diff"):
            sh([console, step, "--tid", about], env=wenv)
            marks.append((f"{step}_{which}_tid", C.now()))
    times = {name: t - marks[k][1] for k, (name, t) in enumerate(marks[1:])}
    times["begin_stage_commit"] = times["begin"] + times["stage_write"] + times["commit"]
    return times


# --- (d) many agents on one workspace -----------------------------------------------------------

AGENT = """
import json, os, sys, time
from agent_2pc import Agent2PC
root, me, rounds, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
client = Agent2PC(root)
while time.time() < start:
    time.sleep(0.002)
lat, fails = [], 0
t_first = time.time()
for r in range(rounds):
    t = time.perf_counter()
    tx = client.begin(label=f"agent {me}")
    tx.stage_write(f"agents/a{me:03d}/r{r}.txt", f"agent {me} round {r}\\n")
    res = tx.commit()
    lat.append(time.perf_counter() - t)
print(json.dumps({"lat": lat, "first": t_first, "last": time.time()}))
"""


def section_agents(mode: dict, python: str, env: dict, console: str) -> dict:
    """Each level twice: the agents working in their own processes on the log (``direct``),
    and through the workspace's daemon (``daemon``: one process holds the folded log, commits
    that arrive together share an fsync)."""
    out: dict = {"rounds_per_agent_min": mode["agent_rounds"],
                 "transactions_per_level_min": mode.get("agent_total", 0), "levels": {},
                 "daemon": {}}
    with Scratch("agents") as d:
        for n in mode["agents"]:
            for way in ("direct", "daemon"):
                root = os.path.join(d.path, f"ws-{n}-{way}")
                os.makedirs(root)
                sh([console, "--root", root, "init"], env=env)
                if way == "daemon":
                    sh([console, "--root", root, "daemon", "start"], env=env)
                os.sync()
                try:
                    row = _agents_run(n, mode, python, env, root)
                finally:
                    if way == "daemon":
                        sh([console, "--root", root, "daemon", "stop"], env=env)
                (out["levels"] if way == "direct" else out["daemon"])[str(n)] = row
                C.log(f"(d) {n} agents, {way}: {row['throughput_tx_per_s']} tx/s, "
                      f"p99 {row['latency']['p99']} ms")
                delete_later(root)
    for key, table in (("growth_vs_one_agent", out["levels"]),
                       ("daemon_growth_vs_one_agent", out["daemon"])):
        levels = list(table)
        one = table[levels[0]]
        out[key] = {
            lv: {"throughput": C.ratio(row["throughput_tx_per_s"], one["throughput_tx_per_s"]),
                 "p50": C.ratio(row["latency"]["p50"], one["latency"]["p50"]),
                 "p99": C.ratio(row["latency"]["p99"], one["latency"]["p99"])}
            for lv, row in table.items() if lv != levels[0]}
    return out


def _agents_run(n: int, mode: dict, python: str, env: dict, root: str) -> dict:
    # At least ``agent_total`` transactions per level, so that one agent's figures are not
    # those of a handful of transactions.
    rounds = max(mode["agent_rounds"], -(-mode.get("agent_total", 0) // n))
    start = time.time() + 1.0 + 0.12 * n  # every agent imported before the start
    procs = [subprocess.Popen([python, "-c", AGENT, root, str(me), str(rounds),
                               str(start)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
             for me in range(n)]
    res = []
    for p in procs:
        o, e = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"agent failed: {e.decode()[-2000:]}")
        res.append(json.loads(o))
    lat = [x for r in res for x in r["lat"]]
    late = max(0.0, min(r["first"] for r in res) - start)
    span = max(r["last"] for r in res) - min(r["first"] for r in res)
    return {"transactions": len(lat), "throughput_tx_per_s": round(len(lat) / span, 1),
            "latency": C.latency_ms(lat), "first_agent_late_s": round(late, 3)}


# --- (e) the staged view on huge trees ----------------------------------------------------------

def build_tree(root: str, n: int) -> None:
    body = b"y" * 300 + b"\n"
    for i in range(n):
        if i % FILES_PER_DIR == 0:
            dpath = os.path.join(root, f"p{i // (FILES_PER_DIR * 100):03d}",
                                 f"d{(i // FILES_PER_DIR) % 100:03d}")
            os.makedirs(dpath, exist_ok=True)
        fd = os.open(os.path.join(dpath, f"f{i:07d}.txt"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, body)
        os.close(fd)


def section_view(mode: dict, python: str, env: dict, console: str) -> dict:
    """The staged view on big trees, per tier that this host offers (overlay, fuse-overlayfs;
    the copy tier only when neither is there: it copies the tree, linear by design): the
    library's ``StagedView.run(["true"])`` + capture, the ``setup_ms`` it reports, and the
    CLI's ``stage-cmd --command true`` and ``exec -- true`` against the CLI's ``status`` (one
    process start, the baseline) and a plain ``true``."""
    from agent_2pc import Agent2PC
    from agent_2pc.isolation import StagedView, probe_tiers

    probe = probe_tiers()
    tiers = [t for t in ("overlay", "fuse-overlayfs") if probe.get(t) is None] or (
        ["copy"] if probe.get("copy") is None else [])
    out: dict = {"tiers": tiers, "tiers_available": probe, "sizes": {}}
    runs = {"full": 9, "quick": 5, "smoke": 2}[mode["name"]]
    with Scratch("view") as d:
        for n in mode["view"]:
            root = os.path.join(d.path, f"tree-{n}")
            os.makedirs(root)
            t0 = C.now()
            build_tree(root, n)
            built = C.now() - t0
            client = Agent2PC.init(root)
            tx = client.begin(label="view bench")
            for k in range(10):
                tx.stage_write(f"p000/d{k:03d}/f{k * FILES_PER_DIR:07d}.txt", f"staged {k}\n")
            tx.stage_write("newdir/new.txt", "new\n")
            os.sync()
            size: dict = {"build_s": round(built, 1), "runs": runs}
            for tier in tiers:
                C.log(f"(e) {n} files (built in {built:.1f} s), tier {tier}: {runs} runs")
                wenv = dict(env, AGENT2PC_ROOT=root, AGENT2PC_ISOLATION=tier)
                s: dict[str, list[float]] = {k: [] for k in (
                    "view", "setup", "true", "status", "stage_cmd", "exec")}
                for i in range(runs + 1):
                    t = C.now()
                    subprocess.run(["true"], check=True)
                    tt = C.now() - t
                    t = C.now()
                    view = StagedView(root, client.engine.txs[tx.tid].changes(),
                                      client.engine.blobs, tier=tier)
                    res = view.run(["true"], timeout_s=600)
                    view.capture()
                    dt = C.now() - t
                    view.close()
                    if res.exit_code != 0:
                        raise SystemExit(f"true failed in the view: {res!r}")
                    t = C.now()
                    sh([console, "status", "--tid", tx.tid], env=wenv)
                    st = C.now() - t
                    t = C.now()
                    sh([console, "stage-cmd", "--tid", tx.tid, "--command", "true"], env=wenv)
                    sc = C.now() - t
                    t = C.now()
                    sh([console, "exec", "--tid", tx.tid, "--", "true"], env=wenv)
                    ex = C.now() - t
                    if i:  # the first round only warms up
                        for k, v in (("view", dt), ("setup", (res.setup_ms or 0.0) / 1000),
                                     ("true", tt), ("status", st), ("stage_cmd", sc),
                                     ("exec", ex)):
                            s[k].append(v)
                size[tier] = {"view_true_capture_ms": median_ms(s["view"]),
                              "setup_ms": median_ms(s["setup"]),
                              "plain_true_ms": median_ms(s["true"]),
                              "cli_status_ms": median_ms(s["status"]),
                              "cli_stage_cmd_ms": median_ms(s["stage_cmd"]),
                              "cli_exec_ms": median_ms(s["exec"])}
            out["sizes"][str(n)] = size
            client.close()
            delete_later(root)
    sizes = list(out["sizes"])
    if len(sizes) > 1:
        out["growth"] = {"files_ratio": C.ratio(int(sizes[-1]), int(sizes[0]))}
        for tier in tiers:
            a, b = out["sizes"][sizes[0]][tier], out["sizes"][sizes[-1]][tier]
            out["growth"][tier] = {k: C.ratio(b[k], a[k]) for k in (
                "view_true_capture_ms", "setup_ms", "cli_stage_cmd_ms", "cli_exec_ms",
                "cli_status_ms")}
    return out


SECTIONS = {"a": ("large_file", section_large), "b": ("big_tree", section_tree),
            "c": ("history", section_history), "d": ("agents", section_agents),
            "e": ("view", section_view)}


def save(result: dict) -> str:
    ver = result["machine"]
    if ver.get("src_uncommitted_changes") is not False:
        raise SystemExit("--save: src/ has uncommitted changes (or no git): figures are kept "
                         "only for a committed tree")
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = os.path.join(C.HERE, "results", f"scale.{stamp}.{ver['git_head']}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    return path


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CI: tiny sizes, a few seconds")
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--sections", default="abcde", help="which sections, e.g. a,c (default all)")
    ap.add_argument("--tree", help="(b): these file counts instead, e.g. 1000,5000")
    ap.add_argument("--tree-runs", type=int, default=0,
                    help="(b): runs per size (default 1 from 20k files on, else the mode's)")
    ap.add_argument("--distinct", action="store_true",
                    help="(b): every file of its own content (else all the same 121 bytes)")
    ap.add_argument("--unbatched-max", type=int, default=5000,
                    help="(b): run the unbatched variant (an fsync per file) up to this size")
    ap.add_argument("--agents", help="(d): these agent counts instead, e.g. 1,100")
    ap.add_argument("--save", action="store_true",
                    help="also write the JSON to benchmarks/results/ (committed src/ only)")
    args = ap.parse_args()
    name = "smoke" if args.smoke else "quick" if args.quick else "full"
    mode = dict(MODES[name], name=name, unbatched_max=args.unbatched_max,
                distinct=args.distinct, tree_runs=args.tree_runs)
    if args.tree:
        mode["tree"] = [int(x) for x in args.tree.split(",")]
    if args.agents:
        mode["agents"] = [int(x) for x in args.agents.split(",")]
    python = C.venv_python()
    env = C.bytecode_env(python)
    C.warm_bytecode(python, env)
    console = C.console_script(python)
    result: dict = {"benchmark": "scale", "mode": name, "smoke": args.smoke,
                    "machine": C.machine()}
    t_all = C.now()
    for key in args.sections.replace(",", ""):
        label, fn = SECTIONS[key]
        t0 = C.now()
        result[label] = fn(mode, python, env, console)
        result[label]["section_s"] = round(C.now() - t0, 1)
    result["total_s"] = round(C.now() - t_all, 1)
    result["waited_for_deletes_s"] = wait_deletes()
    if args.save:
        C.log(f"saved {save(result)}")
    C.emit(result, smoke=args.smoke)


if __name__ == "__main__":
    main()
