"""Undo takes a committed transaction back as a new one (content and mode of modified, created
and deleted files), after compaction too, refuses with nothing changed when a file changed
since, and undoes an undo; the log lists finished transactions newest first, chained by
SHA-256 so that an edited, deleted, reordered or cut-off history line is found, and a crash
during compaction keeps the chain whole (docs/collaboration.md, "Undo and log")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import read, write

from agent_2pc import Agent2PC
from agent_2pc.errors import BadState, NotFound, Tampered, TransactionAborted, UnknownTid
from agent_2pc.storage import history
from agent_2pc.storage.history_store import Store

pytestmark = pytest.mark.timeout(120)


def cli(root: str, *args: str, env: dict[str, str] | None = None
        ) -> tuple[int, dict]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    full.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "agent_2pc", "--root", root, *args, "--json"],
                          capture_output=True, text=True, timeout=60, env=full)
    return proc.returncode, json.loads(proc.stdout)


def mode(root: str, rel: str) -> int:
    return os.stat(os.path.join(root, rel)).st_mode & 0o7777


def tree(root: str) -> dict[str, tuple[bytes, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".agent-tx")]
        for name in filenames:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, root)] = (f.read(), os.stat(full).st_mode & 0o7777)
    return out


def three_kinds(client: Agent2PC, root: str) -> str:
    """A committed transaction that modifies a 0755 file, creates one and deletes a 0600 one."""
    write(root, "mod.sh", "echo one\n", mode=0o755)
    write(root, "gone.txt", "secret\n", mode=0o600)
    tx = client.begin(label="three kinds")
    tx.stage_write("mod.sh", "echo two\n")
    tx.stage_write("sub/new.txt", "new\n")
    tx.stage_delete("gone.txt")
    tx.commit()
    return tx.tid


def test_undo_restores_content_and_mode_of_modified_created_and_deleted_files(client, root):
    before = {"mod.sh": (b"echo one\n", 0o755), "gone.txt": (b"secret\n", 0o600)}
    tid = three_kinds(client, root)
    assert read(root, "mod.sh") == b"echo two\n" and not os.path.exists(f"{root}/gone.txt")
    out = client.undo(tid)
    assert out["undoes"] == tid and out["state"] == "committed" and out["tid"] != tid
    assert out["files"] == ["gone.txt", "mod.sh", "sub/new.txt"]
    assert tree(root) == before
    assert not os.path.exists(f"{root}/sub")  # emptied by the delete, removed as git does


def test_undo_restores_a_mode_links_and_directories(client, root):
    write(root, "x.sh", "run\n", mode=0o644)
    os.symlink("x.sh", os.path.join(root, "ln"))
    with client.transaction() as chmod:
        chmod.stage_write("x.sh", "run\n", mode=0o755)  # the mode only
    assert client.undo(chmod.tid)["files"] == ["x.sh"] and mode(root, "x.sh") == 0o644
    tx = client.begin()
    tx.exec(["sh", "-c", "ln -s elsewhere ln2 && mkdir d && rm ln"])
    tx.commit()
    undo = client.undo(tx.tid)
    assert os.readlink(os.path.join(root, "ln")) == "x.sh"
    assert not os.path.lexists(os.path.join(root, "ln2")) and not os.path.exists(f"{root}/d")
    client.undo(undo["tid"])
    assert os.readlink(os.path.join(root, "ln2")) == "elsewhere" and os.path.isdir(f"{root}/d")
    assert not os.path.lexists(os.path.join(root, "ln"))


def test_undo_of_an_undo_redoes(client, root):
    tid = three_kinds(client, root)
    after = tree(root)
    first = client.undo(tid)
    with pytest.raises(TransactionAborted) as exc:
        client.undo(tid)  # twice: its files are no longer as it left them
    assert exc.value.code == "conflict" and f"undone already, by {first['tid']}" in str(exc.value)
    second = client.undo(first["tid"])
    assert second["undoes"] == first["tid"]
    assert tree(root) == after
    third = client.undo(second["tid"])  # and back again
    assert third["state"] == "committed" and read(root, "mod.sh") == b"echo one\n"


def test_undo_works_after_compaction_and_in_a_new_process(client, root):
    tid = three_kinds(client, root)
    for i in range(3):  # later transactions on other files
        with client.transaction() as tx:
            tx.stage_write(f"other{i}.txt", f"{i}\n")
    client.compact()
    assert tid not in client.engine.txs  # only in the history now
    line = Store(os.path.join(root, ".agent-tx", "history.jsonl")).lookup(tid)
    assert line is not None and {c["path"] for c in line["changes"]} == {
        "gone.txt", "mod.sh", "sub/new.txt"}
    code, out = cli(root, "undo", "--tid", tid)
    assert code == 0 and out["ok"] and out["undoes"] == tid, out
    assert read(root, "mod.sh") == b"echo one\n" and mode(root, "mod.sh") == 0o755
    assert read(root, "gone.txt") == b"secret\n" and mode(root, "gone.txt") == 0o600
    assert not os.path.exists(f"{root}/sub/new.txt")
    assert read(root, "other2.txt") == b"2\n"  # what came later stays


def test_undo_after_a_later_change_is_a_conflict_and_changes_nothing(client, root):
    tid = three_kinds(client, root)
    with client.transaction(label="later") as tx:
        tx.stage_write("mod.sh", "echo three\n")
    before = tree(root)
    log_before = client.log()["entries"]
    code, out = cli(root, "undo", "--tid", tid)
    assert code == 1 and out["error"]["code"] == "conflict", out
    assert out["error"]["paths"] == ["mod.sh"]
    assert tree(root) == before
    assert client.log()["entries"] == log_before  # no transaction was begun
    with pytest.raises(TransactionAborted) as exc:
        client.undo(tid)
    assert exc.value.code == "conflict"


def test_a_change_between_the_check_and_the_commit_aborts_the_undo(client, root):
    """The undo stalls after staging (a real process); another process commits one of the
    files meanwhile; the undo's own commit must then vote no: nothing of it is applied."""
    tid = three_kinds(client, root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    env.update(AGENT2PC_STALL_AT="undo.after_stage", AGENT2PC_STALL_S="3")
    proc = subprocess.Popen([sys.executable, "-m", "agent_2pc", "--root", root, "undo",
                             "--tid", tid, "--json"], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        deadline = 200
        while deadline and not any(tx.label == f"undo {tid}" for tx in _live(client)):
            deadline -= 1
            threading.Event().wait(0.02)
        assert deadline, "the undo never staged"
        with client.transaction(label="meanwhile") as tx:
            tx.stage_write("mod.sh", "echo meanwhile\n")
        out = json.loads(proc.communicate(timeout=60)[0])
    finally:
        proc.kill()
    assert proc.returncode == 1 and out["error"]["code"] == "conflict", out
    assert out["state"] == "aborted"
    assert read(root, "mod.sh") == b"echo meanwhile\n"
    assert read(root, "sub/new.txt") == b"new\n" and not os.path.exists(f"{root}/gone.txt")


def _live(client: Agent2PC) -> list:
    client.engine.journal.refresh()
    return [tx for tx in client.engine.txs.values() if tx.state == "active"]


def test_a_crash_after_the_undo_staged_changes_nothing_and_undo_runs_again(client, root):
    tid = three_kinds(client, root)
    after = tree(root)
    env = {"AGENT2PC_CRASH_AT": "undo.after_stage"}
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    full.update(env)
    proc = subprocess.run([sys.executable, "-m", "agent_2pc", "--root", root, "undo", "--tid",
                           tid], capture_output=True, timeout=60, env=full)
    assert proc.returncode == 137
    assert cli(root, "recover")[0] == 0
    assert tree(root) == after
    code, out = cli(root, "undo", "--tid", tid)
    assert code == 0 and out["undoes"] == tid, out
    assert read(root, "mod.sh") == b"echo one\n"


def _race_once(root: str, tid: str, other: str) -> tuple[dict, dict]:
    """Start `undo --tid tid` and `commit --tid other` in two processes at once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    go = os.path.join(root, ".go")
    script = ("import os, subprocess, sys, time\n"
              "while not os.path.exists(sys.argv[1]): time.sleep(0.001)\n"
              "sys.exit(subprocess.call([sys.executable, '-m', 'agent_2pc'] + sys.argv[2:]))\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, go, "--root", root, *args,
                               "--json"], stdout=subprocess.PIPE, text=True, env=env)
             for args in (("undo", "--tid", tid), ("commit", "--tid", other))]
    threading.Event().wait(0.3)  # both interpreters started and waiting
    Path(go).touch()
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    os.unlink(go)
    return outs[0], outs[1]


def test_undo_and_a_commit_racing_on_one_file_end_with_exactly_one_of_them(client, root):
    wins = {"undo": 0, "commit": 0}
    for i in range(4):
        write(root, "race.txt", f"base {i}\n")
        with client.transaction(label="t") as t:
            t.stage_write("race.txt", f"by t {i}\n")
        other = client.begin(label="other")
        other.stage_write("race.txt", f"by other {i}\n")
        undo, commit = _race_once(root, t.tid, other.tid)
        content = read(root, "race.txt")
        assert undo["ok"] != commit["ok"], (undo, commit)  # exactly one
        if undo["ok"]:
            wins["undo"] += 1
            assert commit["error"]["code"] == "conflict" and content == f"base {i}\n".encode()
        else:
            wins["commit"] += 1
            assert undo["error"]["code"] == "conflict", undo
            assert content == f"by other {i}\n".encode()
    assert sum(wins.values()) == 4, wins


def test_undo_of_a_transaction_that_never_committed_is_refused_and_changes_nothing(
        client, root, snapshot):
    aborted = client.begin()
    aborted.stage_write("a.txt", "a\n")
    aborted.abort()
    active = client.begin()
    active.stage_write("b.txt", "b\n")
    before = snapshot()
    for tid, err, code in ((aborted.tid, BadState, "bad_state"),
                           (active.tid, BadState, "bad_state"),
                           ("tx-20200101-000000-abcdef", UnknownTid, "unknown_tid"),
                           ("not a tid", UnknownTid, "unknown_tid")):
        with pytest.raises(err):
            client.undo(tid)
        status, out = cli(root, "undo", "--tid", tid)
        assert status == 2 and out["error"]["code"] == code, out
    assert snapshot() == before


def test_undo_refuses_a_history_line_whose_changes_were_forged(client, root, snapshot):
    tid = three_kinds(client, root)
    client.compact()
    path = _history(root)
    path.write_bytes(path.read_bytes().replace(b'"path":"mod.sh"', b'"path":"../mod.sh"'))
    before = snapshot()
    code, out = cli(root, "undo", "--tid", tid)
    assert code == 1 and out["error"]["code"] == "tampered", out
    assert snapshot() == before


def test_undo_past_the_pre_image_retention_is_not_found(client, root, monkeypatch):
    from agent_2pc.coordinator import compaction

    tid = three_kinds(client, root)
    monkeypatch.setattr(compaction, "PREIMAGE_RETENTION_S", 0.0)
    monkeypatch.setattr(compaction, "UNDO_KEEP", 0)
    assert client.compact()["preimages_collected"] >= 2
    before = tree(root)
    with pytest.raises(NotFound) as exc:
        client.undo(tid)
    assert "no longer kept" in exc.value.message
    assert tree(root) == before


def test_garbage_collection_keeps_the_pre_images_of_the_latest_commits(client, root,
                                                                        monkeypatch):
    from agent_2pc.coordinator import compaction

    tid = three_kinds(client, root)
    monkeypatch.setattr(compaction, "PREIMAGE_RETENTION_S", 0.0)
    monkeypatch.setattr(compaction, "UNDO_KEEP", 1)
    assert client.compact()["preimages_collected"] == 0  # the latest commit: kept
    assert client.undo(tid)["undoes"] == tid


# -- log --------------------------------------------------------------------------------------


def test_log_lists_finished_transactions_newest_first_with_their_fields(client, root):
    write(root, "t.txt", "x\n")
    with client.transaction(label="checked") as tx:
        tx.stage_write("t.txt", "y\n")
        tx.stage_cmd("test -f t.txt")
    failed = client.begin(label="given up")
    failed.stage_write("u.txt", "u\n")
    failed.abort("no reason")
    undo = client.undo(tx.tid)
    client.compact()
    with client.transaction(label="after compaction") as last:
        last.stage_write("v.txt", "v\n")
    entries = client.log()["entries"]
    assert [e["tid"] for e in entries] == [last.tid, undo["tid"], failed.tid, tx.tid]
    newest, undone, aborted, checked = entries
    assert newest["compacted"] is False and "compacted" not in undone
    assert checked["label"] == "checked" and checked["state"] == "committed"
    assert checked["files"] == ["t.txt"] and checked["checks"] == ["test -f t.txt"]
    assert checked["undone_by"] == undo["tid"] and undone["undoes"] == tx.tid
    assert aborted["state"] == "aborted" and aborted["reason"] == "no reason"
    for e in entries:
        assert {"tid", "label", "state", "at", "files", "hash", "prev"} <= set(e)
    # Each entry chains to the one before it (older), the first to the genesis.
    assert checked["prev"] == history.GENESIS
    for newer, older in zip(entries, entries[1:], strict=False):
        assert newer["prev"] == older["hash"]
    assert client.log(limit=2)["entries"] == entries[:2]
    code, out = cli(root, "log", "--limit", "1")
    assert code == 0 and out["entries"] == entries[:1]
    client.compact()  # the hash shown before compaction is the one written
    assert client.log()["entries"][0]["hash"] == newest["hash"]
    assert cli(root, "log", "--limit", "0")[0] == 2


def _history(root: str) -> Path:
    return Path(root) / ".agent-tx" / "history.jsonl"


def _chained(client: Agent2PC, n: int) -> list[bytes]:
    for i in range(n):
        with client.transaction(label=f"n{i}") as tx:
            tx.stage_write(f"f{i}.txt", f"{i}\n")
        if i % 2:
            client.compact()
    client.compact()
    lines = _history(client.root).read_bytes().splitlines(keepends=True)
    assert len(lines) == n
    return lines


def _verify_fails(root: str, line: int) -> dict:
    code, out = cli(root, "log", "--verify")
    assert code == 1 and out["error"]["code"] == "tampered", out
    assert out["error"]["line"] == line, out
    return out


def test_verify_passes_on_an_untouched_history(client, root):
    _chained(client, 5)
    assert cli(root, "log", "--verify") == (0, {"ok": True, "verified": 5, "unchained": 0})


def test_verify_finds_an_edited_line(client, root):
    lines = _chained(client, 5)
    lines[2] = lines[2].replace(b'"label":"n2"', b'"label":"N2"')
    _history(root).write_bytes(b"".join(lines))
    out = _verify_fails(root, 3)
    assert "edited" in out["error"]["message"]
    with pytest.raises(Tampered):
        client.log(verify=True)


def test_verify_finds_a_deleted_line(client, root):
    lines = _chained(client, 5)
    del lines[1]
    _history(root).write_bytes(b"".join(lines))
    _verify_fails(root, 2)


def test_verify_finds_reordered_lines(client, root):
    lines = _chained(client, 5)
    lines[1], lines[2] = lines[2], lines[1]
    _history(root).write_bytes(b"".join(lines))
    _verify_fails(root, 2)


def test_verify_finds_lines_cut_off_the_end(client, root):
    lines = _chained(client, 5)
    _history(root).write_bytes(b"".join(lines[:-1]))
    _verify_fails(root, 5)


def test_a_rehashed_edit_is_found_by_the_next_line(client, root):
    """Editing a line and fixing its own hash still breaks the next line's prev."""
    lines = _chained(client, 4)
    obj = json.loads(lines[1])
    obj["label"] = "rewritten"
    obj["hash"] = history.line_hash(obj)
    lines[1] = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
    _history(root).write_bytes(b"".join(lines))
    _verify_fails(root, 3)


def test_lines_of_an_earlier_version_still_read_and_are_covered_by_the_chain(client, root):
    old = [{"tid": f"tx-20250101-00000{i}-abcdef", "state": "committed", "label": f"old{i}",
            "created_at": "2025-01-01T00:00:00.000Z", "ops": 1, "ended_at":
            "2025-01-01T00:00:01.000Z", "files": ["x"], "code": None, "reason": None}
           for i in range(2)]
    legacy = "".join(json.dumps(o, separators=(",", ":")) + "\n" for o in old).encode()
    _history(root).write_bytes(legacy)
    with client.transaction(label="new") as tx:
        tx.stage_write("n.txt", "n\n")
    client.compact()
    assert cli(root, "log", "--verify") == (0, {"ok": True, "verified": 1, "unchained": 2})
    entries = client.log()["entries"]
    assert [e["label"] for e in entries] == ["new", "old1", "old0"]
    assert entries[1]["hash"] is None  # an old line has none
    data = _history(root).read_bytes()
    _history(root).write_bytes(data.replace(b'"old0"', b'"OLD0"', 1))
    _verify_fails(root, 3)  # the first chained line's prev covers the old bytes


def test_line_hash_is_rfc8785_canonical_json():
    import hashlib

    import rfc8785

    line = {"tid": "tx-20261202-000000-abcdef", "state": "committed", "label": "naïve ✓ \u2028",
            "files": ["a", "b/c"], "ops": 2, "code": None, "changes": [{"k": 0, "mode": 420}],
            "prev": history.GENESIS}
    assert history.line_hash(line) == hashlib.sha256(rfc8785.dumps(line)).hexdigest()


@pytest.mark.parametrize("point", ["compact.after_history", "compact.before_rename"])
def test_a_crash_during_compaction_keeps_the_chain_verifiable(client, root, point):
    _chained(client, 3)
    for i in range(3):
        with client.transaction(label=f"late{i}") as tx:
            tx.stage_write(f"late{i}.txt", f"{i}\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    full["AGENT2PC_CRASH_AT"] = point
    proc = subprocess.run([sys.executable, "-m", "agent_2pc", "--root", root, "compact"],
                          capture_output=True, timeout=60, env=full)
    assert proc.returncode == 137
    assert cli(root, "log", "--verify")[0] == 0
    code, out = cli(root, "log")
    assert code == 0 and [e["label"] for e in out["entries"]][:3] == ["late2", "late1", "late0"]
    assert cli(root, "compact")[0] == 0
    code, out = cli(root, "log", "--verify")
    assert code == 0 and out["verified"] == 6, out  # no line written twice
    tids = [json.loads(line)["tid"] for line in _history(root).read_bytes().splitlines()]
    assert len(tids) == len(set(tids)) == 6


def test_a_torn_last_line_is_cut_before_the_next_append(client, root):
    _chained(client, 2)
    with _history(root).open("ab") as f:
        f.write(b'{"tid":"tx-20261202-000000-abcdef","sta')  # a crash mid-append
    assert cli(root, "log", "--verify")[1]["verified"] == 2  # not counted, not tampering
    with client.transaction(label="next") as tx:
        tx.stage_write("next.txt", "n\n")
    client.compact()
    assert cli(root, "log", "--verify") == (0, {"ok": True, "verified": 3, "unchained": 0})
