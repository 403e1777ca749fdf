"""What the host lets us confine a command with, and the pieces that do it.

- ``without_view_changing_caps``: a root command's bounding set cut to ROOT_CAPS (``setpriv``),
  so that it cannot undo the view's mounts or get past them (docs/staged-view.md, "Root in the
  view");
- ``copy_confinement``: how the copy tier keeps a command out of the real repository (a mount
  namespace where it is read-only, else Landlock, else why neither);
- ``memfd``: an fstab in memory, for one mount(8) -a of several mounts;
- ``_which``, ``_userns_refusal``: what is installed, and whether user namespaces are allowed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess

from ..errors import IsolationUnavailable
from ._procs import ROOT_CAPS

SYS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROBE_TIMEOUT_S = 10.0
LANDLOCK_CREATE_RULESET = 444  # the syscall's number (asm-generic: every architecture)
WATCH_FD_MIN = 10  # descriptors we pass to the helper: above its own 3..9

_confinement: str | None = None


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + SYS_PATH)


def _userns_refusal() -> str | None:
    """Why an unprivileged user namespace cannot be had here (None: it can, as far as the
    host's settings tell)."""
    for path, bad in (("/proc/sys/user/max_user_namespaces", "0"),
                      ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
                      ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1")):
        try:
            with open(path) as f:
                if f.read().strip() == bad:
                    return f"{path} is {bad}: no user namespaces for users other than root"
        except OSError:
            pass
    return None


_setpriv: str | None = None


def memfd(text: str) -> int:
    """A sealed-off in-memory file holding ``text`` (an fstab for mount -a), at a descriptor
    of 10 or above, close-on-exec here (passed on explicitly)."""
    fd = os.memfd_create("agent-2pc-fstab", os.MFD_CLOEXEC)
    try:
        os.write(fd, text.encode("utf-8", "surrogateescape"))
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, WATCH_FD_MIN)
    finally:
        os.close(fd)
    return high


def without_view_changing_caps(cmd: list[str], tier: str) -> list[str]:
    """``cmd`` run as root with a bounding set of ROOT_CAPS only (``setpriv``): without
    CAP_SYS_ADMIN (umount, remount, setns, pivot_root), CAP_DAC_READ_SEARCH
    (open_by_handle_at), CAP_SYS_PTRACE, CAP_MKNOD, CAP_SYS_MODULE, CAP_SYS_RAWIO, ...
    nothing can undo or get past the view."""
    global _setpriv
    if _setpriv is None:
        _setpriv = _which("setpriv") or ""
    if not _setpriv:
        raise IsolationUnavailable("setpriv(1) (util-linux) is not installed: a command run "
                                   "as root would keep the capabilities that undo the view",
                                   tier=tier)
    keep = ",".join("+" + name for name in ROOT_CAPS)
    return [_setpriv, "--bounding-set", f"-all,{keep}", "--inh-caps", "-all", "--", *cmd]


def copy_confinement() -> str:
    """How the copy tier keeps a command out of the real repository here: ``ns`` (a private
    mount namespace where it is read-only: root, or a user namespace), ``landlock``, or why
    neither can be had. Tried once per process."""
    global _confinement
    if _confinement is None:
        _confinement = _probe_confinement()
    return _confinement


def _probe_confinement() -> str:
    unshare = _which("unshare")
    refusal = _userns_refusal() if os.geteuid() != 0 else None
    if unshare is not None and _which("mount") is not None and refusal is None:
        head = [unshare] + (["--user", "--map-root-user"] if os.geteuid() != 0 else [])
        try:
            if subprocess.run([*head, "--mount", "--propagation", "private", "--", "/bin/true"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S,
                              check=False).returncode == 0:
                return "ns"
        except (OSError, subprocess.SubprocessError):
            pass
    landlock = _probe_landlock()
    if landlock == "landlock":
        return landlock
    return ("no private mount namespace (" + (refusal or "unshare --mount is refused") +
            f") and no Landlock ({landlock})")


def _probe_landlock() -> str:
    """``landlock`` when the kernel has it, else why not."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(LANDLOCK_CREATE_RULESET, None, 0, 1)
    if abi >= 1:
        return "landlock"
    return f"Linux 5.13+ with the landlock LSM: {os.strerror(ctypes.get_errno())}"
