"""The governor: limits on one run in the staged view, enforced by the kernel where the host
lets us, watched by a sampler everywhere, and a tripped limit stops the whole tree.

    res = view.run("make test", limits=Limits(runtime_ms=60_000, procs=64, memory_mb=512))
    res.tripped          # None, or "max_procs", "max_memory_mb", ... ("timeout_ms": timeout_s)
    res.governor         # {"limits", "enforced", "usage", "sampling", ...}

Per limit (docs/staged-view.md has the table and what this host enforces):
  max_runtime_ms     the wall clock of the caller's wait loop (exact to the ms)
  max_cpu_ms         the run cgroup's CPU usage, sampled; without a cgroup the CPU times of
                     the live processes plus what they reaped, sampled; RLIMIT_CPU per process
                     (ceil to whole seconds, +1) as a backstop that holds even if we die
  max_procs          pids.max of the run's pids cgroup (a fork past it fails with EAGAIN, and
                     pids.events counts it: the trip); else RLIMIT_NPROC when the command runs
                     in a user namespace of its own (not root: the count is per namespace;
                     root ignores RLIMIT_NPROC altogether); else sampled. Tasks are counted,
                     threads included, as the kernel does; bwrap's two processes are not.
  max_memory_mb      the run's memory cgroup (the kernel OOM-kills inside it; oom_kill is the
                     trip); else the sampled sum of resident sizes, with RLIMIT_AS per
                     process at twice the limit + 256 MiB as a backstop (address space is
                     not memory: runtimes reserve far more than they touch)
  max_files_written  files the view holds that the command wrote (net, ignored paths left
                     out), sampled from the upper dir (copy tier: the copy) — _fswatch.py
  max_forks_per_s    tasks created in any 1 s window: the highest PID of the run in its PID
                     namespace (numbers are handed out in order), sampled; copy tier: new
                     processes seen by the sampler (a lower bound)
  max_deletes_per_s  files deleted from the view in any 1 s window, sampled
  max_disk_mb        bytes the command wrote into the view and its log: RLIMIT_FSIZE per file
                     (a write past it gets SIGXFSZ/EFBIG at once), plus the sampled total; the
                     sandbox's private /tmp is a tmpfs of this size

The sampler runs in the caller's wait loop. A tick is at least TICK_S_MIN apart and at least
SAMPLE_SHARE_INV times the cost of the last sample, so sampling never takes more than about
1/SAMPLE_SHARE_INV of a core; the worst detection latency (reported) is one interval plus one
sample's cost, and never more than TICK_S_MAX plus that cost. On a trip: SIGSTOP every process
of the run, round after round until no new one appears (a stopped process cannot fork), then
SIGKILL them all and the namespace; the output so far is in the log. After the run the
cgroups are removed (what is still in them killed first).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections import deque

from ..errors import IsolationUnavailable, UsageError
from ._cgroups import RunCgroups
from ._procs import children_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping

    from ._fswatch import CopyWatch, FsCounts, UpperWatch

MIB = 1 << 20
AS_FACTOR, AS_SLACK_MB = 2, 256  # RLIMIT_AS backstop, when no memory cgroup: 2x + 256 MiB
FIELDS = ("runtime_ms", "cpu_ms", "procs", "memory_mb", "files_written", "forks_per_s",
          "deletes_per_s", "disk_mb")
MAXIMA = {"runtime_ms": 30 * 24 * 3600 * 1000, "cpu_ms": 30 * 24 * 3600 * 1000,
          "procs": 1 << 22, "memory_mb": 1 << 24, "files_written": 10**9,
          "forks_per_s": 10**7, "deletes_per_s": 10**9, "disk_mb": 1 << 30}
# The order in which limits that tripped in the same tick are named (the first one wins).
TRIP_ORDER = ("max_memory_mb", "max_procs", "max_forks_per_s", "max_cpu_ms", "max_disk_mb",
              "max_files_written", "max_deletes_per_s", "max_runtime_ms")
TICK_S_MIN = 0.02
TICK_S_MAX = 0.5
SAMPLE_SHARE_INV = 5
WINDOW_S = 1.0
STOP_ROUNDS_MAX = 1000
SYS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
INFRA_COMMS = ("fuse-overlayfs",)

# The command's first wrapper (POSIX sh): joins the run's cgroups ("0" is the writer), closes
# the status descriptor unless the sandbox's shim comes later, then execs the rest.
ENTER = r"""
while [ "$1" != -- ]; do
    echo 0 > "$1" || { echo "@refused cannot join the cgroup $1" >&3; exit 125; }
    shift
done
shift
if [ "$1" = --close-status ]; then shift; exec 3>&-; fi
exec "$@"
"""


class Limits:
    """Limits on one run; each is None (no limit) or a positive int. Built by field name
    (``Limits(procs=64)``) or by the CLI's option name (``Limits(max_procs=64)``)."""

    __slots__ = FIELDS
    runtime_ms: int | None
    cpu_ms: int | None
    procs: int | None
    memory_mb: int | None
    files_written: int | None
    forks_per_s: int | None
    deletes_per_s: int | None
    disk_mb: int | None

    def __init__(self, runtime_ms: int | None = None, cpu_ms: int | None = None,
                 procs: int | None = None, memory_mb: int | None = None,
                 files_written: int | None = None, forks_per_s: int | None = None,
                 deletes_per_s: int | None = None, disk_mb: int | None = None,
                 **cli_names: int | None) -> None:
        given = dict(runtime_ms=runtime_ms, cpu_ms=cpu_ms, procs=procs, memory_mb=memory_mb,
                     files_written=files_written, forks_per_s=forks_per_s,
                     deletes_per_s=deletes_per_s, disk_mb=disk_mb)
        for name, value in cli_names.items():
            field = name.removeprefix("max_")
            if not name.startswith("max_") or field not in FIELDS:
                raise UsageError(f"unknown limit {name!r} (one of "
                                 f"{', '.join('max_' + f for f in FIELDS)})")
            if value is not None and given[field] is not None:
                raise UsageError(f"the limit {field} is given twice")
            if value is not None:
                given[field] = value
        for field, value in given.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or
                                      not 0 < value <= MAXIMA[field]):
                raise UsageError(f"max_{field} must be a whole number from 1 to "
                                 f"{MAXIMA[field]}, not {value!r}")
            setattr(self, field, value)

    @classmethod
    def coerce(cls, value: Limits | Mapping[str, int | None]) -> Limits:
        if isinstance(value, Limits):
            return value
        try:
            return cls(**dict(value))
        except TypeError as exc:
            raise UsageError(f"limits are a Limits or a mapping of limit names: {exc}") \
                from None

    def items(self) -> list[tuple[str, int]]:
        """(CLI name, value) of each limit that is set."""
        return [(f"max_{f}", v) for f in FIELDS if (v := getattr(self, f)) is not None]

    def to_json(self) -> dict[str, int]:
        return dict(self.items())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Limits) and self.items() == other.items()

    def __repr__(self) -> str:
        return "Limits(" + ", ".join(f"{k}={v}" for k, v in self.items()) + ")"


class Window:
    """A cumulative count sampled over time; ``peak`` is the largest rise within any window
    of WINDOW_S that the samples show."""

    def __init__(self, t0: float) -> None:
        self.samples: deque[tuple[float, int]] = deque([(t0, 0)])
        self.base = 0  # the last value that fell out of the window
        self.peak = 0

    def add(self, t: float, value: int) -> int:
        self.samples.append((t, value))
        while len(self.samples) > 1 and self.samples[0][0] < t - WINDOW_S:
            self.base = self.samples.popleft()[1]
        low = min(self.base, min(v for _, v in self.samples))
        rate = max(0, value - low)
        self.peak = max(self.peak, rate)
        return rate


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first); None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].decode().split()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _ns_pid(pid: int, level: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    parts = line.split()[1:]
                    return int(parts[level]) if len(parts) > level else None
    except (OSError, ValueError):
        pass
    return None


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    stack = [pid]
    seen = {pid}
    while stack:
        for c in children_of(stack.pop()):
            if c not in seen:
                seen.add(c)
                out.append(c)
                stack.append(c)
    return out


class Governor:
    """Limits for one run: ``setup()`` before the command starts (cgroups, rlimits),
    ``wrap(argv)`` its command line, ``start(root_pid)``, then ``sample()`` each tick until it
    names a tripped limit; ``stop_tree()`` on a trip; ``finish()`` after the run, ``close()``
    always (removes the cgroups)."""

    def __init__(self, limits: Limits, *, pid_ns: bool, own_userns: bool, sandboxed: bool,
                 fs: UpperWatch | CopyWatch | None, log_path: str | None,
                 overhead_tasks: int = 0) -> None:
        self.limits = limits
        self.pid_ns = pid_ns
        self.own_userns = own_userns
        self.sandboxed = sandboxed
        self.fs = fs
        self.log_path = log_path
        self.overhead = overhead_tasks
        self.enforced: dict[str, list[str]] = {}
        self.cg: RunCgroups | None = None
        self.rlimits: list[str] = []
        self.root_pid: int | None = None
        self.t0 = 0.0
        self.ticks = 0
        self.interval_s = TICK_S_MIN
        self.interval_s_max = TICK_S_MIN
        self.cost_s_max = 0.0
        self.tripped: str | None = None
        self.fs_base: FsCounts | None = None
        self.usage: dict[str, Any] = {}
        self._forks: Window | None = None
        self._deletes: Window | None = None
        self._ns_base: int | None = None
        self._ns_max = 0
        self._seen: set[tuple[int, str]] = set()
        self._peak_tasks = 0
        self._peak_rss = 0
        self._cpu_ns = 0
        self._helper: int | None = None
        self.cgroups_left: list[str] = []

    # -- before the command starts ---------------------------------------------------------

    def setup(self) -> None:
        lim = self.limits
        want = tuple(c for c, v in (("pids", lim.procs), ("memory", lim.memory_mb),
                                    ("cpu", lim.cpu_ms)) if v is not None)
        self.cg = RunCgroups(want)
        cg = self.cg
        try:
            if lim.procs is not None and "pids" in cg.dirs:
                cg.set_pids_max(lim.procs + self.overhead)
            if lim.memory_mb is not None and "memory" in cg.dirs:
                cg.set_memory_max(lim.memory_mb * MIB)
        except OSError as exc:
            self.close()
            raise IsolationUnavailable(f"the governor cannot set a limit in its cgroup "
                                       f"{exc.filename}: {exc.strerror}") from exc
        prlimit = shutil.which("prlimit", path=os.environ.get("PATH", "") + os.pathsep +
                               SYS_PATH)
        rl: list[str] = []
        en = self.enforced
        if lim.runtime_ms is not None:
            en["max_runtime_ms"] = ["clock"]
        if lim.cpu_ms is not None:
            en["max_cpu_ms"] = [f"sample:{cg.describe('cpu')}" if "cpu" in cg.dirs
                                else "sample:/proc cpu times"]
            if prlimit:
                soft = -(-lim.cpu_ms // 1000) + 1  # whole seconds, rounded up, + 1
                rl.append(f"--cpu={soft}:{soft + 1}")
                en["max_cpu_ms"].append("rlimit:RLIMIT_CPU")
        if lim.procs is not None:
            if "pids" in cg.dirs:
                en["max_procs"] = [cg.describe("pids")]
            else:
                en["max_procs"] = ["sample:/proc tasks"]
                if prlimit and self.own_userns and os.geteuid() != 0:
                    rl.append(f"--nproc={lim.procs + self.overhead}")
                    en["max_procs"].insert(0, "rlimit:RLIMIT_NPROC")
        if lim.memory_mb is not None:
            if "memory" in cg.dirs:
                en["max_memory_mb"] = [cg.describe("memory")]
            else:
                en["max_memory_mb"] = ["sample:/proc resident size"]
                if prlimit:  # a backstop: address space is not memory (runtimes reserve)
                    rl.append(f"--as={(lim.memory_mb * AS_FACTOR + AS_SLACK_MB) * MIB}")
                    en["max_memory_mb"].append("rlimit:RLIMIT_AS")
        if lim.disk_mb is not None:
            en["max_disk_mb"] = []
            if prlimit:
                rl.append(f"--fsize={lim.disk_mb * MIB + 1}")
                en["max_disk_mb"].append("rlimit:RLIMIT_FSIZE")
            if self.fs is not None:
                en["max_disk_mb"].append(self.fs.method)
            if self.sandboxed:
                en["max_disk_mb"].append("tmpfs-size:/tmp")
        if self.fs is not None:
            for name, v in (("max_files_written", lim.files_written),
                            ("max_deletes_per_s", lim.deletes_per_s)):
                if v is not None:
                    en[name] = [self.fs.method]
        if lim.forks_per_s is not None:
            en["max_forks_per_s"] = ["sample:pid-namespace numbers" if self.pid_ns
                                     else "sample:new processes seen"]
        self.rlimits = [prlimit, *rl, "--"] if (prlimit and rl) else []

    def baseline(self) -> None:
        """What the view already held from earlier runs (so that counts are this run's)."""
        if self.fs is not None and self._wants_fs():
            self.fs_base = self.fs.sample()

    @property
    def needs_status(self) -> bool:
        """Does the command line report on the status descriptor (fd 3)? Only joining a
        cgroup can fail in a way we must hear of (a run outside its cgroup is unconfined)."""
        return self.cg is not None and bool(self.cg.dirs)

    def wrap(self, argv: list[str], close_status: bool) -> list[str]:
        """The command line that joins the cgroups and sets the rlimits, then runs ``argv``.
        ``close_status``: it gets the status descriptor and must close it (no sandbox
        comes after it to do so)."""
        assert self.cg is not None
        if not self.needs_status:
            return self.rlimits + argv
        joins = self.cg.join_files()
        head = ["/bin/sh", "-c", ENTER, "agent-2pc-governor", *joins, "--"]
        if close_status:
            head.append("--close-status")
        return head + self.rlimits + argv

    # -- while it runs ---------------------------------------------------------------------

    def start(self, root_pid: int, t0: float) -> None:
        self.root_pid = root_pid
        self.t0 = t0
        self._forks = Window(t0)
        self._deletes = Window(t0)

    def _wants_fs(self) -> bool:
        lim = self.limits
        return any(v is not None for v in (lim.files_written, lim.deletes_per_s, lim.disk_mb))

    def _infra(self) -> set[int]:
        """Our own processes around the command: the root (unshare or the copy tier's
        supervisor), the namespace's helper, a FUSE daemon, bwrap."""
        assert self.root_pid is not None
        out = {self.root_pid}
        if self.pid_ns:
            if self._helper is None:
                kids = children_of(self.root_pid)
                self._helper = kids[0] if kids else None
            if self._helper is not None:
                out.add(self._helper)
        return out

    def members(self) -> list[int]:
        """The command's processes (thread group ids), ours left out."""
        assert self.root_pid is not None
        if self.cg is not None and self.cg.dirs:
            return self.cg.procs()
        infra = self._infra()
        out = []
        for pid in descendants(self.root_pid):
            if pid in infra:
                continue
            comm = _comm(pid)
            if comm in INFRA_COMMS or (self.sandboxed and comm == "bwrap"):
                continue
            out.append(pid)
        return out

    def sample(self, now: float | None = None, final: bool = False) -> str | None:
        """Look at the run once; the name of a limit that tripped, or None. ``final``: the
        run is over (no process left to look at)."""
        if now is None:
            now = time.monotonic()
        t_start = time.perf_counter()
        lim = self.limits
        cg = self.cg
        has = cg.dirs if cg is not None else {}
        need_procs = (lim.procs is not None and "pids" not in has) or \
            (lim.memory_mb is not None and "memory" not in has) or \
            (lim.cpu_ms is not None and "cpu" not in has) or lim.forks_per_s is not None
        trips: set[str] = set()
        if need_procs and not final:
            self._sample_procs(now, trips)
        if cg is not None:
            if "pids" in has:
                self._peak_tasks = max(self._peak_tasks, cg.pids_current() - self.overhead)
                if cg.pids_refused() > 0:
                    trips.add("max_procs")
            if "memory" in has:
                self._peak_rss = max(self._peak_rss, cg.memory_peak_bytes())
                if cg.oom_kills() > 0:
                    trips.add("max_memory_mb")
            if "cpu" in has:
                self._cpu_ns = max(self._cpu_ns, cg.cpu_ns())
        if lim.cpu_ms is not None and self._cpu_ns > lim.cpu_ms * 1_000_000:
            trips.add("max_cpu_ms")
        if self.fs is not None and self._wants_fs():
            self._sample_fs(now, trips)
        self.ticks += 1
        cost = time.perf_counter() - t_start
        self.cost_s_max = max(self.cost_s_max, cost)
        self.interval_s = min(TICK_S_MAX, max(TICK_S_MIN, cost * SAMPLE_SHARE_INV))
        self.interval_s_max = max(self.interval_s_max, self.interval_s)
        for name in TRIP_ORDER:
            if name in trips:
                return name
        return None

    def _sample_procs(self, now: float, trips: set[str]) -> None:
        lim = self.limits
        assert self.root_pid is not None
        infra = self._infra() if self.pid_ns else {self.root_pid}
        pids = self.members()
        tasks = 0
        rss = 0
        cpu_ticks = 0
        ns_max = 0
        ns_min: int | None = None
        for pid in pids:
            st = _stat(pid)
            if st is None or st[0] in ("Z", "X"):
                continue
            tasks += int(st[17])
            rss += int(st[21])
            cpu_ticks += sum(int(x) for x in st[11:15])
            if lim.forks_per_s is not None:
                if self.pid_ns:
                    n = _ns_pid(pid, 1)
                    if n is not None:
                        ns_max = max(ns_max, n)
                        ns_min = n if ns_min is None else min(ns_min, n)
                else:
                    self._seen.add((pid, st[19]))
        for pid in infra:  # what our processes reaped, when they reaped it
            st = _stat(pid)
            if st is not None:
                cpu_ticks += int(st[13]) + int(st[14])
        if self.cg is None or "pids" not in self.cg.dirs:
            tasks -= self.overhead if (self.cg is not None and self.cg.dirs) else 0
            self._peak_tasks = max(self._peak_tasks, tasks)
            if lim.procs is not None and (tasks > lim.procs or (
                    tasks >= lim.procs and "rlimit:RLIMIT_NPROC" in
                    self.enforced.get("max_procs", []))):
                trips.add("max_procs")
        if self.cg is None or "memory" not in self.cg.dirs:
            self._peak_rss = max(self._peak_rss, rss * PAGE_BYTES)
            if lim.memory_mb is not None and rss * PAGE_BYTES > lim.memory_mb * MIB:
                trips.add("max_memory_mb")
        if self.cg is None or "cpu" not in self.cg.dirs:
            self._cpu_ns = max(self._cpu_ns, cpu_ticks * 1_000_000_000 // CLK_TCK)
        if lim.forks_per_s is not None and self._forks is not None:
            if self.pid_ns:
                if ns_min is not None and self._ns_base is None:
                    self._ns_base = ns_min
                self._ns_max = max(self._ns_max, ns_max)
                forks = max(0, self._ns_max - (self._ns_base or self._ns_max))
            else:
                forks = max(0, len(self._seen) - 1)
            if self._forks.add(now, forks) > lim.forks_per_s:
                trips.add("max_forks_per_s")
            self.usage["forks"] = forks

    def _sample_fs(self, now: float, trips: set[str]) -> None:
        assert self.fs is not None
        lim = self.limits
        c = self.fs.sample()
        base = self.fs_base
        files = max(0, c.files_written - (base.files_written if base else 0))
        deletes = max(0, c.deletes - (base.deletes if base else 0))
        disk = max(0, c.disk_bytes - (base.disk_bytes if base else 0))
        if self.log_path is not None:
            try:
                disk += os.stat(self.log_path).st_blocks * 512
            except OSError:
                pass
        self.usage["files_written"] = files
        self.usage["deletes"] = deletes
        self.usage["disk_bytes"] = max(self.usage.get("disk_bytes", 0), disk)
        if lim.files_written is not None and files > lim.files_written:
            trips.add("max_files_written")
        if lim.disk_mb is not None and disk > lim.disk_mb * MIB:
            trips.add("max_disk_mb")
        if self._deletes is not None and lim.deletes_per_s is not None:
            if self._deletes.add(now, deletes) > lim.deletes_per_s:
                trips.add("max_deletes_per_s")

    # -- a trip --------------------------------------------------------------------------

    def stop_tree(self) -> list[int]:
        """SIGSTOP every process of the run (not the root: it is ours), round after round
        until none appears (a stopped process cannot fork); return them."""
        assert self.root_pid is not None
        stopped: list[int] = []
        done: set[int] = {self.root_pid}
        for _ in range(STOP_ROUNDS_MAX):
            found = set(descendants(self.root_pid))
            if self.cg is not None and self.cg.dirs:
                found.update(self.cg.procs())
            fresh = found - done
            if not fresh:
                break
            for pid in fresh:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except OSError:
                    pass
            done |= fresh
            stopped.extend(fresh)
        return stopped

    def kill(self, stopped: list[int]) -> None:
        """SIGKILL the stopped processes, but not the namespace's PID 1 (the helper): the
        caller kills it after its parent, whose message about its death would otherwise end
        in the log. Their parents are stopped too, so no PID is reaped (and reused) before
        the signal reaches it."""
        spare = set(children_of(self.root_pid)) if self.pid_ns and self.root_pid else set()
        for pid in stopped:
            if pid in spare:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    # -- after -----------------------------------------------------------------------------

    def finish(self, trip: str | None) -> str | None:
        """The last look, once every process is gone: a limit the kernel enforced (an OOM
        kill, a refused fork) or a count over its limit trips even when the command exited
        by itself. Returns the limit that tripped (``trip`` if one did already)."""
        if trip is None:
            trip = self.sample(final=True)
        self.tripped = trip
        return trip

    def close(self) -> list[str]:
        """Remove the cgroups (killing what is left in them); directories that stayed.
        Idempotent."""
        if self.cg is None:
            return []
        self.cgroups_left = self.cg.remove()
        return self.cgroups_left

    def report(self, runtime_ms: float) -> dict[str, Any]:
        lim = self.limits
        usage: dict[str, Any] = {"runtime_ms": runtime_ms}
        if lim.cpu_ms is not None or (self.cg is not None and "cpu" in self.cg.dirs):
            usage["cpu_ms"] = round(self._cpu_ns / 1e6, 3)
        if lim.procs is not None or lim.forks_per_s is not None:
            usage["peak_procs"] = self._peak_tasks
        if lim.memory_mb is not None:
            usage["peak_memory_mb"] = round(self._peak_rss / MIB, 3)
        for key in ("files_written", "deletes", "forks"):
            if key in self.usage:
                usage[key] = self.usage[key]
        if "disk_bytes" in self.usage:
            usage["disk_mb"] = round(self.usage["disk_bytes"] / MIB, 3)
        if self._forks is not None and lim.forks_per_s is not None:
            usage["peak_forks_per_s"] = self._forks.peak
        if self._deletes is not None and lim.deletes_per_s is not None:
            usage["peak_deletes_per_s"] = self._deletes.peak
        out: dict[str, Any] = {
            "limits": lim.to_json(), "enforced": self.enforced, "usage": usage,
            "sampling": {"ticks": self.ticks,
                         "interval_ms_max": round(self.interval_s_max * 1000, 3),
                         "detection_latency_ms_max": round(
                             (self.interval_s_max + self.cost_s_max) * 1000, 3)}}
        if self.cg is not None and self.cg.refused:
            out["cgroups_refused"] = dict(self.cg.refused)
        if self.cgroups_left:
            out["cgroups_left"] = list(self.cgroups_left)
        return out
