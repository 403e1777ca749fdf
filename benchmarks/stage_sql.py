#!/usr/bin/env python3
"""``tx.stage_sql`` + ``commit`` (with one file) against a plain psycopg transaction doing the
same statements, and against psycopg doing the same two-phase commit by hand (issue 17).

Per repetition, on a fresh table row: (a) agent-2pc, in-process through the library: begin,
stage one file, ``stage_sql`` (validated in a rolled-back transaction), ``commit`` (PREPARE
TRANSACTION, the decision, the file, COMMIT PREPARED), timed as stage_sql and commit; (b)
psycopg: connect, the statements, COMMIT; (c) psycopg by hand: connect, the statements,
PREPARE TRANSACTION, connect, COMMIT PREPARED; (d) the commit of a transaction with the file
alone (what the SQL adds to a commit). ``overhead_vs_plain`` is (a)'s median over (b)'s.

The server: $AGENT2PC_BENCH_POSTGRES_2PC_DSN, else a throwaway cluster (initdb/pg_ctl under
/usr/lib/postgresql/*/bin, fsync on, on the benchmark's disk; as the postgres user when root).

    python benchmarks/stage_sql.py              # 50 repetitions
    python benchmarks/stage_sql.py --smoke      # CI
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import shutil
import socket
import subprocess
import uuid
from typing import Iterator

from _common import BenchDir, emit, log, machine, now, ratio
from _common import wall_summary as summary


def start_cluster(path: str) -> tuple[str, list[str]]:
    """Start a cluster with max_prepared_transactions in ``path``; (DSN, pg_ctl stop argv)."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        raise SystemExit("no initdb under /usr/lib/postgresql/*/bin: set "
                         "AGENT2PC_BENCH_POSTGRES_2PC_DSN")
    bindir = os.path.dirname(bins[-1])
    prefix: list[str] = []
    if os.geteuid() == 0:
        import pwd

        pw = pwd.getpwnam("postgres")
        os.chmod(path, 0o755)
        os.chown(path, pw.pw_uid, pw.pw_gid)
        prefix = [shutil.which("runuser") or "runuser", "-u", "postgres", "--"]
    data = os.path.join(path, "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = [*prefix, os.path.join(bindir, "initdb"), "-D", data, "-U", "postgres",
           "--auth=trust", "-E", "UTF8"]
    subprocess.run(run, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    opts = (f"-c listen_addresses=127.0.0.1 -p {port} -k {path} "
            "-c max_prepared_transactions=10")
    pg_ctl = os.path.join(bindir, "pg_ctl")
    subprocess.run([*prefix, pg_ctl, "-D", data, "-o", opts, "-w", "-l",
                    os.path.join(path, "log"), "start"], check=True, stdout=subprocess.DEVNULL)
    return (f"postgresql://postgres@127.0.0.1:{port}/postgres",
            [*prefix, pg_ctl, "-D", data, "-m", "fast", "-w", "stop"])


@contextlib.contextmanager
def server_2pc() -> Iterator[tuple[str, str]]:
    """(DSN, what it is) of a server with max_prepared_transactions on:
    $AGENT2PC_BENCH_POSTGRES_2PC_DSN, else a throwaway cluster, stopped and removed at the end.
    The cluster lives in the system's temp dir, as tests/pg_cluster.py's does (what it is
    names the dir): run as root, initdb runs as the postgres user, who cannot go through a
    private parent of the benchmark's own dir (a checkout in ``mktemp -d``)."""
    dsn = os.environ.get("AGENT2PC_BENCH_POSTGRES_2PC_DSN")
    if dsn:
        yield dsn, "given"
        return
    import tempfile

    pg = tempfile.mkdtemp(prefix="a2pc-bench-pg-")
    try:
        dsn, stop = start_cluster(pg)
        try:
            yield dsn, f"throwaway cluster in {pg}, fsync on"
        finally:
            subprocess.run(stop, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        shutil.rmtree(pg, ignore_errors=True)


def measure(dsn: str, ws: str, reps: int) -> dict:
    import psycopg

    from agent_2pc import Agent2PC

    table = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text)")

    def statements(i: int) -> str:
        return (f"INSERT INTO {table} VALUES ({i}, 'x'); "
                f"UPDATE {table} SET v = 'y' WHERE id = {i}")

    os.makedirs(ws)
    client = Agent2PC.init(ws)
    staged, committed, total, plain, by_hand, file_only = [], [], [], [], [], []
    for r in range(reps):
        tx = client.begin()
        tx.stage_write("generated.txt", f"row {r}\n")
        t0 = now()
        tx.stage_sql(dsn, statements(3 * r))
        t1 = now()
        tx.commit()
        t2 = now()
        staged.append(t1 - t0)
        committed.append(t2 - t1)
        total.append(t2 - t0)

        tx = client.begin()
        tx.stage_write("generated.txt", f"row {r} alone\n")
        t = now()
        tx.commit()
        file_only.append(now() - t)

        t = now()
        with psycopg.connect(dsn) as conn:
            conn.execute(statements(3 * r + 1))
        plain.append(now() - t)

        t = now()
        gid = f"bench_{uuid.uuid4().hex}"
        with psycopg.connect(dsn) as conn:
            conn.execute(statements(3 * r + 2))
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"COMMIT PREPARED '{gid}'")
        by_hand.append(now() - t)
    client.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        conn.execute(f"DROP TABLE {table}")
    assert rows == 3 * reps, rows
    a, b, c = summary(total), summary(plain), summary(by_hand)
    log(f"stage_sql+commit {a['median_ms']} ms, psycopg {b['median_ms']} ms, "
        f"psycopg 2PC by hand {c['median_ms']} ms")
    return {"stage_sql_and_commit": a, "stage_sql": summary(staged),
            "commit": summary(committed), "commit_of_the_file_alone": summary(file_only),
            "psycopg_transaction": b,
            "psycopg_two_phase_by_hand": c,
            "overhead_vs_plain": ratio(a["median_ms"], b["median_ms"]),
            "overhead_vs_two_phase_by_hand": ratio(a["median_ms"], c["median_ms"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    reps = 3 if args.smoke else args.reps
    with BenchDir("sql") as d:
        with server_2pc() as (dsn, server):
            result = measure(dsn, os.path.join(d.path, "ws"), reps)
        emit({"benchmark": "stage_sql", "reps": reps, "server": server,
              "statements": "INSERT one row; UPDATE it", "file": "one file written with it",
              **result, "disk": d.describe(probe=False), "machine": machine()},
             smoke=args.smoke)


if __name__ == "__main__":
    main()
