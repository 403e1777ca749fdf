"""The file participant: optimistic checks and synced temp files at prepare, renames at apply.

A transaction's ops put regular files (write), symbolic links (symlink) and empty directories
(mkdir), and delete files, links and empty directories. What stands at a path is compared by
fingerprint (core/states.py): a file's sha256, ``symlink:`` + the sha256 of a link's target,
``dir``; links are never followed.

prepare (under the commit lock, before the decision):
  1. every changed path still holds what it held when first staged (``pre``; a mkdir also
     accepts a directory that someone else made), and every recorded read still holds:
     otherwise vote no (``conflict``) and the other writer's content stays;
  2. each written file's blob is read and checked against its hash, then fsynced, and each
     blob directory fsynced once: after this the new content survives a machine crash. The
     mode each file will get goes into the decision record. (A link's target and a
     directory's mode are in the stage records themselves.)
apply (after the decision, holding the log lock; also the redo of recovery, so every step is
  idempotent): deletes first (deepest first; a directory with rmdir; emptied parent
  directories are removed, as git does), then writes, links and directories in path order: a
  file or link is hard-linked as a pre-image (preimages/<tid>.<k>); a write renames the blob
  itself over the target (or a synced copy of it, when another live transaction names the
  same blob) and sets its mode; a link is made in ``objects/tmp`` and renamed over the target;
  a directory is made (a file or link standing there gives way). Each touched directory is
  fsynced once at the end, before the end record is written.
A target that holds neither what it held at prepare nor what the op puts when a redo reaches
it was changed by someone outside any transaction after the decision: it is left as it is and
reported as ``diverged`` rather than overwritten. What to do with each target is decided by
core/applyplan.py from what stands there; this module looks at the path and does the step.

Every directory is opened from the root with O_NOFOLLOW, so a symlink planted in the tree after
staging makes prepare vote no instead of leading a write outside the root.
"""

from __future__ import annotations

import binascii
import errno
import os
import stat

from .. import crashpoints
from ..core.applyplan import Action, plan_step, replaces_dir
from ..core.confine import name_problem
from ..core.states import DIR_FINGERPRINT, Op, Tx, named_blobs
from ..storage.blobs import BlobCorrupt, BlobStore
from ..storage.durable import FsyncFailed, batching, fsync_fd, rename, sync_filesystems, write_all
from ..storage.hashing import link_fingerprint, sha256_bytes, sha256_fd
from .base import YES, Applied, ApplyFailed, Vote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..core.applyplan import Step
    from .base import Context

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Small written files travel in the commit decision itself (``inline``), so that prepare syncs
# nothing for them: the decision's fsync makes their content durable, the apply fsyncs each
# blob just before renaming it into the tree, and a redo that finds a blob missing or damaged
# writes it again from the decision. Bounded per file and per decision.
INLINE_BYTES_MAX = 8 * 1024
INLINE_TOTAL_BYTES_MAX = 64 * 1024


class PathChanged(Exception):
    """A directory on the way to a target is no longer a plain directory."""


class Unconfined(PathChanged):
    """A path component that no transaction may open or write (``..``, ``.git``, ...): the
    engine refuses such a transaction before it gets here (core/confine.py); this is the check
    at the moment of writing, so that nothing that slipped past it leaves the root."""


class ParentNotDir(PathChanged):
    """A file or a link stands where a directory on the way to a target would be: nothing is
    at the target, fine when the transaction itself replaces that file or link (``rel_dir``,
    deleted or made a directory before the target is put)."""

    def __init__(self, rel_dir: str, what: str) -> None:
        super().__init__(f"{rel_dir} is {what}, not a directory")
        self.rel_dir = rel_dir


class Dirs:
    """Directory descriptors opened from the root, one component at a time, never following a
    symlink. Created directories are remembered so their parents get fsynced."""

    def __init__(self, root: str, remember_missing: bool = False) -> None:
        self.fds: dict[str, int] = {"": os.open(root, _DIR_FLAGS)}
        self.grew: set[str] = set()  # directories that got a new subdirectory
        # ``remember_missing`` (a vote, which only looks): directories found missing, and so
        # everything below them. A vote on 20,000 new files in 200 new directories then asks
        # the file system 200 times, not 60,000 (a directory someone else makes meanwhile is
        # a race the apply meets, as one made just after the vote).
        self.missing: set[str] | None = set() if remember_missing else None

    def open(self, rel_dir: str, create: bool = False) -> int:
        fd = self.fds.get(rel_dir)
        if fd is not None:
            return fd
        missing = self.missing
        if missing is not None and rel_dir in missing:
            raise FileNotFoundError(errno.ENOENT, "missing (seen before)", rel_dir)
        parent, _, name = rel_dir.rpartition("/")
        why = name_problem(name, top=not parent)
        if why is not None:
            raise Unconfined(f"{rel_dir}: {why}")
        try:
            pfd = self.open(parent, create)
        except FileNotFoundError:
            if missing is not None:
                missing.add(rel_dir)
            raise
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=pfd)
        except FileNotFoundError:
            if not create:
                if missing is not None:
                    missing.add(rel_dir)
                raise
            assert missing is None, "a Dirs that remembers what is missing only looks"
            try:
                os.mkdir(name, 0o755, dir_fd=pfd)
            except FileExistsError:
                pass
            self.grew.add(parent)
            fd = os.open(name, _DIR_FLAGS, dir_fd=pfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                mode = os.stat(name, dir_fd=pfd, follow_symlinks=False).st_mode
                raise ParentNotDir(rel_dir, "a symbolic link" if stat.S_ISLNK(mode) else
                                   "a file") from None
            raise
        self.fds[rel_dir] = fd
        return fd

    def forget(self, rel_dir: str) -> None:
        fd = self.fds.pop(rel_dir, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def split(path: str) -> tuple[str, str]:
    """(the directory, the name) of ``path``; Unconfined when the name may not be written."""
    parent, _, name = path.rpartition("/")
    why = name_problem(name, top=not parent)
    if why is not None:
        raise Unconfined(f"{path}: {why}")
    return parent, name


def current(dirs: Dirs, path: str) -> tuple[str | None, int | None]:
    """(fingerprint, mode) of what stands at ``path``: a regular file's sha256 and mode, a
    symbolic link's fingerprint or DIR_FINGERPRINT for a directory (mode None); (None, None)
    when nothing does. Never follows a link.

    Raises PathChanged when a parent is not a plain directory, or when something else (a fifo,
    a device) stands there.
    """
    parent, name = split(path)
    if dirs.missing is not None and parent in dirs.missing:
        return None, None  # known missing: no exception raised to say so again
    try:
        dfd = dirs.open(parent)
    except FileNotFoundError:
        return None, None
    except PathChanged:
        raise
    except NotADirectoryError:
        return None, None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            try:
                return link_fingerprint(os.readlink(name, dir_fd=dfd)), None
            except FileNotFoundError:
                return None, None
            except OSError:
                raise PathChanged(f"{path} changed while it was read") from None
        raise
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return DIR_FINGERPRINT, None
        if not stat.S_ISREG(st.st_mode):
            raise PathChanged(f"{path} is no longer a regular file")
        digest, _ = sha256_fd(fd, st.st_size)
        return digest, stat.S_IMODE(st.st_mode)
    finally:
        os.close(fd)


def placed_name(tid: str, k: int) -> str:
    """What prepare names the content of the k-th change bound for another file system."""
    return f".agent-2pc-{tid}-{k}.tmp"


def _home(dirs: Dirs, path: str, known: dict[str, str] | None = None) -> str:
    """The deepest directory on the way to ``path`` that exists now (what apply creates
    below it is on its file system). ``known``: answers for directories asked before."""
    parent = probe = split(path)[0]
    if known is not None and parent in known:
        return known[parent]
    while True:
        try:
            dirs.open(probe)
            break
        except (FileNotFoundError, NotADirectoryError, ParentNotDir):
            probe = probe.rpartition("/")[0]
    if known is not None:
        known[parent] = probe
    return probe


def first_left(root: str, rel_dir: str, deleted: Callable[[str], bool]) -> str | None:
    """The first path below the directory ``rel_dir`` of the tree that is not ``deleted``
    (files, links, and directories that are empty to begin with); None when deleting those
    empties it, so that the deletes of a commit remove it (as git does) and a file or link
    can take its place."""
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, rel_dir)):
        rel_here = os.path.relpath(dirpath, root)
        if rel_here != rel_dir and not dirnames and not filenames:
            if not deleted(rel_here):
                return rel_here + "/"  # an empty directory that stays
            continue
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in sorted(filenames + links):
            if not deleted(f"{rel_here}/{name}"):
                return f"{rel_here}/{name}"
    return None


def _make_claim(claim: str, fill: Callable[[int], Any], mode: int, sync: bool = True) -> str:
    """Write ``claim`` (a copy to rename over a target, in objects/tmp) through ``fill``,
    with ``mode``, synced (unless ``sync`` is False: a batched apply syncs the file system
    before any rename into the tree), under a ``.part`` name first: it exists whole or not at
    all."""
    fd = os.open(claim + ".part", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o444)
    try:
        fill(fd)
        os.fchmod(fd, mode)
        if sync:
            fsync_fd(fd)
    except BaseException:
        os.unlink(claim + ".part")  # never trusted after a failed fsync: written anew
        raise
    finally:
        os.close(fd)
    rename(claim + ".part", claim)
    return claim


def _spares(tid: str, tmp_dir: str) -> dict[str, list[str]]:
    """The spare copies of ``tid`` in ``tmp_dir`` (``spare-<tid>-<digest>-<pid>.<n>``), by
    digest."""
    prefix = f"spare-{tid}-"
    out: dict[str, list[str]] = {}
    for name in os.listdir(tmp_dir):
        if name.startswith(prefix):
            digest = name[len(prefix):].rpartition("-")[0]
            out.setdefault(digest, []).append(os.path.join(tmp_dir, name))
    return out


def _take_spare(spares: dict[str, list[str]], digest: str, claim: str) -> bool:
    """Make a spare copy of ``digest`` the copy ``claim``, if there is one whose bytes are
    still the blob's (checked: nothing but its hash at capture vouched for them)."""
    found = spares.get(digest)
    while found:
        spare = found.pop()
        if _intact(spare, digest):
            rename(spare, claim)
            return True
    return False


def _intact(claim: str, digest: str) -> bool:
    """Does the copy ``claim`` hold the blob ``digest``? A batched apply writes its copies
    unsynced and syncs them before any rename: a machine crash before that syncfs can leave
    one with its name and the wrong bytes (and then no rename has moved the blob it copies,
    so it can be made again). Damaged or not, it is unlinked when it is not intact. A redo
    checks every copy it finds, batched or not by its own settings: the run that made it may
    have batched (another AGENT2PC_SYNCFS_MIN, or a host with syncfs)."""
    try:
        fd = os.open(claim, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if sha256_fd(fd)[0] == digest:
            return True
    finally:
        os.close(fd)
    os.unlink(claim)
    return False


def _short(fingerprint: str | None) -> str:
    if fingerprint is None:
        return "absent"
    if fingerprint == DIR_FINGERPRINT:
        return "a directory"
    if fingerprint.startswith("symlink:"):
        return "a symbolic link"
    return fingerprint[:12]


class _ApplyRun:
    """One run of the apply (or redo) of one transaction: what its decision carries and what
    the run has done so far."""

    __slots__ = ("tid", "seen", "keep", "dirs", "out", "modes", "placed", "inline", "touched",
                 "later_uses", "batch", "deferred", "spares")

    def __init__(self, tx: Tx, seen: dict[str, str | None] | None, keep: set[str], dirs: Dirs,
                 out: Applied, blobs_tmp: str) -> None:
        fields = tx.decision_fields
        self.tid = tx.tid
        self.seen = seen  # what this process's prepare saw; None in a redo
        self.keep = keep  # blobs that other live transactions name: copied, never moved
        self.dirs = dirs
        self.out = out
        self.modes: dict[int, int] = {
            int(k): m for k, m in (fields.get("modes") or {}).items()}
        self.placed: dict[int, str] = {  # k -> the directory prepare placed it in
            int(k): h for k, h in (fields.get("placed") or {}).items()}
        self.inline: dict[int, str] = {  # k -> a small file's content, base64
            int(k): v for k, v in (fields.get("inline") or {}).items()}
        self.touched: set[str] = set()  # directories to fsync at the end
        self.later_uses: dict[str, int] = {}  # blob -> writes after this one that move it
        # A big transaction (durable.batching): files are written unsynced, the file systems
        # synced once, then renamed into the tree (``deferred``), then synced once again.
        self.batch = batching(len(tx.changes()))
        self.deferred: list[_Deferred] = []
        # digest -> spare copies that exec's capture kept of content already stored (the
        # same file at many paths: storage/blobs.py, put_moved). A batched first run renames
        # one into the tree where it would copy the blob: the syncfs before the renames syncs
        # it with the copies. Unused ones are removed at the end of the first run (a small
        # transaction syncs its copies one by one: it makes them, as a redo does).
        self.spares: dict[str, list[str]] = {}
        if seen is not None:
            self.spares = _spares(tx.tid, blobs_tmp)


class _Deferred:
    """A rename into the tree that a batched apply does after its syncfs: ``src`` (the blob
    ``blob``, or a copy of it) over ``name`` in the directory ``parent``; ``inline``: the
    decision carries the content (a small file)."""

    __slots__ = ("src", "name", "parent", "blob", "inline")

    def __init__(self, src: str, name: str, parent: str, blob: str, inline: bool) -> None:
        self.src, self.name, self.parent = src, name, parent
        self.blob, self.inline = blob, inline


class FileParticipant:
    """The files of the tree (participants/base.py: the protocol)."""

    name = "fs"
    kinds = frozenset({"write", "delete", "symlink", "mkdir"})

    def __init__(self, root: str, blobs: BlobStore) -> None:
        self.root = root
        self.blobs = blobs
        # What prepare saw, for the apply that follows in the same process (under the same
        # commit lock): saves hashing every target twice. Redo after a crash hashes again.
        self._seen: dict[str, dict[str, str | None]] = {}
        self._modes: dict[str, dict[int, int]] = {}
        self._placed: dict[str, dict[int, str]] = {}
        self._inline: dict[str, dict[int, bytes]] = {}

    # -- the participant protocol (base.py) -------------------------------------------------

    def prepare(self, tx: Tx, ctx: Context) -> Vote:
        try:
            return self._vote(tx, ctx.sync)
        except OSError as exc:  # a participant that raises has voted no
            return Vote.no("prepare_failed", f"preparing the files failed: {exc}")

    def apply(self, tx: Tx, ctx: Context, redo: bool) -> Applied:
        """Apply (or, ``redo``, resume) a decided commit. A blob that another unfinished
        transaction names is copied rather than moved (the caller holds the log lock, so
        the set is complete)."""
        keep = {name for other in ctx.others() for op in other.ops
                for name in named_blobs(op) if name}
        return self.recover(tx, keep) if redo else self.commit(tx, keep)

    def undo(self, tx: Tx, ctx: Context) -> dict[str, Any]:
        self.undo_prepare(tx)
        return {}

    def close(self) -> None:
        pass  # prepare and apply open nothing that outlives them

    def describe(self, tx: Tx) -> dict[str, Any]:
        return {"files": [{"path": op.path, "op": op.op, "via": op.via}
                          for op in tx.changes()],
                "reads": [{"path": p, "sha256": d} for p, d in tx.reads]}

    # -- prepare ---------------------------------------------------------------------------

    def _vote(self, tx: Tx, sync_log: Callable[[], None] | None = None) -> Vote:
        """Vote on ``tx``. ``sync_log`` makes the log durable; it is called before anything
        is placed in the tree (a target on another file system), so that a machine crash
        cannot keep what was placed and lose the records that say whose it is."""
        changes = tx.changes()
        self._placed[tx.tid] = {}  # nothing placed yet (an abort has nothing to look for)
        dirs = Dirs(self.root, remember_missing=True)
        try:
            seen: dict[str, str | None] = {}
            modes: dict[str, int | None] = {}
            # Paths whose file gives way to a directory at apply, before what goes below them.
            replaced = {op.path for op in changes if op.op in ("delete", "mkdir")}
            for op in changes:
                try:
                    seen[op.path], modes[op.path] = current(dirs, op.path)
                except ParentNotDir as exc:
                    if exc.rel_dir not in replaced:
                        return Vote.no("conflict", f"{exc}, so {op.path} cannot be there; it "
                                       "changed since it was staged")
                    seen[op.path], modes[op.path] = None, None
                except PathChanged as exc:
                    return Vote.no("conflict", f"{exc}; it changed since it was staged")
                if seen[op.path] != op.pre and not (
                        op.op == "mkdir" and seen[op.path] == DIR_FINGERPRINT):
                    return Vote.no("conflict", (
                        f"{op.path} changed since it was staged (it was {_short(op.pre)}, now "
                        f"{_short(seen[op.path])}); the other writer's content is kept"))
            deleted = {op.path for op in changes if op.op == "delete"}
            for op in changes:  # a file or link for a directory: the deletes must empty it
                if op.op in ("write", "symlink") and op.pre == DIR_FINGERPRINT:
                    left = first_left(self.root, op.path, deleted.__contains__)
                    if left is not None:
                        return Vote.no("conflict", (
                            f"{op.path} is a directory that still holds {left}, which this "
                            "transaction does not delete, so a file cannot take its place"))
            for path, digest in tx.reads:
                if path not in seen:
                    try:
                        seen[path], _ = current(dirs, path)
                    except PathChanged as exc:
                        return Vote.no("conflict", f"{exc}; it changed since it was read")
                if seen[path] != digest:
                    return Vote.no("conflict", (
                        f"{path} changed since it was read (it was {_short(digest)}, now "
                        f"{_short(seen[path])})"))
            writes = [(k, op) for k, op in enumerate(changes) if op.op == "write"]
            foreign = self._foreign(dirs, changes)
            inline: dict[int, bytes] = {}
            budget = INLINE_TOTAL_BYTES_MAX
            far = {k for k, _, _ in foreign}
            try:
                for k, op in writes:
                    assert op.blob is not None
                    if k not in far and op.size <= min(INLINE_BYTES_MAX, budget):
                        inline[k] = self.blobs.read(op.blob)  # checked against its hash
                        budget -= op.size
                self.blobs.make_durable([op.blob for k, op in writes if op.blob and k not in
                                         inline], batch=batching(len(changes)))
            except BlobCorrupt as exc:
                self.blobs.discard(exc.digest)
                path = next(op.path for _, op in writes if op.blob == exc.digest)
                return Vote.no("corrupt_blob", f"the staged content of {path}: {exc}; "
                               "stage it again")
            if foreign and sync_log is not None:
                sync_log()
            placed = self._place(dirs, tx.tid, foreign)
            self._seen[tx.tid] = seen
            # New content keeps the file's permission bits, never its setuid, setgid or
            # sticky bits (docs/cli.md, Modes).
            self._modes[tx.tid] = {
                k: op.mode if op.mode is not None else (modes.get(op.path) or 0o644) & 0o777
                for k, op in writes}
            self._placed[tx.tid] = placed
            self._inline[tx.tid] = inline
            return YES
        finally:
            dirs.close()

    def _foreign(self, dirs: Dirs, changes: list[Op]) -> list[tuple[int, Op, str]]:
        """(k, op, home) of each write or link whose target's deepest existing directory
        (its home) is on another file system than the blobs: it cannot be renamed there."""
        blobs_dev = os.stat(self.blobs.dir).st_dev
        foreign: list[tuple[int, Op, str]] = []
        homes: dict[str, str] = {}
        for k, op in enumerate(changes):  # writes and links are renamed into place
            if op.op not in ("write", "symlink"):
                continue
            home = _home(dirs, op.path, homes)
            if os.fstat(dirs.open(home)).st_dev != blobs_dev:
                foreign.append((k, op, home))
        return foreign

    def _place(self, dirs: Dirs, tid: str, foreign: list[tuple[int, Op, str]]
               ) -> dict[int, str]:
        """Put the content of each write (or the link) that goes to another file system than
        .agent-tx/ next to it, in the deepest directory on its way that exists now, as
        ``.agent-2pc-<tid>-<k>.tmp``, synced with its directory: the apply renames it into
        place like a blob. Returns {k: that directory}. A failure (no space, no permission)
        removes what was placed and votes no through the OSError."""
        placed: dict[int, str] = {}
        try:
            for k, op, home in foreign:
                dfd = dirs.open(home)
                name = placed_name(tid, k)
                try:
                    os.unlink(name, dir_fd=dfd)  # an earlier, interrupted prepare's
                except FileNotFoundError:
                    pass
                placed[k] = home
                if op.op == "symlink":
                    assert op.target is not None
                    os.symlink(op.target, name, dir_fd=dfd)
                    continue
                assert op.blob is not None
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                             os.O_CLOEXEC, 0o600, dir_fd=dfd)
                try:
                    self.blobs.copy_to(op.blob, fd)
                    fsync_fd(fd)
                finally:
                    os.close(fd)
            for home in set(placed.values()):
                fsync_fd(dirs.open(home))
        except BaseException:
            for k, home in placed.items():
                try:
                    os.unlink(placed_name(tid, k), dir_fd=dirs.open(home))
                except OSError:
                    pass
            raise
        return placed

    def undo_prepare(self, tx: Tx) -> None:
        """After an abort of a prepared transaction: remove what prepare placed next to
        targets on other file systems. The process that prepared knows where; an abort after
        a crash looks for the names in every directory on the way of each write and link."""
        self.forget(tx.tid)
        known = self._placed.pop(tx.tid, None)
        dirs = Dirs(self.root)
        try:
            if known is not None:  # prepared in this process: it knows
                for k, home in known.items():
                    try:
                        os.unlink(placed_name(tx.tid, k), dir_fd=dirs.open(home))
                    except (OSError, PathChanged):
                        pass
                return
            for k, op in enumerate(tx.changes()):
                if op.op not in ("write", "symlink"):
                    continue
                probe = split(op.path)[0]
                while True:
                    try:
                        os.unlink(placed_name(tx.tid, k), dir_fd=dirs.open(probe))
                    except (OSError, PathChanged):
                        pass
                    if not probe:
                        break
                    probe = probe.rpartition("/")[0]
        finally:
            dirs.close()

    def decision_fields(self, tid: str) -> dict[str, Any]:
        """What the commit decision must carry for a redo: each written file's mode, where
        prepare placed the content bound for other file systems, and the small files' content
        (base64)."""
        fields: dict[str, Any] = {
            "modes": {str(k): m for k, m in self._modes.get(tid, {}).items()}}
        placed = self._placed.get(tid)
        if placed:
            fields["placed"] = {str(k): home for k, home in placed.items()}
        inline = self._inline.get(tid)
        if inline:
            fields["inline"] = {str(k): binascii.b2a_base64(data, newline=False).decode("ascii")
                                for k, data in inline.items()}
        return fields

    # -- apply (commit) and redo (recover) --------------------------------------------------

    def commit(self, tx: Tx, keep: set[str]) -> Applied:
        """Apply after the decision. ``keep``: blobs that other live transactions name, which
        must be copied rather than moved (the caller holds the log lock, so it is complete)."""
        self._modes.pop(tx.tid, None)
        self._placed.pop(tx.tid, None)
        self._inline.pop(tx.tid, None)
        return self._apply(tx, self._seen.pop(tx.tid, None), keep)

    def recover(self, tx: Tx, keep: set[str]) -> Applied:
        return self._apply(tx, None, keep)

    def forget(self, tid: str) -> None:
        """Drop what prepare saw (what it placed is for undo_prepare)."""
        self._seen.pop(tid, None)
        self._modes.pop(tid, None)
        self._inline.pop(tid, None)

    def _apply(self, tx: Tx, seen: dict[str, str | None] | None, keep: set[str]) -> Applied:
        """Apply (``seen``: what this process's prepare saw) or redo (None) a decided commit.
        A target whose directory is no longer a plain one (a link swapped in after the
        decision) is ``diverged``, as in a redo; an error (a refusal of the file system, a
        lost blob) stops it with ApplyFailed, and a redo resumes it."""
        out = Applied()
        try:
            dirs = Dirs(self.root)
            try:
                self._apply_in(tx, seen, keep, dirs, out)
            finally:
                dirs.close()
        except (OSError, BlobCorrupt, PathChanged, binascii.Error) as exc:
            raise ApplyFailed(exc, out.files + out.diverged) from exc
        out.files.sort()
        return out

    @staticmethod
    def _parent(dirs: Dirs, parent: str, create: bool = False) -> int | None:
        """The directory a target goes in; None when it is no longer a plain directory."""
        try:
            return dirs.open(parent, create)
        except PathChanged:
            return None

    def _apply_in(self, tx: Tx, seen: dict[str, str | None] | None, keep: set[str],
                  dirs: Dirs, out: Applied) -> None:
        """Look at each target, ask core/applyplan.py what to do, do it: deletes first
        (deepest first: changes are sorted by path), then writes, links and directories in
        path order (a directory before what goes in it); then every touched directory is
        synced."""
        changes = tx.changes()
        run = _ApplyRun(tx, seen, keep, dirs, out, self.blobs.tmp_dir)
        deletes = [(k, op) for k, op in enumerate(changes) if op.op == "delete"]
        for k, op in reversed(deletes):
            now = seen[op.path] if seen is not None else self._fingerprint(dirs, op)
            parent, name = split(op.path)
            step = plan_step("delete", None, op.pre, now, redo=seen is None)
            self._delete(run, k, op, parent, name, step)
        for k, op in enumerate(changes):
            if op.op == "write" and k not in run.placed:
                assert op.blob is not None
                run.later_uses[op.blob] = run.later_uses.get(op.blob, 0) + 1
        objects_fd = os.open(self.blobs.dir, _DIR_FLAGS) if run.batch else -1
        try:
            for k, op in enumerate(changes):
                if op.op != "delete":
                    self._put_step(run, k, op)
            if run.deferred:
                self._renames(run, objects_fd)
        finally:
            if objects_fd >= 0:
                os.close(objects_fd)
        for spares in run.spares.values():  # more than the copies needed: not kept
            for spare in spares:
                try:
                    os.unlink(spare)
                except FileNotFoundError:
                    pass
        if seen is None:
            self._touch_all(dirs, changes, run.touched)
        if run.batch:
            sync_filesystems([fd for rel_dir in run.touched | dirs.grew
                              if (fd := dirs.fds.get(rel_dir)) is not None])
            return
        for rel_dir in run.touched | dirs.grew:
            dir_fd = dirs.fds.get(rel_dir)
            if dir_fd is not None:
                fsync_fd(dir_fd)

    def _renames(self, run: _ApplyRun, objects_fd: int) -> None:
        """A batched apply's second half: what its first half wrote unsynced (copies, small
        files' blobs, modes) and the directories it made become durable in one syncfs per file
        system, then every file is renamed into the tree. A failed syncfs drops what it was
        to sync (never trusted again: a redo writes it anew from the decision or the blob): a
        small file's blob, and each copy that can be made again (a copy whose blob an earlier
        run moved into the tree stays: it was checked against its hash by this redo)."""
        try:
            sync_filesystems([objects_fd, *run.dirs.fds.values()])
        except FsyncFailed:
            for d in run.deferred:
                blob_path = self.blobs.path(d.blob)
                if d.src == blob_path:
                    if d.inline:
                        self.blobs.discard(d.blob)
                elif d.inline or os.path.exists(blob_path):
                    try:
                        os.unlink(d.src)
                    except FileNotFoundError:
                        pass
            raise
        for d in run.deferred:
            rename(d.src, d.name, dst_dir_fd=run.dirs.open(d.parent))
            crashpoints.hit("commit.mid_apply")
        run.deferred.clear()

    def _delete(self, run: _ApplyRun, k: int, op: Op, parent: str, name: str,
                step: Step) -> None:
        """Carry out the plan's step for the k-th change, a delete."""
        out = run.out
        if step.action == Action.NOTHING:
            return
        if step.action == Action.GONE:  # deleted by an earlier run
            out.files.append(op.path)
            self._prune_empty(run.dirs, parent, run.touched)
            return
        if step.action == Action.DIVERGED:
            out.diverged.append(op.path)
            return
        dfd = self._parent(run.dirs, parent)
        if dfd is None:
            out.diverged.append(op.path)
            return
        if step.action == Action.REMOVE_DIR:
            run.dirs.forget(op.path)
            try:
                os.rmdir(name, dir_fd=dfd)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                out.diverged.append(op.path)  # something was put in it meanwhile
                return
        else:
            assert step.action == Action.REMOVE, step
            self.blobs.keep_preimage(dfd, name, run.tid, k)
            os.unlink(name, dir_fd=dfd)  # a file, or a link itself (never its target)
        run.touched.add(parent)
        out.files.append(op.path)
        self._prune_empty(run.dirs, parent, run.touched)
        crashpoints.hit("commit.mid_apply")

    def _put_step(self, run: _ApplyRun, k: int, op: Op) -> None:
        """Look at the k-th target (a write, link or directory), ask the plan, carry it out."""
        parent, name = split(op.path)
        if run.seen is None or replaces_dir(op.op, op.pre):
            now = self._fingerprint(run.dirs, op)
        else:
            now = run.seen[op.path]
        mode = 0
        if op.op == "write":
            assert op.blob is not None
            if k not in run.placed:
                run.later_uses[op.blob] -= 1
            mode = run.modes.get(k, op.mode if op.mode is not None else 0o644)
            new = op.blob
        elif op.op == "symlink":
            assert op.target is not None
            new = link_fingerprint(op.target)
        else:
            assert op.op == "mkdir", op
            mode = op.mode if op.mode is not None else 0o755
            new = DIR_FINGERPRINT
        step = plan_step(op.op, new, op.pre, now, redo=run.seen is None,
                         placed=k in run.placed)
        if step.action == Action.IN_PLACE:  # an earlier run's work (or, a mkdir, anyone's)
            if step.fix_mode:
                self._ensure_mode(run.dirs.open(parent), name, mode)
            if step.drop_placed:  # a file system that kept both names of the rename
                self._drop_placed(run.dirs, run.tid, k, run.placed[k], run.touched)
            run.out.files.append(op.path)
            return
        if step.action == Action.DIVERGED:
            run.out.diverged.append(op.path)
            return
        dfd = self._parent(run.dirs, parent, create=True)
        hfd = self._ensure_placed(run.dirs, run.tid, k, op, run.placed[k]) if (
            k in run.placed and dfd is not None) else None
        if dfd is None or (k in run.placed and hfd is None):
            run.out.diverged.append(op.path)
            return
        self._put(run, k, op, step, parent, name, mode, dfd, hfd)
        run.touched.add(parent)
        run.out.files.append(op.path)
        crashpoints.hit("commit.mid_apply")

    def _put(self, run: _ApplyRun, k: int, op: Op, step: Step, parent: str, name: str,
             mode: int, dfd: int, hfd: int | None) -> None:
        """Carry out a PUT or MAKE_DIR step: rename the placed content (``hfd``: its
        directory), the blob (or a synced copy) or a link over the target, or make the
        directory; what stood there gives way, its pre-image kept."""
        tid = run.tid
        if step.displace:
            self.blobs.keep_preimage(dfd, name, tid, k)
        if hfd is not None:  # prepared next to it, on its file system
            if op.op == "write":  # its mode before it is visible
                self._ensure_mode(hfd, placed_name(tid, k), mode)
            rename(placed_name(tid, k), name, src_dir_fd=hfd, dst_dir_fd=dfd)
            run.touched.add(run.placed[k])
        elif op.op == "write":
            blob = op.blob
            assert blob is not None
            copy = blob in run.keep or run.later_uses[blob] > 0
            if k in run.inline:
                src, unsynced = self._inline_source(tid, k, blob, run.inline[k], copy,
                                                    run.seen is None, mode, run.batch,
                                                    run.spares if run.batch else None)
            else:
                src, unsynced = self._source(tid, k, blob, copy, mode, run.batch,
                                             run.seen is None,
                                             run.spares if run.batch else None), False
                if src == self.blobs.path(blob) and not run.batch:
                    self._sync_made_dirs(run.dirs, parent)
            fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
            try:
                # The mode before the name, synced with it: a chmod after the rename could be
                # lost by a crash that keeps the end record.
                if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                    os.fchmod(fd, mode)
                    unsynced = True
                if run.batch:  # synced with the rest before any rename (_renames)
                    run.deferred.append(_Deferred(src, name, parent, blob, k in run.inline))
                    return
                if unsynced:  # a small file's blob, or a new mode: synced here
                    try:
                        fsync_fd(fd)
                    except FsyncFailed:
                        if k in run.inline and src == self.blobs.path(blob):
                            # Never trusted again (fsyncgate): a redo writes the content anew
                            # from the decision.
                            self.blobs.discard(blob)
                        raise
                rename(src, name, dst_dir_fd=dfd)
            finally:
                os.close(fd)
        elif op.op == "symlink":
            assert op.target is not None
            rename(self._link_source(tid, k, op.target), name, dst_dir_fd=dfd)
        else:
            if step.displace:
                os.unlink(name, dir_fd=dfd)  # a file or link gives way to a directory
            os.mkdir(name, 0o700, dir_fd=dfd)
            self._ensure_mode(dfd, name, mode, sync=False)  # synced as touched
            run.dirs.open(op.path)
            run.touched.add(op.path)  # fsync the new directory's own inode too

    def _source(self, tid: str, k: int, digest: str, copy: bool, mode: int,
                batch: bool = False, redo: bool = False,
                spares: dict[str, list[str]] | None = None) -> str:
        """The file to rename over the k-th target: the blob itself, or a synced copy of it
        when the blob must stay (``objects/tmp/claim-<tid>-<k>``, kept across a crash; unsynced
        in a ``batch``; a spare copy of exec's capture where there is one)."""
        claim = os.path.join(self.blobs.tmp_dir, f"claim-{tid}-{k}")
        if redo and _intact(claim, digest):  # only a redo can find one: the first run of an
            return claim  # apply made it, and was interrupted
        if not copy:
            return self.blobs.path(digest)
        if spares and _take_spare(spares, digest, claim):
            return claim
        return _make_claim(claim, lambda fd: self.blobs.copy_to(digest, fd), mode,
                           sync=not batch)

    def _inline_source(self, tid: str, k: int, digest: str, data_b64: str, copy: bool,
                       check: bool, mode: int, batch: bool = False,
                       spares: dict[str, list[str]] | None = None) -> tuple[str, bool]:
        """As ``_source``, for a small file whose content the decision carries: (the file to
        rename over the k-th target, whether it still needs an fsync). The blob, unless it
        must stay (``copy``) or, in a redo (``check``), it is missing or damaged: then a
        synced copy written from the decision."""
        claim = os.path.join(self.blobs.tmp_dir, f"claim-{tid}-{k}")
        if check and _intact(claim, digest):  # as in _source: only a redo can find one
            return claim, False
        if not copy:
            path = self.blobs.path(digest)
            if not check:
                return path, True  # read and checked by this process's prepare
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                pass
            else:
                try:
                    if sha256_fd(fd)[0] == digest:
                        return path, True
                finally:
                    os.close(fd)
        if copy and spares and _take_spare(spares, digest, claim):
            return claim, False  # synced with the copies (``spares`` only in a batch)
        data = binascii.a2b_base64(data_b64)
        if sha256_bytes(data) != digest:
            raise BlobCorrupt(digest, "not what the decision carries for it")
        return _make_claim(claim, lambda fd: write_all(fd, data), mode, sync=not batch), False

    def _ensure_placed(self, dirs: Dirs, tid: str, k: int, op: Op, home: str) -> int | None:
        """The directory that holds the k-th placed content; placed again from the blob (or
        the target) when it is missing (a redo after someone removed it). None when that
        directory is no longer a plain one."""
        hfd = self._parent(dirs, home, create=True)
        if hfd is None:
            return None
        try:
            os.stat(placed_name(tid, k), dir_fd=hfd, follow_symlinks=False)
        except FileNotFoundError:
            self._place(dirs, tid, [(k, op, home)])
        return hfd

    @staticmethod
    def _sync_made_dirs(dirs: Dirs, rel_dir: str) -> None:
        """Before a blob leaves objects/ for ``rel_dir`` (a file too big for the decision to
        carry): the names of the directories this apply made on the way are durable. Else a
        crash could keep the blob's departure and lose the new directory that holds it, and
        the content would be nowhere a redo can find it."""
        rel = rel_dir
        while True:
            if rel in dirs.grew:
                fsync_fd(dirs.open(rel))
                dirs.grew.discard(rel)
            if not rel:
                return
            rel = rel.rpartition("/")[0]


    @staticmethod
    def _touch_all(dirs: Dirs, changes: list[Op], touched: set[str]) -> None:
        """A redo: what the interrupted run renamed, unlinked or made may be in the page cache
        only (a killed process is not a machine crash), and a redo that finds it in place does
        nothing to it. Every directory on the way to every target that exists is synced,
        before the end record can become durable."""
        seen: set[str] = set()
        for op in changes:
            rel = split(op.path)[0]
            while rel not in seen:
                seen.add(rel)
                try:
                    dirs.open(rel)
                    touched.add(rel)
                except (OSError, PathChanged):
                    pass
                if not rel:
                    break
                rel = rel.rpartition("/")[0]


    @staticmethod
    def _drop_placed(dirs: Dirs, tid: str, k: int, home: str, touched: set[str]) -> None:
        """A redo found the k-th target in place: its placed name, if a crash kept it
        (a rename is not atomic everywhere), goes."""
        try:
            os.unlink(placed_name(tid, k), dir_fd=dirs.open(home))
        except (FileNotFoundError, PathChanged):
            return
        touched.add(home)


    def _link_source(self, tid: str, k: int, target: str) -> str:
        """A symbolic link to ``target`` to rename over the k-th target
        (``objects/tmp/claim-<tid>-<k>``; an interrupted run's is reused when it is right)."""
        claim = os.path.join(self.blobs.tmp_dir, f"claim-{tid}-{k}")
        try:
            os.symlink(target, claim)
        except FileExistsError:
            if os.path.islink(claim) and os.readlink(claim) == target:
                return claim
            os.unlink(claim)
            os.symlink(target, claim)
        return claim

    @staticmethod
    def _ensure_mode(dfd: int, name: str, mode: int, sync: bool = True) -> None:
        """Give ``name`` its mode; a change is synced (unless the caller syncs it): the end
        record must not become durable before it."""
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                os.fchmod(fd, mode)
                if sync:
                    fsync_fd(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _fingerprint(dirs: Dirs, op: Op) -> str | None:
        """What stands at the target, for a redo; "" when it is something no op puts."""
        try:
            return current(dirs, op.path)[0]
        except PathChanged:
            return ""

    @staticmethod
    def _prune_empty(dirs: Dirs, rel_dir: str, touched: set[str]) -> None:
        """Remove directories that the deletes left empty, up to the root (as git does)."""
        while rel_dir:
            parent, name = split(rel_dir)
            dirs.forget(rel_dir)
            try:
                os.rmdir(name, dir_fd=dirs.open(parent))
            except PathChanged:
                return
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                    return
                raise
            touched.discard(rel_dir)
            touched.add(parent)
            rel_dir = parent
