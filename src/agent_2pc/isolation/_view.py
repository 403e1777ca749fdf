"""The staged view: run commands against the repo as it would be after commit.

Tiers, best first (docs/staged-view.md):
  overlay         kernel overlayfs in a private mount namespace (a user namespace when not
                  root), mounted over the repo's own path; lower dirs: the staged layer, the
                  repo; upper: a scratch dir that receives every write.
  fuse-overlayfs  the same with fuse-overlayfs, where the kernel refuses overlay.
  copy            a copy of the tree elsewhere, compared before and after.
With no tier asked for, the first one the host allows is used: a tier whose mount is refused is
recorded in ``refused`` and the next one is tried — the command had not started. A tier that
was asked for and cannot be had raises IsolationUnavailable. No tier ever runs a command
against the real tree: in the overlay tiers the command starts only after the helper reported
the mount made (``@ok``), in the copy tier its working directory is in the copy and the real
repository is read-only to it. In every tier the view has no .agent-tx/, a root command has no
capability that undoes the view (``_without_view_changing_caps``), and the run dies with its
caller (a pipe only the caller holds). docs/staged-view.md says why and how.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time

from ..errors import IsolationUnavailable, NotFound, PathOutsideRoot, UsageError
from ..storage.workspace import DIRNAME
from ._capture import Capture, capture_upper
from ._confine import (
    WATCH_FD_MIN,
    _userns_refusal,
    _which,
    copy_confinement,
    memfd,
    without_view_changing_caps,
)
from ._copy import build_copy, capture_copy, picture, wait_for_tick
from ._fswatch import CopyWatch, UpperWatch
from ._governor import MIB, Governor, Limits
from ._ignore import DEFAULT_IGNORE, Ignore
from ._layer import Layer
from ._owner import owner_tag
from ._procs import (
    COPY_HELPER,
    HELPER,
    PROC_SYS_READ_ONLY,
    ROOT_CAPS,
    children_of,
    exit_code,
    fstab_line,
    ns_of_children,
    reap_namespace,
    wait_ready,
)
from ._remove import discard, rmtree
from ._sandbox import SANDBOXED, Sandbox, probe_sandbox
from ._terminal import STOP_POLL_S, Terminal, session_argv, wanted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Mapping, Sequence

    from ..core.states import Op
    from ..storage.blobs import BlobStore

OVERLAY, FUSE, COPY = "overlay", "fuse-overlayfs", "copy"
TIERS = (OVERLAY, FUSE, COPY)
ENV_TIER = "AGENT2PC_ISOLATION"  # overlay | fuse-overlayfs | copy | auto
TAIL_BYTES = 4096
TAIL_BYTES_MAX = 1 << 20
TIMEOUT_S_MAX = 30 * 24 * 3600.0
REAPER_GRACE_S = 10.0  # the copy tier's supervisor enforces the timeout; this is our backstop
KILL_WAIT_S = 10.0
PROBE_TIMEOUT_S = 10.0
ARGV_ITEMS_MAX = 100_000
SESSION_MARK = "session-"  # + the tier: a view dir in which a terminal session ran
RELAY_POLL_S = 0.05  # without a pidfd, how often a terminal relay looks for the exit
# redirect_dir=off: a rename of a merged directory fails with EXDEV and tools copy instead, so
# renames reach the upper dir as plain files; metacopy=off: a chmod copies the whole file up;
# index=off: no hard-link index in the work dir. In a user namespace the kernel wants
# redirect_dir=nofollow with userxattr (same effect for us: no redirect is ever created).
ROOT_OPTS = ",redirect_dir=off,metacopy=off,index=off"
USERNS_OPTS = ",redirect_dir=nofollow,metacopy=off,index=off,userxattr"
REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reaper.py")

_probe_cache: dict[str, str | None] | None = None


def probe_tiers(refresh: bool = False) -> dict[str, str | None]:
    """For each tier, None when the host may have it, else why not. Cheap (no mount is tried:
    a refused mount is found at the first run and the next tier is taken then)."""
    global _probe_cache
    if _probe_cache is not None and not refresh:
        return dict(_probe_cache)
    out: dict[str, str | None] = {}
    ns: str | None = None
    if not _which("unshare"):
        ns = "unshare(1) is not installed (util-linux)"
    elif os.geteuid() != 0:
        ns = _userns_refusal()
    if ns is not None:
        out[OVERLAY] = ns
    elif not _which("mount"):
        out[OVERLAY] = "mount(8) is not installed"
    else:
        out[OVERLAY] = None
    if ns is not None:
        out[FUSE] = ns
    elif not _which("fuse-overlayfs"):
        out[FUSE] = "fuse-overlayfs is not installed"
    elif not os.access("/dev/fuse", os.R_OK | os.W_OK):
        out[FUSE] = "/dev/fuse is missing or not accessible"
    else:
        out[FUSE] = None
    out[COPY] = None
    _probe_cache = out
    return dict(out)


class RunResult:
    """One command run in a view.

    ``exit_code`` is the command's status as a shell gives it (128+N when a signal N ended
    it), None when it timed out (``timed_out``). ``duration_ms`` is the wall time from start to
    the last process reaped; ``setup_ms`` the time spent building the view before that (0 for
    a view that was already built). ``log_path`` and ``tail`` (the last bytes of the log,
    decoded) are None in interactive mode. ``survivors`` counts processes found alive after
    the kill's budget ran out (0 unless the host misbehaves).

    ``sandbox``: what confined the run (None: not sandboxed). ``tripped``: the limit that
    stopped it — ``timeout_ms`` for the plain timeout (then ``timed_out`` too), ``max_procs``,
    ``max_memory_mb``, ... for the governor's (then ``timed_out`` is False) — or None.
    ``governor``: limits, the mechanism that enforced each, usage, sampling (None: no limits).
    """

    __slots__ = ("tier", "namespace", "command", "cwd", "exit_code", "timed_out",
                 "duration_ms", "setup_ms", "log_path", "tail", "interactive", "survivors",
                 "refused", "sandbox", "tripped", "governor", "tty")

    def __init__(self, *, tier: str, namespace: str | None, command: list[str], cwd: str,
                 exit_code: int | None, timed_out: bool, duration_ms: float,
                 log_path: str | None, tail: str | None, interactive: bool,
                 survivors: int, sandbox: dict[str, Any] | None = None,
                 tripped: str | None = None, governor: dict[str, Any] | None = None,
                 tty: bool = False) -> None:
        self.tier = tier
        self.namespace = namespace  # mount+pid | user+mount+pid | None (copy)
        self.command = command
        self.cwd = cwd  # the working directory as the command saw it
        self.exit_code = exit_code
        self.timed_out = timed_out
        self.duration_ms = duration_ms
        self.setup_ms = 0.0
        self.log_path = log_path
        self.tail = tail
        self.interactive = interactive
        self.survivors = survivors
        self.refused: dict[str, str] = {}  # tiers passed over, and why
        self.sandbox = sandbox
        self.tripped = "timeout_ms" if timed_out and tripped is None else tripped
        self.governor = governor
        self.tty = tty  # the command had a pseudo-terminal of its own (interactive runs)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.tripped is None

    def to_json(self) -> dict[str, Any]:
        out = {"isolation": self.tier, "exit_code": self.exit_code, "passed": self.passed,
               "timed_out": self.timed_out, "duration_ms": self.duration_ms,
               "setup_ms": self.setup_ms, "log": self.log_path, "tail": self.tail}
        for key in ("sandbox", "tripped", "governor"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.tty:
            out["tty"] = True
        return out

    def __repr__(self) -> str:
        return (f"RunResult({self.tier}, exit_code={self.exit_code}, "
                f"timed_out={self.timed_out}, tripped={self.tripped}, {self.duration_ms} ms)")


def _argv(command: str | Sequence[str]) -> list[str]:
    if isinstance(command, str):
        if not command.strip():
            raise UsageError("the command is empty")
        return ["/bin/sh", "-c", command]
    argv = [os.fsdecode(a) if isinstance(a, bytes) else a for a in command]
    if not argv or len(argv) > ARGV_ITEMS_MAX or not all(isinstance(a, str) for a in argv):
        raise UsageError("the command is a non-empty list of strings")
    if not argv[0]:
        raise UsageError("the command's program name is empty")
    return argv


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class StagedView:
    """``StagedView(root, tx.changes(), engine.blobs, scratch_dir=..., trash_dir=...)``.

    Build it, ``run`` commands in it (as many as needed, one at a time: what one writes, the
    next sees), ``capture`` what they changed, ``close`` it (or use ``with``). Nothing is
    mounted between runs: each run sets up its own namespace, which dies with the run.

    root          the repo; must be a directory (its real path is used).
    changes       the transaction's net changes (``Op``: path, op write|delete, blob, mode).
    blobs         the BlobStore the ops' blobs live in (None when there is no write).
    tier          overlay | fuse-overlayfs | copy | auto | None (None: $AGENT2PC_ISOLATION,
                  else auto).
    ignore        globs never captured nor copied (_ignore.py); .git and .agent-tx always.
    scratch_dir   where the view's own directory goes (upper and work dirs, logs, status):
                  default ``<root>/.agent-tx/tx`` in a workspace, else the temp dir. Inside
                  the repo only below .agent-tx/ (which the view hides).
    trash_dir     where large scratch goes to be deleted in the background (same file system
                  as scratch_dir); default ``<root>/.agent-tx/trash`` in a workspace.
    layer_parent  where the staged layer is built (outside the repo): default /dev/shm.
    copy_parent   where the copy tier copies the tree: default the temp dir.
    """

    def __init__(self, root: str | os.PathLike[str], changes: Iterable[Op] = (),
                 blobs: BlobStore | None = None, *, tier: str | None = None,
                 ignore: Iterable[str] = DEFAULT_IGNORE,
                 scratch_dir: str | os.PathLike[str] | None = None,
                 trash_dir: str | os.PathLike[str] | None = None,
                 layer_parent: str | os.PathLike[str] | None = None,
                 copy_parent: str | os.PathLike[str] | None = None) -> None:
        real = os.path.realpath(os.fspath(root))
        if not os.path.isdir(real):
            raise UsageError(f"not a directory: {real}")
        self.root = real
        self.ignore = Ignore(ignore)
        self.refused: dict[str, str] = {}
        self._candidates, self.forced = self._choose(tier)
        self.tier = self._candidates[0]  # final after the first run
        self.layer = Layer(real, changes, blobs)
        agent_tx = os.path.join(real, DIRNAME)
        self.agent_tx = agent_tx if os.path.isdir(agent_tx) else None
        if scratch_dir is None:
            scratch = os.path.join(agent_tx, "tx") if self.agent_tx else tempfile.gettempdir()
        else:
            scratch = os.path.realpath(os.fspath(scratch_dir))
        if _inside(scratch, real) and not (self.agent_tx and _inside(scratch, agent_tx)):
            raise UsageError(f"the view's scratch dir {scratch} is inside the repo; put it "
                             f"below {DIRNAME}/ or outside the repo")
        if trash_dir is None and self.agent_tx and _inside(scratch, agent_tx):
            trash_dir = os.path.join(agent_tx, "trash")
        self.trash_dir = os.fspath(trash_dir) if trash_dir is not None else None
        self._layer_parent = os.fspath(layer_parent) if layer_parent is not None else None
        self._copy_parent = os.fspath(copy_parent) if copy_parent is not None else None
        os.makedirs(scratch, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix=f"view-{owner_tag()}-", dir=scratch)
        self._layer_dir: str | None = None
        self._upper: str | None = None
        self._work: str | None = None
        self._mounts_dir: str | None = None  # fuse-overlayfs's upper and work dirs
        self._copy_base: str | None = None
        self._copy_root: str | None = None
        self._before: dict[str, Any] | None = None
        self._built: str | None = None  # the tier whose view is built
        self._work_used = False
        self._ran = False
        self._runs = 0
        self._running = False
        self._closed = False
        self._failure = ""

    # -- choosing a tier ---------------------------------------------------------------------

    def _choose(self, tier: str | None) -> tuple[list[str], bool]:
        asked = tier if tier is not None else (os.environ.get(ENV_TIER) or "auto")
        probe = probe_tiers()
        if asked == "auto":
            for t, why in probe.items():
                if why is not None:
                    self.refused[t] = why
            return [t for t in TIERS if probe[t] is None], False
        if asked not in TIERS:
            raise UsageError(f"unknown isolation tier {asked!r} (overlay, fuse-overlayfs, copy "
                             "or auto)")
        why = probe[asked]
        if why is not None:
            raise IsolationUnavailable(f"the {asked} tier is not available on this host: {why}",
                                       tier=asked)
        return [asked], True

    @property
    def view_root(self) -> str:
        """Where commands see the repo: its own path (overlay tiers), or the copy."""
        if self.tier == COPY and self._copy_root is not None:
            return self._copy_root
        return self.root

    @property
    def namespace(self) -> str | None:
        return _namespace(self.tier)

    # -- building ----------------------------------------------------------------------------

    def _outside_repo(self, parent: str, what: str) -> str:
        real = os.path.realpath(parent)
        if _inside(real, self.root):
            raise UsageError(f"the {what} must be outside the repo; {real} is not")
        return real

    def _build(self, tier: str) -> None:
        if self._built == tier:
            return
        if tier == COPY:
            parent = self._outside_repo(self._copy_parent or tempfile.gettempdir(), "copy")
            self._copy_base = tempfile.mkdtemp(prefix=f"agent-2pc-{os.getuid()}-copy-"
                                               f"{owner_tag()}-",
                                               dir=parent)
            dest = os.path.join(self._copy_base, os.path.basename(self.root) or "root")
            os.mkdir(dest, 0o700)
            self._copy_root = dest
            build_copy(self.root, dest, self.layer, self.ignore)
            self._before = picture(dest, self.ignore)[0]
            wait_for_tick(self._copy_base, self._before)
        else:
            if self._layer_dir is None:
                default = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else \
                    tempfile.gettempdir()
                parent = self._outside_repo(self._layer_parent or default, "staged layer")
                self._layer_dir = tempfile.mkdtemp(prefix=f"agent-2pc-{os.getuid()}-layer-"
                                                   f"{owner_tag()}-",
                                                   dir=parent)
                # .agent-tx/ is hidden in the view: no command reaches the workspace's state
                self.layer.build_overlay(self._layer_dir, hide=(DIRNAME,))
            if self._upper is not None:  # left by a tier whose mount was refused
                rmtree(self._upper)
            self._upper = os.path.join(self.dir, "upper")
            if tier == FUSE:
                # fuse-overlayfs reaches its upper and work dirs by path, and the view hides
                # .agent-tx/ (and mounts over the repo): they live outside it, the view's dir
                # links to them
                parent = self._outside_repo(self._copy_parent or tempfile.gettempdir(),
                                            "fuse-overlayfs upper dir")
                self._mounts_dir = tempfile.mkdtemp(
                    prefix=f"agent-2pc-{os.getuid()}-upper-{owner_tag()}-", dir=parent)
                os.mkdir(os.path.join(self._mounts_dir, "upper"), 0o700)
                os.symlink(os.path.join(self._mounts_dir, "upper"), self._upper)
            else:
                os.mkdir(self._upper, 0o700)
            self._work = os.path.join(self._mounts_dir or self.dir, f"work-{self._runs}")
            os.mkdir(self._work, 0o700)
            self._work_used = False
            self.layer.match_root(self._upper)  # the view's root shows the upper's attributes
        self._built = tier

    # -- running -----------------------------------------------------------------------------

    def _rel_cwd(self, cwd: str | os.PathLike[str] | None) -> str:
        if cwd is None:
            return ""
        p = os.fspath(cwd)
        if not os.path.isabs(p):
            p = os.path.join(self.root, p)
        p = os.path.realpath(p) if os.path.exists(p) else os.path.normpath(p)
        if not _inside(p, self.root):
            raise PathOutsideRoot(f"the working directory {p} is outside the repo {self.root}",
                                  path=p)
        rel = "" if p == self.root else p[len(self.root) + 1:]
        if rel:
            seen = self.layer.before(rel)
            if seen is None or seen.kind != "dir":
                raise NotFound(f"{rel} is not a directory in the staged view", path=rel)
        return rel

    def _env(self, env: Mapping[str, str] | None, tier: str, cwd: str) -> dict[str, str]:
        out = dict(os.environ if env is None else env)
        out["PWD"] = cwd
        out["AGENT2PC_VIEW"] = tier
        return out

    def run(self, command: str | Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
            env: Mapping[str, str] | None = None, timeout_s: float | None = None,
            interactive: bool = False, log_path: str | os.PathLike[str] | None = None,
            tail_bytes: int = TAIL_BYTES, stdout_fd: int | None = None,
            sandbox: bool = False, network: bool = False,
            limits: Limits | Mapping[str, int | None] | None = None,
            tty: bool | None = None) -> RunResult:
        """Run ``command`` (argv list, or a shell string for /bin/sh -c) in the view.

        cwd          a directory of the view: relative to the repo root, or an absolute path
                     inside the repo (default: the root); mapped into the view.
        env          the command's environment (default: ours); PWD and AGENT2PC_VIEW (the
                     tier) are set.
        timeout_s    wall time; when it runs out every process of the command is killed
                     (SIGKILL) and the result says ``timed_out``.
        interactive  stdin/stdout/stderr are the caller's own (a terminal stays one); no log.
                     Otherwise stdin is /dev/null and stdout+stderr go to ``log_path``
                     (default: a file in the view's dir, gone at close).
        stdout_fd    interactive only: our descriptor that the command's stdout goes to
                     instead of ours (2 for ``exec --json``, whose stdout is the JSON alone).
        tty          interactive only: give the command a pseudo-terminal of its own
                     (_terminal.py), relayed to ours; None (default): when our stdin and
                     the output descriptor are both terminals. True where they are not is a
                     UsageError.
        sandbox      confine the command with bubblewrap (_sandbox.py): the host read-only,
                     a private /tmp, no network, only the view writable; ``result.sandbox``
                     says how. IsolationUnavailable when it cannot be had: never unconfined.
        network      with ``sandbox``: keep the host's network (default: loopback only).
        limits       a Limits (or a mapping of its names): the governor (_governor.py);
                     ``result.tripped`` names the limit that stopped the run.
        """
        if self._closed:
            raise UsageError("this staged view is closed")
        assert not self._running, "one run at a time per view"
        argv = _argv(command)
        rel = self._rel_cwd(cwd)
        if timeout_s is not None and not 0 < timeout_s <= TIMEOUT_S_MAX:
            raise UsageError(f"the timeout must be between 0 and {TIMEOUT_S_MAX:.0f} s")
        if stdout_fd is not None and not interactive:
            raise UsageError("stdout_fd is for interactive runs (others write to the log)")
        out_fd = 1 if stdout_fd is None else stdout_fd
        if tty and not (interactive and wanted(0, out_fd)):
            raise UsageError("tty= needs an interactive run whose stdin and output are "
                             "terminals")
        use_tty = interactive and (wanted(0, out_fd) if tty is None else tty)
        if not 0 <= tail_bytes <= TAIL_BYTES_MAX:
            raise UsageError(f"tail_bytes must be between 0 and {TAIL_BYTES_MAX}")
        if network and not sandbox:
            raise UsageError("network= is for sandboxed runs (without the sandbox the command "
                             "has the host's network anyway)")
        if sandbox:
            why = probe_sandbox()
            if why is not None:
                raise IsolationUnavailable(f"the sandbox is not available on this host: {why}",
                                           tier="sandbox")
        lim = None if limits is None else Limits.coerce(limits)
        if log_path is not None:
            log = os.path.realpath(os.fspath(log_path))
            if _inside(log, self.root) and not (self.agent_tx and _inside(log, self.agent_tx)):
                raise UsageError(f"the log {log} would be a file in the repo; put it below "
                                 f"{DIRNAME}/ or outside the repo")
        self._running = True
        compat_tried = False
        try:
            while True:
                tier = self._candidates[0]
                t0 = time.perf_counter()
                self._build(tier)
                setup_ms = round((time.perf_counter() - t0) * 1000, 3)
                res = self._run_once(tier, argv, rel, env, timeout_s, interactive,
                                     None if log_path is None else os.fspath(log_path),
                                     tail_bytes, stdout_fd, sandbox, network, lim, use_tty)
                if res is not None:
                    self.tier = tier
                    self._candidates = [tier]
                    self._ran = True
                    res.setup_ms = setup_ms
                    res.refused = dict(self.refused)
                    return res
                if self._failure == COMPAT and tier in _COMPAT_MOUNT and not compat_tried:
                    compat_tried = True  # the same tier again, mounted the long way
                    continue
                self.refused[tier] = self._failure
                if self.forced or self._ran or len(self._candidates) == 1:
                    raise IsolationUnavailable(
                        f"the {tier} tier cannot make a staged view here: {self._failure}",
                        tier=tier, refused=dict(self.refused))
                self._candidates.pop(0)
        finally:
            self._running = False

    def _copy_argv(self, cmd: list[str], status: str, timeout_s: float | None,
                   interactive: bool, keep: bool, watch: int, copy_ns: bool,
                   fds: list[int], proc_ro: bool = True) -> list[str]:
        """The copy tier's supervisor (_reaper.py) for ``cmd``, kept out of the real
        repository: in a mount namespace where it is read-only (COPY_HELPER), else by
        Landlock (the supervisor restricts itself); IsolationUnavailable when neither can
        be had."""
        how = copy_confinement()
        opts = [*(["keep-status"] if keep else []), f"watch={watch}"]
        if os.geteuid() == 0:  # the supervisor drops them from the bounding set itself
            opts.append("caps=" + ",".join(str(n) for n in ROOT_CAPS.values()))
        if how == "landlock":
            assert self._copy_base is not None
            opts += [f"landlock={self.root}", f"allow={self._copy_base}"]
        elif how != "ns":
            raise IsolationUnavailable(f"the copy tier cannot keep the command out of the "
                                       f"repository here: {how}", tier=COPY)
        reaper = [sys.executable, "-S", "-I", REAPER,
                  "/proc/self/fd/3" if how == "ns" else status, repr(float(timeout_s or 0)),
                  "1" if interactive else "0", "0" if copy_ns else str(os.getpid()), *opts,
                  "--", *cmd]
        if how != "ns":
            if not copy_ns:
                return reaper
            unshare = _which("unshare")
            assert unshare is not None
            return [unshare, "--pid", "--fork", "--kill-child", "--", *reaper]
        unshare = _which("unshare")
        assert unshare is not None
        head = [unshare]
        if os.geteuid() != 0:  # as root of a user namespace to mount, then ourselves again
            head += ["--user", "--map-root-user"]
            reaper = [unshare, "--user", f"--map-user={os.getuid()}",
                      f"--map-group={os.getgid()}", "--", *reaper]
        head += ["--mount", "--propagation", "private"]
        if copy_ns:
            head += ["--pid", "--fork", "--kill-child"]
        fstab = memfd(fstab_line(self.root, self.root, "none", "bind,ro")
                       + (PROC_SYS_READ_ONLY if os.geteuid() == 0 and proc_ro else ""))
        fds.append(fstab)
        return [*head, "--", "/bin/sh", "-c", COPY_HELPER, "agent-2pc-copy", self.root, status,
                f"/proc/self/fd/{fstab}", *reaper]

    def _helper_argv(self, tier: str, argv: list[str], view_cwd: str, status: str,
                     keep_status: bool = False, watch: int | None = None,
                     fds: list[int] | None = None, proc_ro: bool = True) -> list[str]:
        unshare = _which("unshare")
        assert unshare is not None
        assert self._layer_dir and self._upper and self._work
        head = [unshare]
        cmd = argv
        if os.geteuid() != 0:
            # Mount as root of a new user namespace, then run the command as ourselves again
            # in a nested one: it must not see itself as root.
            head += ["--user", "--map-root-user"]
            cmd = [unshare, "--user", f"--map-user={os.getuid()}",
                   f"--map-group={os.getgid()}", "--", *argv]
        opts = (ROOT_OPTS if os.geteuid() == 0 else USERNS_OPTS) if tier == OVERLAY else ""
        mounter = tier
        lines = []
        if tier == OVERLAY and tier not in _COMPAT_MOUNT:
            mounter = "overlay-fstab"  # the overlay and what follows, in one mount(8)
            lines.append(fstab_line("agent-2pc-view", self.root, "overlay",
                                    "lowerdir=/proc/self/fd/6:/proc/self/fd/5,upperdir="
                                    f"/proc/self/fd/7,workdir=/proc/self/fd/8{opts}"
                                    f"{FAST_MOUNT_OPTS}"))
        if os.geteuid() == 0 and proc_ro:  # (the sandbox has a /proc of its own)
            lines.append(PROC_SYS_READ_ONLY)
        fstab = ""
        if lines:
            fd = memfd("".join(lines))
            if fds is not None:
                fds.append(fd)
            fstab = f"/proc/self/fd/{fd}"
        head += ["--mount", "--propagation", "private", "--pid", "--fork", "--kill-child",
                 "--mount-proc", "--", "/bin/sh", "-c", HELPER, "agent-2pc-view"]
        return head + [self.root, self._layer_dir, self._upper, self._work, view_cwd, status,
                       mounter, opts, fstab, "1" if keep_status else "",
                       "" if watch is None else str(watch)] + cmd

    def _run_once(self, tier: str, argv: list[str], rel: str, env: Mapping[str, str] | None,
                  timeout_s: float | None, interactive: bool, log_path: str | None,
                  tail_bytes: int, stdout_fd: int | None, sandbox: bool = False,
                  network: bool = False, limits: Limits | None = None,
                  use_tty: bool = False) -> RunResult | None:
        """Run once in ``tier``; None when the view could not be made (nothing ran)."""
        self._runs += 1
        status = os.path.join(self.dir, f"status-{self._runs}")
        os.close(os.open(status, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600))
        view_root = self._copy_root if tier == COPY else self.root
        assert view_root is not None
        view_cwd = os.path.join(view_root, rel) if rel else view_root
        log = None
        if not interactive:
            log = log_path or os.path.join(self.dir, f"run-{self._runs}.log")
        cmd = argv
        term = None
        if use_tty:  # the last step before the program: a session of its own on the pty
            term = Terminal(0, 1 if stdout_fd is None else stdout_fd)
            cmd = session_argv(argv)
            # a terminal session: what it wrote may be salvaged if we die (recover, runs.py)
            os.close(os.open(os.path.join(self.dir, f"{SESSION_MARK}{tier}"),
                             os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        if os.geteuid() == 0 and not sandbox and tier != COPY:
            cmd = without_view_changing_caps(cmd, tier)  # the copy tier's supervisor does it
        box = None
        if sandbox:
            readonly = ()
            box = Sandbox(view_root=view_root, cwd=view_cwd, network=network,
                          interactive=interactive, readonly=readonly,
                          tmp_size_bytes=None if limits is None or limits.disk_mb is None
                          else limits.disk_mb * MIB)
            cmd = box.argv(cmd)
        gov = None
        # A governed copy-tier run gets a PID namespace where it can (as root): its process
        # numbers count its forks exactly, and the namespace's end kills every process.
        copy_ns = tier == COPY and limits is not None and os.geteuid() == 0 and _pid_ns_ok()
        if limits is not None:
            if tier == COPY:
                assert self._copy_root is not None and self._before is not None
                fs: UpperWatch | CopyWatch = CopyWatch(self._copy_root, self._before,
                                                       self.ignore)
            else:
                assert self._upper is not None
                fs = UpperWatch(self._upper, self.layer, self.ignore, fuse=tier == FUSE)
            gov = Governor(limits, pid_ns=tier != COPY or copy_ns,
                           own_userns=tier != COPY and os.geteuid() != 0,
                           sandboxed=box is not None, fs=fs, log_path=log,
                           overhead_tasks=box.overhead_tasks if box else 0)
            gov.setup()
        try:
            if gov is not None:
                if self._ran:
                    gov.baseline()
                cmd = gov.wrap(cmd, close_status=box is None)
            return self._spawn(tier, argv, cmd, view_cwd, env, status, timeout_s, interactive,
                               log, tail_bytes, stdout_fd, box, gov, copy_ns, term)
        finally:
            if gov is not None:
                gov.close()  # idempotent: _spawn closed it already unless it raised

    def _spawn(self, tier: str, argv: list[str], cmd: list[str], view_cwd: str,
               env: Mapping[str, str] | None, status: str, timeout_s: float | None,
               interactive: bool, log: str | None, tail_bytes: int, stdout_fd: int | None,
               box: Sandbox | None, gov: Governor | None, copy_ns: bool = False,
               term: Terminal | None = None) -> RunResult | None:
        if term is None:
            return self._spawn_on(tier, argv, cmd, view_cwd, env, status, timeout_s,
                                  interactive, log, tail_bytes, stdout_fd, box, gov, copy_ns)
        slave = term.open()
        try:
            return self._spawn_on(tier, argv, cmd, view_cwd, env, status, timeout_s,
                                  interactive, log, tail_bytes, slave, box, gov, copy_ns, term)
        finally:
            term.drain()
            term.close()

    def _spawn_on(self, tier: str, argv: list[str], cmd: list[str], view_cwd: str,
                  env: Mapping[str, str] | None, status: str, timeout_s: float | None,
                  interactive: bool, log: str | None, tail_bytes: int, stdout_fd: int | None,
                  box: Sandbox | None, gov: Governor | None, copy_ns: bool = False,
                  term: Terminal | None = None) -> RunResult | None:
        """Spawn and wait. With ``term``, ``stdout_fd`` is the pty's slave: the command's
        stdin, stdout and stderr, closed here once the command has it."""
        keep = box is not None or (gov is not None and gov.needs_status)
        log_fd = None
        if log is not None:
            log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        # The run dies with us: its helper (or supervisor) watches a pipe whose other end only
        # we hold, and kills the run when it closes (we exited, however: SIGKILL included).
        watch_r, watch_w = os.pipe2(os.O_CLOEXEC)
        watch = fcntl.fcntl(watch_r, fcntl.F_DUPFD_CLOEXEC, WATCH_FD_MIN)  # clear of 3..9
        os.close(watch_r)
        fds = [watch]  # passed on, and closed here once the helper has them
        if tier == COPY:
            full = self._copy_argv(cmd, status, timeout_s, interactive, keep, watch, copy_ns,
                                   fds, box is None)
            popen_cwd: str | None = view_cwd
        else:
            # A volatile mount refuses a work dir that one used before: each run after the
            # first gets a fresh one. The old ones go at close (a delete frees disk blocks,
            # which is slow on discard mounts: not on the critical path).
            if self._work_used:
                self._work = os.path.join(self._mounts_dir or self.dir, f"work-{self._runs}")
                os.mkdir(self._work, 0o700)
            self._work_used = True
            full = self._helper_argv(tier, cmd, view_cwd, status, keep, watch, fds, box is None)
            popen_cwd = "/"
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(
                full, cwd=popen_cwd, env=self._env(env, tier, view_cwd),
                stdin=stdout_fd if term else None if interactive else subprocess.DEVNULL,
                stdout=stdout_fd if interactive else log_fd,
                stderr=stdout_fd if term else None if interactive else subprocess.STDOUT,
                start_new_session=not interactive or term is not None, pass_fds=tuple(fds))
        except BaseException:
            os.close(watch_w)
            raise
        finally:
            for fd in fds:
                os.close(fd)
            if log_fd is not None:
                os.close(log_fd)
            if term is not None and stdout_fd is not None:
                os.close(stdout_fd)  # the slave: the command has it now
        if gov is not None:
            gov.start(proc.pid, time.monotonic())
        if term is not None:
            term.start()
        try:
            timed_out, survivors, tripped = self._wait(proc, tier, timeout_s, interactive, gov,
                                                       term)
        finally:
            os.close(watch_w)
        duration_ms = round((time.perf_counter() - t0) * 1000, 3)
        killed = tripped is not None
        if gov is not None:  # every process is gone: the last look, then the cgroups go
            if not timed_out:
                tripped = gov.finish(tripped)
            gov.close()
        with open(status, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        if "@compat" in lines and "@ok" not in lines:  # an older kernel: the long way next
            _COMPAT_MOUNT.add(tier)
            self._failure = COMPAT
            return None
        if "@ok" not in lines and not timed_out and not killed:
            self._failure = "; ".join(line.removeprefix("@fail ").strip() for line in lines
                                      if line.strip()) or f"the helper exited {proc.returncode}"
            return None
        refused = [line.removeprefix("@refused ") for line in lines
                   if line.startswith("@refused ")]
        if refused:
            raise IsolationUnavailable(f"the governor could not confine the run: "
                                       f"{'; '.join(refused)}", tier=tier)
        if box is not None and SANDBOXED not in lines and not timed_out and not killed:
            why = _tail(log, 2048).strip() if log is not None else ""
            raise IsolationUnavailable(
                "the sandbox (bwrap) could not be set up here; nothing ran"
                + (f": {why}" if why else " (its message went to the terminal)"),
                tier="sandbox")
        code: int | None = None
        for line in lines:
            if line.startswith("@exit "):
                code = int(line.split()[1])
            elif line == "@timeout":
                timed_out = True
            elif line.startswith("@fail "):
                survivors = max(survivors, 1)
        if code is None and not timed_out:
            code = exit_code(proc.returncode)
        if timed_out:
            tripped = None  # the plain timeout stopped it: RunResult names it timeout_ms
        report = None
        if gov is not None:
            if killed:
                code = None  # we killed it
            report = gov.report(duration_ms)
        return RunResult(tier=tier, namespace="pid" if copy_ns else _namespace(tier),
                         command=argv, cwd=view_cwd, exit_code=None if timed_out else code,
                         timed_out=timed_out, duration_ms=duration_ms, log_path=log,
                         tail=None if log is None else _tail(log, tail_bytes),
                         interactive=interactive, survivors=survivors,
                         sandbox=None if box is None else box.info, tripped=tripped,
                         governor=report, tty=term is not None)

    def _wait(self, proc: subprocess.Popen[bytes], tier: str, timeout_s: float | None,
              interactive: bool, gov: Governor | None = None, term: Terminal | None = None
              ) -> tuple[bool, int, str | None]:
        """Wait for the helper; kill everything on timeout, on a tripped limit or on an
        exception (then re-raise). Returns (timed out, survivors, tripped limit)."""
        budget = timeout_s
        if tier == COPY and timeout_s is not None:
            budget = timeout_s + REAPER_GRACE_S
        saved = []
        own_session = not interactive or term is not None
        if interactive and term is None:  # like system(3): ^C and ^\ are for the command
            for sig in (signal.SIGINT, signal.SIGQUIT):
                try:
                    saved.append((sig, signal.signal(sig, signal.SIG_IGN)))
                except ValueError:
                    pass  # not the main thread: signals cannot be changed from here
        try:
            try:
                if gov is not None:
                    return self._wait_governed(proc, tier, budget, own_session, gov, term)
                _wait_exit(proc, budget, term)
                return False, 0, None
            except subprocess.TimeoutExpired:
                return True, self._kill(proc, tier, own_session), None
            except BaseException:
                if gov is not None:
                    gov.kill(gov.stop_tree())
                self._kill(proc, tier, own_session)
                raise
        finally:
            for sig, old in saved:
                signal.signal(sig, old)

    def _wait_governed(self, proc: subprocess.Popen[bytes], tier: str, budget: float | None,
                       own_session: bool, gov: Governor, term: Terminal | None = None
                       ) -> tuple[bool, int, str | None]:
        """Wait, sampling the run every tick (the governor sets the pace); on a tripped limit
        stop the whole tree (SIGSTOP), then kill it."""
        t0 = gov.t0
        deadline = None if budget is None else t0 + budget
        runtime_ms = gov.limits.runtime_ms
        stop_at = None if runtime_ms is None else t0 + runtime_ms / 1000
        while True:
            now = time.monotonic()
            step = gov.interval_s
            for d in (deadline, stop_at):
                if d is not None:
                    step = min(step, max(0.0, d - now))
            try:
                _wait_exit(proc, step, term)
                return False, 0, None
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise subprocess.TimeoutExpired(proc.args, budget or 0.0)
            trip = "max_runtime_ms" if stop_at is not None and now >= stop_at else \
                gov.sample(now)
            if trip is not None:
                gov.kill(gov.stop_tree())
                return False, self._kill(proc, tier, own_session), trip

    def _kill(self, proc: subprocess.Popen[bytes], tier: str, own_session: bool) -> int:
        """Kill the command's every process; return how many survived (should be 0).
        ``own_session``: the helper leads a session of its own (its process group is ours
        to kill)."""
        if tier == COPY and ns_of_children(proc.pid) is None:
            proc.send_signal(signal.SIGTERM)  # the supervisor kills its descendants
            try:
                proc.wait(KILL_WAIT_S)
                return 0
            except subprocess.TimeoutExpired:
                pass
        ns = ns_of_children(proc.pid)
        kids = children_of(proc.pid)  # PID 1 of the namespace: its death kills the rest
        # unshare first: killed, it cannot write about its child's death into the log
        proc.kill()
        if own_session:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait()
        return reap_namespace(ns)

    # -- capture and cleanup -----------------------------------------------------------------

    def capture(self, select: Callable[[str], bool] | None = None) -> Capture:
        """What the runs so far changed, relative to the repo root. ``select(path)`` narrows
        it (e.g. the paths a stage-cmd promotes); the content of a write stays readable at its
        ``source`` until ``close``."""
        if self._closed:
            raise UsageError("this staged view is closed")
        if not self._ran:
            return Capture()
        if self.tier == COPY:
            assert self._copy_root is not None and self._before is not None
            return capture_copy(self._copy_root, self._before, self.layer, self.ignore, select)
        assert self._upper is not None
        return capture_upper(self._upper, self.layer, self.ignore, fuse=self.tier == FUSE,
                             select=select)

    def close(self) -> None:
        """Remove everything the view made: the staged layer, the upper and work dirs, the
        copy, logs kept in the view's dir. Large trees go to the trash at once and are deleted
        in the background. Idempotent."""
        if self._closed:
            return
        assert not self._running, "close() while a run is in progress"
        self._closed = True
        if self._layer_dir is not None:
            rmtree(self._layer_dir)  # tmpfs, and small: at once
        if self._copy_base is not None:
            discard(self._copy_base)
        if self._mounts_dir is not None:
            discard(self._mounts_dir)
        discard(self.dir, self.trash_dir)

    def __enter__(self) -> StagedView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_pid_ns_cache: bool | None = None
_COMPAT_MOUNT: set[str] = set()  # tiers whose mount(8) -a was refused here: the long way
COMPAT = "@compat"
# no xattr written at mount, no sync when the namespace dies (see _procs.py); a kernel that does
# not know them makes the first run of a process take the long way (mounter "overlay")
FAST_MOUNT_OPTS = ",uuid=off,volatile"
def _pid_ns_ok() -> bool:
    """Can we make a PID namespace here (``unshare --pid``)? Tried once per process: root in
    a container may lack the capability."""
    global _pid_ns_cache
    if _pid_ns_cache is None:
        unshare = _which("unshare")
        try:
            _pid_ns_cache = unshare is not None and subprocess.run(
                [unshare, "--pid", "--fork", "--kill-child", "--", "/bin/true"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S, check=False
            ).returncode == 0
        except (OSError, subprocess.SubprocessError):
            _pid_ns_cache = False
    return _pid_ns_cache


def _wait_exit(proc: subprocess.Popen[bytes], timeout_s: float | None,
               term: Terminal | None = None) -> None:
    """``proc.wait(timeout_s)``, but woken by the exit itself (a pidfd) rather than by
    Popen's polling, whose sleeps double up to 50 ms and add to every run's duration. With
    ``term``, relay the terminal meanwhile."""
    if term is not None:
        _relay_until_exit(proc, timeout_s, term)
        return
    if timeout_s is None or proc.returncode is not None:
        proc.wait()
        return
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # Linux < 5.3, or reaped already
        proc.wait(timeout_s)
        return
    try:
        if not wait_ready([pidfd], [], timeout_s)[0]:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
    finally:
        os.close(pidfd)
    proc.wait()


def _relay_until_exit(proc: subprocess.Popen[bytes], timeout_s: float | None,
                      term: Terminal) -> None:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # Linux < 5.3, or reaped already: poll
        pidfd = None
    try:
        while proc.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout_s or 0.0)
            rd, wr = term.fds()
            poll_s = STOP_POLL_S if pidfd is not None else min(STOP_POLL_S, RELAY_POLL_S)
            left = poll_s if left is None else min(left, poll_s)
            if pidfd is not None:
                rd = [*rd, pidfd]
            ready_r, ready_w = wait_ready(rd, wr, left)
            term.pump(ready_r, ready_w)
            if pidfd is not None and pidfd in ready_r:
                break
            term.watch_stop()
    finally:
        if pidfd is not None:
            os.close(pidfd)
    proc.wait()


def _namespace(tier: str) -> str | None:
    """What isolates a command of ``tier`` (None: no namespace, the copy tier)."""
    if tier == COPY:
        return None
    return "mount+pid" if os.geteuid() == 0 else "user+mount+pid"


def _tail(path: str, n: int) -> str:
    if n == 0:
        return ""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - n))
        return f.read(n).decode("utf-8", errors="replace")
