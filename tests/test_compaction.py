"""Compaction keeps the log short whatever the history, loses no answer, and garbage
collection never takes what a live transaction still names."""

from __future__ import annotations

import os

from agent_2pc import Agent2PC
from agent_2pc.coordinator import compaction as compaction_mod
from agent_2pc.storage import wal_format


def _records_in_log(root) -> int:
    return len(wal_format.decode((root / ".agent-tx" / "wal.bin").read_bytes()).records)


def test_automatic_compaction_bounds_the_log_and_keeps_every_answer(tmp_path):
    client = Agent2PC.init(tmp_path)
    tids = []
    for i in range(3 * compaction_mod.COMPACT_FINISHED_MAX + 5):
        tx = client.begin(label=f"n{i}")
        tx.stage_write(f"f{i % 7}.txt", f"{i}\n")
        tx.commit()
        tids.append(tx.tid)
    open_tx = client.begin(label="still open")
    open_tx.stage_write("open.txt", "pending\n")
    # At most one batch of finished transactions (5 records each) plus the open one.
    assert _records_in_log(tmp_path) <= compaction_mod.COMPACT_FINISHED_MAX * 5 + 2
    rows = {r["tid"]: r for r in Agent2PC(tmp_path).transactions(limit=None)}
    assert all(rows[t]["state"] == "committed" for t in tids)
    assert rows[open_tx.tid]["state"] == "active"
    fresh = Agent2PC(tmp_path)
    assert fresh.engine.commit(tids[0])["state"] == "committed"  # the same answer, from history
    assert fresh.engine.commit(open_tx.tid)["files"] == ["open.txt"]


def test_explicit_compact_leaves_only_live_transactions(tmp_path):
    client = Agent2PC.init(tmp_path)
    done = client.begin()
    done.stage_write("a.txt", "a\n")
    done.commit()
    live = client.begin()
    live.stage_write("b.txt", "b\n")
    out = client.compact()
    assert out["after_bytes"] < out["before_bytes"]
    recs = wal_format.decode((tmp_path / ".agent-tx" / "wal.bin").read_bytes()).records
    assert recs[0]["type"] == "log"  # the header, kept at the front
    assert {r["tid"] for r in recs[1:]} == {live.tid}
    assert live.commit()["state"] == "committed"
    assert (tmp_path / "b.txt").read_text() == "b\n"


def test_garbage_collection_keeps_blobs_of_live_transactions(tmp_path, monkeypatch):
    (tmp_path / "old.txt").write_text("before\n")
    client = Agent2PC.init(tmp_path)
    done = client.begin()
    done.stage_write("old.txt", "after\n")
    done.commit()  # its blob moved into the tree; its pre-image stays behind
    dropped = client.begin()
    dropped.stage_write("never.txt", "aborted content\n")
    dropped.abort()
    live = client.begin()
    live.stage_write("pending.txt", "still needed\n")
    monkeypatch.setattr(compaction_mod, "BLOB_GRACE_S", 0.0)
    monkeypatch.setattr(compaction_mod, "PREIMAGE_RETENTION_S", 0.0)
    monkeypatch.setattr(compaction_mod, "UNDO_KEEP", 0)  # undo's pre-images: none kept
    out = client.compact()
    # The aborted transaction's blob, and the committed one's base ("before\n", kept by
    # staging for a merge at commit).
    assert out["blobs_collected"] == 2 and out["preimages_collected"] == 1
    remaining = [e.name for fan in os.scandir(tmp_path / ".agent-tx" / "objects")
                 if len(fan.name) == 2 for e in os.scandir(fan.path)]
    assert len(remaining) == 1  # the live transaction's blob
    assert live.commit()["state"] == "committed"
    assert (tmp_path / "pending.txt").read_text() == "still needed\n"


def test_a_blob_named_by_two_transactions_survives_the_first_commit(tmp_path):
    client = Agent2PC.init(tmp_path)
    first, second = client.begin(), client.begin()
    first.stage_write("a.txt", "same bytes\n")
    second.stage_write("b.txt", "same bytes\n")  # the same blob
    first.commit()  # must copy, not move, the blob the second still names
    assert second.commit()["state"] == "committed"
    assert (tmp_path / "a.txt").read_text() == (tmp_path / "b.txt").read_text()
    assert os.stat(tmp_path / "a.txt").st_ino != os.stat(tmp_path / "b.txt").st_ino


def test_the_same_content_at_two_paths_of_one_transaction_gets_two_files(tmp_path):
    client = Agent2PC.init(tmp_path)
    tx = client.begin()
    tx.stage_write("x/one.txt", "twin\n")
    tx.stage_write("y/two.txt", "twin\n")
    tx.commit()
    one, two = tmp_path / "x" / "one.txt", tmp_path / "y" / "two.txt"
    assert one.read_text() == two.read_text() == "twin\n"
    assert os.stat(one).st_ino != os.stat(two).st_ino
    one.write_text("edited in place\n")  # tools write in place: the twin must not change
    assert two.read_text() == "twin\n"


def test_preimages_keep_what_a_commit_replaced(tmp_path):
    (tmp_path / "a.txt").write_text("original\n")
    client = Agent2PC.init(tmp_path)
    tx = client.begin()
    tx.stage_write("a.txt", "replaced\n")
    tx.stage_write("b.txt", "new\n")
    tx.commit()
    kept = sorted((tmp_path / ".agent-tx" / "preimages").iterdir())
    assert [p.name for p in kept] == [f"{tx.tid}.0"]
    assert kept[0].read_text() == "original\n"


def test_the_sweep_never_takes_a_copy_that_a_transaction_it_does_not_know_is_applying(tmp_path):
    """A process's sweep judges the copies in objects/tmp by its picture of the log, which may
    predate a transaction begun since: that transaction's lock, held through its apply,
    keeps its copies (a parallel commit lost one mid-rename: ApplyFailed, ENOENT)."""
    sweeper = Agent2PC.init(tmp_path)  # its picture of the log: before the transaction
    applier = Agent2PC(tmp_path)
    tid = applier.begin().tid
    copy = tmp_path / ".agent-tx" / "objects" / "tmp" / f"claim-{tid}-0.part"
    lock = applier.engine.journal.tx_lock(tid)
    lock.acquire()
    try:
        copy.write_bytes(b"being written\n")
        sweeper.engine.compaction.sweep_scratch()
        assert copy.exists()
    finally:
        lock.release()
    applier.get(tid).abort("done")
    sweeper.engine.compaction.sweep_scratch()  # finished, no holder: left by a dead run
    assert not copy.exists()
    sweeper.close()
    applier.close()


def test_garbage_collection_walks_the_store_outside_the_log_lock(tmp_path, monkeypatch):
    # The log lock holds every append back: it covers the judging of what may be garbage,
    # not a walk of every blob (100,000 blobs were 0.3 s under it).
    client = Agent2PC.init(tmp_path)
    for i in range(6):
        tx = client.begin()
        tx.stage_write(f"f{i}.txt", f"content {i}\n")
        tx.abort() if i % 2 else tx.commit()
    live = client.begin()
    live.stage_write("pending.txt", "still needed\n")
    monkeypatch.setattr(compaction_mod, "BLOB_GRACE_S", 0.0)
    lock = client.engine.journal.log.lock
    objects = os.path.realpath(tmp_path / ".agent-tx" / "objects")
    walked_under_lock: list[str] = []
    real_scandir = os.scandir

    def scandir(path):  # type: ignore[no-untyped-def]
        if lock.held and os.path.realpath(path).startswith(objects):
            walked_under_lock.append(os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(compaction_mod.os, "scandir", scandir)
    out = client.compact()
    assert walked_under_lock == []
    assert out["blobs_collected"] == 3  # the aborted ones'
    assert live.commit()["state"] == "committed"
    assert (tmp_path / "pending.txt").read_text() == "still needed\n"


def test_a_sweeper_emptying_trash_meanwhile_does_not_fail_the_collection(tmp_path, monkeypatch):
    # Another collection's background sweeper empties trash/, the folder this collection is
    # filling included (seen in CI: FileNotFoundError from the collection's last rmdir).
    from agent_2pc.storage.scratch import empty

    client = Agent2PC.init(tmp_path)
    for i in range(4):
        tx = client.begin()
        tx.stage_write(f"f{i}.txt", f"content {i}\n")
        tx.abort()
    monkeypatch.setattr(compaction_mod, "BLOB_GRACE_S", 0.0)
    trash = str(tmp_path / ".agent-tx" / "trash")
    real = compaction_mod.Compaction._old_blobs

    def old_blobs_then_a_sweep(self, now_s):  # type: ignore[no-untyped-def]
        out = real(self, now_s)
        empty(trash)
        return out

    monkeypatch.setattr(compaction_mod.Compaction, "_old_blobs", old_blobs_then_a_sweep)
    assert client.compact()["blobs_collected"] == 4
    empty(trash)
    assert client.compact()["blobs_collected"] == 0  # and nothing left to fail on


def test_the_sweep_never_takes_the_scratch_of_an_exec_begun_after_its_picture_of_the_log(
        tmp_path):
    """``recover`` in one process swept ``tx/<tid>/`` of a transaction that another process
    had begun since the sweeper last read the log, while that process's exec ran its command
    there (the view's scratch: the exec failed, FileNotFoundError on its status file; seen with
    agents calling ``recover`` beside others' ``exec``). The scratch of a transaction the log
    names as live is kept; a dead one's still goes."""
    import subprocess
    import sys
    import textwrap
    import time

    sweeper = Agent2PC.init(tmp_path)  # its picture of the log: before the transaction
    tid = Agent2PC(tmp_path).begin().tid
    runner = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""\
        import sys
        from agent_2pc import Agent2PC
        tx = Agent2PC(sys.argv[1], daemon=False).get(sys.argv[2])
        out = tx.exec(["sh", "-c", "sleep 1.5; echo made > made.txt"])
        print(out["exit_code"])
        """), str(tmp_path), tid], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scratch = tmp_path / ".agent-tx" / "tx" / tid
    deadline = time.monotonic() + 30
    while not any(p.name.startswith("view-") for p in scratch.glob("*")):
        assert time.monotonic() < deadline and runner.poll() is None, runner.communicate()
        time.sleep(0.02)
    sweeper.engine.compaction.sweep_scratch()
    out, err = runner.communicate(timeout=60)
    assert runner.returncode == 0 and out.strip() == "0", err[-2000:]
    assert Agent2PC(tmp_path).get(tid).status()["ops"] == 1
    Agent2PC(tmp_path).get(tid).abort("done")
    sweeper.engine.compaction.sweep_scratch()  # finished now: its scratch goes
    assert not scratch.exists()
    sweeper.close()
