"""Large files at disk speed (issue 19): staging and committing a large file streams it in
bounded memory, through the library and the CLI; prepare reads a large blob again only when a
machine crash could have damaged it (storage/blobs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from agent_2pc import Agent2PC
from agent_2pc.errors import TransactionAborted
from agent_2pc.storage import blobs as blobs_mod

pytestmark = pytest.mark.timeout(180)

MIB = 1 << 20
BIG = 256 * MIB
RSS_GROWTH_MAX_MIB = 24  # a few chunks of 1 MiB, and the interpreter's own noise

LIBRARY_CHILD = """
import json, os, resource, sys
from agent_2pc import Agent2PC
root, src = sys.argv[1], sys.argv[2]
client = Agent2PC(root)
tx = client.begin()  # everything imported and warm before the baseline
tx.stage_write("warm.txt", "warm\\n")
tx.commit()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tx = client.begin()
if sys.argv[3] == "path":
    tx.stage_write_file("big.bin", src)
else:
    with open(src, "rb") as f:
        tx.stage_write_file("big.bin", f)
tx.commit()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_kib": before, "after_kib": after}))
"""


def xattrs_work(path: Path) -> bool:
    probe = path / "xattr-probe"
    probe.write_bytes(b"x")
    try:
        os.setxattr(probe, "user.agent2pc.probe", b"1")
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


def sparse_file(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that costs no disk to make (reads as zeros)."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@pytest.mark.parametrize("source", ["path", "file object"])
def test_a_256_mib_file_is_staged_and_committed_by_the_library_in_bounded_memory(
        tmp_path: Path, source: str) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    Agent2PC.init(root).close()
    src = sparse_file(tmp_path / "big.src", BIG)
    proc = subprocess.run([sys.executable, "-c", LIBRARY_CHILD, str(root), str(src),
                           "path" if source == "path" else "fileobj"],
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    growth_mib = (out["after_kib"] - out["before_kib"]) / 1024
    assert growth_mib < RSS_GROWTH_MAX_MIB, out
    assert (root / "big.bin").stat().st_size == BIG


def test_a_256_mib_file_is_staged_and_committed_by_the_cli_in_bounded_memory(
        tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    Agent2PC.init(root).close()
    src = sparse_file(tmp_path / "big.src", BIG)
    # One child runs the three CLI calls and reports the largest RSS among them.
    script = """
import json, resource, subprocess, sys
cli = [sys.executable, "-m", "agent_2pc", "--root", sys.argv[1]]
tid = subprocess.run(cli + ["begin"], check=True, capture_output=True, text=True).stdout.strip()
subprocess.run(cli + ["stage-write", "--tid", tid, "--path", "big.bin", "--from-file",
                      sys.argv[2]], check=True, capture_output=True)
subprocess.run(cli + ["commit", "--tid", tid], check=True, capture_output=True)
print(json.dumps({"children_max_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""
    small = subprocess.run([sys.executable, "-c", script.replace("big.bin", "small.txt"),
                            str(root), str(sparse_file(tmp_path / "small.src", 10))],
                           capture_output=True, text=True, timeout=170)
    assert small.returncode == 0, small.stderr
    big = subprocess.run([sys.executable, "-c", script, str(root), str(src)],
                         capture_output=True, text=True, timeout=170)
    assert big.returncode == 0, big.stderr
    baseline = json.loads(small.stdout)["children_max_kib"]
    peak = json.loads(big.stdout)["children_max_kib"]
    assert (peak - baseline) / 1024 < RSS_GROWTH_MAX_MIB, (baseline, peak)
    assert (root / "big.bin").stat().st_size == BIG


def test_prepare_does_not_read_a_large_blob_written_in_this_boot_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not xattrs_work(tmp_path):
        pytest.skip("no user extended attributes on this file system")
    client = Agent2PC.init(tmp_path)
    data = os.urandom(2 * MIB)
    tx = client.begin()
    tx.stage_write("big.bin", data)

    def no_second_read(*a: object, **k: object) -> None:
        raise AssertionError("prepare hashed a blob written in this boot again")

    monkeypatch.setattr(blobs_mod, "sha256_fd", no_second_read)
    assert tx.commit()["state"] == "committed"
    assert (tmp_path / "big.bin").read_bytes() == data
    with pytest.raises(OSError):  # the mark stays in the blob store, never in the tree
        os.getxattr(tmp_path / "big.bin", blobs_mod.BOOT_XATTR)


def test_a_large_blob_from_an_earlier_boot_is_checked_and_a_damaged_one_refused(
        tmp_path: Path) -> None:
    if not xattrs_work(tmp_path):
        pytest.skip("no user extended attributes on this file system")
    client = Agent2PC.init(tmp_path)
    tx = client.begin()
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(2 * MIB))
    digest = None
    tx.stage_write_file("big.bin", src)
    digest = next(op.blob for op in client.engine.txs[tx.tid].changes())
    blob = Path(client.engine.blobs.path(digest))
    assert os.getxattr(blob, blobs_mod.BOOT_XATTR) == blobs_mod.boot_id()
    # What a machine crash before prepare leaves: the right size, other bytes, an old boot.
    os.chmod(blob, 0o600)
    with open(blob, "r+b") as f:
        f.seek(MIB)
        f.write(b"\0" * 4096)
    os.setxattr(blob, blobs_mod.BOOT_XATTR, b"00000000-0000-0000-0000-000000000000")
    os.chmod(blob, 0o444)
    with pytest.raises(TransactionAborted) as info:
        tx.commit()
    assert info.value.code == "corrupt_blob"
    assert not (tmp_path / "big.bin").exists()


def test_stage_write_file_takes_a_file_object_from_where_it_stands_or_one_without_descriptor(
        tmp_path: Path) -> None:
    import gzip
    import io

    (tmp_path / "ws").mkdir()
    client = Agent2PC.init(tmp_path / "ws")
    data = os.urandom(3 * MIB + 17)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    tx = client.begin()
    with open(src, "rb") as f:
        f.read(10)  # its buffer now holds more than it handed out
        assert tx.stage_write_file("partly-read.bin", f)["bytes"] == len(data) - 10
        assert f.read() == b""  # left at its end, as after reading it all
    pipe = subprocess.Popen(["cat", str(src)], stdout=subprocess.PIPE)
    assert pipe.stdout is not None
    pipe.stdout.read(5)
    tx.stage_write_file("from-pipe.bin", pipe.stdout)
    pipe.stdout.close()
    pipe.wait()
    tx.stage_write_file("bytesio.bin", io.BytesIO(data))
    tx.stage_write_file("gunzipped.bin", gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(data))))
    tx.commit()
    ws = tmp_path / "ws"
    assert (ws / "partly-read.bin").read_bytes() == data[10:]
    assert (ws / "from-pipe.bin").read_bytes() == data[5:]
    assert (ws / "bytesio.bin").read_bytes() == data
    assert (ws / "gunzipped.bin").read_bytes() == data


def test_stage_write_file_refuses_a_text_file_object_and_stages_nothing(tmp_path: Path) -> None:
    import io

    from agent_2pc.errors import UsageError

    client = Agent2PC.init(tmp_path)
    tx = client.begin()
    with pytest.raises(UsageError):
        tx.stage_write_file("a.txt", io.StringIO("text"))  # type: ignore[arg-type]
    assert tx.status()["ops"] == 0
    assert os.listdir(client.engine.blobs.tmp_dir) == []


def test_stage_write_file_of_a_path_it_cannot_read_is_a_usage_error_that_stages_nothing(
        tmp_path: Path) -> None:
    from agent_2pc.errors import UsageError

    ws, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    ws.mkdir()
    elsewhere.mkdir()
    client = Agent2PC.init(ws)
    tx = client.begin()
    (elsewhere / "a-dir").mkdir()
    for source, why in ((elsewhere / "missing.bin", "No such file"),
                        (elsewhere / "a-dir", "it is a directory"),
                        (str(elsewhere / ("x" * 300)), "File name too long")):
        with pytest.raises(UsageError, match=why) as err:
            tx.stage_write_file("a.bin", source)
        assert err.value.code == "usage" and str(source) in str(err.value)
    assert tx.status()["ops"] == 0 and not (ws / "a.bin").exists()
    assert os.listdir(client.engine.blobs.tmp_dir) == []


# --- a large file is copied by the kernel while a thread hashes the copy (blobs.put_fd) ------

def staged_blob(client: Agent2PC, tid: str, path: str) -> Path:
    digest = next(op.blob for op in client.engine.txs[tid].changes() if op.path == path)
    return Path(client.engine.blobs.path(digest))


def counting_copies(monkeypatch: pytest.MonkeyPatch, after=None) -> list[int]:  # type: ignore[no-untyped-def]
    """Count blobs.copy_range's calls; ``after(n_calls)`` runs after each."""
    calls: list[int] = []
    real = blobs_mod.copy_range

    def copy(src: int, dst: int, count: int) -> int:
        n = real(src, dst, count)
        calls.append(n)
        if after is not None:
            after(len(calls))
        return n

    monkeypatch.setattr(blobs_mod, "copy_range", copy)
    return calls


def test_a_large_file_is_copied_by_the_kernel_and_named_by_the_hash_of_its_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    (tmp_path / "ws").mkdir()
    client = Agent2PC.init(tmp_path / "ws")
    data = os.urandom(blobs_mod.COPY_CHUNK * 2 + 12345)  # three chunks, the last one short
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    calls = counting_copies(monkeypatch)
    tx = client.begin()
    with open(src, "rb") as f:
        f.read(10)  # a file object read from: staged from where it stands
        assert tx.stage_write_file("big.bin", f)["bytes"] == len(data) - 10
    assert sum(calls) == len(data) - 10 and calls[-1] == 0, calls  # all of it by the kernel
    blob = staged_blob(client, tx.tid, "big.bin")
    assert blob.name == hashlib.sha256(data[10:]).hexdigest()
    tx.commit()
    assert (tmp_path / "ws" / "big.bin").read_bytes() == data[10:]
    assert os.listdir(client.engine.blobs.tmp_dir) == []


def test_a_large_file_whose_bytes_change_while_it_is_copied_gives_a_blob_named_by_its_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hash is of the copy read back, not of the source read separately: a source that
    another program writes during the copy cannot give a blob whose name lies."""
    import hashlib

    (tmp_path / "ws").mkdir()
    client = Agent2PC.init(tmp_path / "ws")
    src = tmp_path / "src.bin"
    src.write_bytes(b"a" * (blobs_mod.COPY_CHUNK * 2))

    def rewrite_the_rest(n_calls: int) -> None:
        if n_calls == 1:  # the first chunk is copied: change what is not yet
            with open(src, "r+b") as f:
                f.seek(blobs_mod.COPY_CHUNK)
                f.write(b"b" * blobs_mod.COPY_CHUNK)

    counting_copies(monkeypatch, rewrite_the_rest)
    tx = client.begin()
    tx.stage_write_file("big.bin", src)
    blob = staged_blob(client, tx.tid, "big.bin")
    content = blob.read_bytes()
    assert blob.name == hashlib.sha256(content).hexdigest()
    assert content == b"a" * blobs_mod.COPY_CHUNK + b"b" * blobs_mod.COPY_CHUNK


@pytest.mark.parametrize("how", ["EXDEV", "stops short"])
def test_a_large_file_the_kernel_cannot_copy_is_streamed_from_where_the_copy_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """EXDEV: two file systems the kernel cannot copy between. Stops short: a copy that
    answers 0 (the end) before the file's size, as some file systems' does."""
    import errno

    (tmp_path / "ws").mkdir()
    client = Agent2PC.init(tmp_path / "ws")
    data = os.urandom(blobs_mod.COPY_CHUNK * 2 + 99)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    real = blobs_mod.copy_range
    calls: list[int] = []

    def copy_once_then_exdev(src_fd: int, dst: int, count: int) -> int:
        calls.append(count)
        if len(calls) > 1:
            if how == "EXDEV":
                raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
            return 0
        return real(src_fd, dst, count)

    monkeypatch.setattr(blobs_mod, "copy_range", copy_once_then_exdev)
    tx = client.begin()
    assert tx.stage_write_file("big.bin", src)["bytes"] == len(data)
    assert len(calls) == 2
    tx.commit()
    assert (tmp_path / "ws" / "big.bin").read_bytes() == data


@pytest.mark.parametrize("err", ["ENOSPC", "EIO"])
def test_a_large_copy_that_fails_stages_nothing_and_leaves_no_temp_file_or_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: str) -> None:
    import errno
    import threading

    (tmp_path / "ws").mkdir()
    client = Agent2PC.init(tmp_path / "ws")
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(blobs_mod.COPY_CHUNK * 2))
    real = blobs_mod.copy_range
    calls: list[int] = []

    def copy_once_then_fail(src_fd: int, dst: int, count: int) -> int:
        calls.append(count)
        if len(calls) > 1:  # the disk filled up (or failed) after one chunk
            raise OSError(getattr(errno, err), os.strerror(getattr(errno, err)))
        return real(src_fd, dst, count)

    monkeypatch.setattr(blobs_mod, "copy_range", copy_once_then_fail)
    threads = threading.active_count()
    tx = client.begin()
    with pytest.raises(OSError) as info:
        tx.stage_write_file("big.bin", src)
    assert info.value.errno == getattr(errno, err)
    assert tx.status()["ops"] == 0
    assert os.listdir(client.engine.blobs.tmp_dir) == []
    assert threading.active_count() == threads  # the hashing thread is gone
    monkeypatch.setattr(blobs_mod, "copy_range", real)
    tx.stage_write_file("big.bin", src)  # and the next try goes through
    tx.commit()
    assert (tmp_path / "ws" / "big.bin").read_bytes() == src.read_bytes()


def test_a_large_content_given_as_bytes_is_hashed_beside_its_writing_and_named_by_it(
        tmp_path: Path) -> None:
    import hashlib
    import threading

    client = Agent2PC.init(tmp_path)
    data = os.urandom(blobs_mod.COPY_CHUNK + blobs_mod.COPY_MIN + 7)
    threads = threading.active_count()
    tx = client.begin()
    assert tx.stage_write("big.bin", data)["bytes"] == len(data)
    assert staged_blob(client, tx.tid, "big.bin").name == hashlib.sha256(data).hexdigest()
    assert threading.active_count() == threads
    tx.stage_write("again.bin", data)  # the same content: the blob is there, the temp goes
    assert os.listdir(client.engine.blobs.tmp_dir) == []
    tx.commit()
    assert (tmp_path / "big.bin").read_bytes() == data == (tmp_path / "again.bin").read_bytes()


def test_a_large_content_given_as_bytes_that_fails_to_write_stages_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    client = Agent2PC.init(tmp_path)
    real = blobs_mod.write_all
    calls: list[int] = []

    def write_once_then_enospc(fd: int, chunk: object) -> None:
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, chunk)  # type: ignore[arg-type]

    monkeypatch.setattr(blobs_mod, "write_all", write_once_then_enospc)
    tx = client.begin()
    with pytest.raises(OSError):
        tx.stage_write("big.bin", os.urandom(blobs_mod.COPY_CHUNK * 2))
    assert tx.status()["ops"] == 0
    assert os.listdir(client.engine.blobs.tmp_dir) == []


@pytest.mark.parametrize("point,expect", [
    ("stage.after_blob", "old"),  # the blob copied and hashed, its record not appended
    ("prepare.before_decision", "old"),
    ("commit.after_decision", "new"),
    ("commit.mid_apply:1", "new"),
    ("commit.before_end", "new"),
])
def test_a_large_file_killed_anywhere_from_its_copy_to_its_end_is_all_or_nothing(
        tmp_path: Path, point: str, expect: str) -> None:
    """A real process killed at each point of staging and committing a file big enough for
    the kernel's copy: recover leaves the old content or puts the whole new one, never a part,
    and no temp file stays."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "big.bin").write_bytes(b"old\n")
    Agent2PC.init(root).close()
    data = os.urandom(blobs_mod.COPY_CHUNK + blobs_mod.COPY_MIN + 3)
    src = tmp_path / "src.bin"
    src.write_bytes(data)

    def cli(*args: str, crash: str | None = None) -> subprocess.CompletedProcess[bytes]:
        return run_cli(args, root=str(root), env={"AGENT2PC_CRASH_AT": crash} if crash else None)

    tid = cli("begin").stdout.decode().strip()
    staging = point == "stage.after_blob"
    proc = cli("stage-write", "--tid", tid, "--path", "big.bin", "--from-file", str(src),
               crash=point if staging else None)
    if not staging:
        assert proc.returncode == 0, proc.stderr
        proc = cli("commit", "--tid", tid, crash=point)
    assert proc.returncode == 137, proc.stdout + proc.stderr[-2000:]
    assert cli("recover").returncode == 0
    assert (root / "big.bin").read_bytes() == (data if expect == "new" else b"old\n")
    assert os.listdir(root / ".agent-tx" / "objects" / "tmp") == []
