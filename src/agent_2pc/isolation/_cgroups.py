"""Cgroups for one governed run: made before the command starts, removed when it is over.

The command joins them itself, first thing (a shell prefix writes 0 — "the writer" — to each
``cgroup.procs``, then execs the rest), so every process it ever starts is in them, whatever
it does with sessions or process groups. They are made *below the caller's own cgroup* in each
hierarchy, so that the limits the caller lives under still hold, and named
``agent-2pc-<caller pid>-<random>``: a cgroup whose caller died is found and removed by the
next governed run (``sweep_stale``), after its leftover processes are killed.

Controllers used, on whichever hierarchy the host binds them to:
  pids     pids.max (fork fails with EAGAIN past it); pids.events ``max`` counts refusals
  memory   v1 memory.limit_in_bytes (+ memsw when swap is accounted), v2 memory.max
           (+ memory.swap.max 0, memory.oom.group 1); the kernel's OOM killer acts inside the
           cgroup, and ``oom_kill`` (v1 memory.oom_control, v2 memory.events) counts it
  cpu      v1 cpuacct.usage (ns), v2 cpu.stat usage_usec (there even without the cpu
           controller): read by the sampler, which trips max_cpu_ms
A v2 controller is used only when the caller's cgroup already hands it to its children (its
``cgroup.subtree_control`` has it: a delegated cgroup, or the root of a container's cgroup
namespace). We never enable one ourselves: that would change the host for good (and a cgroup
that holds processes cannot, the "no internal processes" rule). Nothing here is required:
what cannot be had is reported, and the governor falls back to rlimits and sampling.
"""

from __future__ import annotations

import errno
import os
import signal
import time

from ..storage.pids import pid_alive

V1, V2 = "cgroup-v1", "cgroup-v2"
PREFIX = "agent-2pc-"
REMOVE_S_MAX = 5.0


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _keyed(path: str, key: str) -> int:
    """The value of ``key`` in a flat keyed file (``key value`` lines); 0 when absent."""
    try:
        for line in _read(path).splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


def _mounts() -> list[tuple[str, str, str, str]]:
    """(fstype, root within the hierarchy, mount point, super options) of cgroup mounts."""
    out: list[tuple[str, str, str, str]] = []
    try:
        lines = _read("/proc/self/mountinfo").splitlines()
    except OSError:
        return out
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mnt = fields[4].replace("\\040", " ")
        out.append((tail[0], fields[3], mnt, tail[2]))
    return out


def _own() -> tuple[dict[str, str], str | None]:
    """Our cgroup: {v1 controller: path in its hierarchy}, and the v2 path (or None)."""
    v1: dict[str, str] = {}
    v2 = None
    try:
        lines = _read("/proc/self/cgroup").splitlines()
    except OSError:
        return v1, v2
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if ctrls == "":
            v2 = path
        else:
            for c in ctrls.split(","):
                v1[c] = path
    return v1, v2


def _under(mnt: str, mount_root: str, path: str) -> str | None:
    """The directory of our cgroup ``path`` through a mount of its hierarchy at ``mnt``."""
    root = mount_root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None
    rel = path[len(root):].lstrip("/")
    d = os.path.join(mnt, rel) if rel else mnt
    return d if os.path.isfile(os.path.join(d, "cgroup.procs")) else None


def find_parents(want: tuple[str, ...] = ("pids", "memory", "cpu")
                 ) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """Where a run's cgroup can be made for each wanted controller: {controller: (version,
    parent dir)}, and {controller: why not} for the others."""
    found: dict[str, tuple[str, str]] = {}
    why: dict[str, str] = {}
    v1_own, v2_own = _own()
    mounts = _mounts()
    v2_dir = None
    if v2_own is not None:
        for fstype, root, mnt, _ in mounts:
            if fstype == "cgroup2":
                v2_dir = _under(mnt, root, v2_own)
                if v2_dir:
                    break
    for ctrl in want:
        v1_name = "cpuacct" if ctrl == "cpu" else ctrl
        if v1_name in v1_own:
            d = None
            for fstype, root, mnt, opts in mounts:
                if fstype == "cgroup" and v1_name in opts.split(","):
                    d = _under(mnt, root, v1_own[v1_name])
                    if d:
                        break
            if d is None:
                why[ctrl] = f"the v1 {v1_name} hierarchy is not mounted where we can see it"
            elif not os.access(d, os.W_OK | os.X_OK):
                why[ctrl] = f"no write access to {d}"
            else:
                found[ctrl] = (V1, d)
            continue
        if v2_dir is None:
            why[ctrl] = f"no {v1_name} controller (neither a cgroup v1 hierarchy nor cgroup v2)"
            continue
        if not os.access(v2_dir, os.W_OK | os.X_OK):
            why[ctrl] = f"no write access to {v2_dir}"
            continue
        if ctrl == "cpu":  # cpu.stat's usage_usec is in every v2 cgroup
            found[ctrl] = (V2, v2_dir)
            continue
        try:
            enabled = _read(os.path.join(v2_dir, "cgroup.subtree_control")).split()
            available = _read(os.path.join(v2_dir, "cgroup.controllers")).split()
        except OSError as exc:
            why[ctrl] = f"cannot read {v2_dir}: {exc.strerror}"
            continue
        if ctrl not in enabled:  # enabling it would change the host for good: we do not
            why[ctrl] = (f"cgroup v2 at {v2_dir} does not delegate {ctrl} to its children"
                         if ctrl in available else
                         f"cgroup v2 at {v2_dir} does not have the {ctrl} controller")
            continue
        found[ctrl] = (V2, v2_dir)
    return found, why


def _procs(d: str) -> list[int]:
    try:
        return [int(x) for x in _read(os.path.join(d, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def _empty_and_remove(d: str, budget_s: float) -> bool:
    """SIGKILL whatever is in the cgroup ``d``, then rmdir it; True when it is gone."""
    deadline = time.monotonic() + budget_s
    rounds = 0
    while True:
        pids = _procs(d)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not pids:
            try:
                os.rmdir(d)
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    return False
        rounds += 1
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002 if rounds < 50 else 0.02)


def sweep_stale(parents: list[str]) -> int:
    """Remove cgroups of runs whose caller died (killing what they still hold); how many."""
    n = 0
    for parent in set(parents):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            if not name.startswith(PREFIX):
                continue
            try:
                pid = int(name[len(PREFIX):].split("-", 1)[0])
            except ValueError:
                continue
            if pid == os.getpid() or pid_alive(pid):
                continue
            if _empty_and_remove(os.path.join(parent, name), 1.0):
                n += 1
    return n


class RunCgroups:
    """The cgroups of one run: ``dirs`` {controller: directory}, ``version`` {controller:
    cgroup-v1 | cgroup-v2}, ``refused`` {controller: why it could not be had}."""

    def __init__(self, want: tuple[str, ...]) -> None:
        self.dirs: dict[str, str] = {}
        self.version: dict[str, str] = {}
        self.refused: dict[str, str] = {}
        if not want:
            return
        found, self.refused = find_parents(want)
        sweep_stale([p for _, p in found.values()])
        name = f"{PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
        made: dict[str, str] = {}  # parent dir -> our dir (one per hierarchy)
        try:
            for ctrl, (version, parent) in found.items():
                d = made.get(parent)
                if d is None:
                    d = os.path.join(parent, name)
                    try:
                        os.mkdir(d)
                    except OSError as exc:
                        self.refused[ctrl] = f"cannot make a cgroup in {parent}: {exc.strerror}"
                        continue
                    made[parent] = d
                self.dirs[ctrl] = d
                self.version[ctrl] = version
        except BaseException:
            self.remove()
            raise

    # -- setting limits (before the command starts) ------------------------------------------

    def set_pids_max(self, n: int) -> None:
        _write(os.path.join(self.dirs["pids"], "pids.max"), str(n))

    def set_memory_max(self, size_bytes: int) -> None:
        d = self.dirs["memory"]
        if self.version["memory"] == V1:
            _write(os.path.join(d, "memory.limit_in_bytes"), str(size_bytes))
            memsw = os.path.join(d, "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):  # swap accounting on: swap must not be a way around
                _write(memsw, str(size_bytes))
            return
        _write(os.path.join(d, "memory.max"), str(size_bytes))
        for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            try:
                _write(os.path.join(d, name), value)
            except OSError:
                pass

    def join_files(self) -> list[str]:
        """The ``cgroup.procs`` files the command writes itself into (one per directory)."""
        return [os.path.join(d, "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    # -- reading ---------------------------------------------------------------------------

    def procs(self) -> list[int]:
        d = self.dirs.get("pids") or next(iter(self.dirs.values()), None)
        return _procs(d) if d else []

    def pids_current(self) -> int:
        try:
            return int(_read(os.path.join(self.dirs["pids"], "pids.current")))
        except (OSError, ValueError):
            return 0

    def pids_refused(self) -> int:
        """How many forks the pids limit refused."""
        return _keyed(os.path.join(self.dirs["pids"], "pids.events"), "max")

    def oom_kills(self) -> int:
        d = self.dirs["memory"]
        if self.version["memory"] == V1:
            return _keyed(os.path.join(d, "memory.oom_control"), "oom_kill")
        return _keyed(os.path.join(d, "memory.events"), "oom_kill")

    def memory_peak_bytes(self) -> int:
        d = self.dirs["memory"]
        name = "memory.max_usage_in_bytes" if self.version["memory"] == V1 else "memory.peak"
        try:
            return int(_read(os.path.join(d, name)))
        except (OSError, ValueError):
            try:
                cur = "memory.usage_in_bytes" if self.version["memory"] == V1 else \
                    "memory.current"
                return int(_read(os.path.join(d, cur)))
            except (OSError, ValueError):
                return 0

    def cpu_ns(self) -> int:
        d = self.dirs["cpu"]
        if self.version["cpu"] == V1:
            try:
                return int(_read(os.path.join(d, "cpuacct.usage")))
            except (OSError, ValueError):
                return 0
        return _keyed(os.path.join(d, "cpu.stat"), "usage_usec") * 1000

    def describe(self, ctrl: str) -> str:
        name = "cpuacct" if ctrl == "cpu" and self.version[ctrl] == V1 else ctrl
        return f"{self.version[ctrl]}:{name}"

    # -- removing --------------------------------------------------------------------------

    def remove(self, budget_s: float = REMOVE_S_MAX) -> list[str]:
        """Kill what is left in them and remove them; the directories that could not be."""
        left = []
        for d in dict.fromkeys(self.dirs.values()):
            if not _empty_and_remove(d, budget_s):
                left.append(d)
        self.dirs = {c: d for c, d in self.dirs.items() if d in left}
        return left
