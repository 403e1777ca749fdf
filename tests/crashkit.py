"""Helpers for the crash tests: a small repo, a transaction that touches it in every way, tree
snapshots, and running the CLI in a child process that a crash point or SIGKILL ends."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from agent_2pc import Agent2PC
from agent_2pc.storage import wal_format

BEFORE = {
    "keep.txt": b"untouched\n",
    "mod1.txt": b"one\ntwo\nthree\n",
    "mod2.py": b"def f():\n    return 1\n",
    "gone.txt": b"to be deleted\n",
    "old/only.txt": b"its directory goes with it\n",
    "bin.dat": bytes(range(256)),
}


def snapshot(root: str | Path) -> dict[str, tuple[bytes, int] | str]:
    """Every file (content, mode), symbolic link ("symlink:" + target) and directory (with its
    mode) under root, but .git and .agent-tx."""
    root = str(root)
    out: dict[str, tuple[bytes, int] | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in (".git", ".agent-tx")]
        else:
            out[rel_dir + "/"] = f"dir {stat.S_IMODE(os.lstat(dirpath).st_mode):o}"
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = [d for d in dirnames if d not in links]
        for name in [*filenames, *links]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = "symlink:" + os.readlink(path)
                continue
            with open(path, "rb") as f:
                out[rel] = (f.read(), stat.S_IMODE(os.lstat(path).st_mode))
    return out


def write_files(root: Path, files: dict[str, bytes]) -> None:
    """``files`` (path -> content) under ``root``, mode 0644, parents made."""
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(0o644)


def make_repo(root: Path) -> Agent2PC:
    write_files(root, BEFORE)
    (root / "mod2.py").chmod(0o755)
    return Agent2PC.init(root)


def stage_everything(client: Agent2PC) -> str:
    """One transaction that modifies, creates (in new directories), deletes and chmods."""
    tx = client.begin(label="crash test")
    tx.stage_replace("mod1.txt", "two", "TWO")
    tx.stage_write("mod2.py", "def f():\n    return 2\n")
    tx.stage_write("new/deep/file.txt", "created\n", mode=0o600)
    tx.stage_delete("gone.txt")
    tx.stage_delete("old/only.txt")
    tx.stage_write("bin.dat", bytes(reversed(range(256))))
    return tx.tid


def cli(root: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60
        ) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.pop("AGENT2PC_CRASH_AT", None)
    full_env.pop("AGENT2PC_STALL_AT", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "agent_2pc", "--root", str(root), *args,
                           "--json"], env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def wal_is_clean(root: Path) -> bool:
    data = (root / ".agent-tx" / "wal.bin").read_bytes()
    return wal_format.decode(data).damage is None


def tree_files_with_temp_names(root: Path) -> list[str]:
    bad = []
    for rel in snapshot(root):
        name = rel.rstrip("/").rsplit("/", 1)[-1]
        if ".tmp" in name or "a2pc" in name:
            bad.append(rel)
    return bad


def assert_recovered_and_usable(root: Path) -> None:
    """What every crash test checks at the end: no temporary file left in the tree, a log
    without damage, and a new transaction commits."""
    assert tree_files_with_temp_names(root) == []
    assert wal_is_clean(root)
    c = Agent2PC(root)
    tx = c.begin()
    tx.stage_write("after.txt", "works\n")
    assert tx.commit()["state"] == "committed"
    assert (root / "after.txt").read_text() == "works\n"
    c.close()
