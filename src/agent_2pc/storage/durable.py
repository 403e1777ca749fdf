"""The one place that makes bytes durable: fsync, directory fsync, atomic file replacement.

An fsync that fails is fatal: the caller must stop and let recovery decide (the page cache may
have dropped the dirty pages, so retrying the fsync would lie). ``FsyncFailed`` is not an
Agent2PCError on purpose: it is not an answer, it ends the process's work.
"""

from __future__ import annotations

import os


class FsyncFailed(OSError):
    pass


def fsync_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise FsyncFailed(exc.errno, f"fsync failed: {exc.strerror}") from exc


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync_fd(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: temp file in the same directory, fsync, rename, fsync dir."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fsync_fd(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)
    fsync_dir(directory)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
