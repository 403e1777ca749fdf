#!/usr/bin/env python3
"""A global transaction across two workspaces and one database (issue 17), against the same
work in one workspace, in the same run; and stage-sql + commit against plain psycopg.

Setup: a throwaway Postgres cluster (fsync on, max_prepared_transactions on) is both the store
(schema ``bench_*``) and the application database; two workspaces (git repositories on the
benchmark's disk), each served by its own ``agent-2pc node`` subprocess (defaults: LISTEN plus
a 500 ms poll), the coordinator in this process through the library (GlobalClient).

Per repetition: (a) global: begin, stage a file in workspace 1, a file in workspace 2, two SQL
statements through workspace 1's Postgres participant, commit (vote in both, the decision row,
the decide in both); (b) local: the same files and statements in one workspace through the
library, commit. Latency per transaction (total and commit alone); throughput: transactions
per second with ``--clients`` coordinator threads at once (each its own connection), for
both. Then benchmarks/stage_sql.py's measure() on the same server: stage_sql + commit vs a plain
psycopg transaction doing the same statements.

    python benchmarks/distributed.py              # 30 repetitions, 4 clients
    python benchmarks/distributed.py --smoke      # CI
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import uuid

from _common import BenchDir, emit, log, machine, now, ratio, venv_python
from _common import wall_summary as summary
from stage_sql import measure as measure_stage_sql
from stage_sql import server_2pc


def _workspace(path: str) -> str:
    from agent_2pc import Agent2PC

    os.makedirs(path)
    subprocess.run(["git", "init", "-q", path], check=True)
    with open(os.path.join(path, "README"), "w") as f:
        f.write("bench\n")
    git = ["git", "-C", path, "-c", "user.email=b@example.com", "-c", "user.name=b"]
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "init"], check=True)
    Agent2PC.init(path).close()
    return path


def _node(root: str, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([venv_python(), "-m", "agent_2pc", "--root", root, "node", "--name",
                             name, "--json"], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line or not json.loads(line).get("ok"):
        raise SystemExit(f"node {name} did not start")
    return proc


def measure(dsn: str, base: str, reps: int, clients: int) -> dict:
    import psycopg

    from agent_2pc import Agent2PC
    from agent_2pc.distributed import GlobalClient

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    table = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text)")  # type: ignore
    env = dict(os.environ, AGENT2PC_STORE=dsn, AGENT2PC_STORE_SCHEMA=schema)
    env.pop("AGENT2PC_CRASH_AT", None)
    ws1 = _workspace(os.path.join(base, "ws1"))
    ws2 = _workspace(os.path.join(base, "ws2"))
    local_ws = _workspace(os.path.join(base, "local"))
    nodes = [_node(ws1, "ws1", env), _node(ws2, "ws2", env)]
    counter = iter(range(10**9))
    lock = threading.Lock()

    def ids() -> int:
        with lock:
            return next(counter)

    def sql(i: int) -> str:
        return f"INSERT INTO {table} VALUES ({i}, 'x'); UPDATE {table} SET v = 'y' WHERE id = {i}"

    def one_global(g: GlobalClient, k: int) -> tuple[float, float]:
        t0 = now()
        tx = g.begin(label="bench")
        tx.stage_write("ws1", f"f{k}.txt", f"global {k}\n")
        tx.stage_write("ws2", f"f{k}.txt", f"global {k}\n")
        tx.stage_sql("ws1", dsn, sql(ids()))
        t1 = now()
        out = tx.commit()
        t2 = now()
        assert out["state"] == "committed" and "pending" not in out, out
        return t2 - t0, t2 - t1

    def one_local(c: Agent2PC, k: int) -> tuple[float, float]:
        t0 = now()
        tx = c.begin(label="bench")
        tx.stage_write(f"a/f{k}.txt", f"local {k}\n")
        tx.stage_write(f"b/f{k}.txt", f"local {k}\n")
        tx.stage_sql(dsn, sql(ids()))
        t1 = now()
        tx.commit()
        t2 = now()
        return t2 - t0, t2 - t1

    def latency(kind: str) -> dict:
        total, commit = [], []
        if kind == "global":
            with GlobalClient(dsn, schema) as g:
                one_global(g, -1)  # warm: connections, schema
                for k in range(reps):
                    a, b = one_global(g, k)
                    total.append(a)
                    commit.append(b)
        else:
            c = Agent2PC(local_ws, daemon=False)
            try:
                one_local(c, -1)
                for k in range(reps):
                    a, b = one_local(c, k)
                    total.append(a)
                    commit.append(b)
            finally:
                c.close()
        return {"transaction": summary(total), "commit": summary(commit)}

    def throughput(kind: str) -> dict:
        per = max(1, reps // clients)
        errors: list[BaseException] = []

        def worker(w: int) -> None:
            try:
                if kind == "global":
                    with GlobalClient(dsn, schema) as g:
                        for k in range(per):
                            one_global(g, 1000 * (w + 1) + k)
                else:
                    c = Agent2PC(local_ws, daemon=False)
                    try:
                        for k in range(per):
                            one_local(c, 1000 * (w + 1) + k)
                    finally:
                        c.close()
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
        t = now()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = now() - t
        if errors:
            raise errors[0]
        return {"clients": clients, "transactions": per * clients,
                "elapsed_s": round(elapsed, 3), "tx_per_s": round(per * clients / elapsed, 2)}

    try:
        out: dict = {}
        for kind in ("global", "local"):
            log(f"{kind}: latency")
            out[kind] = latency(kind)
            log(f"{kind}: throughput with {clients} clients")
            out[kind]["throughput"] = throughput(kind)
        g, loc = out["global"], out["local"]
        out["global_vs_local_latency"] = ratio(g["transaction"]["median_ms"],
                                               loc["transaction"]["median_ms"])
        out["global_vs_local_commit"] = ratio(g["commit"]["median_ms"],
                                              loc["commit"]["median_ms"])
        out["global_vs_local_throughput"] = ratio(g["throughput"]["tx_per_s"],
                                                  loc["throughput"]["tx_per_s"])
        log(f"global {g['transaction']['median_ms']} ms/tx, local "
            f"{loc['transaction']['median_ms']} ms/tx")
        return out
    finally:
        for p in nodes:
            p.terminate()
            p.wait(30)
            if p.stdout is not None:
                p.stdout.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}")  # type: ignore[arg-type]
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    reps, clients = (2, 2) if args.smoke else (args.reps, args.clients)
    with BenchDir("distributed") as d:
        with server_2pc() as (dsn, server):
            result = measure(dsn, d.path, reps, clients)
            log("stage_sql + commit vs psycopg")
            result["stage_sql_vs_psycopg"] = measure_stage_sql(
                dsn, os.path.join(d.path, "sqlws"), 3 if args.smoke else reps)
        emit({"benchmark": "distributed", "reps": reps, "server": server,
              "work": "two files (one per workspace; in two directories locally) and an "
              "INSERT + UPDATE through the Postgres participant",
              "nodes": "two agent-2pc node processes, LISTEN/NOTIFY + 500 ms poll",
              **result, "disk": d.describe(probe=False), "machine": machine()},
             smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
