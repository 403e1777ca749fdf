"""Processes: the mount-namespace helper script, and making sure nothing a command started
outlives it.

Overlay tiers run the command through ``unshare --mount --pid --fork --kill-child
--mount-proc`` and a small POSIX shell script (the helper). The helper is PID 1 of a new PID
namespace: when it exits, the kernel kills every process left in that namespace, daemons that
setsid() included, and waits for them before the helper's exit is reported. A timeout kills the
helper (SIGKILL); then ``reap_namespace`` checks /proc until no live process of that namespace
is left (the kernel tears it down asynchronously once PID 1 is gone).
"""

from __future__ import annotations

import os
import select
import signal
import time

NS_REAP_S_MAX = 10.0

# The helper: $1..$11 are fixed, then the command. It opens every directory it needs *before*
# mounting over the root (the upper dir lives below it, in .agent-tx/) and hands them to the
# mounts as /proc/self/fd/N, so no path needs escaping in a mount option. The view shows no
# .agent-tx/ (the staged layer hides it with a whiteout): the workspace is out of reach.
# Status lines go to the status file: @ok once the view is ready (the command runs only after
# that), @exit N when the command ended, or @fail WHY (and the mount's own message) when the
# view could not be made.
# $10 non-empty: the command keeps the status file on fd 3 (the governor's and the sandbox's
# wrappers report on it, and the last of them closes it before the command proper starts).
# $11: a descriptor (10 or above) that reads from a pipe whose other end only the caller holds:
# a watcher (a fork of the helper, no exec) waits on it and, when it reads end-of-file (the
# caller exited, however: SIGKILL included), tells the helper to exit at its next step (USR1:
# before the command starts, or once it is gone) and kills every other process of the
# namespace; with PID 1 gone the namespace goes. dash takes no descriptor above 9 in a
# redirection, so the pipe is opened again through /proc at 4: read-write first (that never
# waits for a writer, even when the caller is already gone), then read-only, and the
# read-write one is closed at once: the caller's end is then the only writer.
# The kernel overlay is mounted ``uuid=off,volatile`` where the kernel knows these options (it
# is tried without them otherwise): uuid=on (the default since Linux 6.6) writes an xattr on the
# upper root at mount time, and without volatile the upper file system is synced when the
# namespace dies; either makes a run wait behind unrelated writeback on that disk (over 100 ms
# measured). Nothing needs the upper dir to survive a crash, and no file handle is exported.
# $9: an fstab (/proc/self/fd/N, a memfd of the caller) of more mounts, made by one mount(8)
# (each exec of mount costs a millisecond or more): /proc/sys read-only for a root command
# (root owns its files: a command without capabilities could still set kernel.core_pattern, a
# program the kernel runs as root outside the view); not for a sandboxed run, whose bwrap
# mounts a /proc of its own, which the kernel refuses while a mount covers part of ours (and
# which makes /proc/sys read-only itself). Mounter ``overlay-fstab``: the overlay is
# the fstab's first line, with uuid=off,volatile; if mount -a fails, the helper says @compat
# and the caller runs it again the long way (mounter ``overlay``, an older kernel).
HELPER = r"""
root=$1 layer=$2 upper=$3 work=$4 cwd=$5 status=$6 mounter=$7 opts=$8 fstab=$9 keep=${10}
watch=${11}
shift 11
sys_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec 3>>"$status"
fail() { echo "@fail $*" >&3; exit 125; }
trap 'exit 137' USR1
if [ -n "$watch" ]; then
    exec 9<>"/proc/self/fd/$watch" 4</proc/self/fd/9 9<&-
    { trap - USR1; read _ <&4; kill -USR1 1; kill -KILL -1; } 3>&- &
    exec 4<&-
fi
exec 5<"$root" 6<"$layer" 7<"$upper" 8<"$work"
lower=/proc/self/fd/6:/proc/self/fd/5
case $mounter in
overlay-fstab)
    PATH="$sys_path:$PATH" mount -c -a -T "$fstab" 2>&3 || { echo @compat >&3; exit 125; } ;;
overlay)
    o="lowerdir=$lower,upperdir=/proc/self/fd/7,workdir=/proc/self/fd/8$opts"
    PATH="$sys_path:$PATH" mount -t overlay agent-2pc-view -o "$o,uuid=off,volatile" "$root" \
        2>/dev/null \
    || PATH="$sys_path:$PATH" mount -t overlay agent-2pc-view -o "$o,volatile" "$root" \
        2>/dev/null \
    || PATH="$sys_path:$PATH" mount -t overlay agent-2pc-view -o "$o" "$root" \
        2>&3 || fail "mount -t overlay was refused" ;;
fuse-overlayfs)
    PATH="$sys_path:$PATH" fuse-overlayfs \
        -o "lowerdir=$lower,upperdir=/proc/self/fd/7,workdir=/proc/self/fd/8$opts" "$root" \
        2>&3 || fail "fuse-overlayfs was refused" ;;
*) fail "unknown mounter $mounter" ;;
esac
if [ -n "$fstab" ] && [ "$mounter" != overlay-fstab ]; then
    PATH="$sys_path:$PATH" mount -c -a -T "$fstab" 2>&3 || fail "cannot make /proc/sys read-only"
fi
exec 5<&- 6<&- 7<&- 8<&-
cd "$cwd" 2>&3 || fail "cannot enter $cwd in the view"
echo @ok >&3
if [ -n "$keep" ]; then "$@"; else "$@" 3>&-; fi
rc=$?
echo "@exit $rc" >&3
exit $rc
"""

# The copy tier's helper, in a private mount namespace (a user namespace too when not root):
# the real repository is made read-only at its own path (the command works in the copy, and
# must not reach the tree, nor .agent-tx/, by the repo's absolute path), then the supervisor
# runs. The status file is opened first (on fd 3; it lives in .agent-tx/) and the supervisor
# opens it again through /proc/self/fd/3, which leads to the writable mount beneath.
# $3: an fstab (/proc/self/fd/N) with that bind (and /proc/sys read-only for root), made by one
# mount(8).
COPY_HELPER = r"""
root=$1 status=$2 fstab=$3
shift 3
sys_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec 3>>"$status"
PATH="$sys_path:$PATH" mount -c -a -T "$fstab" 2>&3 || {
    echo "@fail cannot make the repository read-only in the view's mount namespace" >&3
    exit 125
}
exec "$@"
"""


def fstab_line(source: str, target: str, fstype: str, options: str) -> str:
    """One line of an fstab(5), its fields escaped as libmount reads them back."""
    def field(value: str) -> str:
        return "".join(f"\\{ord(c):03o}" if c in " \t\n\\#" else c for c in value)

    return f"{field(source)} {field(target)} {fstype} {field(options)} 0 0\n"


PROC_SYS_READ_ONLY = fstab_line("/proc/sys", "/proc/sys", "none", "bind,ro")

# What a command run as root in a view keeps of its capabilities (the bounding set; the rest
# is dropped): the common set of container runtimes (Docker's default, without MKNOD), enough
# to own, chmod and chown files, change uid, bind low ports, send signals. Not SYS_ADMIN
# (mount, umount, remount, setns, pivot_root: undoing the view), DAC_READ_SEARCH
# (open_by_handle_at: opening real files past the view), SYS_PTRACE, MKNOD (devices),
# SYS_MODULE, SYS_RAWIO, SYS_BOOT, BPF, PERFMON, NET_ADMIN, SYS_RESOURCE, ... Numbers from
# linux/capability.h (the copy tier's supervisor drops by number).
ROOT_CAPS = {"chown": 0, "dac_override": 1, "fowner": 3, "fsetid": 4, "kill": 5, "setgid": 6,
             "setuid": 7, "setpcap": 8, "net_bind_service": 10, "net_raw": 13,
             "sys_chroot": 18, "audit_write": 29, "setfcap": 31}


def ns_of_children(pid: int) -> tuple[int, int] | None:
    """(dev, ino) of the PID namespace that ``pid``'s children live in, when it is not ours."""
    try:
        theirs = os.stat(f"/proc/{pid}/ns/pid_for_children")
        ours = os.stat("/proc/self/ns/pid")
    except OSError:
        return None
    key = (theirs.st_dev, theirs.st_ino)
    return None if key == (ours.st_dev, ours.st_ino) else key


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


def _alive(pid: str) -> bool:
    """Not a zombie (a zombie has finished: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    state = data[data.rfind(b")") + 2:data.rfind(b")") + 3]
    return state not in (b"Z", b"X", b"x")


def namespace_members(ns: tuple[int, int]) -> list[int]:
    """Live processes in the PID namespace ``ns`` (a scan of /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{name}/ns/pid")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == ns and _alive(name):
            out.append(int(name))
    return out


def reap_namespace(ns: tuple[int, int] | None, budget_s: float = NS_REAP_S_MAX) -> int:
    """SIGKILL whatever still lives in ``ns`` until nothing does; return how many processes
    were still alive when the budget ran out (0: the namespace is empty)."""
    if ns is None:
        return 0
    deadline = time.monotonic() + budget_s
    while True:
        members = namespace_members(ns)
        if not members:
            return 0
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if time.monotonic() > deadline:
            return len(members)
        time.sleep(0.005)


def exit_code(returncode: int) -> int:
    """A subprocess return code as a shell gives it: 128+N when killed by signal N."""
    return returncode if returncode >= 0 else 128 - returncode


_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR
_WRITABLE = select.POLLOUT | select.POLLHUP | select.POLLERR


def wait_ready(rd: list[int], wr: list[int], timeout_s: float | None
               ) -> tuple[list[int], list[int]]:
    """``select.select(rd, wr, [], timeout_s)`` without select's limit on descriptor numbers
    (FD_SETSIZE, 1024: a long-lived caller with many files open passes it). An end of file or
    an error counts as ready, as select says."""
    poller = select.poll()
    for fd in set(rd) | set(wr):
        poller.register(fd, (select.POLLIN | select.POLLPRI if fd in rd else 0) |
                        (select.POLLOUT if fd in wr else 0))
    events = poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000)))
    return ([fd for fd, ev in events if fd in rd and ev & _READABLE],
            [fd for fd, ev in events if fd in wr and ev & _WRITABLE])
