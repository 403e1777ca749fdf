"""The one place that makes bytes durable: writes, fsync, directory fsync, renames, atomic file
replacement -- and where injected I/O failures strike (faults.py, ``AGENT2PC_FAULT_AT``).

Many files at once (a commit or a capture of tens of thousands) are made durable by one
``syncfs`` per file system instead of an fsync each (``sync_filesystems``): each fsync of a
small file flushes the disk's write cache, a syncfs flushes it once for all of them. It covers
every file and directory of the file system (other processes' dirty data too), so it pays only
from ``SYNCFS_MIN`` files on; below that the callers fsync file by file as before.

An fsync that fails is fatal: the caller must stop and let recovery decide (the page cache may
have dropped the dirty pages, so retrying the fsync would lie). ``FsyncFailed`` is not an
Agent2PCError on purpose: it is not an answer, it ends the process's work.
"""

from __future__ import annotations

import errno
import os

from .. import faults


class FsyncFailed(OSError):
    pass


# From this many files on, one syncfs per file system replaces their fsyncs (an fsync costs a
# cache flush of the disk: 1-10 ms here; a syncfs one flush plus the file system's dirty
# data). AGENT2PC_SYNCFS_MIN sets it (0: never), for tests of the batched path on few files.
SYNCFS_MIN = int(os.environ.get("AGENT2PC_SYNCFS_MIN", "") or 64)
_libc_fns: dict[str, object] = {}  # name -> libc function, or None where there is none


def _libc(name: str, *argtypes: object) -> object:
    """``libc.<name>`` through ctypes, looked up once (None where there is none)."""
    if name not in _libc_fns:
        fn = None
        try:
            import ctypes  # only for big batches and big files: a few ms for the CLI to import

            fn = getattr(ctypes.CDLL(None, use_errno=True), name)
            fn.argtypes = list(argtypes)
            fn.restype = ctypes.c_int
        except (OSError, AttributeError, ImportError):
            fn = None
        _libc_fns[name] = fn
    return _libc_fns[name]


def _libc_syncfs() -> object:
    import ctypes

    return _libc("syncfs", ctypes.c_int)


def batching(count: int) -> bool:
    """Should ``count`` files be made durable by ``sync_filesystems`` rather than one by one?
    (Depends on the count only, so that a redo of an apply decides as its first run did.)"""
    return 0 < SYNCFS_MIN <= count and _libc_syncfs() is not None


def syncfs_fd(fd: int, _kind: str = "syncfs") -> None:
    """syncfs(2) of the file system that holds ``fd``: every file and directory of it durable.
    An error (a writeback error of any file on it since ``fd`` was opened, or one nobody has
    seen yet) is an FsyncFailed, as an fsync's."""
    fn = _libc_syncfs()
    assert fn is not None, "syncfs_fd without syncfs (check batching() first)"
    try:
        if faults.ARMED:
            faults.hit(_kind)
        if fn(fd) != 0:  # type: ignore[operator]
            import ctypes

            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    except OSError as exc:
        raise FsyncFailed(exc.errno, f"syncfs failed: {exc.strerror}") from exc


def sync_filesystems(fds: list[int]) -> int:
    """One syncfs per distinct file system among the open descriptors ``fds`` (open them
    before writing what must become durable: the error a syncfs reports is one seen since its
    descriptor was opened). Returns the number of syncfs calls."""
    seen: set[int] = set()
    for fd in fds:
        dev = os.fstat(fd).st_dev
        if dev not in seen:
            seen.add(dev)
            syncfs_fd(fd)
    return len(seen)


def start_writeback(fd: int, offset: int, count: int) -> None:
    """Ask the kernel to start writing ``count`` bytes of ``fd`` from ``offset`` to the disk
    now, without waiting (sync_file_range(2) with SYNC_FILE_RANGE_WRITE). It makes nothing
    durable (an fsync is still needed, and reports any error of this writeback): it lets the
    disk work while the caller goes on, so that the fsync finds little left to write. Best
    effort: nothing happens where the call is missing or refused."""
    import ctypes

    fn = _libc("sync_file_range", ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    if fn is not None:
        fn(fd, offset, count, 2)  # type: ignore[operator]  # SYNC_FILE_RANGE_WRITE


def copy_range(src: int, dst: int, count: int) -> int:
    """One copy_file_range(2) of up to ``count`` bytes from ``src``'s position to ``dst``'s,
    inside the kernel: the bytes copied, 0 at the end of ``src``. Raises OSError where the
    kernel cannot copy between these files (EXDEV, EINVAL, ENOSYS, EOPNOTSUPP: see
    ``COPY_UNSUPPORTED``); an injected failure copies half first, as a failed write."""
    if faults.ARMED:
        faults.hit("write", lambda: os.copy_file_range(src, dst, count // 2))
    return os.copy_file_range(src, dst, count)


# What copy_file_range answers where it cannot copy between two files: copy through user space.
COPY_UNSUPPORTED = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP,
                              errno.EBADF, errno.ETXTBSY})


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
