"""The one place that makes bytes durable: writes, fsync, directory fsync, renames, atomic file
replacement -- and where injected I/O failures strike (faults.py, ``AGENT2PC_FAULT_AT``).

An fsync that fails is fatal: the caller must stop and let recovery decide (the page cache may
have dropped the dirty pages, so retrying the fsync would lie). ``FsyncFailed`` is not an
Agent2PCError on purpose: it is not an answer, it ends the process's work.
"""

from __future__ import annotations

import os

from .. import faults


class FsyncFailed(OSError):
    pass


def fsync_fd(fd: int, _kind: str = "fsync") -> None:
    try:
        if faults.ARMED:
            faults.hit(_kind)
        os.fsync(fd)
    except OSError as exc:
        raise FsyncFailed(exc.errno, f"fsync failed: {exc.strerror}") from exc


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync_fd(fd, "fsync_dir")
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: temp file in the same directory, fsync, rename, fsync dir."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        write_all(fd, data)
        fsync_fd(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    rename(tmp, path)
    fsync_dir(directory)


def write(fd: int, data: bytes | memoryview) -> int:
    """One ``write(2)``: the number of bytes written."""
    if faults.ARMED:
        faults.hit("write", lambda: os.write(fd, data[: len(data) // 2]))
    return os.write(fd, data)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    if faults.ARMED:
        faults.hit("write", lambda: os.write(fd, view[: len(view) // 2]))
    while view:
        view = view[os.write(fd, view):]


def rename(src: str, dst: str, *, src_dir_fd: int | None = None,
           dst_dir_fd: int | None = None) -> None:
    if faults.ARMED:
        faults.hit("rename")
    os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
