"""The log's fast paths give exactly what the slow paths give (docs/design.md, "Reading and
appending the log fast").

- ``apply_record`` skips the transition table for a ``stage`` of an active transaction (most of
  any log). Checked against a naive fold written from the table in docs/format.md, over random
  logs, legal and illegal.
- ``Log.append`` tells the usual case (nothing new, file not replaced) with one ``fstat`` and
  writes at once; everything else (another writer's records, a torn tail, corruption, a
  compaction that replaced the file) goes through the reading path first. Checked with two
  ``Log`` objects on one file, as two processes would have them.
- Reading pauses the cyclic garbage collector and always restores it.
"""

from __future__ import annotations

import gc
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_2pc import Agent2PC
from agent_2pc.core.states import (
    ACTIVE,
    TRANSITIONS,
    IllegalTransition,
    Tx,
    apply_record,
    record_kind,
)
from agent_2pc.errors import CorruptWal
from agent_2pc.storage import wal_format
from agent_2pc.storage.log import Log, PausedGc

TIDS = ("tx-a", "tx-b", "tx-c")


def _record(kind: str, tid: str, ts: int, pick: int) -> dict:
    rec: dict = {"type": kind, "tid": tid, "ts": ts}
    if kind == "begin":
        rec.update(label=None, timeout_ms=None, boot="b", pid=1)
    elif kind == "read":
        rec.update(path=f"p{pick % 3}", sha256=None)
    elif kind == "stage":
        rec.update(path=f"p{pick % 3}", op=("write", "delete")[pick % 2], via="write",
                   blob=None if pick % 2 else f"{pick:064x}", size=pick, mode=None, pre=None)
    elif kind == "effect":
        rec.update(n=pick % 2, kind="http", request={"method": "POST", "url": "u"}, key="k",
                   compensate=None)
    elif kind == "result":
        rec.update(phase="effect", n=0, outcome="done")
    elif kind == "check":
        rec.update(key=f"c{pick % 2}")
    elif kind in ("savepoint", "rollback"):
        rec.update(name=f"s{pick % 2}")
    elif kind == "prepare":
        rec.update(pid=1)
    elif kind == "decision":
        rec.update(outcome=("commit", "abort")[pick % 2], code=None, reason=None)
    elif kind == "end":
        rec.update(state=("committed", "aborted")[pick % 2], files=[])
    return rec


KINDS = ("begin", "read", "stage", "stage", "stage", "effect", "result", "check", "savepoint",
         "rollback", "prepare", "decision", "end")

logs = st.lists(st.tuples(st.sampled_from(KINDS), st.sampled_from(TIDS),
                          st.integers(min_value=0, max_value=5)), max_size=60)


def _as_records(draw: list[tuple[str, str, int]]) -> list[dict]:
    # Every transaction begins first, so that most random logs go a long way before any
    # illegal record (the legal runs are what the fast path is about).
    begins = [_record("begin", tid, 0, 0) for tid in TIDS]
    return begins + [_record(k, tid, i + 1, pick) for i, (k, tid, pick) in enumerate(draw)]


def naive_fold(records: list[dict]) -> tuple[dict, dict, dict, int | None]:
    """States, (path, op, blob) per transaction and the indexes of each one's records, from
    the transition table alone; and the index of the first illegal record, if any."""
    states: dict[str, str] = {}
    ops: dict[str, list] = {}
    marks: dict[str, list] = {}  # savepoint name, #ops, #effects
    effects: dict[str, int] = {}
    seen: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        tid, kind = rec["tid"], record_kind(rec)
        after = TRANSITIONS.get((kind, states.get(tid)))
        if after is None:
            return states, ops, seen, i
        if rec["type"] == "begin":
            ops[tid], marks[tid], effects[tid], seen[tid] = [], [], 0, []
        elif rec["type"] == "stage":
            ops[tid].append((rec["path"], rec["op"], rec["blob"]))
        elif rec["type"] == "effect":
            if rec["n"] != effects[tid]:
                return states, ops, seen, i
            effects[tid] += 1
        elif rec["type"] == "savepoint":
            marks[tid] = [m for m in marks[tid] if m[0] != rec["name"]]
            marks[tid].append((rec["name"], len(ops[tid]), effects[tid]))
        elif rec["type"] == "rollback":
            names = [m[0] for m in marks[tid]]
            if rec["name"] not in names:
                return states, ops, seen, i
            k = names.index(rec["name"])
            _, n_ops, n_effects = marks[tid][k]
            del ops[tid][n_ops:]
            effects[tid] = n_effects
            del marks[tid][k + 1:]
        states[tid] = after
        seen[tid].append(i)
    return states, ops, seen, None


def fold(records: list[dict], frames: list[bytes] | None = None) -> tuple[dict, int | None]:
    txs: dict[str, Tx] = {}
    for i, rec in enumerate(records):
        try:
            apply_record(txs, rec, frames[i] if frames is not None else str(i).encode())
        except IllegalTransition:
            return txs, i
    return txs, None


def assert_same(txs: dict[str, Tx], stop: int | None, records: list[dict]) -> None:
    states, ops, seen, naive_stop = naive_fold(records)
    assert stop == naive_stop
    assert {tid: tx.state for tid, tx in txs.items()} == states
    assert {tid: [(o.path, o.op, o.blob) for o in tx.ops] for tid, tx in txs.items()} == ops
    assert {tid: [int(f) for f in tx.frames] for tid, tx in txs.items()} == seen


def test_the_fast_path_is_the_tables_own_transition():
    assert TRANSITIONS[("stage", ACTIVE)] == ACTIVE


@settings(max_examples=300, deadline=None)
@given(logs)
def test_fold_matches_the_transition_table_on_random_logs(draw):
    records = _as_records(draw)
    txs, stop = fold(records)
    assert_same(txs, stop, records)


def test_a_stage_outside_an_active_transaction_is_still_illegal():
    for before in ("prepare", "decision"):
        records = [_record("begin", "tx-a", 0, 0), _record(before, "tx-a", 1, 0),
                   _record("stage", "tx-a", 2, 0)]
        with pytest.raises(IllegalTransition):
            fold_strict(records)
    with pytest.raises(IllegalTransition):
        fold_strict([_record("stage", "tx-a", 0, 0)])  # no begin


def fold_strict(records: list[dict]) -> dict[str, Tx]:
    txs: dict[str, Tx] = {}
    for rec in records:
        apply_record(txs, rec)
    return txs


# -- the log file, as two processes see it ---------------------------------------------------


def _logs(tmp_path) -> tuple[Log, Log, str]:
    path = str(tmp_path / "wal.bin")
    lock = str(tmp_path / "lock")
    open(path, "xb").close()  # init makes it; the log never does
    return Log(path, lock), Log(path, lock), path


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
def two(tmp_path):
    a, b, path = _logs(tmp_path)
    yield a, b, path
    a.close()
    b.close()
    a.lock.close()
    b.lock.close()


def _legal(records: list[dict]) -> list[dict]:
    _, stop = fold(records)
    return records if stop is None else records[:stop]


@settings(max_examples=40, deadline=None)
@given(logs, st.lists(st.booleans(), max_size=60), st.integers(min_value=1, max_value=12))
def test_appends_from_two_writers_fold_like_the_records_in_file_order(tmp_path_factory, draw,
                                                                      who, torn_bytes):
    tmp_path = tmp_path_factory.mktemp("log")
    records = _legal(_as_records(draw))
    a, b, path = _logs(tmp_path)
    seen: dict[int, dict[str, Tx]] = {id(a): {}, id(b): {}}
    try:
        for i, rec in enumerate(records):
            log = a if (who[i] if i < len(who) else False) else b
            batch = log.append([rec], sync=False)
            if batch.reset:
                seen[id(log)] = {}
            for r, f in zip(batch.records, batch.frames, strict=True):
                apply_record(seen[id(log)], r, f)
        # A writer killed mid-append leaves half a frame; the next append repairs it first.
        half = wal_format.encode(_record("read", "tx-a", 0, 0))[:torn_bytes]
        with open(path, "ab") as f:
            f.write(half)
        last = _record("begin", "tx-z", 99, 0)
        for log in (a, b):
            batch = log.append([last], sync=True) if log is a else log.read()
            if batch.reset:
                seen[id(log)] = {}
            for r, f in zip(batch.records, batch.frames, strict=True):
                apply_record(seen[id(log)], r, f)
        assert a.truncated_bytes == torn_bytes
        cut_at = os.path.getsize(path) - len(wal_format.encode(last))
        assert os.path.exists(f"{path}.torn-{cut_at}")
        everything = records + [last]
        on_disk = wal_format.decode(_read(path))
        assert on_disk.damage is None and on_disk.records == everything
        expected, stop = fold(everything, [bytes(f) for f in on_disk.frames])
        assert stop is None
        for log in (a, b):
            txs = seen[id(log)]
            assert {t: tx.state for t, tx in txs.items()} == {
                t: tx.state for t, tx in expected.items()}
            assert {t: [bytes(f) for f in tx.frames] for t, tx in txs.items()} == {
                t: [bytes(f) for f in tx.frames] for t, tx in expected.items()}
    finally:
        for log in (a, b):
            log.close()
            log.lock.close()


def test_an_append_behind_another_writers_records_returns_them_first(two):
    a, b, path = two
    a.append([_record("begin", "tx-a", 1, 0)], sync=False)
    b.append([_record("begin", "tx-b", 2, 0), _record("stage", "tx-b", 3, 1)], sync=False)
    batch = a.append([_record("stage", "tx-a", 4, 2)], sync=True)
    assert [(r["tid"], r["type"]) for r in batch.records] == [
        ("tx-b", "begin"), ("tx-b", "stage"), ("tx-a", "stage")]
    assert not batch.reset
    assert b"".join(bytes(f) for f in batch.frames) == _read(path)[
        len(wal_format.encode(_record("begin", "tx-a", 1, 0))):]


def test_an_append_after_a_compaction_goes_to_the_new_file(two):
    a, b, path = two
    first = [_record("begin", t, 1, 0) for t in TIDS]
    a.append(first, sync=False)
    b.read()
    with b.lock:
        b.replace([wal_format.encode(first[2])])  # the others "finished"
    own = _record("stage", "tx-c", 5, 0)
    batch = a.append([own], sync=True)
    assert batch.reset
    assert batch.records == [first[2], own]
    assert wal_format.decode(_read(path)).records == [first[2], own]


def test_an_append_never_lands_after_corruption(two):
    a, b, path = two
    a.append([_record("begin", "tx-a", 1, 0)], sync=False)
    b.read()
    b.append([_record("begin", "tx-b", 2, 0), _record("begin", "tx-c", 3, 0)], sync=False)
    data = bytearray(_read(path))
    second = len(wal_format.encode(_record("begin", "tx-a", 1, 0)))
    data[second + 20] ^= 1  # a payload byte of tx-b's begin: tx-c's frame stays valid after it
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(CorruptWal) as exc:
        a.append([_record("stage", "tx-a", 4, 0)], sync=True)
    assert exc.value.details["offset"] == second
    assert _read(path) == bytes(data)  # nothing written, nothing cut


# -- the garbage collector -------------------------------------------------------------------


def test_paused_gc_restores_the_collector_as_it_was():
    assert gc.isenabled()
    try:
        with PausedGc():
            assert not gc.isenabled()
        assert gc.isenabled()
        with pytest.raises(RuntimeError), PausedGc():
            raise RuntimeError("boom")
        assert gc.isenabled()
        gc.disable()
        with PausedGc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller that turned it off keeps it off
    finally:
        gc.enable()


def test_opening_and_working_leave_the_collector_on(tmp_path):
    root = str(tmp_path)
    client = Agent2PC.init(root)
    tx = client.begin()
    tx.stage_write("a.txt", "a\n")
    tx.commit()
    assert gc.isenabled()
    Agent2PC(root).engine.transactions()
    assert gc.isenabled()


def test_torn_tails_set_aside_are_bounded_the_newest_kept(tmp_path):
    from agent_2pc.storage.log import TORN, TORN_KEPT_MAX

    client = Agent2PC.init(tmp_path)
    wal = os.path.join(tmp_path, ".agent-tx", "wal.bin")
    cuts = []
    try:
        for i in range(TORN_KEPT_MAX + 5):
            cuts.append(os.path.getsize(wal))
            with open(wal, "ab") as f:  # a writer killed mid-append
                f.write(wal_format.encode(_record("begin", f"tx-{i}", i, 0))[:7])
            client.begin()  # the next append cuts it off and sets it aside
    finally:
        client.close()
    aside = sorted(n for n in os.listdir(os.path.dirname(wal)) if TORN in n)
    assert len(aside) == TORN_KEPT_MAX, aside
    assert f"wal.bin{TORN}{cuts[-1]}" in aside and f"wal.bin{TORN}{cuts[0]}" not in aside
    assert wal_format.decode(_read(wal)).damage is None
