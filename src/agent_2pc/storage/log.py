"""The write-ahead log file: appends under the workspace lock, tailing reads, tail repair.

Many processes share one log. Every append holds ``.agent-tx/lock``; before writing, the
appender reads what others appended since it last looked, repairs a torn tail left by a killed
writer (copy it aside to ``wal.bin.torn-<offset>``, cut it off, fsync), and re-opens the file
when compaction replaced it (the file it holds has no name any more). Readers need
no lock: they read complete frames and stop at a partial one; anything that looks damaged is
looked at again under the lock before it is repaired (a torn tail) or reported (corruption,
with its offset).

An fsync of the log that fails leaves a mark, ``wal.bin.unsynced``: what it was to sync may be
gone from the disk while the page cache still shows it, and a later fsync would succeed
without writing it (PostgreSQL's fsyncgate). Whoever opens the log next writes it anew (a
fresh file, synced, renamed over the old one) before believing a record of it.

A ``Batch`` tells the caller what is new: ``reset`` means the file was replaced and ``records``
is its whole content; otherwise ``records`` follow what the caller saw before.
"""

from __future__ import annotations

import gc
import os
from _thread import RLock

from .. import crashpoints
from ..errors import CorruptWal
from . import wal_format
from .durable import FsyncFailed, fsync_dir, fsync_fd, rename, write, write_all
from .locks import FileLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable


HEADER_READ_BYTES = 512  # a log header is ~100 bytes


UNSYNCED = ".unsynced"  # wal.bin.unsynced: an fsync of the log failed; write it anew
TORN = ".torn-"  # wal.bin.torn-<offset>: a torn tail cut off the log, kept to look at
TORN_KEPT_MAX = 16  # the newest ones; older ones are removed when a new one is set aside


def set_aside(path: str, offset: int, torn: bytes) -> None:
    """Keep a torn tail cut off the log at ``offset`` as ``<log>.torn-<offset>`` (for a person
    to look at: nothing reads it back), and only the TORN_KEPT_MAX newest of them: one is
    left by each writer killed mid-append, so without a bound they would pile up."""
    aside = os.open(f"{path}{TORN}{offset}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                    0o644)
    try:
        write_all(aside, torn)
    finally:
        os.close(aside)
    folder, prefix = os.path.split(path + TORN)
    kept = []
    for entry in os.scandir(folder):
        at = entry.name[len(prefix):]
        if entry.name.startswith(prefix) and at.isdigit():
            try:  # newest last: by time, then (the same tick) by offset, which only grows
                kept.append((entry.stat().st_mtime_ns, int(at), entry.name))
            except FileNotFoundError:
                continue
    for _, _, name in sorted(kept)[:-TORN_KEPT_MAX]:
        try:
            os.unlink(os.path.join(folder, name))
        except FileNotFoundError:
            pass


class Batch:
    __slots__ = ("reset", "records", "frames", "truncated_bytes")

    def __init__(self) -> None:
        self.reset = False
        self.records: list[dict[str, Any]] = []
        self.frames: list[bytes | memoryview] = []  # the frame of each record, as on disk
        self.truncated_bytes = 0


class PausedGc:
    """The cyclic garbage collector off while a log is decoded and folded into states.

    Reading a log creates several objects per record (its dict, an ``Op``, the frame's view)
    and frees none, so every collection their allocations trigger meanwhile is wasted work,
    and each full one walks the whole heap again: ~0.1 s of the 0.6 s it takes to open a
    100k-record log, and half of it in a process that already holds a big heap (opening the
    same workspace again). Nothing read is cyclic garbage. The collector resumes, if it was on,
    as the block ends, whatever happens in it; it is one switch for the whole process, so the
    block is kept to reading.
    """

    __slots__ = ("_was_enabled",)

    def __enter__(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._was_enabled:
            gc.enable()


class Log:
    """A log file may begin with a header naming its workspace (wal_format.log_header): the log
    consumes it when it opens the file, keeps it at the front when compaction rewrites the
    file, and hands its id to ``check_header`` (which may refuse the file: a log that is not
    this workspace's, storage/workspace.py)."""

    def __init__(self, path: str, lock_path: str, *,
                 check_header: Callable[[str | None], None] | None = None) -> None:
        self.path = path
        self.check_header = check_header
        self.header = b""  # the header frame of the file this object holds, if it has one
        self.lock = FileLock(lock_path)
        self._mutex = RLock()
        self._fd: int | None = None
        self._offset = 0  # end of the last complete frame this object has handed out
        self.truncated_bytes = 0  # bytes of torn tail this object cut off, in total

    # -- reading ---------------------------------------------------------------------------

    def read(self) -> Batch:
        """What was appended since the last read or append (everything after a replacement)."""
        with self._mutex:
            batch = Batch()
            self._read_tail(batch, self._size(batch), locked=False)
            return batch

    def _size(self, batch: Batch) -> int:
        """The log's size, re-opening it first if compaction replaced it: the file we hold has
        no name any more (one fstat, no path lookup: this runs before every step)."""
        if self._fd is not None:
            st = os.fstat(self._fd)
            if st.st_nlink > 0:
                return st.st_size
            os.close(self._fd)
        try:  # never created here: a log that is gone is not an empty one (init makes it)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:
            raise CorruptWal(f"{self.path} is missing: the log is gone, and with it every "
                             "transaction in flight. Restore it, or, to start over, create an "
                             f"empty one (': > {self.path}')", path=self.path) from None
        self._offset = 0
        batch.reset = True
        batch.records.clear()
        batch.frames.clear()
        try:
            head = os.pread(self._fd, HEADER_READ_BYTES, 0)
            workspace_id, self._offset = wal_format.read_log_header(head)
            self.header = head[:self._offset]
            if self.check_header is not None:
                self.check_header(workspace_id)
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise
        if os.path.exists(self.path + UNSYNCED):  # one stat per opening
            self._rehome()
        return os.fstat(self._fd).st_size

    def _distrust(self) -> None:
        """An fsync of the log failed: mark it for whoever opens it next (``_rehome``), and
        let go of the descriptor so that this process opens it again too."""
        try:
            os.close(os.open(self.path + UNSYNCED, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC,
                             0o644))
        except OSError:
            pass  # a disk that refuses even this refuses the log's next write as well
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _rehome(self) -> None:
        """Write the log anew, synced, in place of a file whose fsync once failed; a torn tail
        is cut off (and kept aside) as it would be anyway. What the page cache shows is what
        the failed step wrote; if the kernel dropped it, the disk's version is read, and that is
        what stays. Damage in the middle is left for the reader to report."""
        with self.lock:
            assert self._fd is not None
            if not os.path.exists(self.path + UNSYNCED):
                return  # another process did it: read the file it made
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            start = len(self.header)  # the header stays (replace writes it first)
            data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
            decoded = wal_format.decode(data[start:])
            if decoded.damage is not None:
                if not decoded.damage.torn:
                    return
                at = start + decoded.damage.offset
                set_aside(self.path, at, data[at:])
                self.truncated_bytes += len(data) - at
            self.replace(list(decoded.frames))
            self._offset = start  # the caller reads the new file from its first record
            os.unlink(self.path + UNSYNCED)

    def _read_tail(self, batch: Batch, size: int, locked: bool) -> None:
        assert self._fd is not None
        if size == self._offset:
            return
        if size < self._offset:  # only compaction shrinks the log, and it replaces the file
            raise CorruptWal(f"{self.path} shrank below offset {self._offset} (size {size})",
                             path=self.path, offset=size)
        buf = os.pread(self._fd, size - self._offset, self._offset)
        decoded = wal_format.decode(buf)
        batch.records.extend(decoded.records)
        batch.frames.extend(decoded.frames)
        start = self._offset
        self._offset += decoded.end
        if decoded.damage is None:
            return
        damage_at = start + decoded.damage.offset
        if not locked:
            # A concurrent append may still be in flight: look again holding the lock.
            with self.lock:
                self._read_tail(batch, self._size(batch), locked=True)
            return
        if not decoded.damage.torn:
            raise CorruptWal(
                f"{self.path}: damaged record at offset {damage_at} "
                f"({decoded.damage.reason}) with valid records after it; refusing to guess. "
                "Move the file aside to start over, or restore it from a backup.",
                path=self.path, offset=damage_at)
        self._truncate(damage_at, size - damage_at)
        batch.truncated_bytes += size - damage_at

    def _truncate(self, offset: int, nbytes: int) -> None:
        """Cut a torn tail off, keeping a copy of it aside (``wal.bin.torn-<offset>``)."""
        assert self._fd is not None and self.lock.held
        set_aside(self.path, offset, os.pread(self._fd, nbytes, offset))
        os.ftruncate(self._fd, offset)
        try:
            fsync_fd(self._fd)
        except FsyncFailed:
            self._distrust()
            raise
        self.truncated_bytes += nbytes
        crashpoints.hit("wal.after_truncate")

    # -- appending -------------------------------------------------------------------------

    def append(self, records: list[dict[str, Any]], *, sync: bool) -> Batch:
        """Append ``records`` as one write (one fsync if ``sync``); return what is new.

        Encoding happens before the lock is taken. Under it, one ``fstat`` of the held
        descriptor tells the usual case (the file still has its name and ends where this
        object last saw it end) from the rest (another process appended, compaction replaced
        the file, or a torn tail waits to be cut), which goes through ``_read_tail``. So an
        append is five system calls: flock, fstat, write, fsync if asked, unlock.
        """
        if len(records) == 1:  # most appends: no list comprehension (a call of its own)
            frames = wal_format.encode(records[0])
            encoded = [frames]
        else:
            encoded = [wal_format.encode(r) for r in records]
            frames = b"".join(encoded)
        lock = self.lock
        with self._mutex:
            if not lock.try_acquire():  # the usual case, without acquire()'s layers
                lock.acquire()
            try:
                batch = Batch()
                fd = self._fd
                if fd is None:
                    self._read_tail(batch, self._size(batch), locked=True)
                else:
                    st = os.fstat(fd)
                    if st.st_nlink == 0 or st.st_size != self._offset:
                        self._read_tail(batch, self._size(batch), locked=True)
                fd = self._fd
                assert fd is not None
                crashpoints.hit("wal.torn_append", before_exit=lambda: write_all(
                    fd, frames[: max(1, len(frames) // 2)]))
                written = write(fd, frames)
                if written != len(frames):  # a short write: finish it
                    write_all(fd, memoryview(frames)[written:])
                if sync:
                    try:
                        fsync_fd(fd)
                    except FsyncFailed:
                        self._distrust()
                        raise
                self._offset += len(frames)
                batch.records.extend(records)
                batch.frames.extend(encoded)
                return batch
            finally:
                lock.release()

    def replace(self, frames: list[bytes | memoryview]) -> int:
        """Atomically replace the log with ``frames`` (compaction: the live transactions'
        frames, copied as they were); the caller holds the lock. Returns the new size. The
        caller's view of the log is these frames: nothing is read back."""
        assert self.lock.held
        data = b"".join([self.header, *frames])
        tmp = self.path + ".compact"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, data)
            fsync_fd(fd)
        finally:
            os.close(fd)
        crashpoints.hit("compact.before_rename")
        rename(tmp, self.path)
        fsync_dir(os.path.dirname(self.path))
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            self._offset = len(data)
        return len(data)

    def sync(self) -> None:
        """Make everything appended so far durable (one fsync of the log)."""
        with self._mutex:
            if self._fd is not None:
                try:
                    fsync_fd(self._fd)
                except FsyncFailed:
                    self._distrust()
                    raise

    def offset_of(self, frame: bytes | memoryview) -> int | None:
        """Where ``frame`` (one this object handed out) lies in the file: for reporting a
        record the fold refused. Reads the whole file; None if the frame is not there."""
        try:
            with open(self.path, "rb") as f:
                at = f.read().find(bytes(frame))
        except OSError:
            return None
        return at if at >= 0 else None

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        # A caller that drops its engine without closing it must not leak the descriptor (a
        # long-lived agent opens many); the object is unreachable, so nobody else holds _fd.
        fd = getattr(self, "_fd", None)
        if fd is not None:
            self._fd = None
            try:
                os.close(fd)
            except OSError:
                pass
