"""The workspace: ``.agent-tx/`` at the root of a tree, and how a root is found.

Layout (docs/format.md has the details)::

    .agent-tx/
      FORMAT           "agent-2pc workspace 1"
      wal.bin          the write-ahead log
      lock             flock: appends to the log and log replacement (compaction)
      commit.lock      flock: serializes prepare..end of transactions (and their recovery)
      objects/xx/...   content-addressed staged content; objects/tmp/ for blobs being written
      preimages/       what commits replaced or deleted (<tid>.<k>), kept by hard link
      txlocks          one byte per transaction (OFD lock at an offset from its tid): held while
                       a process works on that transaction (tells liveness)
      tx/<tid>/        per-transaction scratch, for steps that need one
      history.jsonl    one line per finished transaction, moved out of the log by compaction
      trash/           what is being deleted in the background
"""

from __future__ import annotations

import os

from ..errors import NotInitialized, UsageError

DIRNAME = ".agent-tx"
FORMAT_LINE = "agent-2pc workspace 1\n"


class Layout:
    """Absolute paths of everything inside one workspace (pure: no I/O)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.dir = os.path.join(root, DIRNAME)
        self.format = os.path.join(self.dir, "FORMAT")
        self.wal = os.path.join(self.dir, "wal.bin")
        self.lock = os.path.join(self.dir, "lock")
        self.commit_lock = os.path.join(self.dir, "commit.lock")
        self.txlocks = os.path.join(self.dir, "txlocks")
        self.objects = os.path.join(self.dir, "objects")
        self.objects_tmp = os.path.join(self.objects, "tmp")
        self.preimages = os.path.join(self.dir, "preimages")
        self.tx = os.path.join(self.dir, "tx")
        self.history = os.path.join(self.dir, "history.jsonl")
        self.trash = os.path.join(self.dir, "trash")
        self.gc_stamp = os.path.join(self.dir, "gc.stamp")

    def tx_dir(self, tid: str) -> str:
        return os.path.join(self.tx, tid)



def is_workspace(root: str) -> bool:
    return os.path.isdir(os.path.join(root, DIRNAME))


def find_root(explicit: str | None = None, cwd: str | None = None) -> str:
    """The workspace root: ``explicit`` if given, else the nearest ancestor holding .agent-tx/."""
    if explicit is not None:
        if not explicit:
            raise UsageError("--root is empty")
        root = os.path.realpath(explicit)
        if not is_workspace(root):
            raise NotInitialized(f"no agent-2pc workspace at {root} (run 'agent-2pc init' there)",
                                 root=root)
        return root
    here = os.path.realpath(cwd or os.getcwd())
    probe = here
    while True:
        if is_workspace(probe):
            return probe
        parent = os.path.dirname(probe)
        if parent == probe:
            raise NotInitialized(f"no agent-2pc workspace in {here} or above "
                                 "(run 'agent-2pc init' at the repository root)", root=here)
        probe = parent


def init(root: str) -> str:
    """Create the workspace under ``root`` (idempotent); return the real root path."""
    root = os.path.realpath(root)
    if not os.path.isdir(root):
        raise UsageError(f"not a directory: {root}")
    lay = Layout(root)
    fresh = not os.path.isdir(lay.dir)
    for d in (lay.dir, lay.objects, lay.objects_tmp, lay.preimages, lay.tx, lay.trash):
        os.makedirs(d, exist_ok=True)
    for i in range(256):
        os.makedirs(os.path.join(lay.objects, f"{i:02x}"), exist_ok=True)
    # The log is made here, with the directory synced after it: a log that the first append
    # creates has a name no fsync of the log makes durable (tests/crashsim, posix model).
    made = False
    for f in (lay.lock, lay.commit_lock, lay.txlocks, lay.wal):
        if not os.path.exists(f):
            os.close(os.open(f, os.O_WRONLY | os.O_CREAT, 0o644))
            made = True
    if not os.path.exists(lay.format):
        from .durable import write_atomic

        write_atomic(lay.format, FORMAT_LINE.encode())
    if fresh or made:
        from .durable import fsync_dir

        fsync_dir(lay.objects)
        fsync_dir(lay.dir)
        fsync_dir(root)
    _exclude_from_git(root)
    return root


def _exclude_from_git(root: str) -> None:
    """Add .agent-tx/ to .git/info/exclude (never to a tracked .gitignore)."""
    git = os.path.join(root, ".git")
    if os.path.isfile(git):  # a worktree or submodule: "gitdir: <path>"
        with open(git, encoding="utf-8", errors="replace") as f:
            line = f.readline().strip()
        if not line.startswith("gitdir:"):
            return
        git = os.path.normpath(os.path.join(root, line[len("gitdir:"):].strip()))
        common = os.path.join(git, "commondir")
        if os.path.isfile(common):
            with open(common, encoding="utf-8") as f:
                git = os.path.normpath(os.path.join(git, f.read().strip()))
    if not os.path.isdir(git):
        return
    info = os.path.join(git, "info")
    exclude = os.path.join(info, "exclude")
    entry = f"/{DIRNAME}/"
    try:
        with open(exclude, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    if any(line.strip() in (entry, DIRNAME, f"{DIRNAME}/") for line in text.splitlines()):
        return
    os.makedirs(info, exist_ok=True)
    with open(exclude, "a", encoding="utf-8") as f:
        f.write(("" if not text or text.endswith("\n") else "\n") + entry + "\n")
