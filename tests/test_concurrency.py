"""Many processes and threads on one workspace: disjoint transactions all commit; overlapping
ones never lose an update (each conflict is an abort the caller retries)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from crashkit import wal_is_clean

from agent_2pc import Agent2PC, TransactionAborted

pytestmark = pytest.mark.timeout(240)

WORKER = r'''
import json, sys
from agent_2pc import Agent2PC, TransactionAborted
root, mode, me, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
client = Agent2PC(root)
done = conflicts = 0
for j in range(rounds):
    while True:
        tx = client.begin(label=f"w{me}-{j}")
        try:
            if mode == "disjoint":
                tx.stage_write(f"w{me}/f{j}.txt", f"{me} {j}\n")
                tx.stage_write(f"shared-dir/w{me}-{j}.txt", "x\n")
            else:
                value = int(tx.read("counter.txt"))
                tx.stage_write("counter.txt", f"{value + 1}\n")
                tx.stage_write(f"log/w{me}-{j}.txt", f"{value}\n")
            tx.commit()
            done += 1
            break
        except TransactionAborted as exc:
            assert exc.code == "conflict", exc.code
            conflicts += 1
print(json.dumps({"done": done, "conflicts": conflicts}))
'''


def _run_workers(root: Path, mode: str, workers: int, rounds: int) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(root), mode, str(i),
                               str(rounds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(workers)]
    answers = []
    try:
        for p in procs:
            answers.append(p.communicate(timeout=200))
    finally:  # every worker waited for, whatever failed (none left running to later tests)
        for p in procs:
            if p.returncode is None:
                p.kill()
                p.communicate()
    results = []
    for p, (out, err) in zip(procs, answers, strict=True):
        assert p.returncode == 0, err
        results.append(json.loads(out))
    return results


def test_disjoint_transactions_from_many_processes_all_commit(tmp_path):
    Agent2PC.init(tmp_path)
    results = _run_workers(tmp_path, "disjoint", workers=6, rounds=15)
    assert all(r == {"done": 15, "conflicts": 0} for r in results)
    for i in range(6):
        for j in range(15):
            assert (tmp_path / f"w{i}" / f"f{j}.txt").read_text() == f"{i} {j}\n"
    assert len(list((tmp_path / "shared-dir").iterdir())) == 90
    rows = Agent2PC(tmp_path).transactions()
    assert len(rows) == 90 and all(r["state"] == "committed" for r in rows)
    assert wal_is_clean(tmp_path)


def test_overlapping_read_modify_writes_from_many_processes_never_lose_an_update(tmp_path):
    (tmp_path / "counter.txt").write_text("0\n")
    Agent2PC.init(tmp_path)
    results = _run_workers(tmp_path, "counter", workers=5, rounds=12)
    total = sum(r["done"] for r in results)
    assert total == 60
    assert (tmp_path / "counter.txt").read_text() == "60\n"
    # Every committed increment saw a distinct value: none was lost or applied twice.
    seen = sorted(int(p.read_text()) for p in (tmp_path / "log").iterdir())
    assert seen == list(range(60))
    rows = Agent2PC(tmp_path).transactions(limit=None)  # every one (the default: 100)
    assert sum(r["state"] == "committed" for r in rows) == 60
    assert sum(r["state"] == "aborted" for r in rows) == sum(r["conflicts"] for r in results)


def test_threads_with_their_own_clients_never_lose_an_update(tmp_path):
    (tmp_path / "counter.txt").write_text("0\n")
    Agent2PC.init(tmp_path)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            client = Agent2PC(tmp_path)
            barrier.wait()
            for _ in range(10):
                while True:
                    tx = client.begin()
                    try:
                        tx.stage_write("counter.txt", f"{int(tx.read('counter.txt')) + 1}\n")
                        tx.commit()
                        break
                    except TransactionAborted as exc:
                        assert exc.code == "conflict"
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=200)
    assert not errors, errors
    assert (tmp_path / "counter.txt").read_text() == "40\n"


def test_stage_then_outside_write_then_commit_keeps_the_outside_content(tmp_path):
    (tmp_path / "a.txt").write_text("base\n")
    client = Agent2PC.init(tmp_path)
    tx = client.begin()
    tx.stage_write("a.txt", "mine\n")
    (tmp_path / "a.txt").write_text("theirs\n")
    with pytest.raises(TransactionAborted) as info:
        tx.commit()
    assert info.value.code == "conflict"
    assert (tmp_path / "a.txt").read_text() == "theirs\n"
