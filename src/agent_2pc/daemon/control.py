"""Start, stop, look at and reap through the daemon: what ``agent-2pc daemon ...`` calls.

``start`` runs ``agent-2pc daemon start --foreground --json`` detached (its own session,
stdin and stdout on /dev/null once ready, stderr appended to ``.agent-tx/daemon.log``) and
waits for the line it prints once it listens: its ``{pid, socket}``, or the error that stopped
it (a daemon already there: ``busy``).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

from .. import errors
from ..storage import durable
from . import protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 60.0
LOG_NAME = "daemon.log"
LOG_BYTES_MAX = 1 << 20  # at a start, a bigger daemon.log becomes daemon.log.1


def _call(root: str, method: str, params: dict[str, Any] | None = None) -> Any:
    """One request to the daemon of ``root``; None when none listens."""
    sock = protocol.connect(root)
    if sock is None:
        return None
    try:
        sock.sendall(protocol.request(1, method, params or {}))
        line = protocol.LineReader(sock).readline()
    except OSError as exc:
        raise errors.DaemonUnavailable(f"the daemon stopped answering ({exc})",
                                       socket=protocol.socket_path(root)) from None
    finally:
        sock.close()
    if not line.endswith(b"\n"):
        raise errors.DaemonUnavailable("the daemon closed the connection before answering",
                                       socket=protocol.socket_path(root))
    msg = json.loads(line)
    if "error" in msg:
        protocol.raise_error(msg["error"])
    return msg["result"]


def _error_from(obj: dict[str, Any]) -> errors.Agent2PCError:
    err = obj.get("error") or {}
    code, message = err.get("code", "internal"), err.get("message", "the daemon did not start")
    for cls in _classes(errors.Agent2PCError):
        if cls.__dict__.get("code") == code:
            return cls(message, code=code)
    return errors.DaemonUnavailable(message)


def _classes(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _classes(sub)
    return out


def start(root: str, reap_interval_ms: int | None = None) -> dict[str, Any]:
    from .server import Lock

    lock = Lock(root)
    try:
        pid = lock.holder()
    finally:
        lock.close()
    if pid is not None:
        raise errors.Busy(f"a daemon (pid {pid}) already serves this workspace on "
                          f"{protocol.socket_path(root)}", pid=pid,
                          socket=protocol.socket_path(root))
    argv = [sys.executable, "-m", "agent_2pc", "--root", root, "daemon", "start",
            "--foreground", "--json"]
    if reap_interval_ms is not None:
        argv += ["--reap-interval-ms", str(reap_interval_ms)]
    log_path = os.path.join(root, ".agent-tx", LOG_NAME)
    try:
        if os.path.getsize(log_path) > LOG_BYTES_MAX:  # one older log kept: daemon.log.1
            durable.rename(log_path, log_path + ".1")
    except FileNotFoundError:
        pass
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=log, start_new_session=True, close_fds=True)
    finally:
        os.close(log)
    assert child.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT_S
    line = b""
    try:
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            ready, _, _ = select.select([child.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(child.stdout.fileno(), 65536)
                if not chunk:
                    break
                line += chunk
    finally:
        child.stdout.close()
    if not line.endswith(b"\n"):
        why = f"did not start within {START_TIMEOUT_S:.0f} s"
        if child.poll() is None:
            child.kill()
        else:
            why = f"exited with status {child.returncode} before it listened"
        raise errors.DaemonUnavailable(
            f"the daemon {why}; see {os.path.join(root, '.agent-tx', LOG_NAME)}",
            socket=protocol.socket_path(root))
    obj = json.loads(line)
    if not obj.get("ok"):
        child.wait()
        raise _error_from(obj)
    return {"pid": obj["pid"], "socket": obj["socket"]}


def stop(root: str) -> dict[str, Any]:
    """Ask the daemon to stop and wait until it is gone; ``stopped: false`` when none ran."""
    from .server import Lock

    try:
        answer = _call(root, "daemon.stop")
    except errors.DaemonUnavailable:
        answer = None
    if answer is None:
        return {"stopped": False, "pid": None}
    lock = Lock(root)
    try:
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while lock.holder() is not None:
            if time.monotonic() > deadline:
                raise errors.Busy(f"the daemon (pid {answer['pid']}) did not stop within "
                                  f"{STOP_TIMEOUT_S:.0f} s", pid=answer["pid"])
            time.sleep(0.01)
    finally:
        lock.close()
    return {"stopped": True, "pid": answer["pid"]}


NOT_RUNNING = {"running": False, "pid": None, "socket": None, "uptime_s": None, "clients": 0,
               "requests": 0, "commits": 0, "fsyncs": 0}


def status(root: str) -> dict[str, Any]:
    try:
        out = _call(root, "daemon.status")
    except errors.DaemonUnavailable:
        out = None
    return dict(NOT_RUNNING) if out is None else out  # type: ignore[no-any-return]


def reap(root: str) -> dict[str, Any]:
    """The reaper, once: through the daemon, else in this process."""
    out = _call(root, "daemon.reap")
    if out is not None:
        return out | {"daemon": True}  # type: ignore[no-any-return]
    import threading

    from ..coordinator.engine import Engine
    from .reaper import Reaper

    engine = Engine(root)
    try:
        return Reaper(engine, threading.RLock(), 0).run_once() | {"daemon": False}
    finally:
        engine.close()


def foreground(root: str, as_json: bool, reap_interval_ms: int | None = None) -> None:
    """Serve in this process until stopped; print ``{ok, pid, socket}`` (or a line of text)
    once listening."""
    from .reaper import INTERVAL_MS
    from .server import run

    def ready(daemon: Any) -> None:
        if as_json:
            line = json.dumps({"ok": True, "pid": os.getpid(), "socket": daemon.socket_path})
        else:
            line = f"agent-2pc daemon (pid {os.getpid()}) serving {root} on {daemon.socket_path}"
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            pass
        if not sys.stdout.isatty():  # started detached: the starter has read its line
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.close(devnull)

    run(root, INTERVAL_MS if reap_interval_ms is None else reap_interval_ms, ready)
