"""The daemon's server: one per workspace, on ``.agent-tx/daemon.sock``.

``.agent-tx/daemon.lock`` (flock) is held for the daemon's life: a second daemon is refused,
and a socket found while the lock is free was left by a dead daemon and is replaced. The socket
is made with mode 0600, and each connection's peer (SO_PEERCRED) must be this user.

One thread per connection; requests on one connection are answered in order. The engine is
one object, used under a mutex; a step waits for its transaction's lock (and recover for the
commit lock) before taking the mutex, so that a step that waits never holds up the others.
Commits go through the group commit (groupcommit.py); the reaper runs beside (reaper.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import sys
import threading
import time

from ..errors import Agent2PCError, Busy, DaemonUnavailable, IoFailed
from . import protocol
from .groupcommit import GroupCommit
from .methods import METHODS, check_params
from .reaper import INTERVAL_MS, Reaper

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ACCEPT_POLL_S = 0.2
STOP_GRACE_S = 30.0
_UCRED = struct.Struct("3i")


class Lock:
    """``daemon.lock``: held (flock) while a daemon serves; it holds the daemon's pid."""

    def __init__(self, root: str) -> None:
        self.path = protocol.lock_path(root)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def take(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        return True

    def holder(self) -> int | None:
        """The pid of the daemon holding it (None: free)."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return int(os.pread(self.fd, 32, 0).split()[0])
            except (ValueError, IndexError):
                return -1
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return None

    def close(self) -> None:
        os.close(self.fd)


class Daemon:
    def __init__(self, root: str, reap_interval_ms: int = INTERVAL_MS) -> None:
        from ..coordinator.engine import Engine

        self.root = root
        self.socket_path = protocol.socket_path(root)
        self.lock = Lock(root)
        if not self.lock.take():
            pid = self.lock.holder()
            self.lock.close()
            raise Busy(f"a daemon (pid {pid}) already serves this workspace on "
                       f"{self.socket_path}; 'agent-2pc daemon stop' first", pid=pid,
                       socket=self.socket_path)
        try:
            self.engine = Engine(root)
        except BaseException:
            self.lock.close()
            raise
        self.mutex = threading.RLock()
        self.group = GroupCommit(self.engine, self.mutex)
        self.reaper = Reaper(self.engine, self.mutex, reap_interval_ms)
        self.started = time.monotonic()
        self.stopping = threading.Event()
        self.requests = 0
        self.clients = 0
        self.clients_total = 0
        self.refused_peers = 0
        self.in_request = 0
        self._count = threading.Lock()
        self._conns: set[socket.socket] = set()
        self.listener = self._listen()

    # -- the socket ----------------------------------------------------------------------------

    def _listen(self) -> socket.socket:
        """Bind the socket (a stale one replaced: we hold the lock), mode 0600."""
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        addr, dir_fd = protocol.address(self.socket_path)
        old = os.umask(0o177)
        try:
            sock.bind(addr)
        finally:
            os.umask(old)
            if dir_fd is not None:
                os.close(dir_fd)
        os.chmod(self.socket_path, 0o600)
        sock.listen(128)
        sock.settimeout(ACCEPT_POLL_S)
        self._inode = os.stat(self.socket_path).st_ino
        return sock

    def serve(self) -> None:
        """Accept connections until stopped (``daemon.stop``, SIGTERM, SIGINT)."""
        self.reaper.start()
        try:
            while not self.stopping.is_set():
                try:
                    conn, _ = self.listener.accept()
                except socket.timeout:
                    if self._socket_gone():
                        print("agent-2pc daemon: its socket is gone (the workspace was removed "
                              "or moved): stopping", file=sys.stderr, flush=True)
                        break
                    continue
                except InterruptedError:
                    continue
                conn.settimeout(None)
                threading.Thread(target=self._connection, args=(conn,), daemon=True).start()
        finally:
            self.close()

    def _socket_gone(self) -> bool:
        """Is our socket no longer at its path (the workspace removed or moved, or the socket
        file deleted)? No client can reach us there any more, and the engine's root may be
        gone: a daemon left serving nobody would run until the machine stops."""
        try:
            return os.stat(self.socket_path).st_ino != self._inode
        except OSError:
            return True

    def close(self) -> None:
        """Stop listening, let requests in progress finish, release everything."""
        self.stopping.set()
        try:
            if os.stat(self.socket_path).st_ino == self._inode:
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        self.listener.close()
        self.reaper.stop()
        deadline = time.monotonic() + STOP_GRACE_S
        while self.in_request and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._count:
            for conn in list(self._conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        with self.mutex:
            self.engine.close()
        self.lock.close()

    def _connection(self, conn: socket.socket) -> None:
        try:
            cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            _pid, uid, _gid = _UCRED.unpack(cred)
            if uid != os.getuid():
                with self._count:
                    self.refused_peers += 1
                conn.sendall(protocol.failure(None, protocol.SERVER_ERROR, (
                    f"this daemon serves its own user only (uid {os.getuid()}), not uid "
                    f"{uid}"), {"code": "daemon_unavailable", "type": "DaemonUnavailable",
                                "exit_status": 2, "details": {}}))
                return
            with self._count:
                self.clients += 1
                self.clients_total += 1
                self._conns.add(conn)
            try:
                self._requests(conn)
            finally:
                with self._count:
                    self.clients -= 1
                    self._conns.discard(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def _requests(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        while not self.stopping.is_set():
            line = reader.readline(protocol.LINE_BYTES_MAX + 1)
            if not line:
                return
            if not line.endswith(b"\n"):
                if len(line) > protocol.LINE_BYTES_MAX:
                    conn.sendall(protocol.failure(None, protocol.INVALID_REQUEST, (
                        f"a request is one line of at most {protocol.LINE_BYTES_MAX} bytes")))
                return
            with self._count:
                self.in_request += 1
                self.requests += 1
            try:
                out = self.handle(line)
                if out is not None:
                    conn.sendall(out)
            finally:
                with self._count:
                    self.in_request -= 1

    # -- one request -----------------------------------------------------------------------------

    def handle(self, line: bytes) -> bytes | None:
        """The answer to one request line (None for a notification: a request without id)."""
        try:
            msg = json.loads(line)
        except ValueError as exc:
            return protocol.failure(None, protocol.PARSE_ERROR, f"not JSON: {exc}")
        if not isinstance(msg, dict):
            return protocol.failure(None, protocol.INVALID_REQUEST,
                                    "a request is one JSON object (batches are not supported)")
        rid = msg.get("id")
        method, params = msg.get("method"), msg.get("params", {})
        if msg.get("jsonrpc") != "2.0" or not isinstance(method, str) or not isinstance(
                params, dict) or isinstance(rid, (dict, list, bool)):
            return protocol.failure(rid, protocol.INVALID_REQUEST,
                                    'a request is {"jsonrpc": "2.0", "id": N, "method": M, '
                                    '"params": {...}}')
        try:
            result = self.call(method, params)
        except _NoMethod:
            out = protocol.failure(rid, protocol.METHOD_NOT_FOUND, f"no method {method!r}")
        except Agent2PCError as exc:
            out = protocol.failure(rid, protocol.SERVER_ERROR, exc.message,
                                   protocol.error_data(exc))
        except OSError as exc:
            io = IoFailed.from_os_error(exc)
            out = protocol.failure(rid, protocol.SERVER_ERROR, io.message,
                                   protocol.error_data(io))
        except Exception as exc:  # a bug: answered, logged, the daemon goes on
            print(f"agent-2pc daemon: {method}: {exc!r}", file=sys.stderr, flush=True)
            out = protocol.failure(rid, -32603, f"internal error: {exc!r}")
        else:
            out = protocol.answer(rid, result)
        return None if "id" not in msg else out

    def call(self, name: str, params: dict[str, Any]) -> Any:
        if name in DAEMON_METHODS:
            return DAEMON_METHODS[name](self, params)
        method = METHODS.get(name)
        if method is None:
            raise _NoMethod(name)
        params = check_params(method, params)
        if name == "commit":
            return self.group.commit(params["tid"], params.get("merge", True))
        if name in ("recover", "compact"):
            with self.engine.journal.commit_lock:  # before the mutex: the leader holds it
                with self.mutex:
                    return method.run(self.engine, params)
        lock = None
        tid = params.get("tid") if method.tid else None
        if isinstance(tid, str) and _tid_shaped(tid):
            lock = self.group.tx_lock(tid)
            lock.acquire(what=f"transaction {tid} (another process is working on it)")
        try:
            with self.mutex:
                return method.run(self.engine, params)
        finally:
            if lock is not None:
                lock.release()

    # -- the daemon's own methods ------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        uptime = time.monotonic() - self.started
        g = self.group.stats
        with self.mutex:
            self.engine.journal.refresh()
            by_state: dict[str, int] = {}
            for tx in self.engine.txs.values():
                by_state[tx.state] = by_state.get(tx.state, 0) + 1
        with g.lock:
            commits, fsyncs, batches, largest = g.commits, g.fsyncs, g.batches, g.largest_batch
            aborted = g.aborted
        return {
            "running": True, "pid": os.getpid(), "socket": self.socket_path, "root": self.root,
            "protocol": protocol.PROTOCOL_VERSION, "uptime_s": round(uptime, 3),
            "clients": self.clients, "clients_total": self.clients_total,
            "refused_peers": self.refused_peers, "requests": self.requests,
            "commits": commits, "commits_aborted": aborted,
            "commits_per_s": round(commits / uptime, 3) if uptime > 0 else 0.0,
            "fsyncs": fsyncs, "fsyncs_saved": commits - fsyncs if commits > fsyncs else 0,
            "batches": batches, "largest_batch": largest, "transactions": by_state,
            "reaper": {"interval_ms": self.reaper.interval_ms, "runs": self.reaper.runs,
                       "reaped": self.reaper.reaped, "last_error": self.reaper.last_error},
        }


class _NoMethod(Exception):
    pass


def _tid_shaped(tid: str) -> bool:
    from ..coordinator.gate import TID_RE

    return bool(TID_RE.fullmatch(tid))


def _hello(d: Daemon, p: dict[str, Any]) -> dict[str, Any]:
    from .. import __version__

    return {"protocol": protocol.PROTOCOL_VERSION, "pid": os.getpid(), "root": d.root,
            "version": __version__, "methods": sorted([*METHODS, *DAEMON_METHODS])}


def _stop(d: Daemon, p: dict[str, Any]) -> dict[str, Any]:
    d.stopping.set()
    return {"stopped": True, "pid": os.getpid()}


DAEMON_METHODS = {
    "hello": _hello,
    "daemon.status": lambda d, p: d.status(),
    "daemon.reap": lambda d, p: d.reaper.run_once(),
    "daemon.stop": _stop,
}


def run(root: str, reap_interval_ms: int = INTERVAL_MS, ready: Any = None) -> None:
    """Serve ``root`` in this process until stopped; ``ready(daemon)`` once listening."""
    import signal

    daemon = Daemon(root, reap_interval_ms)

    def on_signal(signum: int, frame: Any) -> None:
        daemon.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if ready is not None:
        ready(daemon)
    daemon.serve()


__all__ = ["Daemon", "DaemonUnavailable", "run"]
