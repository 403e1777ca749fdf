"""The client side of the daemon: an engine whose steps are requests on the daemon's socket.

``Agent2PC`` uses a ``RemoteEngine`` when a daemon serves the workspace (one ``connect`` tells);
it has the methods of coordinator/engine.Engine that the library calls, with the same
arguments, answers and errors. What does not travel well over a socket (a step that streams
from a file descriptor, runs a command with this process's terminal and environment, or looks
inside the engine) goes to an in-process engine opened on first use: every step is safe from
any process, the daemon's included, because the log and the locks are shared on disk.

A daemon that dies in the middle of a request answers nothing: the step raises
DaemonUnavailable, and the next one goes to a restarted daemon or, with none, in-process, where
the engine finishes or undoes what the dead daemon left (its locks died with it).
"""

from __future__ import annotations

import _socket
import base64
import json
import os
from _thread import allocate_lock

from ..core.paging import LIST_LIMIT
from ..errors import DaemonUnavailable
from . import protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..coordinator.engine import Engine


def _text_or_b64(params: dict[str, Any], name: str, value: str | bytes) -> None:
    if isinstance(value, str):
        params[name] = value
    else:
        params[name + "_b64"] = base64.b64encode(bytes(value)).decode("ascii")


class RemoteEngine:
    def __init__(self, root: str, sock: _socket.socket) -> None:
        self.root = root
        self._sock: _socket.socket | None = sock
        self._reader = protocol.LineReader(sock)
        self._mutex = allocate_lock()
        self._next_id = 0
        self._local: Engine | None = None

    # -- the connection ----------------------------------------------------------------------

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One request, its answer; an error answer raises the error it names. With the
        daemon gone (stopped, or dead before this request was sent), the method runs
        in-process; dead during it: DaemonUnavailable."""
        params = params or {}
        with self._mutex:
            if self._sock is not None and _hung_up(self._sock):
                self._drop()  # closed while idle: this request was never sent
            if self._sock is None:
                sock = protocol.connect(self.root)
                if sock is not None:
                    self._sock, self._reader = sock, protocol.LineReader(sock)
            if self._sock is not None:
                self._next_id += 1
                try:
                    self._sock.sendall(protocol.request(self._next_id, method, params))
                    line = self._reader.readline(protocol.LINE_BYTES_MAX + 1)
                except OSError as exc:
                    self._drop()
                    raise self._died(method, str(exc)) from None
                if not line.endswith(b"\n"):
                    self._drop()
                    raise self._died(method, "the connection closed before the answer")
                msg = json.loads(line)
                if "error" in msg:
                    protocol.raise_error(msg["error"])
                return msg.get("result")
        from .methods import run_method

        return run_method(self.local, method, params)

    def _died(self, method: str, why: str) -> DaemonUnavailable:
        return DaemonUnavailable(
            f"the daemon stopped answering during {method!r} ({why}); the next command (through "
            "a restarted daemon, or in-process) finds it finished or undone, all or nothing",
            method=method, socket=protocol.socket_path(self.root))

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def close(self) -> None:
        with self._mutex:
            self._drop()
        if self._local is not None:
            self._local.close()
            self._local = None

    @property
    def local(self) -> Engine:
        """An in-process engine on the same workspace, for what is not forwarded."""
        if self._local is None:
            from ..coordinator.engine import Engine

            self._local = Engine(self.root)
        return self._local

    # -- decided by an outside coordinator: in this process, on purpose ----------------------
    # vote and decide take the transaction's lock and then the commit lock, and vote may run
    # checks for minutes: inside the daemon that would hold its mutex while waiting for the
    # commit lock, which a group-commit leader takes before the mutex. Here they take the same
    # file locks as the daemon's steps (flock), so they exclude each other across processes.

    def vote(self, tid: str, coordinator: dict[str, Any] | str) -> dict[str, Any]:
        return self.local.vote(tid, coordinator)

    def decide(self, tid: str, outcome: str, reason: str | None = None) -> dict[str, Any]:
        return self.local.decide(tid, outcome, reason)

    def in_doubt(self) -> list[dict[str, Any]]:
        return self.local.in_doubt()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.local, name)

    # -- the steps forwarded (their names and arguments are the library's) -------------------

    def begin(self, timeout_ms: int | None = None, label: str | None = None,
              git_branch: str | None = None) -> dict[str, Any]:
        return self.call("begin", {"timeout_ms": timeout_ms, "label": label,  # type: ignore
                                   "git_branch": git_branch})

    def commit(self, tid: str, merge: bool = True) -> dict[str, Any]:
        return self.call("commit", {"tid": tid, "merge": merge})  # type: ignore

    def abort(self, tid: str, reason: str | None = None) -> dict[str, Any]:
        return self.call("abort", {"tid": tid, "reason": reason})  # type: ignore

    def recover(self) -> dict[str, Any]:
        return self.call("recover")  # type: ignore[no-any-return]

    def compact(self, gc: bool = True) -> dict[str, Any]:
        return self.call("compact", {"gc": gc})  # type: ignore[no-any-return]

    def transactions(self, state: str | None = None, *, finished: bool = True,
                     limit: int | None = LIST_LIMIT, before: str | None = None
                     ) -> list[dict[str, Any]]:
        return self.call("transactions", {"state": state, "finished": finished,  # type: ignore
                                          "limit": limit, "before": before})

    def status(self, tid: str | None = None) -> dict[str, Any]:
        return self.call("status", {"tid": tid})  # type: ignore[no-any-return]

    def record_read(self, tid: str, path: str) -> dict[str, Any]:
        return self.call("record_read", {"tid": tid, "path": path})  # type: ignore

    def read(self, tid: str, path: str) -> bytes | None:
        out = self.call("read", {"tid": tid, "path": path})
        b64 = out.get("content_b64")
        return None if b64 is None else base64.b64decode(b64)

    def stage_write(self, tid: str, path: str, content: bytes | None = None, *,
                    src_fd: int | None = None, mode: int | None = None,
                    via: str = "write", create_dirs: bool = True) -> dict[str, Any]:
        if src_fd is not None or via != "write":  # streamed from a descriptor: in-process
            return self.local.stage_write(tid, path, content, src_fd=src_fd, mode=mode,
                                          via=via, create_dirs=create_dirs)
        params: dict[str, Any] = {"tid": tid, "path": path, "mode": mode,
                                  "create_dirs": create_dirs}
        if content is not None:
            params["content_b64"] = base64.b64encode(content).decode("ascii")
        return self.call("stage_write", params)  # type: ignore[no-any-return]

    def stage_delete(self, tid: str, path: str) -> dict[str, Any]:
        return self.call("stage_delete", {"tid": tid, "path": path})  # type: ignore

    def stage_replace(self, tid: str, path: str, old: str | bytes, new: str | bytes,
                      all: bool = False) -> dict[str, Any]:
        params: dict[str, Any] = {"tid": tid, "path": path, "all": all}
        _text_or_b64(params, "old", old)
        _text_or_b64(params, "new", new)
        return self.call("stage_replace", params)  # type: ignore[no-any-return]

    def stage_patch(self, tid: str, patch: str | bytes) -> dict[str, Any]:
        params: dict[str, Any] = {"tid": tid}
        _text_or_b64(params, "patch", patch)
        return self.call("stage_patch", params)  # type: ignore[no-any-return]

    def stage_api(self, tid: str, method: str, url: str, body: Any = None,
                  headers: dict[str, str] | None = None, idempotency_key: str | None = None,
                  compensate: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.call("stage_api", {  # type: ignore[no-any-return]
            "tid": tid, "method": method, "url": url, "body": body, "headers": headers,
            "idempotency_key": idempotency_key, "compensate": compensate})

    def stage_effect(self, tid: str, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        return self.call("stage_effect", {"tid": tid, "kind": kind, "args": args})  # type: ignore

    def savepoint(self, tid: str, name: str) -> dict[str, Any]:
        return self.call("savepoint", {"tid": tid, "name": name})  # type: ignore

    def rollback_to(self, tid: str, name: str) -> dict[str, Any]:
        return self.call("rollback_to", {"tid": tid, "name": name})  # type: ignore

    def diff(self, tid: str, stat_only: bool = False) -> dict[str, Any]:
        return self.call("diff", {"tid": tid, "stat": stat_only})  # type: ignore


def _hung_up(sock: _socket.socket) -> bool:
    """Did the daemon close this idle connection (stopped, restarted)?"""
    try:
        return sock.recv(1, _socket.MSG_PEEK | _socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def open_remote(root: str) -> RemoteEngine | None:
    """A remote engine on the daemon serving ``root``, or None when none does (or when
    $AGENT2PC_NO_DAEMON is set)."""
    if os.environ.get("AGENT2PC_NO_DAEMON"):
        return None
    sock = protocol.connect(root)
    return None if sock is None else RemoteEngine(root, sock)
