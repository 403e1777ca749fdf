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
``caps=N,N,...``: the capabilities (by number) the command keeps; every other one is dropped
from the bounding set before it starts (root's commands: nothing may undo the view).
``landlock=ROOT`` (and ``allow=DIR``, repeatable in one option as ``allow=A:B``): where no
mount namespace can be had, keep the command out of the real repository ROOT with Landlock
(``landlock``): every write right is handled, and granted beneath every entry of ROOT's
ancestors but the one on the way to ROOT (and but /proc and /sys at the top), and beneath each
DIR (the copy). See ``landlock_confine``.

It appends to STATUS_FILE: ``@ok`` once it runs, then ``@exit N`` (N as a shell gives it:
128+signal when killed), ``@timeout``, or ``@fail WHY`` when it cannot supervise.
"""

from __future__ import annotations

import ctypes
import os
import signal
import stat
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


SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
LL_WRITE_FILE = 1 << 1
LL_DIR_WRITES = sum(1 << b for b in (4, 5, 6, 7, 8, 9, 10, 11, 12))  # remove_*, make_*
LL_REFER, LL_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
LANDLOCK_RULES_MAX = 200_000
NOT_GRANTED_AT_TOP = ("proc", "sys")


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_confine(libc: ctypes.CDLL, root: str, allow: list[str]) -> str | None:
    """Restrict this process (and what it starts) from writing below ``root``; None when done,
    else why not. Landlock rules can only grant: write rights are granted beneath each entry of
    each ancestor of ``root`` except the one on the way to it (so new entries made later right
    in an ancestor, and files right in one, are not writable), and beneath ``allow``."""
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return f"Landlock is not available here ({os.strerror(ctypes.get_errno())})"
    dir_rights = LL_WRITE_FILE | LL_DIR_WRITES | (LL_REFER if abi >= 2 else 0) | \
        (LL_TRUNCATE if abi >= 3 else 0)
    file_rights = LL_WRITE_FILE | (LL_TRUNCATE if abi >= 3 else 0)
    handled = ctypes.c_uint64(dir_rights)
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(handled), 8, 0)
    if ruleset < 0:
        return f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"
    try:
        grants: list[str] = list(allow)
        parts = root.strip("/").split("/")
        for depth in range(len(parts)):
            parent = "/" + "/".join(parts[:depth])
            try:
                names = os.listdir(parent)
            except OSError:
                continue
            for name in names:
                if name == parts[depth] or (depth == 0 and name in NOT_GRANTED_AT_TOP):
                    continue
                grants.append(os.path.join(parent, name))
        for path in grants[:LANDLOCK_RULES_MAX]:
            try:
                fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if stat.S_ISLNK(st.st_mode):
                    continue
                rule = _PathBeneath(dir_rights if stat.S_ISDIR(st.st_mode) else file_rights, fd)
                libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                             ctypes.byref(rule), 0)
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}"
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            return f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(ruleset)
    return None


PR_CAPBSET_DROP = 24
CAP_LAST_CAP_FILE = "/proc/sys/kernel/cap_last_cap"


def drop_caps(libc: ctypes.CDLL, keep: set[int]) -> str | None:
    """Drop every capability but ``keep`` from the bounding set (what a program we start can
    ever have); None when done, else why not."""
    try:
        with open(CAP_LAST_CAP_FILE) as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        if cap not in keep and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err != 22:  # EINVAL: a number this kernel does not know
                return f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(err)}"
    return None


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
    libc.syscall.restype = ctypes.c_long
    if opts.get("landlock"):
        why = landlock_confine(libc, opts["landlock"], [a for a in opts.get("allow", "")
                                                        .split(":") if a])
        if why is not None:
            note(f"@fail the command cannot be kept out of the repository: {why}")
            return 125
    if "caps" in opts:
        why = drop_caps(libc, {int(n) for n in opts["caps"].split(",") if n})
        if why is not None:
            note(f"@fail {why}")
            return 125
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
