"""The sandbox: a run confined by bubblewrap, inside whatever tier made the view.

bwrap runs as the last wrapper before the command — inside the overlay helper's mount
namespace (where the view is already mounted over the repo's path), or under the copy tier's
supervisor — and builds a new mount, PID, IPC, UTS and (unless the network is asked for)
network namespace:

  --ro-bind / /              the whole host, read-only (recursively: every submount too)
  --dev /dev                 a minimal /dev: null zero full random urandom tty, a private
                             devpts and /dev/shm
  --proc /proc               the proc of the sandbox's own PID namespace
  --tmpfs /tmp               a private, empty /tmp (sized when the governor bounds the disk);
                             $TMPDIR points there (elsewhere is read-only)
  --bind VIEW VIEW           the staged view, the only writable place (so capture still works)
  (readonly=)                more binds, read-only (none by default: the view has no
                             .agent-tx/, so the workspace is not in the sandbox either)
  --unshare-all              + --share-net only when the network is asked for; otherwise a
                             new network namespace whose only interface is loopback
  --cap-drop ALL             no capabilities, even as root; bwrap always sets no_new_privs
  --die-with-parent          the sandbox dies with whoever started it
  --new-session              (non-interactive runs) no way to push input into our terminal

The command starts through a shim inside the sandbox that reports ``@sandboxed`` on the
run's status descriptor and closes it: when that line is missing, bwrap failed before the
command could start (its message is in the log), and the run raises IsolationUnavailable —
nothing ever runs unconfined when confinement was asked for.
"""

from __future__ import annotations

import os
import shutil
import subprocess

SYS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VERSION_TIMEOUT_S = 10.0
# The shim: runs inside the sandbox with the status file on fd 3.
SHIM = 'echo @sandboxed >&3; exec 3>&-; exec "$@"'
SANDBOXED = "@sandboxed"

_probe: tuple[str | None, str | None, str | None] | None = None  # (bwrap, version, why not)


def probe_sandbox(refresh: bool = False) -> str | None:
    """None when the host may have the sandbox (bubblewrap is installed), else why not."""
    return _probed(refresh)[2]


def _probed(refresh: bool = False) -> tuple[str | None, str | None, str | None]:
    global _probe
    if _probe is not None and not refresh:
        return _probe
    path = shutil.which("bwrap", path=os.environ.get("PATH", "") + os.pathsep + SYS_PATH)
    if path is None:
        _probe = (None, None, "bubblewrap (bwrap) is not installed")
        return _probe
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True,
                             timeout=VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        _probe = (None, None, f"{path} cannot be run: {exc}")
        return _probe
    if out.returncode != 0:
        _probe = (None, None, f"{path} --version failed: {out.stderr.strip()}")
        return _probe
    version = out.stdout.strip().rpartition(" ")[2] or None
    _probe = (path, version, None)
    return _probe


class Sandbox:
    """What confines one run: ``argv(command)`` wraps a command, ``info`` says how."""

    def __init__(self, *, view_root: str, cwd: str, network: bool, interactive: bool,
                 readonly: tuple[str, ...] = (), tmp_size_bytes: int | None = None) -> None:
        bwrap, version, why = _probed()
        assert bwrap is not None, why
        self.bwrap = bwrap
        self.version = version
        self.view_root = view_root
        self.cwd = cwd
        self.network = network
        self.interactive = interactive
        self.readonly = readonly
        self.tmp_size_bytes = tmp_size_bytes

    def argv(self, command: list[str]) -> list[str]:
        out = [self.bwrap, "--unshare-all"]
        if self.network:
            out.append("--share-net")
        out += ["--die-with-parent", "--cap-drop", "ALL"]
        if not self.interactive:
            out.append("--new-session")
        out += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        if self.tmp_size_bytes is not None:
            out += ["--size", str(self.tmp_size_bytes)]
        out += ["--tmpfs", "/tmp", "--bind", self.view_root, self.view_root]
        for path in self.readonly:
            out += ["--ro-bind", path, path]
        out += ["--setenv", "TMPDIR", "/tmp", "--chdir", self.cwd,
                "--", "/bin/sh", "-c", SHIM, "agent-2pc-sandbox"]
        return out + command

    @property
    def overhead_tasks(self) -> int:
        """Processes bwrap itself keeps in the run: the monitor and PID 1 of the sandbox."""
        return 2

    @property
    def info(self) -> dict[str, object]:
        namespaces = ["mount", "pid", "ipc", "uts"] + ([] if self.network else ["net"])
        return {"tool": "bwrap", "version": self.version, "network": self.network,
                "readonly_host": True, "private_tmp": True,
                "tmp_size_bytes": self.tmp_size_bytes, "writable": [self.view_root],
                "readonly_inside_view": list(self.readonly), "dev": "minimal",
                "proc": "own pid namespace", "namespaces": namespaces,
                "no_new_privs": True, "capabilities": [],
                "new_session": not self.interactive, "env": {"TMPDIR": "/tmp"}}
