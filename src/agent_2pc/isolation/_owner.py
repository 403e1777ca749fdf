"""Who owns a view's leftovers, and removing those whose owner is gone.

A view's directories carry their owner in their names: ``view-<tag>-*`` (the view's scratch:
upper and work dirs, status files, logs), ``agent-2pc-<uid>-layer-<tag>-*`` (the staged layer,
in /dev/shm), ``agent-2pc-<uid>-copy-<tag>-*`` (the copy tier's copy, in the temp dir) and
``agent-2pc-<uid>-wasm-<tag>-*`` (a WASI run's compiled module and report, in the temp dir)
and ``agent-2pc-<uid>-upper-<tag>-*`` (fuse-overlayfs's upper and work dirs, in the temp dir),
where ``<tag>`` is ``<ns>.<pid>.<start>``: the process that made the view, its start time (in
clock ticks since boot, /proc/PID/stat field 22: a reused pid is not taken for the owner) and
its PID namespace (the inode of /proc/self/ns/pid). An owner in another PID namespace cannot
be looked up here and is never judged gone (a nested ``recover`` inside a view must not take
the outer view's live layer for a leftover).

A caller killed outright (SIGKILL, the OOM killer) cannot clean up. What it started in the view
dies with it: the namespace helper (PID 1 of the run's PID namespace, whose end kills every
process in it) and the copy tier's supervisor watch a pipe whose other end only the caller
holds, and end the run when it closes (_procs.py, _reaper.py). What it leaves on disk — the
layer (as big as the staged files), the scratch, the copy — is removed by ``sweep``
(``agent-2pc recover`` calls it), which also kills whatever still runs for such a view (a
process whose arguments name the view's scratch: the helper chain, the supervisor), should a
run have escaped the watch (a caller gone in the instant before its helper forked the command).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

from ._procs import ns_of_children, reap_namespace
from ._remove import discard, rmtree

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

LAYER_PARENT = "/dev/shm"
PROC = "/proc"

_tag: tuple[int, str] | None = None  # (pid, tag)
_pid_ns: str | None = None


def _start_ticks(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot); None when it is gone or a zombie."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    if not fields or fields[0] in (b"Z", b"X", b"x"):
        return None
    return fields[19].decode("ascii") if len(fields) > 19 else None


def _our_pid_ns() -> str:
    global _pid_ns
    if _pid_ns is None:
        try:
            _pid_ns = str(os.stat(f"{PROC}/self/ns/pid").st_ino)
        except OSError:
            _pid_ns = "0"
    return _pid_ns


def owner_tag() -> str:
    """``<ns>.<pid>.<start>`` of this process (computed again after a fork)."""
    global _tag
    pid = os.getpid()
    if _tag is None or _tag[0] != pid:
        _tag = (pid, f"{_our_pid_ns()}.{pid}.{_start_ticks(pid) or 0}")
    return _tag[1]


def owner_gone(tag: str) -> bool:
    """Is the owner named by ``tag`` known to be gone (an owner in another PID namespace
    never is)?"""
    ns, pid, start = tag.split(".")
    if ns != _our_pid_ns():
        return False
    return _start_ticks(int(pid)) != start


def _tag_of(name: str, prefix: str) -> str | None:
    """The owner tag in ``name`` (``<prefix><tag>-<random>``), or None."""
    if not name.startswith(prefix):
        return None
    tag = name[len(prefix):].rpartition("-")[0]
    parts = tag.split(".")
    return tag if len(parts) == 3 and all(p.isdigit() for p in parts) else None


def _processes_naming(path: str) -> list[int]:
    """Processes whose arguments hold ``path`` (the view's scratch dir)."""
    needle = os.fsencode(path)
    out = []
    for name in os.listdir(PROC):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"{PROC}/{name}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if any(a == needle or a.startswith(needle + b"/") for a in args):
            out.append(int(name))
    return out


def _kill_runs_of(view_dir: str) -> int:
    """SIGKILL what still runs for the view at ``view_dir``, its PID namespaces with it."""
    pids = _processes_naming(view_dir)
    spaces = {ns_of_children(p) for p in pids} - {None}
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    for ns in spaces:
        reap_namespace(ns)
    # Wait (briefly) until they are gone: the layers they own are swept next, and a process
    # still exiting would look alive to owner_gone (a loaded machine left a layer behind).
    deadline = time.monotonic() + KILLED_EXIT_WAIT_S
    while time.monotonic() < deadline and any(os.path.exists(f"{PROC}/{p}") and
                                              not _zombie(p) for p in pids):
        time.sleep(0.01)
    return len(pids)


KILLED_EXIT_WAIT_S = 5.0


def _zombie(pid: int) -> bool:
    """Has ``pid`` exited, its parent not having reaped it yet?"""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


# A fuse-overlayfs upper in the temp dir holds what a terminal session changed; the view's scratch
# in its workspace links to it (view-*/upper). That workspace's ``recover`` salvages the session
# and removes both; another workspace's ``recover`` (any recover sweeps this user's temp dirs)
# must not take it first. One left a day is abandoned (its workspace gone or never recovered).
UPPER_ABANDONED_S = 24 * 3600


def _discard_upper_of(view_dir: str, trash: str | None) -> None:
    """Remove the fuse-overlayfs upper dir outside the workspace that ``view_dir`` links to."""
    try:
        target = os.readlink(os.path.join(view_dir, "upper"))
    except OSError:
        return  # no link: an overlay view's upper is inside view_dir
    mounts_dir = os.path.dirname(target)
    if os.path.basename(mounts_dir).startswith(f"agent-2pc-{os.getuid()}-upper-"):
        discard(mounts_dir, trash)


def _abandoned(path: str) -> bool:
    try:
        return time.time() - os.lstat(path).st_mtime > UPPER_ABANDONED_S
    except OSError:
        return False


def sweep(scratch_root: str | None, trash: str | None = None,
          salvage: Callable[[str, str], None] | None = None) -> dict[str, int]:
    """Remove what views whose owner is gone left behind: their runs' processes, their
    scratch below ``scratch_root`` (``<scratch_root>/<tid>/view-*``, a workspace's tx/ dir),
    and this user's staged layers and copies. ``salvage(tid, view_dir)`` may take what it
    wants from a view's scratch once nothing runs there any more, before it goes. Returns
    counts."""
    out = {"views": 0, "layers": 0, "copies": 0, "processes": 0}
    if scratch_root is not None:
        try:
            tids = os.listdir(scratch_root)
        except OSError:
            tids = []
        for tid in tids:
            tx_dir = os.path.join(scratch_root, tid)
            try:
                names = os.listdir(tx_dir)
            except OSError:
                continue
            for name in names:
                tag = _tag_of(name, "view-")
                if tag is None or not owner_gone(tag):
                    continue
                view_dir = os.path.join(tx_dir, name)
                out["processes"] += _kill_runs_of(view_dir)
                if salvage is not None:
                    salvage(tid, view_dir)
                _discard_upper_of(view_dir, trash)
                discard(view_dir, trash)
                out["views"] += 1
    uid = os.getuid()
    for parent in sorted({LAYER_PARENT, tempfile.gettempdir()}):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            for kind in ("layer", "copy", "wasm", "upper"):
                tag = _tag_of(name, f"agent-2pc-{uid}-{kind}-")
                if tag is None or not owner_gone(tag):
                    continue
                path = os.path.join(parent, name)
                if kind == "upper" and not _abandoned(path):
                    continue  # its workspace's recover salvages the session in it first
                if kind in ("copy", "upper"):
                    discard(path)
                    out["copies"] += kind == "copy"
                else:
                    rmtree(path)  # a layer (usually on tmpfs) or a WASI run's module: at once
                    out["layers"] += kind == "layer"
    return out
