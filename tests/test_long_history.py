"""Long histories (issue 19, item 3): ``list``, ``log`` and ``status --tid`` cost what they
show, not the history's length; history.jsonl is sealed into segments and the oldest are cut
by retention, with the hash chain still verifiable; a crash while sealing or cutting leaves a
readable history (storage/history_store.py; docs/format.md, "history.jsonl")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from agent_2pc import Agent2PC
from agent_2pc.coordinator import compaction
from agent_2pc.errors import Tampered, UnknownTid
from agent_2pc.storage import history_store
from agent_2pc.storage.history_store import Store

pytestmark = pytest.mark.timeout(300)


def _cli(root: str, *args: str, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "agent_2pc", "--root", root, *args, "--json"],
                          capture_output=True, text=True, timeout=120, env=full)


def _history(root: str) -> str:
    return os.path.join(root, ".agent-tx", "history.jsonl")


def _commit(client: Agent2PC, n: int, prefix: str = "t") -> list[str]:
    tids = []
    for i in range(n):
        with client.transaction(label=f"{prefix}{i}") as tx:
            tx.stage_write(f"{prefix}{i % 5}.txt", f"{i}\n")
        tids.append(tx.tid)
    return tids


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments of 4 KiB (about 8 lines) and no retention: many segments from few
    transactions."""
    monkeypatch.setattr(history_store, "SEGMENT_BYTES", 4096)
    monkeypatch.setattr(history_store, "KEEP", 0)
    monkeypatch.setattr(compaction, "COMPACT_FINISHED_MAX", 4)  # compact every 4 commits


class _Counted:
    """Counts the bytes the history reader reads (history_store._pread) and the segment files
    it opens."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        self.segments_opened = 0
        real = history_store._pread
        real_path = history_store.Store.segment_path

        def pread(fd: int, n: int, offset: int) -> bytes:
            data = real(fd, n, offset)
            self.bytes += len(data)
            return data

        def segment_path(store: Store, seq: int) -> str:
            self.segments_opened += 1
            return real_path(store, seq)

        monkeypatch.setattr(history_store, "_pread", pread)
        monkeypatch.setattr(history_store.Store, "segment_path", segment_path)


def _grow(root: str, n: int) -> list[str]:
    """Append ``n`` lines to history.jsonl, copies of a real compacted line with fresh tids
    (not chained: for the readers only). Returns the tids, oldest first."""
    with open(_history(root), "rb") as f:
        template = f.read().splitlines()[-1]
    old = json.loads(template)["tid"]
    tids = [f"tx-20260101-000000-{i:06x}" for i in range(n)]
    with open(_history(root), "ab") as f:
        f.write(b"".join(template.replace(old.encode(), t.encode()) + b"\n" for t in tids))
    return tids


def test_list_reads_only_the_newest_page_of_a_long_history(root, client, monkeypatch):
    _commit(client, 2)
    client.compact()
    tids = _grow(root, 40_000)  # ~8 MiB in history.jsonl
    size = os.path.getsize(_history(root))
    live = client.begin(label="live")
    counted = _Counted(monkeypatch)
    rows = Agent2PC(root).transactions()
    assert [r["tid"] for r in rows] == tids[-99:] + [live.tid]  # oldest first, live last
    assert counted.bytes < 128 * 1024 < size // 50
    counted.bytes = 0
    rows = Agent2PC(root).transactions("committed", limit=10)
    assert [r["tid"] for r in rows] == tids[-10:] and counted.bytes < 2 * 64 * 1024
    counted.bytes = 0
    entries = Agent2PC(root).engine.log_entries(limit=5)
    assert [e["tid"] for e in entries] == tids[:-6:-1] and counted.bytes < 2 * 64 * 1024


def test_list_of_the_newest_page_does_not_read_history_damaged_far_back(root, client):
    _commit(client, 3)
    client.compact()
    with open(_history(root), "r+b") as f:  # the oldest line: bytes that are not JSON
        f.write(b"\xff" * 20)
    _grow(root, 20_000)
    out = _cli(root, "list", "--limit", "5")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert len(answer["transactions"]) == 5 and answer["more"] is True


def test_paging_returns_every_transaction_exactly_once(root, client, small_segments):
    early = _commit(client, 40, "a")  # several sealed segments
    client.compact()
    late = _commit(client, 6, "b")  # finished, still in the log
    live = [client.begin(label=f"live{i}").tid for i in range(2)]
    assert len(Store(_history(root)).index()["segments"]) >= 3
    everything = [r["tid"] for r in client.transactions(limit=None)]
    assert everything[:-2] == early + late and set(everything[-2:]) == set(live)
    pages, before = [], None
    while True:
        page = client.transactions(limit=7, before=before)
        if not page:
            break
        pages.append([r["tid"] for r in page])
        before = page[0]["tid"]
    assert [t for page in reversed(pages) for t in page] == everything
    committed = []
    before = None
    while page := client.transactions("committed", limit=4, before=before):
        committed[:0] = [r["tid"] for r in page]
        before = page[0]["tid"]
    assert committed == early + late


def test_list_pages_through_the_cli_with_limit_and_before(root, client):
    tids = _commit(client, 5)
    out = json.loads(_cli(root, "list", "--limit", "3").stdout)
    assert [r["tid"] for r in out["transactions"]] == tids[2:] and out["more"] is True
    out = json.loads(_cli(root, "list", "--limit", "3", "--before", tids[2]).stdout)
    assert [r["tid"] for r in out["transactions"]] == tids[:2] and out["more"] is False


def test_list_refuses_a_bad_limit_or_an_unknown_before(root, client):
    _commit(client, 1)
    for args in (("--limit", "0"), ("--limit", "-3"), ("--limit", "many")):
        proc = _cli(root, "list", *args)
        assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == "usage"
    proc = _cli(root, "list", "--before", "tx-20000101-000000-abcdef")
    assert proc.returncode != 0
    assert json.loads(proc.stdout)["error"]["code"] == "unknown_tid"
    with pytest.raises(UnknownTid):
        client.transactions(before="tx-20000101-000000-abcdef")


def test_status_of_an_old_tid_reads_the_segments_its_range_names(root, client, monkeypatch,
                                                                  small_segments):
    tids = _commit(client, 8)
    client.compact()
    time.sleep(1.1)  # tids begin with their second: the later ones sort after these
    tids += _commit(client, 40)
    client.compact()
    segments = Store(_history(root)).index()["segments"]
    assert len(segments) >= 4
    counted = _Counted(monkeypatch)
    fresh = Agent2PC(root)
    assert fresh.engine.status(tids[0])["transactions"][0]["state"] == "committed"
    # Read: the open segment and the sealed ones whose tid range holds it, no other.
    holding = [s for s in segments if s["min"] <= tids[0] <= s["max"]]
    assert 1 <= len(holding) <= 2 < len(segments)
    current = os.path.getsize(_history(root)) if os.path.exists(_history(root)) else 0
    assert counted.bytes <= sum(s["bytes"] for s in holding) + current + 16  # (+ a byte
    # per file: does it end with a newline?)
    assert counted.segments_opened == len(holding)  # the others are not even opened
    assert fresh.engine.status(tids[-1])["transactions"][0]["state"] == "committed"
    for absent in ("tx-20000101-000000-abcdef", tids[20][:-6] + "zzzzzz"):
        with pytest.raises(UnknownTid):
            fresh.engine.status(absent)
    proc = _cli(root, "status", "--tid", "tx-20000101-000000-abcdef")
    assert json.loads(proc.stdout)["error"]["code"] == "unknown_tid"


def test_a_tid_is_found_in_a_sealed_segment_whatever_its_range(root, client, small_segments):
    tids = _commit(client, 30)
    client.compact()
    store = Store(_history(root))
    for tid in (tids[0], tids[14], tids[-1]):
        found = store.lookup(tid)
        assert found is not None and found["tid"] == tid


def test_retention_cuts_old_segments_and_the_chain_still_verifies(root, client, monkeypatch,
                                                                   small_segments):
    monkeypatch.setattr(history_store, "KEEP", 20)
    tids = _commit(client, 120)
    client.compact()
    store = Store(_history(root))
    index = store.index()
    kept = sum(s["lines"] for s in index["segments"])
    assert index["base"] is not None and index["base"]["lines"] > 0
    assert 20 <= kept + 0 <= 20 + 2 * 20  # the latest 20 at least, in whole segments
    files = sorted(os.listdir(store.dir))
    assert len(files) == len(index["segments"]) + 1  # the kept segments and index.json
    result = client.engine.verify_log()
    assert result["trimmed"] == index["base"]["lines"]
    current = b""
    if os.path.exists(_history(root)):
        with open(_history(root), "rb") as f:
            current = f.read()
    assert result["verified"] == kept + len(current.splitlines())
    assert result["trimmed"] + result["verified"] == 120
    out = _cli(root, "log", "--verify")
    assert out.returncode == 0, out.stdout
    with pytest.raises(UnknownTid):
        client.engine.status(tids[0])  # cut
    assert client.engine.status(tids[-1])["transactions"][0]["state"] == "committed"
    rows = client.transactions(limit=None)
    assert [r["tid"] for r in rows] == tids[-len(rows):] and len(rows) == result["verified"]
    # What is kept is still tamper-evident: an edited line in a kept segment is found.
    first = store.segment_path(index["segments"][0]["seq"])
    with open(first, "rb") as f:
        data = f.read()
    with open(first, "wb") as f:
        f.write(data.replace(b'"label":"t', b'"label":"T', 1))
    with pytest.raises(Tampered):
        client.engine.verify_log()
    with open(first, "wb") as f:
        f.write(data)
    os.unlink(store.segment_path(index["segments"][1]["seq"]))  # a kept segment removed
    with pytest.raises(Tampered):
        client.engine.verify_log()


def test_compaction_appends_only_what_it_moves(root, client, monkeypatch, small_segments):
    """Compaction appends to history.jsonl and seals it by a rename: sealed segments are never
    written again."""
    _commit(client, 40)
    client.compact()
    store = Store(_history(root))
    before = {s["seq"]: os.stat(store.segment_path(s["seq"])) for s in
              store.index()["segments"]}
    _commit(client, 3)
    client.compact()
    for seq, st in before.items():
        now = os.stat(store.segment_path(seq))
        assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size,
                                                               st.st_mtime_ns)


@pytest.mark.parametrize("point", ["history.seal.after_index", "history.trim.after_index"])
def test_a_crash_while_sealing_or_trimming_leaves_a_readable_history(root, client, point):
    env = {"AGENT2PC_HISTORY_SEGMENT_BYTES": "4096", "AGENT2PC_HISTORY_KEEP": "20"}
    tids = []
    for round_ in range(6):  # each round a segment's worth or more, compacted by the CLI
        tids += _commit(client, 10, f"r{round_}-")
        proc = _cli(root, "compact", env=env)
        assert proc.returncode == 0, proc.stderr
    tids += _commit(client, 10, "last")
    proc = _cli(root, "compact", env=dict(env, AGENT2PC_CRASH_AT=point))
    assert proc.returncode == 137, proc.stderr
    # Readable as it is: verify, list, the newest and an old tid, by a fresh process.
    assert _cli(root, "log", "--verify", env=env).returncode == 0
    out = json.loads(_cli(root, "list", "--limit", "10", env=env).stdout)
    assert [r["tid"] for r in out["transactions"]] == tids[-10:]
    assert json.loads(_cli(root, "status", "--tid", tids[-1], env=env).stdout)["transactions"][0][
        "state"] == \
        "committed"
    # The next compaction finishes the seal or the cut; the history stays one chain.
    _commit(client, 2, "after")
    assert _cli(root, "compact", env=env).returncode == 0
    verified = json.loads(_cli(root, "log", "--verify", env=env).stdout)
    assert verified["ok"] is True and verified["verified"] + verified.get("trimmed", 0) == \
        len(tids) + 2
    store = Store(_history(root))
    index = store.index()
    names = set(os.listdir(store.dir)) - {"index.json"}
    assert names == {os.path.basename(store.segment_path(s["seq"])) for s in index["segments"]}
    seen = [r["tid"] for r in Agent2PC(root).transactions(limit=None)]
    assert len(seen) == len(set(seen)) and seen[-2:] and seen[-3] == tids[-1]


def test_the_monitor_reads_the_sealed_segments_too(root, client, small_segments):
    from agent_2pc.coordinator.monitor import _History

    tids = _commit(client, 30)
    client.compact()
    assert Store(_history(root)).index()["segments"]
    seen = _History(_history(root))
    seen.poll()
    assert list(seen.states) == tids
    tids += _commit(client, 12)  # sealed again: history.jsonl is a new file
    client.compact()
    seen.poll()
    assert list(seen.states) == tids
    assert seen.entry(tids[0])["tid"] == tids[0]


def test_listing_live_transactions_does_not_read_the_history(root, client, monkeypatch):
    _commit(client, 2)
    client.compact()
    _grow(root, 5_000)
    live = client.begin(label="live")
    counted = _Counted(monkeypatch)
    assert [r["tid"] for r in Agent2PC(root).transactions("active")] == [live.tid]
    assert counted.bytes == 0


def test_a_head_left_from_before_a_seal_still_verifies(root, client, small_segments):
    """A machine crash can lose the head written after a seal (it is not synced): the head of
    the file that was sealed is accepted, as an older head is."""
    _commit(client, 30)
    client.compact()
    store = Store(_history(root))
    last = store.index()["segments"][-1]
    head = os.path.join(root, ".agent-tx", "history.head")
    with open(head, "w") as f:
        json.dump({"bytes": last["bytes"], "hash": last["hash"]}, f)
    assert client.engine.verify_log()["verified"] >= 30
    with open(head, "w") as f:  # a head that matches nothing: lines were cut
        json.dump({"bytes": last["bytes"] + 10**6, "hash": last["hash"]}, f)
    with pytest.raises(Tampered):
        client.engine.verify_log()
