"""Root inside the view cannot leave it (issue 10.3): a command run as root without the
sandbox keeps only a container runtime's capabilities (no CAP_SYS_ADMIN, CAP_DAC_READ_SEARCH,
CAP_SYS_PTRACE, CAP_MKNOD, ...) and sees /proc/sys read-only, so it can neither undo the view's
mounts nor get past them, in any tier; not as root, the mounts are locked (user namespaces).
Every attack below wrote the real tree, or could have, before."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys

import pytest

from agent_2pc.isolation import _view

from .conftest import NOBODY, SRC, hand_to_nobody, nobody_can_run

pytestmark = pytest.mark.timeout(120)

A2PC = [sys.executable, "-m", "agent_2pc"]
# an interpreter any user may run (a virtualenv's may sit below a private home)
SHARED_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * 128)]


def handle_of(path: str) -> tuple[int, str]:
    """(type, hex bytes) of ``path``'s file handle (name_to_handle_at), as an attacker who
    knows or guesses the inode would build it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fh = FileHandle(handle_bytes=128)
    mount_id = ctypes.c_int()
    rc = libc.name_to_handle_at(-100, os.fsencode(path), ctypes.byref(fh),
                                ctypes.byref(mount_id), 0)
    assert rc == 0, os.strerror(ctypes.get_errno())
    return fh.handle_type, bytes(fh.f_handle[:fh.handle_bytes]).hex()


BY_HANDLE = """
import ctypes, os, sys
class FH(ctypes.Structure):
    _fields_ = [("n", ctypes.c_uint), ("t", ctypes.c_int), ("b", ctypes.c_ubyte * 128)]
libc = ctypes.CDLL(None, use_errno=True)
data = bytes.fromhex(sys.argv[2])
fh = FH(len(data), int(sys.argv[1]))
fh.b[:len(data)] = list(data)
mount_fd = os.open("/", os.O_RDONLY)
fd = libc.open_by_handle_at(mount_fd, ctypes.byref(fh), os.O_WRONLY | os.O_APPEND)
if fd >= 0:
    os.write(fd, b"written by handle\\n")
    print("HANDLE-" + "OPENED")
else:
    print("open_by_handle_at:", os.strerror(ctypes.get_errno()))
"""


def attack(root: str, handle: tuple[int, str], python: str = sys.executable) -> str:
    """Undo the view (umount, remount, a new user namespace, setns into any process), get
    past it (a file handle, a block device), or have the kernel run something outside it
    (core_pattern), then write the real tree."""
    return f"""
R={root}
umount -l "$R" 2>&1; umount -l "$PWD" 2>&1
mount -o remount,bind,rw "$R" 2>&1
unshare -Urm sh -c 'umount -l "$1"; echo undone > "$1/real-userns.txt"' sh "$R" 2>&1
for p in /proc/[0-9]*; do
    nsenter -t "${{p#/proc/}}" -m -- sh -c 'echo undone > "$1/real-setns.txt"' sh "$R" 2>/dev/null
done
cat /proc/sys/kernel/core_pattern > /tmp/core-pattern 2>/dev/null
cp /tmp/core-pattern /proc/sys/kernel/core_pattern 2>/dev/null && echo SYSCTL-WRITABLE
mknod /tmp/disk b 254 0 2>/dev/null && echo MKNOD-DONE
{python} -c '{BY_HANDLE}' {handle[0]} {handle[1]}
echo undone > "$R/real.txt"; echo undone >> "$R/README.md"
true
"""


def _env(tier: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    env["AGENT2PC_ISOLATION"] = tier
    return env


@pytest.mark.skipif(os.geteuid() != 0, reason="root's capabilities are what is tested")
@pytest.mark.parametrize("how", ["stage-cmd", "exec"])
def test_root_in_the_view_cannot_undo_it_or_get_past_it(staged, tier, how):
    script = attack(staged.root, handle_of(os.path.join(staged.root, "README.md")))
    args = (["stage-cmd", "--tid", staged.tx.tid, "--command", script] if how == "stage-cmd"
            else ["exec", "--tid", staged.tx.tid, "--", "sh", "-c", script])
    out = subprocess.run([*A2PC, "--json", "--root", staged.root, *args], env=_env(tier),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    said = (json.loads(out.stdout).get("tail") or "") + out.stderr
    for mark in ("SYSCTL-WRITABLE", "MKNOD-DONE", "HANDLE-OPENED"):
        assert mark not in said, said
    assert staged.tree_hash() == staged.before, said
    if how == "exec":  # in the overlay tiers those writes landed in the view: staged, no more
        captured = {c["path"] for c in json.loads(out.stdout)["captured"]}
        assert captured <= {"README.md", "real.txt", "real-userns.txt", "real-setns.txt"}


@pytest.mark.skipif(os.geteuid() != 0, reason="root's capabilities are what is tested")
def test_a_root_command_keeps_only_the_capabilities_of_a_container(staged, tier):
    with staged.view(tier) as view:
        res = view.run("grep CapBnd /proc/self/status", timeout_s=60)
    bounding = int(res.tail.split()[1], 16)
    from agent_2pc.isolation._procs import ROOT_CAPS

    assert bounding == sum(1 << n for n in ROOT_CAPS.values())


UNPRIVILEGED = """
import json, sys
sys.path.insert(0, sys.argv[1])
from agent_2pc.isolation import StagedView
with StagedView(sys.argv[2], [], None, scratch_dir=sys.argv[3], tier=sys.argv[4]) as view:
    res = view.run(sys.argv[5], timeout_s=60)
    print(json.dumps({"exit_code": res.exit_code, "tail": res.tail,
                      "captured": [c.path for c in view.capture().changes]}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to become an unprivileged user")
def test_without_root_the_views_mounts_are_locked(staged, tier, shared_tmp):
    nobody_can_run(SHARED_PYTHON)
    if tier != "copy" and _view._userns_refusal() is not None:
        pytest.skip("no user namespaces for unprivileged users here")
    scratch = hand_to_nobody(staged.root, shared_tmp)
    before = staged.tree_hash()
    script = attack(staged.root, handle_of(os.path.join(staged.root, "README.md")),
                    SHARED_PYTHON)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"}
    proc = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                           "--clear-groups", SHARED_PYTHON, "-c", UNPRIVILEGED, SRC,
                           staged.root, scratch, tier, script],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for mark in ("SYSCTL-WRITABLE", "MKNOD-DONE", "HANDLE-OPENED"):
        assert mark not in out["tail"], out["tail"]
    assert staged.tree_hash() == before, out["tail"]
