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
