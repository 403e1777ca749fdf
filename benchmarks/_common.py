"""Helpers shared by the benchmark scripts (not a benchmark itself).

Every benchmark prints exactly one JSON object on stdout; progress goes to stderr. Work happens
in a fresh temporary directory on the same disk as the project (never tmpfs: fsync there is a
no-op and would make durability figures meaningless), removed at the end.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(HERE)
SRC = os.path.join(PROJECT, "src")
if SRC not in sys.path:  # run from a checkout without installing: use this tree's library
    sys.path.insert(0, SRC)

# Where temp directories go: the first candidate that exists and is not tmpfs.
SCRATCH_CANDIDATES = (os.environ.get("AGENT2PC_BENCH_DIR") or "", "/work/scratch",
                      os.path.join(PROJECT, ".bench-tmp"), tempfile.gettempdir())
_TMPFS_TYPES = {"tmpfs", "ramfs", "devtmpfs"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _mount_of(path: str) -> tuple[str, str, str, str]:
    """(mount point, file system type, source device, options) of ``path`` (longest prefix
    in /proc/self/mounts)."""
    real = os.path.realpath(path)
    best = ("/", "unknown", "", "")
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 4:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and \
                        len(mnt) >= len(best[0]):
                    best = (mnt, parts[2], parts[0], parts[3])
    except OSError:
        pass
    return best


def fs_type(path: str) -> tuple[str, str]:
    """(mount point, file system type) of ``path``."""
    mnt, fstype, _, _ = _mount_of(path)
    return mnt, fstype


def ext4_journal(path: str) -> bool | None:
    """Does the ext3/ext4 file system holding ``path`` have a journal (a jbd2 instance)?
    None when not ext3/ext4 or unknown."""
    _, fstype, dev, _ = _mount_of(path)
    if fstype not in ("ext3", "ext4") or not dev.startswith("/dev/"):
        return None
    try:
        names = os.listdir("/proc/fs/jbd2")
    except OSError:
        return None
    base = os.path.basename(os.path.realpath(dev))
    return any(n.startswith(base + "-") for n in names)


def fs_probe(parent: str, n: int = 200) -> dict:
    """Median cost of the file-system operations a commit is made of, right now, in a fresh
    directory under ``parent``: creating a file, creating a directory, appending + fsync.

    Creating an inode varies a lot on some file systems (ext4 without a journal skips inodes
    deleted in the last minutes, one bitmap bit and inode-table lookup at a time), so this is
    recorded next to every result.
    """
    d = tempfile.mkdtemp(prefix="probe-", dir=parent)
    try:
        def med(fn) -> float:  # type: ignore[no-untyped-def]
            ts = []
            for i in range(n):
                t = time.perf_counter()
                fn(i)
                ts.append(time.perf_counter() - t)
            return round(statistics.median(ts) * 1e6, 1)

        create = med(lambda i: os.close(os.open(os.path.join(d, f"f{i}"),
                                                os.O_WRONLY | os.O_CREAT, 0o644)))
        mkdir = med(lambda i: os.mkdir(os.path.join(d, f"d{i}")))
        fd = os.open(os.path.join(d, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fsync = os.fsync

            def append(i: int) -> None:
                os.write(fd, b"x" * 300)
                fsync(fd)

            append_fsync = med(append)
        finally:
            os.close(fd)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return {"create_file_us_p50": create, "mkdir_us_p50": mkdir,
            "append_fsync_us_p50": append_fsync}


def scratch_parent() -> str:
    for cand in SCRATCH_CANDIDATES:
        if not cand:
            continue
        if cand == os.path.join(PROJECT, ".bench-tmp"):
            os.makedirs(cand, exist_ok=True)
        if os.path.isdir(cand) and fs_type(cand)[1] not in _TMPFS_TYPES:
            return cand
    raise SystemExit("no non-tmpfs directory for benchmark files; set AGENT2PC_BENCH_DIR")


class BenchDir:
    """``with BenchDir("name") as d``: a fresh directory on a real disk, removed afterwards."""

    def __init__(self, prefix: str) -> None:
        self.parent = scratch_parent()
        self.path = tempfile.mkdtemp(prefix=f"a2pc-bench-{prefix}-", dir=self.parent)

    def __enter__(self) -> "BenchDir":
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def describe(self, probe: bool = True) -> dict:
        mnt, fstype, dev, opts = _mount_of(self.path)
        st = os.stat(self.path)
        project_dev = os.stat(PROJECT).st_dev
        out = {"parent": self.parent, "mount": mnt, "fs_type": fstype, "device": dev,
               "mount_options": opts, "ext4_journal": ext4_journal(self.path),
               "same_device_as_project": st.st_dev == project_dev,
               "tmpfs": fstype in _TMPFS_TYPES}
        if probe:
            out["probe_before"] = fs_probe(self.path)
        return out


class FsyncCounter:
    """Counts the real os.fsync / os.fdatasync calls made in this process while ``active``,
    and the time spent inside them.

    The library calls ``os.fsync`` through the module attribute (storage/durable.py), so
    replacing the attribute sees every call; the minimal loop calls the same attribute.
    """

    def __init__(self) -> None:
        self.fsync = 0
        self.fdatasync = 0
        self.seconds = 0.0
        self.active = True
        self._orig_fsync = os.fsync
        self._orig_fdatasync = getattr(os, "fdatasync", None)

    def install(self) -> "FsyncCounter":
        orig_fsync, orig_fdatasync = self._orig_fsync, self._orig_fdatasync
        clock = time.perf_counter

        def fsync(fd: int) -> None:
            if not self.active:
                return orig_fsync(fd)
            self.fsync += 1
            t = clock()
            try:
                orig_fsync(fd)
            finally:
                self.seconds += clock() - t

        os.fsync = fsync  # type: ignore[assignment]
        if orig_fdatasync is not None:
            def fdatasync(fd: int) -> None:
                if not self.active:
                    return orig_fdatasync(fd)
                self.fdatasync += 1
                t = clock()
                try:
                    orig_fdatasync(fd)
                finally:
                    self.seconds += clock() - t

            os.fdatasync = fdatasync  # type: ignore[assignment]
        return self

    def uninstall(self) -> None:
        os.fsync = self._orig_fsync  # type: ignore[assignment]
        if self._orig_fdatasync is not None:
            os.fdatasync = self._orig_fdatasync  # type: ignore[assignment]

    @property
    def total(self) -> int:
        return self.fsync + self.fdatasync

    def reset(self) -> None:
        self.fsync = self.fdatasync = 0
        self.seconds = 0.0

    def snapshot(self) -> tuple[int, float]:
        return self.total, self.seconds


def pct(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation of sorted values."""
    if not sorted_values:
        return float("nan")
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def latency_ms(samples_s: list[float]) -> dict:
    """p50/p95/p99/mean/min/max in milliseconds of samples given in seconds."""
    s = sorted(x * 1000.0 for x in samples_s)
    return {"n": len(s), "p50": r3(pct(s, 0.50)), "p95": r3(pct(s, 0.95)),
            "p99": r3(pct(s, 0.99)), "mean": r3(statistics.fmean(s)) if s else None,
            "min": r3(s[0]) if s else None, "max": r3(s[-1]) if s else None}


def r3(x: float) -> float:
    return round(x, 3)


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def source_version() -> dict:
    """The commit of the tree under test and whether src/ has uncommitted changes (read-only
    git queries; empty when git or the repository is not there)."""
    import subprocess

    out: dict = {}
    try:
        head = subprocess.run(["git", "-C", PROJECT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            out["git_head"] = head.stdout.strip()
            st = subprocess.run(["git", "-C", PROJECT, "status", "--porcelain", "--", "src"],
                                capture_output=True, text=True, timeout=10)
            out["src_uncommitted_changes"] = bool(st.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def machine() -> dict:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": platform.platform(), "loadavg_1_5_15_at_start": loadavg(),
            **source_version()}


def emit(result: dict, smoke: bool = False) -> None:
    """Print the one JSON object; a ``smoke`` run says its figures are not figures."""
    if smoke:
        result["note"] = "smoke run: tiny sizes to keep the script working, not figures"
    result.setdefault("machine", {})["loadavg_1_5_15_at_end"] = loadavg()
    sys.stdout.write(json.dumps(result, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def now() -> float:
    return time.perf_counter()


def bytecode_env(python: str) -> dict:
    """The environment for timed child processes: bytecode caching allowed, as in a real
    install (PYTHONDONTWRITEBYTECODE makes every start compile every module from source).

    PYTHONPATH points at this tree's src/ only when ``python`` would not import the library
    from there anyway (the project venv has an editable install, so it normally does not).
    """
    import subprocess

    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("AGENT2PC_CRASH_AT", None)
    env.pop("AGENT2PC_ROOT", None)
    probe = subprocess.run([python, "-c", "import agent_2pc, os; "
                            "print(os.path.dirname(os.path.dirname(agent_2pc.__file__)))"],
                           env=env, capture_output=True, text=True)
    if probe.returncode != 0 or os.path.realpath(probe.stdout.strip()) != os.path.realpath(SRC):
        env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"]
                                   if env.get("PYTHONPATH") else "")
    return env


def warm_bytecode(python: str, env: dict) -> None:
    """Compile this tree's modules to .pyc once, as an install does (not timed)."""
    import subprocess

    subprocess.run([python, "-m", "compileall", "-q", os.path.join(SRC, "agent_2pc")],
                   env=env, check=False, stdout=subprocess.DEVNULL)


def venv_python() -> str:
    """The interpreter to time children with: the project's venv if present, else this one."""
    cand = os.path.join(PROJECT, ".venv", "bin", "python")
    return cand if os.path.exists(cand) else sys.executable


OS_CALLS = ("open", "close", "read", "pread", "write", "stat", "lstat", "fstat", "mkdir",
            "rmdir", "unlink", "rename", "replace", "link", "scandir", "listdir", "chmod",
            "fchmod", "fsync", "fdatasync", "ftruncate", "kill", "getpid", "urandom")


class OsCallCounter:
    """Counts, and times, calls of the os functions that are system calls (and fcntl.flock),
    by name, by wrapping the module attributes (os.path helpers call them through ``os`` too).
    ``open`` with O_CREAT is counted apart (a new inode or an existing file), and calls failing
    with EEXIST apart. Untimed passes only: the wrappers cost about a microsecond per call."""

    def __init__(self) -> None:
        import collections

        self.counts: collections.Counter = collections.Counter()
        self.seconds: collections.Counter = collections.Counter()
        self._saved: list[tuple[object, str, object]] = []

    def __enter__(self) -> "OsCallCounter":
        import fcntl

        targets = [(os, name) for name in OS_CALLS if hasattr(os, name)]
        targets.append((fcntl, "flock"))
        for mod, name in targets:
            orig = getattr(mod, name)
            self._saved.append((mod, name, orig))
            setattr(mod, name, self._wrap(name, orig))
        return self

    def _wrap(self, name: str, orig):  # type: ignore[no-untyped-def]
        counts, seconds, clock = self.counts, self.seconds, time.perf_counter
        creat = os.O_CREAT
        stat = os.stat  # the real one: this runs before any wrapping

        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            key = name
            if name == "open" and len(a) > 1 and a[1] & creat:
                try:
                    stat(a[0], dir_fd=k.get("dir_fd"))
                    key = "open+creat(existing)"
                except OSError:
                    key = "open+creat(new inode)"
            t = clock()
            try:
                return orig(*a, **k)
            except FileExistsError:
                key += "(EEXIST)"
                raise
            finally:
                seconds[key] += clock() - t
                counts[key] += 1

        return wrapper

    def __exit__(self, *exc: object) -> None:
        for mod, name, orig in reversed(self._saved):
            setattr(mod, name, orig)
        self._saved.clear()

    def per(self, n: int) -> dict:
        """Calls per unit of work, by name, most frequent first, and the total."""
        out = {k: round(v / n, 2) for k, v in sorted(self.counts.items(), key=lambda kv: -kv[1])}
        out["total"] = round(sum(self.counts.values()) / n, 2)
        return out

    def ms_per(self, n: int) -> dict:
        """Milliseconds spent in each call per unit of work, costliest first, and the total."""
        out = {k: round(v / n * 1000, 4)
               for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])}
        out["total"] = round(sum(self.seconds.values()) / n * 1000, 4)
        return out


def time_run(argv: list[str], env: dict) -> float:
    """Wall time of one child process run to its end (its failure stops the benchmark)."""
    import subprocess

    t = now()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = now() - t
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return dt


def wall_summary(samples: list[float]) -> dict:
    """n, median, p90, min and max of wall times in seconds, in milliseconds."""
    s = sorted(samples)
    return {"n": len(s), "median_ms": r3(statistics.median(s) * 1000),
            "p90_ms": r3(pct(s, 0.9) * 1000), "min_ms": r3(s[0] * 1000),
            "max_ms": r3(s[-1] * 1000)}


def console_script(python: str) -> str:
    """The venv's ``agent-2pc`` next to ``python`` (the benchmark stops when it is missing)."""
    console = os.path.join(os.path.dirname(python), "agent-2pc")
    if not os.path.exists(console):
        raise SystemExit(f"no console script at {console}: pip install -e . into the venv")
    return console
