"""Fixtures for the staged-view tests.

    def test_x(staged, tier):            # every tier the host has (others are skipped)
        with staged.view(tier) as view:   # StagedView on the staged transaction
            res = view.run("cat src/app.py")
        assert staged.tree_hash() == staged.before

``staged`` is a git repository made a workspace, holding the files of ``FILES``, with one
active transaction that stages ``STAGED`` (writes, a new file in new directories, a mode
change, deletes -- one of which empties ``old/``). ``staged.before`` is the hash of the whole
tree (.git included, .agent-tx left out) taken after staging.

The repository lives in a directory that other users may enter, so a test can also run
there as ``nobody``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import Any, Iterator

import pytest

from agent_2pc import Agent2PC
from agent_2pc.isolation import TIERS, StagedView, probe_tiers

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "src")

FILES = {
    "README.md": b"# demo\n",
    "src/app.py": b"def answer():\n    return 41\n",
    "src/util.py": b"X = 1\n",
    "bin/run.sh": (b"#!/bin/sh\necho run\n", 0o755),
    "docs/guide.txt": b"guide\n",
    "gone.txt": b"to be deleted by the transaction\n",
    "old/only.txt": b"its directory goes with it\n",
    "data/blob.bin": bytes(range(256)) * 16,
}
STAGED_WRITES = {
    "src/app.py": b"def answer():\n    return 42\n",
    "new/deep/made.txt": b"created by the transaction\n",
}


def tree_hash(root: str) -> str:
    """One hash of every path, kind, mode and content under ``root`` (.agent-tx left out;
    .git included: a view must not touch it either)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != ".agent-tx"]
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            h.update(f"{os.path.join(rel_dir, name)}\0{st.st_mode:o}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(full).encode())
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


class Staged:
    def __init__(self, root: str, client: Agent2PC) -> None:
        self.root = root
        self.client = client
        self.tx = client.begin(label="staged view")
        for rel, data in STAGED_WRITES.items():
            self.tx.stage_write(rel, data)
        self.tx.stage_write("bin/run.sh", b"#!/bin/sh\necho staged\n", mode=0o700)
        self.tx.stage_delete("gone.txt")
        self.tx.stage_delete("old/only.txt")
        self.before = self.tree_hash()

    @property
    def changes(self) -> list[Any]:
        return self.client.engine.txs[self.tx.tid].changes()

    def view(self, tier: str | None, **kw: Any) -> StagedView:
        kw.setdefault("scratch_dir", self.scratch)
        return StagedView(self.root, self.changes, self.client.engine.blobs, tier=tier, **kw)

    @property
    def scratch(self) -> str:
        return os.path.join(self.root, ".agent-tx", "tx", self.tx.tid)

    def tree_hash(self) -> str:
        return tree_hash(self.root)

    def write(self, rel: str, data: bytes, mode: int | None = None) -> None:
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(path, mode)


@pytest.fixture
def shared_tmp() -> Iterator[str]:
    """A temporary directory any user may enter (pytest's tmp_path is private to us)."""
    d = tempfile.mkdtemp(prefix="a2pc-iso-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def staged(shared_tmp: str) -> Staged:
    root = os.path.join(shared_tmp, "repo")
    os.mkdir(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    for rel, spec in FILES.items():
        data, mode = spec if isinstance(spec, tuple) else (spec, 0o644)
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "-C", root]
    subprocess.run(["git", "init", "-q", root], check=True, capture_output=True, env=env)
    subprocess.run(git + ["add", "-A"], check=True, capture_output=True, env=env)
    subprocess.run(git + ["commit", "-qm", "init"], check=True, capture_output=True, env=env)
    client = Agent2PC.init(root)
    return Staged(os.path.realpath(root), client)


@pytest.fixture(params=TIERS)
def tier(request: pytest.FixtureRequest) -> str:
    why = probe_tiers()[request.param]
    if why is not None:
        pytest.skip(f"{request.param}: {why}")
    return str(request.param)


@pytest.fixture(params=[t for t in TIERS if t != "copy"])
def overlay_tier(request: pytest.FixtureRequest) -> str:
    why = probe_tiers()[request.param]
    if why is not None:
        pytest.skip(f"{request.param}: {why}")
    return str(request.param)


@pytest.fixture(autouse=True)
def _no_tier_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT2PC_ISOLATION", raising=False)


def pids_matching(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ")
            with open(f"/proc/{name}/stat", "rb") as f:
                st = f.read()
        except OSError:
            continue
        if marker.encode() in cmdline and st[st.rfind(b")") + 2:][:1] not in (b"Z", b"X"):
            out.append(int(name))
    return out


PYTHON = sys.executable
# The sandbox gives commands a private, empty /tmp: a virtualenv of a checkout under /tmp (as
# `mktemp -d` makes for CI) is invisible there. Its base interpreter is not; sandboxed runs
# of stdlib-only scripts use that.
SANDBOX_PYTHON = os.path.realpath(sys.executable)


NOBODY = 65534


def hand_to_nobody(root: str, shared_tmp: str) -> str:
    """Give the repository at ``root`` (but .agent-tx) to nobody, and a scratch directory
    beside it for the views; return the scratch directory."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".agent-tx"]
        for name in [*dirnames, *filenames, "."]:
            os.lchown(os.path.join(dirpath, name), NOBODY, NOBODY)
    scratch = os.path.join(shared_tmp, "scratch")
    os.mkdir(scratch)
    os.chown(scratch, NOBODY, NOBODY)
    return scratch


def nobody_can_run(python: str = sys.executable) -> None:
    """Skip unless an unprivileged user can run ``python`` and import our source tree: a
    checkout under a private directory (``mktemp -d`` is 0700) cannot be entered by nobody,
    and the tests that drop to nobody would fail for that reason alone."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to become an unprivileged user (setpriv)")
    proc = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                           "--clear-groups", python, "-c",
                           "import sys; sys.path.insert(0, sys.argv[1]); import agent_2pc", SRC],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    if proc.returncode != 0:
        pytest.skip("an unprivileged user cannot run the interpreter or read the source "
                    f"tree from here (a parent directory is private?): {proc.stderr.strip()}")

