"""The daemon's wire format (docs/daemon.md): JSON-RPC 2.0, one JSON object per line (UTF-8,
``\\n``-terminated), on the Unix socket ``.agent-tx/daemon.sock``.

A request ``{"jsonrpc": "2.0", "id": 1, "method": "stage_write", "params": {...}}`` names a
library operation and its arguments by name; the answer is ``{"jsonrpc": "2.0", "id": 1,
"result": {...}}`` or ``{"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": M,
"data": {"code": CONTRACT_CODE, "type": CLASS, "exit_status": N, "details": {...},
"params": [NAME...]}}}`` (``params``: the parameters the message quotes, as `name`).

Imported by every client that looks for a daemon: standard library only, nothing heavy.
"""

from __future__ import annotations

import _socket
import json
import os

from .. import errors

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROTOCOL_VERSION = 1
SOCKET_NAME = "daemon.sock"
LOCK_NAME = "daemon.lock"
LINE_BYTES_MAX = 256 << 20  # one request or answer (content travels base64-encoded in it)

# JSON-RPC 2.0 error codes; an error of agent-2pc is SERVER_ERROR with the contract's code in
# data.code.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_ERROR = -32000


def socket_path(root: str) -> str:
    return os.path.join(root, ".agent-tx", SOCKET_NAME)


def lock_path(root: str) -> str:
    return os.path.join(root, ".agent-tx", LOCK_NAME)


def address(path: str) -> tuple[str, int | None]:
    """An address ``connect``/``bind`` accept for ``path``: itself when it fits sun_path (107
    bytes), else the same file through /proc/self/fd of its directory (the descriptor is
    returned, to be closed after the call)."""
    if len(os.fsencode(path)) < 108:
        return path, None
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd


def connect(root: str, timeout_s: float | None = None) -> _socket.socket | None:
    """A connection to the daemon serving ``root``, or None when none listens there (no
    socket, or a stale one that a dead daemon left). The C module's socket: the ``socket``
    module costs the CLI milliseconds to import."""
    path = socket_path(root)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    addr, dir_fd = address(path)
    try:
        sock.settimeout(timeout_s)
        sock.connect(addr)
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    return sock


class LineReader:
    """Lines from a socket (the C module's has no ``makefile``)."""

    __slots__ = ("_sock", "_buf")

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._buf = b""

    def readline(self, limit: int = LINE_BYTES_MAX) -> bytes:
        """The next line with its ``\n``; without it at the end of the stream or past
        ``limit`` bytes."""
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                line, self._buf = self._buf[:end + 1], self._buf[end + 1:]
                return line
            if len(self._buf) > limit:
                return self._buf
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                line, self._buf = self._buf, b""
                return line
            self._buf += chunk


def request(rid: int, method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params},
                      separators=(",", ":")).encode("utf-8") + b"\n"


def answer(rid: Any, result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "result": result},
                      separators=(",", ":"), default=str).encode("utf-8") + b"\n"


def failure(rid: Any, code: int, message: str, data: dict[str, Any] | None = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": rid, "error": err},
                      separators=(",", ":"), default=str).encode("utf-8") + b"\n"


def error_data(exc: errors.Agent2PCError) -> dict[str, Any]:
    """What an error of agent-2pc carries on the wire (``data`` of the JSON-RPC error)."""
    details = dict(exc.details)
    tid = getattr(exc, "tid", None)  # TransactionAborted and CheckFailed keep it apart
    if tid is not None and "tid" not in details:
        details["tid"] = tid
    return {"code": exc.code, "type": type(exc).__name__, "exit_status": exc.exit_status,
            "details": details, "params": list(exc.params)}


def raise_error(err: dict[str, Any]) -> None:
    """Raise, in the client, the error the daemon answered (the same class, code, details)."""
    data = err.get("data") or {}
    message = str(err.get("message") or "the daemon refused the request")
    if not data.get("code"):
        raise errors.DaemonUnavailable(f"the daemon answered a protocol error: {message}",
                                       rpc_code=err.get("code"))
    cls = getattr(errors, str(data.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.Agent2PCError)):
        cls = errors.Agent2PCError
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.message = message
    exc.code = str(data["code"])
    exc.params = tuple(p for p in data.get("params") or () if isinstance(p, str))
    details = dict(data.get("details") or {})
    if isinstance(exc, (errors.TransactionAborted, errors.CheckFailed)):
        exc.tid = details.pop("tid", None)
    if isinstance(exc, errors.TransactionAborted):
        exc.reason = message
    exc.details = details
    if type(data.get("exit_status")) is int and cls is errors.Agent2PCError:
        exc.exit_status = data["exit_status"]
    raise exc
