"""exec stages the files its command wrote by moving them into the blob store, not by copying
them (issue 19, item 2: a capture of 20,000 files created 20,000 blobs anew): the staged
view's upper layer is dropped right after the capture, so its files are ours to take. A file
that is not ours alone (another hard link to it) is copied, as before; either way the commit
puts exactly what the command wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import run_cli

pytestmark = pytest.mark.timeout(120)

OLD = 978307200  # 2001-01-01: the mtime the command gives its files


def a2pc(root, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "agent_2pc", "--root", str(root), args[0],
                           "--json", *args[1:]], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def blob_mtime(root, data: bytes) -> int:
    import hashlib

    digest = hashlib.sha256(data).hexdigest()
    return int(os.stat(root / ".agent-tx" / "objects" / digest[:2] / digest).st_mtime)


def test_exec_moves_the_files_its_command_wrote_and_copies_a_shared_one(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "keep.txt").write_text("keep\n")
    a2pc(root, "init")
    tid = a2pc(root, "begin")["tid"]
    script = ("mkdir -p a && printf 'moved\\n' > a/m.txt && printf 'shared\\n' > s.txt && "
              "ln s.txt s2.txt && touch -d @%d a/m.txt s.txt" % OLD)
    out = a2pc(root, "exec", "--tid", tid, "--", "sh", "-c", script)
    assert sorted(c["path"] for c in out["captured"]) == ["a/m.txt", "s.txt", "s2.txt"]
    assert blob_mtime(root, b"moved\n") == OLD  # the command's own file
    assert blob_mtime(root, b"shared\n") != OLD  # two names: copied
    assert os.listdir(root / ".agent-tx" / "objects" / "tmp") == []
    assert a2pc(root, "commit", "--tid", tid)["state"] == "committed"
    assert (root / "a" / "m.txt").read_bytes() == b"moved\n"
    assert (root / "s.txt").read_bytes() == (root / "s2.txt").read_bytes() == b"shared\n"
    assert os.stat(root / "a" / "m.txt").st_mode & 0o777 == 0o644
    assert os.stat(root / "s.txt").st_ino != os.stat(root / "s2.txt").st_ino


def _store(tmp_path):
    from agent_2pc.storage.blobs import BlobStore

    objects = tmp_path / "objects"
    (objects / "tmp").mkdir(parents=True)
    for i in range(256):
        (objects / f"{i:02x}").mkdir()
    (tmp_path / "preimages").mkdir()
    return BlobStore(str(objects), str(tmp_path / "preimages"))


def test_a_captured_file_whose_content_is_stored_stays_put_and_is_used_if_the_blob_goes(
        tmp_path):
    """Content already in the store is not moved (unlinking a duplicate would free its blocks
    on the way); if a commit moves the stored blob away before the stage record is appended,
    settling writes it again from the captured file, which the view still holds."""
    store = _store(tmp_path)
    store.put_bytes(b"dup\n").settle()
    src = tmp_path / "upper-dup.txt"
    src.write_bytes(b"dup\n")
    pending = store.put_moved(str(src))
    assert src.exists()  # left in place
    os.unlink(store.path(pending.digest))  # a commit took the blob into its tree meanwhile
    pending.settle()
    assert store.read(pending.digest) == b"dup\n"
    assert os.listdir(store.tmp_dir) == []


def test_a_captured_file_of_new_content_is_moved_and_settles_to_one_name(tmp_path):
    store = _store(tmp_path)
    src = tmp_path / "upper-new.txt"
    src.write_bytes(b"new\n")
    ino = src.stat().st_ino
    pending = store.put_moved(str(src))
    assert not src.exists()
    pending.settle()
    blob = store.path(pending.digest)
    assert os.stat(blob).st_ino == ino and os.stat(blob).st_nlink == 1
    assert os.stat(blob).st_mode & 0o777 == 0o444
    assert os.listdir(store.tmp_dir) == []


# --- the same content at many paths: spare copies, renamed into the tree at commit ----------

SAME = b"the same bytes\n"
MANY = 80  # past durable.SYNCFS_MIN (64): a batched apply


def _write_many(n: int) -> str:
    return (f"mkdir -p same && for i in $(seq 1 {n}); do printf 'the same bytes\\n' > "
            "same/f$i.txt; done")


def _tmp(root) -> list[str]:
    return sorted(os.listdir(root / ".agent-tx" / "objects" / "tmp"))


def test_the_same_content_at_many_paths_is_renamed_into_the_tree_from_spares_not_copied(
        tmp_path):
    """A package install writes many identical files (licences, empty modules). The capture
    keeps each duplicate as a spare copy of the stored blob instead of leaving it in the view,
    and the commit renames the spares into the tree: no copy of the blob is written at all."""
    root = tmp_path / "repo"
    root.mkdir()
    a2pc(root, "init")
    tid = a2pc(root, "begin")["tid"]
    a2pc(root, "exec", "--tid", tid, "--", "sh", "-c", _write_many(MANY))
    spares = [n for n in _tmp(root) if n.startswith(f"spare-{tid}-")]
    assert len(spares) == MANY - 1, _tmp(root)  # the first one became the blob
    inodes = {os.stat(root / ".agent-tx" / "objects" / "tmp" / n).st_ino for n in spares}
    assert a2pc(root, "commit", "--tid", tid)["state"] == "committed"
    files = [root / "same" / f"f{i}.txt" for i in range(1, MANY + 1)]
    assert all(f.read_bytes() == SAME for f in files)
    in_tree = {f.stat().st_ino for f in files}
    assert len(in_tree) == MANY  # a file of its own at every path
    assert inodes <= in_tree  # the spares themselves, renamed: none was copied
    assert _tmp(root) == []


def test_a_spare_whose_bytes_changed_since_the_capture_is_not_used(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    a2pc(root, "init")
    tid = a2pc(root, "begin")["tid"]
    a2pc(root, "exec", "--tid", tid, "--", "sh", "-c", _write_many(MANY))
    tmp = root / ".agent-tx" / "objects" / "tmp"
    damaged = [tmp / n for n in _tmp(root)[:3]]
    for spare in damaged:  # what a process of the command still writing to it could do
        spare.chmod(0o644)
        spare.write_bytes(b"other bytes!!!\n")
    assert a2pc(root, "commit", "--tid", tid)["state"] == "committed"
    assert all((root / "same" / f"f{i}.txt").read_bytes() == SAME for i in range(1, MANY + 1))
    assert _tmp(root) == []


@pytest.mark.parametrize("end", ["abort", "small commit"])
def test_spares_are_gone_after_an_abort_and_recover_or_a_commit_too_small_to_batch(
        tmp_path, end):
    root = tmp_path / "repo"
    root.mkdir()
    a2pc(root, "init")
    tid = a2pc(root, "begin")["tid"]
    n = 5 if end == "small commit" else MANY
    a2pc(root, "exec", "--tid", tid, "--", "sh", "-c", _write_many(n))
    assert len(_tmp(root)) == n - 1
    if end == "abort":
        a2pc(root, "abort", "--tid", tid)
        a2pc(root, "recover")  # sweeps what finished transactions left
    else:  # an fsync per copy: the copies are made, the spares removed
        assert a2pc(root, "commit", "--tid", tid)["state"] == "committed"
        assert all((root / "same" / f"f{i}.txt").read_bytes() == SAME for i in range(1, n + 1))
    assert _tmp(root) == []


@pytest.mark.parametrize("point", ["commit.mid_apply:40", "commit.mid_apply:85",
                                   "commit.before_end"])
def test_a_commit_killed_while_it_renames_spares_is_finished_by_recover(tmp_path, point):
    """The crash point passes once per path as the apply takes its copy (a spare) and once
    per rename into the tree: killed with half the spares taken and nothing renamed (40),
    after the syncfs with five paths renamed (85), or with every path in place: recover rolls
    the commit forward from the log (a redo makes the copies it lacks), every path holds the
    content, and recover's sweep removes the spares the killed run did not take."""
    root = tmp_path / "repo"
    root.mkdir()
    a2pc(root, "init")
    tid = a2pc(root, "begin")["tid"]
    a2pc(root, "exec", "--tid", tid, "--", "sh", "-c", _write_many(MANY))
    proc = run_cli(("commit", "--tid", tid), root=str(root), env={"AGENT2PC_CRASH_AT": point})
    assert proc.returncode == 137, proc.stdout + proc.stderr[-2000:]
    out = a2pc(root, "recover")
    assert tid in out["rolled_forward"], out
    files = [root / "same" / f"f{i}.txt" for i in range(1, MANY + 1)]
    assert all(f.read_bytes() == SAME for f in files)
    assert len({f.stat().st_ino for f in files}) == MANY
    assert _tmp(root) == []


@pytest.mark.parametrize("how", ["moved", "streamed", "big bytes"])
def test_a_short_blob_a_crash_left_under_its_name_is_replaced_whole(tmp_path, how):
    """A machine crash can leave a blob's name with fewer bytes than it should hold: the
    next staging of that content finds it short and puts the whole content in its place."""
    import hashlib

    from agent_2pc.storage import blobs as blobs_mod

    store = _store(tmp_path)
    data = b"whole content\n" * (1 if how != "big bytes" else blobs_mod.COPY_MIN // 14 + 1)
    digest = hashlib.sha256(data).hexdigest()
    with open(store.path(digest), "wb") as f:
        f.write(data[:5])  # the short one
    src = tmp_path / "upper.bin"
    src.write_bytes(data)
    if how == "moved":
        pending = store.put_moved(str(src))
    elif how == "streamed":
        with open(src, "rb") as f:
            pending = store.put_fd(f.fileno())
    else:
        pending = store.put_bytes(data)
    pending.settle()
    assert pending.digest == digest
    assert store.read(digest) == data
    assert os.listdir(store.tmp_dir) == []
