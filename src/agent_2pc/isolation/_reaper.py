"""Supervisor of a command in the copy tier (run as a script: ``python -S -I _reaper.py``).

The copy tier has no PID namespace to contain a command, so this small process does it: it
becomes a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so that whatever the command leaves
behind — children that outlive it, daemons that double-fork and setsid() — is re-parented to it
rather than to init; it runs the command; when the command exits, or its time is up, or the
caller asks (SIGTERM, or the caller's death through PR_SET_PDEATHSIG), it kills every
descendant with SIGKILL and reaps them until none is left, then exits with the command's status.

Standalone on purpose (stdlib only, no package import): it starts with ``-S -I``.

    _reaper.py STATUS_FILE TIMEOUT_S INTERACTIVE(0|1) PARENT_PID [OPTION...] -- CMD ARGS...

PARENT_PID 0: the caller is not our parent (``unshare --pid --fork`` is, for a governed run:
then we are PID 1 of a namespace, whose end kills whatever is left).

Options: ``keep-status``: the command gets the status file on fd 3 (the governor's and the
sandbox's wrappers report on it and close it before the command proper starts).
``watch=FD``: FD reads from a pipe whose other end only the caller holds; end-of-file there
means the caller is gone (however it went), and everything is killed as on SIGTERM.

It appends to STATUS_FILE: ``@ok`` once it runs, then ``@exit N`` (N as a shell gives it:
128+signal when killed), ``@timeout``, or ``@fail WHY`` when it cannot supervise.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
KILL_ROUNDS_MAX = 500
POLL_S = 0.02
STATUS_FD = 3


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            pass
    return out


def descendants() -> list[int]:
    me = os.getpid()
    seen: list[int] = []
    stack = [me]
    while stack:
        for c in children_of(stack.pop()):
            if c not in seen:
                seen.append(c)
                stack.append(c)
    return seen


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_all() -> bool:
    """SIGKILL every descendant and reap them, until none is left. True when none is."""
    for _ in range(KILL_ROUNDS_MAX):
        pids = descendants()
        if not pids:
            return True
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        reap()
        time.sleep(0.002)
    return not descendants()


def _closed(fd: int) -> bool:
    """Has the other end of the pipe ``fd`` been closed (end-of-file)?"""
    try:
        return os.read(fd, 1) == b""
    except BlockingIOError:
        return False


def main(argv: list[str]) -> int:
    status_path, timeout_s, interactive, parent = argv[:4]
    assert "--" in argv[4:], "usage: _reaper.py STATUS TIMEOUT_S INTERACTIVE PARENT [OPT] -- CMD"
    sep = argv.index("--", 4)
    opts = dict(o.partition("=")[::2] for o in argv[4:sep])
    keep = "keep-status" in opts
    watch = int(opts["watch"]) if opts.get("watch") else None
    cmd = argv[sep + 1:]
    status = os.open(status_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    pass_fds: tuple[int, ...] = ()
    if keep:
        if status != STATUS_FD:
            os.dup2(status, STATUS_FD)  # inheritable
        else:
            os.set_inheritable(STATUS_FD, True)
        pass_fds = (STATUS_FD,)

    def note(line: str) -> None:
        os.write(status, (line + "\n").encode())

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        note(f"@fail prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")
        return 125
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if parent != "0" and os.getppid() != int(parent):
        note("@fail the caller died before the command started")
        return 125
    stop: list[int] = []

    def on_stop(signum: int, frame: object) -> None:
        stop.append(signum)

    def on_tty(signum: int, frame: object) -> None:
        pass  # a handler, not SIG_IGN: the command must get the default disposition

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGHUP, on_stop)
    if interactive == "1":
        signal.signal(signal.SIGINT, on_tty)
        signal.signal(signal.SIGQUIT, on_tty)
    note("@ok")
    if watch is not None:
        os.set_blocking(watch, False)
    try:
        child = subprocess.Popen(cmd, pass_fds=pass_fds)
    except OSError as exc:
        print(f"{cmd[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        note("@exit 127")
        return 127
    limit = float(timeout_s)
    deadline = time.monotonic() + limit if limit > 0 else None
    rc = None
    while rc is None:
        if watch is not None and _closed(watch):
            stop.append(int(signal.SIGKILL))  # the caller is gone
        if stop:
            break
        wait_s = POLL_S
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            wait_s = min(wait_s, left)
        try:
            rc = child.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass
    # PID 1 of a namespace (a governed run): our exit kills every process left in it, and
    # /proc is the host's, whose numbers are not ours: the kernel does the killing.
    clean = True if os.getpid() == 1 else kill_all()
    if not clean:
        note("@fail processes survived SIGKILL")
    if rc is None:
        note("@timeout" if not stop else f"@killed {stop[0]}")
        return 137
    code = rc if rc >= 0 else 128 - rc
    note(f"@exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
