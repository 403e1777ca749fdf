"""The daemon: one client's step latency, and group commit's throughput with concurrent clients.

1. Step latency, one client: ``stage_write`` (a small file) and ``status`` of a transaction,
   through the daemon (the library over the socket) vs the in-process library
   (``Agent2PC(root, daemon=False)``), in alternating blocks; and a CLI process per step
   (``agent-2pc stage-write ... --json``), through the daemon and with ``--no-daemon``.
   Target (issue 15): daemon <= 1.3x in-process.
2. Group commit: N client processes (1, 2, 4, 8, 16), each committing ``begin; stage_write(its
   own file); commit`` in a loop for a fixed time through the daemon (fsync on: the library has
   no switch), against the single-stream minimal durable loop of commit_throughput.py run on the
   same disk in the same run (4 fsyncs per commit: the least a redo-logged durable file change
   needs). Reported: aggregate committed tx/s, p50/p99 of a client's round, the daemon's log
   fsyncs for those commits (its status counters), and the ratio to the minimal loop.
   Target: >= 3x the minimal loop at 8 clients.

    python benchmarks/daemon.py [--rounds 300] [--duration 5] [--clients 1,2,4,8,16] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import _common as C

HERE = os.path.dirname(os.path.abspath(__file__))


def start_daemon(root: str, python: str, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([python, "-m", "agent_2pc", "--root", root, "daemon", "start",
                             "--foreground", "--json", "--reap-interval-ms", "0"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line or not json.loads(line).get("ok"):
        raise SystemExit(f"the daemon did not start: {line!r} "
                         f"{proc.stderr.read().decode() if proc.stderr else ''}")
    return proc


def daemon_status(root: str) -> dict:
    from agent_2pc.daemon.control import status

    return status(root)


# -- 1. step latency -----------------------------------------------------------------------


def step_latency(root: str, rounds: int, block: int) -> dict:
    from agent_2pc import Agent2PC

    sides = {"daemon": Agent2PC(root), "in_process": Agent2PC(root, daemon=False)}
    assert sides["daemon"].via_daemon and not sides["in_process"].via_daemon
    txs = {name: c.begin(label=f"latency {name}") for name, c in sides.items()}
    samples: dict[str, dict[str, list[float]]] = {
        name: {"stage_write": [], "status": []} for name in sides}
    content = b"x" * 200
    for name, tx in txs.items():  # warm-up
        for _ in range(min(20, rounds)):
            tx.stage_write(f"lat-{name}.txt", content)
            tx.status()
    done = 0
    while done < rounds:
        n = min(block, rounds - done)
        for name, tx in txs.items():
            s = samples[name]
            for _ in range(n):
                t0 = C.now()
                tx.stage_write(f"lat-{name}.txt", content)
                t1 = C.now()
                tx.status()
                t2 = C.now()
                s["stage_write"].append(t1 - t0)
                s["status"].append(t2 - t1)
        done += n
    out: dict = {}
    for name in sides:
        out[name] = {step: C.latency_ms(v) for step, v in samples[name].items()}
    out["ratio_daemon_over_in_process_p50"] = {
        step: C.ratio(out["daemon"][step]["p50"], out["in_process"][step]["p50"])
        for step in ("stage_write", "status")}
    for name, tx in txs.items():
        tx.abort()
        sides[name].close()
    return out


def cli_latency(root: str, python: str, env: dict, runs: int) -> dict:
    from agent_2pc import Agent2PC

    console = C.console_script(python)
    client = Agent2PC(root, daemon=False)
    tid = client.begin(label="cli latency").tid
    out = {}
    for name, extra in (("daemon", []), ("no_daemon", ["--no-daemon"])):
        argv = [console, "--root", root, *extra, "stage-write", "--tid", tid, "--path",
                "cli.txt", "--content", "x", "--json"]
        C.time_run(argv, env)  # warm-up (bytecode)
        out[name] = C.wall_summary([C.time_run(argv, env) for _ in range(runs)])
    client.get(tid).abort()
    client.close()
    return out


# -- 2. group commit -----------------------------------------------------------------------


def worker(root: str, ident: int, start_at: float, duration: float) -> None:
    """One client process: commit rounds on its own file until the time is up."""
    from agent_2pc import Agent2PC

    client = Agent2PC(root)
    assert client.via_daemon
    name = f"client-{ident}.txt"
    lat: list[float] = []
    while time.time() < start_at:
        time.sleep(0.001)
    end = start_at + duration
    n = 0
    while time.time() < end:
        t0 = C.now()
        tx = client.begin()
        tx.stage_write(name, f"round {n} of client {ident}\n")
        out = tx.commit()
        lat.append(C.now() - t0)
        assert out["state"] == "committed", out
        n += 1
    client.close()
    sys.stdout.write(json.dumps({"committed": n, "lat": lat}) + "\n")


def group_commit(root: str, python: str, env: dict, clients: int, duration: float) -> dict:
    before = daemon_status(root)
    start_at = time.time() + 1.0 + 0.05 * clients  # every worker up before the start
    procs = [subprocess.Popen([python, os.path.join(HERE, "daemon.py"), "--worker", root,
                               str(i), repr(start_at), repr(duration)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(clients)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=duration + 120)
        if p.returncode != 0:
            raise SystemExit(f"a client failed: {err.decode()[-2000:]}")
        results.append(json.loads(out))
    after = daemon_status(root)
    committed = sum(r["committed"] for r in results)
    lat = [x for r in results for x in r["lat"]]
    commits = after["commits"] - before["commits"]
    fsyncs = after["fsyncs"] - before["fsyncs"]
    return {"clients": clients, "committed": committed,
            "tx_per_s": C.r3(committed / duration), "round_latency_ms": C.latency_ms(lat),
            "daemon_commits": commits, "decision_fsyncs": fsyncs,
            "commits_per_decision_fsync": C.ratio(commits, fsyncs),
            "largest_batch_so_far": after.get("largest_batch")}


def minimal_loop(path: str, duration: float) -> dict:
    sys.path.insert(0, HERE)
    from commit_throughput import MinimalLoop

    tree = os.path.join(path, "tree")
    os.makedirs(tree)
    loop = MinimalLoop(tree, os.path.join(path, "meta"))
    names = [f"f{i}.txt" for i in range(10)]
    lat: list[float] = []
    n = 0
    end = C.now() + duration
    while C.now() < end:
        t0 = C.now()
        loop.commit(n, names[n % len(names)], f"round {n}\n".encode())
        lat.append(C.now() - t0)
        n += 1
    loop.close()
    return {"committed": n, "tx_per_s": C.r3(n / duration), "latency_ms": C.latency_ms(lat),
            "fsyncs_per_tx": 4}


def library_loop(root: str, duration: float) -> dict:
    """The in-process library, one stream (no daemon): the single agent of today."""
    from agent_2pc import Agent2PC

    client = Agent2PC(root, daemon=False)
    n = 0
    end = C.now() + duration
    while C.now() < end:
        tx = client.begin()
        tx.stage_write("single.txt", f"round {n}\n")
        tx.commit()
        n += 1
    client.close()
    return {"committed": n, "tx_per_s": C.r3(n / duration)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=300, help="timed steps per side")
    ap.add_argument("--block", type=int, default=25, help="steps per block (sides alternate)")
    ap.add_argument("--cli-runs", type=int, default=15, help="CLI processes per side")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per client count")
    ap.add_argument("--clients", default="1,2,4,8,16", help="client counts, comma-separated")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.block, args.cli_runs, args.duration = 20, 10, 2, 0.5
        args.clients = "1,2"
    counts = [int(x) for x in args.clients.split(",") if x.strip()]
    python = C.venv_python()
    env = C.bytecode_env(python)
    result: dict = {"benchmark": "daemon", "machine": C.machine()}
    from agent_2pc import Agent2PC

    with C.BenchDir("daemon") as bench:
        result["disk"] = bench.describe(probe=not args.smoke)
        root = os.path.join(bench.path, "ws")
        os.makedirs(root)
        Agent2PC.init(root).close()
        daemon = start_daemon(root, python, env)
        try:
            C.log(f"daemon: step latency, {args.rounds} steps per side")
            result["step_latency"] = step_latency(root, args.rounds, args.block)
            C.log(f"daemon: a CLI process per step, {args.cli_runs} runs per side")
            result["cli_process_per_step"] = cli_latency(root, python, env, args.cli_runs)
            levels = []
            for n in counts:
                C.log(f"daemon: group commit, {n} client(s), {args.duration} s")
                levels.append(group_commit(root, python, env, n, args.duration))
            result["group_commit"] = levels
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
            for s in (daemon.stdout, daemon.stderr):
                if s is not None:
                    s.close()
        C.log(f"daemon: minimal durable loop and in-process library, {args.duration} s each")
        result["minimal_loop"] = minimal_loop(os.path.join(bench.path, "minimal"),
                                              args.duration)
        lib_root = os.path.join(bench.path, "lib")
        os.makedirs(lib_root)
        Agent2PC.init(lib_root).close()
        result["library_single_stream"] = library_loop(lib_root, args.duration)
    floor = result["minimal_loop"]["tx_per_s"]
    result["group_commit_over_minimal_loop"] = {
        str(level["clients"]): C.ratio(level["tx_per_s"], floor) for level in levels}
    result["targets"] = {
        "step_latency_daemon_over_in_process_max": 1.3,
        "group_commit_at_8_over_minimal_loop_min": 3.0}
    C.emit(result, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
