"""A commit's work grows with what is distinct, not with the number of paths (issue 19, item
2): one content staged at many paths is read back once at prepare, and a new directory that
many files go into is asked about once by the check for other writers' changes (the rebase
plan), not once per file. Counted in process, on a real commit."""

from __future__ import annotations

import errno
import os

import pytest

from agent_2pc import Agent2PC
from agent_2pc.participants import fs
from agent_2pc.storage import blobs

N = 120
BODY = b"same bytes\n" * 900  # 9.9 KB: above the decision's inline size, so prepare rereads it


def _stage_same_content(client: Agent2PC) -> str:
    tx = client.begin()
    for i in range(N):
        tx.stage_write(f"new/d{i // 40}/f{i:03d}.txt", BODY)
    return tx.tid


def test_one_content_at_many_paths_is_read_back_once_at_prepare(
        client: Agent2PC, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(BODY) > fs.INLINE_BYTES_MAX
    tid = _stage_same_content(client)
    hashed: list[int] = []
    real = blobs.sha256_fd

    def counted(fd: int, size: int | None = None) -> tuple[str, int]:
        hashed.append(fd)
        return real(fd, size) if size is not None else real(fd)

    monkeypatch.setattr(blobs, "sha256_fd", counted)
    client.get(tid).commit()
    assert len(hashed) == 1, f"the one blob was hashed {len(hashed)} times at prepare"
    assert all(os.path.exists(os.path.join(client.root, f"new/d{i // 40}/f{i:03d}.txt"))
               for i in range(N))


def test_a_new_directory_is_asked_about_once_not_once_per_file(
        client: Agent2PC, monkeypatch: pytest.MonkeyPatch) -> None:
    tid = _stage_same_content(client)
    missing: list[str] = []
    real_open = os.open

    def counting_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return real_open(path, flags, *args, **kwargs)
        except FileNotFoundError:
            if flags & os.O_DIRECTORY:
                missing.append(os.fsdecode(path))
            raise
        except OSError as exc:
            assert exc.errno != errno.ENOENT
            raise

    monkeypatch.setattr(fs.os, "open", counting_open)
    client.get(tid).commit()
    # new/ and its 3 subdirectories do not exist before the commit: a few looks each (the
    # rebase plan, the vote, the apply), whatever the number of files that go in them.
    assert len(missing) <= 4 * 3, missing


def test_a_first_apply_looks_for_no_copy_an_interrupted_run_left(
        client: Agent2PC, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a redo can find a ``claim-<tid>-<k>`` an earlier run of the apply made: the first
    run does not ask the store for one per file (it did: 20,000 lookups for 20,000 files)."""
    tid = _stage_same_content(client)
    looked: list[str] = []  # claims asked for and not there
    real_open, real_stat = os.open, os.stat

    def counting_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return real_open(path, flags, *args, **kwargs)
        except FileNotFoundError:
            if "claim-" in os.fsdecode(path):
                looked.append(os.fsdecode(path))
            raise

    def counting_stat(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return real_stat(path, *args, **kwargs)
        except FileNotFoundError:
            if "claim-" in os.fsdecode(path):
                looked.append(os.fsdecode(path))
            raise

    monkeypatch.setattr(fs.os, "open", counting_open)
    monkeypatch.setattr(fs.os, "stat", counting_stat)
    client.get(tid).commit()
    assert looked == [], looked[:3]
    assert all(os.path.exists(os.path.join(client.root, f"new/d{i // 40}/f{i:03d}.txt"))
               for i in range(N))
