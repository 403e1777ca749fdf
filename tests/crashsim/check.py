"""Running agent-2pc on a crash state, and the invariants it must keep.

Commands run as the CLI runs them (``agent_2pc.cli.main.main`` with the same arguments) in a
child process forked from a process that imported agent-2pc once: a fork costs a millisecond
where starting Python costs a hundred, and the explorer runs thousands.
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import sys
import tempfile
import time
import traceback

from agent_2pc.storage import wal_format

TREE_SKIP = (".git", ".agent-tx")


def warm_up() -> None:
    """Import what the commands import, so that forked children start warm."""
    import agent_2pc.cli.commands  # noqa: F401
    import agent_2pc.cli.main  # noqa: F401
    import agent_2pc.coordinator.client  # noqa: F401
    import agent_2pc.fence  # noqa: F401
    import agent_2pc.participants.api  # noqa: F401

    try:
        import httpx  # noqa: F401
    except ImportError:
        pass


def run_cli(root: str, args: list[str], env: dict[str, str] | None = None,
            timeout_s: float = 60.0) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``agent-2pc --root ROOT ARGS --json``."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: becomes the CLI
            code = 70
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.environ.update(env or {})
                os.chdir(root)
                from agent_2pc.cli.main import main

                code = main(["--root", root, *args, "--json"])
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
                code = 1  # what Python exits with on an uncaught exception
            finally:
                os._exit(code)
        code = _wait(pid, timeout_s)
        out.seek(0)
        err.seek(0)
        return code, out.read().decode("utf-8", "replace"), err.read().decode("utf-8",
                                                                               "replace")


def _wait(pid: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9
        select.select([], [], [], 0.002)


def tree_view(root: str) -> dict[str, tuple[str, ...]]:
    """The tree as a user sees it (not .git, not .agent-tx): kind, mode, content."""
    out: dict[str, tuple[str, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in TREE_SKIP]
        else:
            out[rel_dir] = ("dir", oct(stat.S_IMODE(os.lstat(dirpath).st_mode)))
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = [d for d in dirnames if d not in links]
        for name in [*filenames, *links]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            else:
                with open(path, "rb") as f:
                    data = f.read()
                out[rel] = ("file", oct(stat.S_IMODE(st.st_mode)), _short(data))
    return out


def _short(data: bytes) -> str:
    import hashlib

    if len(data) <= 40:
        return repr(data)
    return f"{len(data)} bytes sha256:{hashlib.sha256(data).hexdigest()[:16]}"


def tree_diff(got: dict[str, tuple[str, ...]], want: dict[str, tuple[str, ...]],
              limit: int = 6) -> list[str]:
    out = []
    for rel in sorted(set(got) | set(want)):
        if got.get(rel) != want.get(rel):
            out.append(f"{rel}: {got.get(rel, 'absent')} (expected {want.get(rel, 'absent')})")
            if len(out) >= limit:
                out.append("...")
                break
    return out


class LogView:
    """What a workspace's log and history say, read without agent-2pc's code paths that
    repair anything."""

    def __init__(self, root: str) -> None:
        path = os.path.join(root, ".agent-tx", "wal.bin")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        dec = wal_format.decode(data)
        self.damage = dec.damage
        self.records = dec.records
        self.decisions: dict[str, str] = {}
        self.ended: dict[str, str] = {}
        self.tids: set[str] = set()
        for rec in dec.records:
            self.tids.add(rec["tid"])
            if rec["type"] == "decision":
                self.decisions[rec["tid"]] = rec["outcome"]
            elif rec["type"] == "end":
                self.ended[rec["tid"]] = rec.get("state", "")
        self.history: dict[str, str] = {}
        try:
            with open(os.path.join(root, ".agent-tx", "history.jsonl"), "rb") as f:
                for line in f.read().splitlines():
                    try:
                        obj = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(obj, dict) and "tid" in obj:
                        self.history[obj["tid"]] = obj.get("state", "")
        except FileNotFoundError:
            pass

    def decided(self, tid: str) -> str | None:
        """commit, abort, or None: what the durable records say of ``tid``."""
        if tid in self.decisions:
            return self.decisions[tid]
        state = self.history.get(tid)
        if state == "committed":
            return "commit"
        if state == "aborted":
            return "abort"
        return None

    def known(self) -> set[str]:
        return self.tids | set(self.history)


def fence_entry(root: str, intent: str) -> dict[str, object] | None:
    """The fence's entry of ``intent`` in a copy of .agent-tx/fence.db (the copy keeps the
    original untouched: opening a SQLite database may recover its WAL)."""
    import shutil
    import sqlite3

    src = os.path.join(root, ".agent-tx", "fence.db")
    if not os.path.exists(src):
        return None
    with tempfile.TemporaryDirectory() as d:
        for suffix in ("", "-wal"):
            if os.path.exists(src + suffix):
                shutil.copyfile(src + suffix, os.path.join(d, "fence.db" + suffix))
        conn = sqlite3.connect(os.path.join(d, "fence.db"))
        try:
            row = conn.execute("SELECT state, generation, cert FROM fence_entries "
                               "WHERE intent = ?", (intent,)).fetchone()
        except sqlite3.DatabaseError as exc:
            return {"error": str(exc)}
        finally:
            conn.close()
    if row is None:
        return None
    cert = json.loads(row[2]) if row[2] else None
    return {"state": row[0], "generation": row[1], "cert": cert.get("hash") if cert else None}
