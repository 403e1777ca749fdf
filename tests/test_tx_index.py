"""The transaction's index of its ops (core/states.py, ``Tx.staged`` and ``Tx.holds_below``):
the same answers as a scan of every op, through overwrites, deletes and rollbacks to a
savepoint, at a cost per lookup that does not grow with the transaction (a step staging n
files into a transaction of n files used to cost n^2: 20,000 files, 400 million compares)."""

from __future__ import annotations

import random
import time

from agent_2pc.core import records
from agent_2pc.core.states import Tx, apply_record

TID = "tx-20261202-054300-000000"
BLOB = "ab" * 32


def _fold(recs: list[dict]) -> Tx:
    txs: dict[str, Tx] = {}
    for rec in recs:
        apply_record(txs, dict(rec))
    return txs[TID]


def _stage(path: str, op: str) -> dict:
    blob = BLOB if op == "write" else None
    return records.stage(TID, path=path, op=op, via=op, blob=blob, size=0, mode=None, pre=None)


def _scan_staged(tx: Tx, path: str):  # type: ignore[no-untyped-def]
    for op in reversed(tx.ops):
        if op.path == path:
            return op
    return None


def _scan_holds_below(tx: Tx, rel_dir: str) -> bool:
    return any(op.op != "delete" and op.path.startswith(rel_dir + "/")
               and _scan_staged(tx, op.path) is op for op in tx.ops)


def test_the_index_answers_as_a_scan_through_overwrites_deletes_and_rollbacks() -> None:
    rng = random.Random(19)
    paths = [f"d{a}/e{b}/f{c}.txt" for a in range(3) for b in range(3) for c in range(3)]
    dirs = sorted({p.rsplit("/", 1)[0] for p in paths} | {p.split("/")[0] for p in paths})
    recs = [records.begin(TID, label=None, timeout_ms=None, boot=None, pid=1)]
    tx = _fold(recs)
    txs = {TID: tx}
    names: list[str] = []
    for step in range(600):
        roll = rng.random()
        if roll < 0.05:
            name = f"s{step}"
            apply_record(txs, dict(records.savepoint(TID, name=name)))
            names.append(name)
        elif roll < 0.09 and names:
            name = rng.choice(names)
            apply_record(txs, dict(records.rollback(TID, name=name)))
            names = names[:names.index(name) + 1]
        else:
            op = rng.choice(["write", "write", "delete", "mkdir"])
            apply_record(txs, dict(_stage(rng.choice(paths), op)))
        if step % 7 == 0:  # looked up now and then: the index catches up in between
            for p in paths:
                assert tx.staged(p) is _scan_staged(tx, p), (step, p)
            for d in dirs:
                assert tx.holds_below(d) == _scan_holds_below(tx, d), (step, d)


def test_looking_up_every_path_of_a_big_transaction_costs_no_scan_per_lookup() -> None:
    n = 100_000
    recs = [records.begin(TID, label=None, timeout_ms=None, boot=None, pid=1)]
    recs += [_stage(f"big/d{i // 100:04d}/f{i:06d}.txt", "write") for i in range(n)]
    tx = _fold(recs)
    t = time.perf_counter()
    assert all(tx.staged(f"big/d{i // 100:04d}/f{i:06d}.txt") is not None for i in range(n))
    assert all(tx.holds_below(f"big/d{i:04d}") for i in range(n // 100))
    assert tx.staged("big/elsewhere.txt") is None and not tx.holds_below("other")
    # A scan per lookup is 5 billion compares here (hours); the index, well under a second.
    assert time.perf_counter() - t < 20
