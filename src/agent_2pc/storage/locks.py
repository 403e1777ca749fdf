"""flock-based locks with bounded waits.

flock belongs to an open file description, so two FileLock objects exclude each other even in
one process (threads each use their own object). The kernel drops a lock when its holder dies:
that is how liveness is told ("is the process that committed this transaction still alive?").
Waits poll with a short backoff up to a deadline: Python has no timed flock, and a signal-based
timeout is not safe in threaded callers.
"""

from __future__ import annotations

import fcntl
import os
import time
from _thread import RLock

from ..errors import Busy

LOCK_TIMEOUT_S = float(os.environ.get("AGENT2PC_LOCK_TIMEOUT_S", "120"))
_BACKOFF_S = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005)


class FileLock:
    def __init__(self, path: str, *, create: bool = True) -> None:
        self.path = path
        self._create = create
        self._fd: int | None = None
        self._depth = 0
        self._mutex = RLock()

    def _open(self) -> int:
        flags = os.O_RDWR | (os.O_CREAT if self._create else 0)
        return os.open(self.path, flags, 0o644)

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never wait."""
        if not self._mutex.acquire(blocking=False):
            return False
        if self._depth:
            self._depth += 1
            return True
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self._mutex.release()
            return False
        self._fd = fd
        self._depth = 1
        return True

    def acquire(self, timeout_s: float | None = None, what: str = "") -> None:
        """Take the lock, waiting up to ``timeout_s`` (default AGENT2PC_LOCK_TIMEOUT_S)."""
        if self.try_acquire():
            return
        budget = LOCK_TIMEOUT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
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

    def release(self) -> None:
        assert self._depth > 0, f"release of an unheld lock {self.path}"
        self._depth -= 1
        if self._depth == 0:
            fd, self._fd = self._fd, None
            assert fd is not None
            os.close(fd)  # closing the descriptor drops the flock
        self._mutex.release()

    @property
    def held(self) -> bool:
        return self._depth > 0

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
