"""Locks with bounded waits: a whole file (flock), or one byte of a shared file (OFD lock).

Both kinds belong to an open file description, so two lock objects exclude each other even in
one process (threads each use their own object), and the kernel drops a lock when its holder
dies: that is how liveness is told ("is the process that committed this transaction alive?").

Transactions are locked by one byte each of ``.agent-tx/txlocks`` (an open-file-description
lock, F_OFD_SETLK, at an offset derived from the tid) rather than by a lock file each: creating
a file costs 0.3 ms on this machine's file system, a third of a whole durable commit.

A wait for another process's hold happens in the kernel (a blocking F_OFD_SETLKW or flock in a
helper thread), which wakes the waiter when the hold ends: a poll with a back-off sleeps through
that moment, so that with many processes a waiter could lose the race for a second and more
while others took the lock again and again (50 agents on one workspace: p99 1.4 s against a
p50 of 0.2 s; docs/benchmarks.md, section 10 (d)). Python has no timed flock and a signal-based
timeout is not safe in threaded callers, so the helper is given up at the deadline: it takes the
lock when it comes and drops it at once. Threads of one process sharing a lock object wait on
its mutex. ``AGENT2PC_LOCK_WAIT=poll`` keeps the older poll alone (to compare).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from _thread import RLock

from ..errors import Busy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LOCK_TIMEOUT_S = float(os.environ.get("AGENT2PC_LOCK_TIMEOUT_S", "120"))
_BACKOFF_S = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005)
# struct flock on Linux (x86_64, aarch64): short l_type, short l_whence, off_t l_start,
# off_t l_len, pid_t l_pid (0 for OFD locks), padded to 32 bytes.
_FLOCK = struct.Struct("hh4xqqi4x")
_RANGE_OFFSET_MAX = (1 << 62) - 1
_FLOCK_TAKE = fcntl.LOCK_EX | fcntl.LOCK_NB
_KERNEL_WAIT = os.environ.get("AGENT2PC_LOCK_WAIT", "kernel") != "poll"


def byte_for(name: str) -> int:
    """A stable byte offset for ``name`` (60 bits of its SHA-256: collisions are negligible)."""
    from .hashing import sha256_bytes

    return int(sha256_bytes(name.encode("utf-8"))[:15], 16) & _RANGE_OFFSET_MAX


class FileLock:
    """An exclusive lock on ``path`` (flock), or on byte ``offset`` of it (OFD lock)."""

    def __init__(self, path: str, *, offset: int | None = None, create: bool = True) -> None:
        self.path = path
        self.offset = offset
        self._create = create
        self._fd: int | None = None
        self._depth = 0
        self._mutex = RLock()

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if self._create else 0)
        return os.open(self.path, flags, 0o644)

    def _lock(self, fd: int, take: bool, wait: bool = False) -> None:
        """Take (without waiting: BlockingIOError when it is held; ``wait``: blocked until it
        is free) or drop the lock on ``fd``."""
        if self.offset is None:
            fcntl.flock(fd, (fcntl.LOCK_EX if wait else _FLOCK_TAKE) if take else fcntl.LOCK_UN)
            return
        kind = fcntl.F_WRLCK if take else fcntl.F_UNLCK
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK,
                        _FLOCK.pack(kind, os.SEEK_SET, self.offset, 1, 0))
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise BlockingIOError(exc.errno, "locked") from None
            raise

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never wait."""
        if not self._mutex.acquire(blocking=False):
            return False
        if self._depth:
            self._depth += 1
            return True
        try:
            fd = self._fd
            if fd is None:  # kept open between holds: an open costs more than a lock
                fd = self._fd = self._open()
            if self.offset is None:  # flock, inline: the log lock is taken around every append
                fcntl.flock(fd, _FLOCK_TAKE)
            else:
                self._lock(fd, True)
        except BlockingIOError:
            self._mutex.release()
            return False
        except BaseException:
            self._mutex.release()
            raise
        self._depth = 1
        return True

    def acquire(self, timeout_s: float | None = None, what: str = "") -> None:
        """Take the lock, waiting up to ``timeout_s`` (default AGENT2PC_LOCK_TIMEOUT_S)."""
        if self.try_acquire():
            return
        budget = LOCK_TIMEOUT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        if _KERNEL_WAIT and self._acquire_in_kernel(deadline):
            return
        step = 0
        while True:
            time.sleep(_BACKOFF_S[min(step, len(_BACKOFF_S) - 1)])
            step += 1
            if self.try_acquire():
                return
            if time.monotonic() >= deadline:
                raise Busy(f"timed out after {budget:g} s waiting for {what or self.path} "
                           "(another process holds it; retry, or raise AGENT2PC_LOCK_TIMEOUT_S)",
                           lock=self.path)

    def _acquire_in_kernel(self, deadline: float) -> bool:
        """Wait for another process's hold to end in the kernel, which wakes the waiter when
        it is released (a poll may sleep through the moment). The wait runs in a helper
        thread on a descriptor of its own, so that it can be given up at the deadline: a
        helper given up takes the lock when it comes and drops it at once. False when the
        wait was not for another process (this process's threads share the object: they
        wait on its mutex) or the deadline passed."""
        import threading

        if not self._mutex.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        # Not this thread's already (try_acquire would have taken it again), and a thread
        # that held it released it whole before its mutex.
        assert not self._depth
        try:
            fd = self._open()
        except BaseException:
            self._mutex.release()
            raise
        got = threading.Event()
        guard = threading.Lock()
        state: dict[str, Any] = {"given_up": False, "error": None}

        def wait() -> None:
            try:
                self._lock(fd, True, wait=True)
            except OSError as exc:
                state["error"] = exc
            with guard:
                if state["given_up"]:
                    os.close(fd)  # the lock, if taken, goes with it
                    return
                got.set()

        threading.Thread(target=wait, name="agent-2pc-lock-wait", daemon=True).start()
        got.wait(max(0.0, deadline - time.monotonic()))
        with guard:
            if not got.is_set():
                state["given_up"] = True
                self._mutex.release()
                return False
        if state["error"] is not None:
            os.close(fd)
            self._mutex.release()
            return False  # the poll below tries again, and says why it gave up
        old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)
        self._depth = 1
        return True

    def release(self) -> None:
        assert self._depth > 0, f"release of an unheld lock {self.path}"
        self._depth -= 1
        if self._depth == 0:
            assert self._fd is not None
            if self.offset is None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            else:
                self._lock(self._fd, False)
        self._mutex.release()

    def close(self) -> None:
        """Drop the descriptor (and with it the lock, if held)."""
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
                self._depth = 0

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def is_free(self) -> bool:
        """Is nobody holding it, this object included? (Probes by taking and dropping it.)"""
        if self._depth:
            return False
        if self.try_acquire():
            self.release()
            return True
        return False

    @property
    def held(self) -> bool:
        return self._depth > 0

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
