"""The workspace: ``.agent-tx/`` at the root of a tree, and how a root is found.

Layout (docs/format.md has the details)::

    .agent-tx/
      FORMAT           "agent-2pc workspace 1"
      TRUST            "inode N\nlog ID": the inode of .agent-tx/ where it was made (or
                       trusted), and the random id in its log's header; a copy or a clone has
                       another inode, a log git checked out over it another id (below)
      wal.bin          the write-ahead log
      lock             flock: appends to the log and log replacement (compaction)
      commit.lock      flock: serializes prepare..end of transactions (and their recovery)
      objects/xx/...   content-addressed staged content; objects/tmp/ for blobs being written
      preimages/       what commits replaced or deleted (<tid>.<k>), kept by hard link
      txlocks          one byte per transaction (OFD lock at an offset from its tid): held while
                       a process works on that transaction (tells liveness)
      tx/<tid>/        per-transaction scratch, for steps that need one
      history.jsonl    one line per finished transaction, moved out of the log by compaction
      history/         sealed segments of the history and their index (history_store.py)
      history.head     where history.jsonl's hash chain ended after the latest compaction
      trash/           what is being deleted in the background

Which workspaces are trusted. The log is a list of changes to apply to the tree, so a
workspace is used only when the user made it, here: ``.agent-tx/`` is a real directory owned by
the effective user (or, under sudo, by $SUDO_UID), ``TRUST`` names its inode, and the log
begins with a header carrying the id that ``TRUST`` names too. A ``.agent-tx/`` that came with
a clone, a copy, an archive or another user, or a log that git put there (a checkout
overwrites ignored files), is refused (untrusted_workspace) until the user says so:
``agent-2pc trust`` writes ``TRUST`` again, and $AGENT2PC_SAFE_DIRECTORY (roots separated by
':', or '*') trusts a root whatever its facts, as git's safe.directory does.
"""

from __future__ import annotations

import os
import stat
import time

from ..errors import CorruptWal, NotInitialized, UntrustedWorkspace, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

DIRNAME = ".agent-tx"
FORMAT_LINE = "agent-2pc workspace 1\n"
SAFE_ENV = "AGENT2PC_SAFE_DIRECTORY"
# Roots this process found trusted: what their TRUST says (the inode of .agent-tx/, the id in
# the log's header). The CLI resolves the root twice; the second look is one lstat.
_trusted: dict[str, tuple[int, str]] = {}


class Layout:
    """Absolute paths of everything inside one workspace (pure: no I/O)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.dir = os.path.join(root, DIRNAME)
        self.format = os.path.join(self.dir, "FORMAT")
        self.trust = os.path.join(self.dir, "TRUST")
        self.wal = os.path.join(self.dir, "wal.bin")
        self.lock = os.path.join(self.dir, "lock")
        self.commit_lock = os.path.join(self.dir, "commit.lock")
        self.txlocks = os.path.join(self.dir, "txlocks")
        self.objects = os.path.join(self.dir, "objects")
        self.objects_tmp = os.path.join(self.objects, "tmp")
        self.preimages = os.path.join(self.dir, "preimages")
        self.tx = os.path.join(self.dir, "tx")
        self.history = os.path.join(self.dir, "history.jsonl")
        self.history_head = os.path.join(self.dir, "history.head")
        self.trash = os.path.join(self.dir, "trash")
        self.gc_stamp = os.path.join(self.dir, "gc.stamp")

    def tx_dir(self, tid: str) -> str:
        return os.path.join(self.tx, tid)



def is_workspace(root: str) -> bool:
    """Does ``root`` hold a .agent-tx/ (whether it is trusted is check_trusted's question)?"""
    return os.path.isdir(os.path.join(root, DIRNAME))


def find_root(explicit: str | None = None, cwd: str | None = None, *,
              trusted: bool = True) -> str:
    """The workspace root: ``explicit`` if given, else the nearest ancestor holding .agent-tx/.
    With ``trusted`` (the default), one the user did not make here is refused."""
    if explicit is not None:
        if not explicit:
            raise UsageError("`root` is empty", params=("root",))
        root = os.path.realpath(explicit)
        if not is_workspace(root):
            raise NotInitialized(f"no agent-2pc workspace at {root} (run 'agent-2pc init' there)",
                                 root=root)
        if trusted:
            check_trusted(root)
        return root
    here = os.path.realpath(cwd or os.getcwd())
    probe = here
    while True:
        if is_workspace(probe):
            if trusted:
                check_trusted(probe)
            return probe
        parent = os.path.dirname(probe)
        if parent == probe:
            raise NotInitialized(f"no agent-2pc workspace in {here} or above "
                                 "(run 'agent-2pc init' at the repository root)", root=here)
        probe = parent


def init(root: str) -> str:
    """Create the workspace under ``root`` (idempotent); return the real root path.

    An existing workspace is only checked (trusted, FORMAT and log present) and completed
    (directories and lock files): init never adopts a ``.agent-tx/`` it did not make, and never
    replaces a lost log with an empty one."""
    root = os.path.realpath(root)
    if not os.path.isdir(root):
        raise UsageError(f"not a directory: {root}")
    lay = Layout(root)
    fresh = not os.path.lexists(lay.dir)
    if not fresh:
        check_trusted(root)
        check_intact(lay)
    for d in (lay.dir, lay.objects, lay.objects_tmp, lay.preimages, lay.tx, lay.trash):
        os.makedirs(d, exist_ok=True)
    for i in range(256):
        os.makedirs(os.path.join(lay.objects, f"{i:02x}"), exist_ok=True)
    for f in (lay.lock, lay.commit_lock, lay.txlocks):
        if not os.path.exists(f):
            os.close(os.open(f, os.O_WRONLY | os.O_CREAT, 0o644))
    if fresh:
        from .durable import fsync_dir, write_atomic
        from .wal_format import log_header

        log_id = os.urandom(16).hex()
        write_atomic(lay.wal, log_header(log_id, time.time_ns() // 1_000_000))
        write_atomic(lay.format, FORMAT_LINE.encode())
        write_atomic(lay.trust, _marker(os.lstat(lay.dir).st_ino, log_id))
        fsync_dir(lay.objects)
        fsync_dir(lay.dir)
        fsync_dir(root)
    _exclude_from_git(root)
    return root


def check_intact(lay: Layout, log: bool = True) -> None:
    """FORMAT and the log must be there: a workspace without its log would forget its live
    transactions (and any decided commit not yet applied) without a word. (``log=False``: the
    caller opens the log next, and Log reports a missing one itself.)"""
    try:
        line = _small_file(lay.format).decode("utf-8", "replace")
    except FileNotFoundError:
        raise CorruptWal(f"{lay.format} is missing: {lay.dir} is damaged (restore it from a "
                         f"backup, or write {FORMAT_LINE.strip()!r} into it)",
                         path=lay.format) from None
    if line != FORMAT_LINE:
        raise CorruptWal(f"{lay.format} says {line.strip()[:80]!r}, not "
                         f"{FORMAT_LINE.strip()!r}: another format, or a damaged workspace",
                         path=lay.format)
    if log and not os.path.exists(lay.wal):
        raise CorruptWal(f"{lay.wal} is missing: the log of this workspace is gone, and with "
                         "it every transaction in flight. Restore it, or, to start over, "
                         f"create an empty one (': > {lay.wal}')", path=lay.wal)


def _small_file(path: str) -> bytes:
    """The first 512 bytes of ``path`` (three system calls: open() would build two buffers)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 512)
    finally:
        os.close(fd)


# -- trust ------------------------------------------------------------------------------------


def _marker(dir_ino: int, log_id: str) -> bytes:
    """TRUST's content: the inode of .agent-tx/, and the id its log's header carries."""
    return f"inode {dir_ino}\nlog {log_id}\n".encode()


def _read_marker(trust_path: str) -> tuple[int, str] | None:
    try:
        lines = _small_file(trust_path).decode("ascii", "replace").splitlines()
    except FileNotFoundError:
        return None
    try:
        kind, dir_ino = lines[0].split(" ")
        log, log_id = lines[1].split(" ")
        if kind != "inode" or log != "log" or not log_id:
            return None
        return int(dir_ino), log_id
    except (IndexError, ValueError):
        return None


def _owned(st: os.stat_result) -> bool:
    """Made by this user: the effective uid (or, for root under sudo, the caller's)."""
    euid = os.geteuid()
    if st.st_uid == euid:
        return True
    return euid == 0 and os.environ.get("SUDO_UID") == str(st.st_uid)


def _safe_by_env(root: str) -> bool:
    value = os.environ.get(SAFE_ENV)
    if not value:
        return False
    return any(p == "*" or (p and os.path.realpath(p) == root) for p in value.split(":"))


def check_trusted(root: str) -> None:
    """Refuse (UntrustedWorkspace) a workspace the user did not make here (module docstring);
    the log's header is checked where the log is opened (log_check). (Paths by hand: a
    Layout costs more than the check.)"""
    ws = os.path.join(root, DIRNAME)
    try:
        st = os.lstat(ws)
    except FileNotFoundError:
        raise NotInitialized(f"no agent-2pc workspace at {root}", root=root) from None
    known = _trusted.get(root)
    if known is not None and known[0] == st.st_ino and _owned(st):
        return
    if _safe_by_env(root):
        return
    marker = _read_marker(ws + "/TRUST")
    why = _distrust(st, marker)
    if why is not None:
        raise UntrustedWorkspace(
            f"{ws} {why}. Its log says what to write into the tree, so agent-2pc does "
            "not use a workspace it did not make here. If it came with a repository "
            "(.agent-tx/ should never be committed), remove it and run 'agent-2pc init'; if "
            f"you copied or moved it yourself, run 'agent-2pc trust' there (or set {SAFE_ENV})",
            root=root)
    assert marker is not None
    _trusted[root] = marker


def _distrust(st: os.stat_result, marker: tuple[int, str] | None) -> str | None:
    """Why a .agent-tx/ with the lstat ``st`` and the TRUST ``marker`` is not trusted."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory (a symbolic link?); agent-2pc uses only a real one"
    if not _owned(st):
        return f"belongs to another user (uid {st.st_uid})"
    if marker is None:
        return "was not made on this machine by agent-2pc (it has no TRUST file)"
    if marker[0] != st.st_ino:
        return "was not made here: it was copied, cloned or unpacked (TRUST names another inode)"
    return None


def log_check(root: str) -> Callable[[str | None], None] | None:
    """What the log calls with the workspace id in the header of the file it opens (at start,
    and after compaction replaced the file): UntrustedWorkspace unless TRUST names it. None
    for a root trusted through $AGENT2PC_SAFE_DIRECTORY (whatever its facts)."""
    if _safe_by_env(root):
        return None

    def check(log_id: str | None) -> None:
        known = _trusted.get(root) or _read_marker(os.path.join(root, DIRNAME, "TRUST"))
        if known is not None and log_id == known[1]:
            return
        lay = Layout(root)
        raise UntrustedWorkspace(
            f"{lay.dir} holds a log that is not its own: {lay.wal} "
            f"{'has no header' if log_id is None else 'names another workspace'}. A git "
            "checkout or pull of a commit that contains .agent-tx/ puts such a file there (git "
            "overwrites ignored files); the transactions in flight were in the file it "
            "replaced. If you put this log there yourself, run 'agent-2pc trust'", root=root)

    return check


def _log_id(lay: Layout) -> str:
    """The workspace id in the log's header; a log without one (made by hand, or before
    headers) gets one: rewritten atomically, under the log lock."""
    from . import wal_format
    from .durable import fsync_dir, fsync_fd, rename, write_all
    from .locks import FileLock

    with FileLock(lay.lock):
        with open(lay.wal, "rb") as f:
            data = f.read()
        log_id, _ = wal_format.read_log_header(data)
        if log_id is not None:
            return log_id
        log_id = os.urandom(16).hex()
        tmp = lay.wal + ".header"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, wal_format.log_header(log_id, time.time_ns() // 1_000_000) + data)
            fsync_fd(fd)
        finally:
            os.close(fd)
        rename(tmp, lay.wal)
        fsync_dir(lay.dir)
        return log_id


def trust(root: str) -> str:
    """Mark the workspace at ``root`` (a real path) as the user's own (``agent-2pc trust``):
    write TRUST for its .agent-tx/ and its log as they are now. One of another user is
    refused: it is trusted only through $AGENT2PC_SAFE_DIRECTORY, which that user cannot
    set."""
    from .durable import write_atomic

    lay = Layout(root)
    try:
        st = os.lstat(lay.dir)
    except FileNotFoundError:
        raise NotInitialized(f"no agent-2pc workspace at {root}", root=root) from None
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedWorkspace(f"{lay.dir} is not a directory (a symbolic link?); agent-2pc "
                                 "uses only a real one", root=root)
    if not _owned(st):
        raise UntrustedWorkspace(
            f"{lay.dir} belongs to another user (uid {st.st_uid}): trusting it would let that "
            f"user choose what agent-2pc writes as you. To use it anyway, set {SAFE_ENV}={root}",
            root=root)
    check_intact(lay)
    marker = (st.st_ino, _log_id(lay))
    write_atomic(lay.trust, _marker(*marker))
    _trusted[root] = marker
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
