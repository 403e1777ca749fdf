"""The staged layer: a transaction's changes as the view shows them.

``Layer`` answers two questions for every tier:
- how to *build* the changes: as an overlay lower directory (written files as copies of their
  blobs, staged links as links, staged directories with their staged mode, deleted files and
  pruned directories as whiteouts, character devices 0/0), or applied to a copy of the tree;
- what the view showed at a path *before* a command ran (``before``, ``lower_files``), which
  capture compares against.

It mirrors what a commit does (participants/fs.py): a write gets the staged mode, else the
mode of the file it replaces, else 0644; deletes remove the directories they leave empty (as
git does), up to the root; directories a write needs are created 0755.

Written files are *copies* of the blobs, never hard links: the layer lives outside the repo (an
overlay lower directory inside another one fails with ELOOP), usually on tmpfs, so a link to
``.agent-tx/objects`` would cross file systems; and a link would share the blob's read-only
mode 0444 instead of the staged one. (Overlay copy-up never writes into a lower file, so a
hard-linked lower would be safe for the blob; docs/staged-view.md.)
"""

from __future__ import annotations

import os
import stat

from ..core.states import OP_KINDS
from ..storage.blobs import BlobStore

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, Iterator

    from ..core.states import Op
    from ._ignore import Ignore

DIR_MODE_NEW = 0o755
FILE_MODE_NEW = 0o644
CHANGES_MAX = 1_000_000


class Seen:
    """What the view showed at one path: ``kind`` is file, symlink, dir or other; a file has
    ``mode``, ``size`` and ``source`` (a path to read its content from); a symlink ``target``."""

    __slots__ = ("kind", "mode", "size", "source", "target")

    def __init__(self, kind: str, mode: int = 0, size: int = 0, source: str | None = None,
                 target: str | None = None) -> None:
        self.kind = kind
        self.mode = mode
        self.size = size
        self.source = source
        self.target = target

    def __repr__(self) -> str:
        return f"Seen({self.kind}, mode={self.mode:o}, size={self.size}, {self.source!r})"


def _kind(st_mode: int) -> str:
    if stat.S_ISREG(st_mode):
        return "file"
    if stat.S_ISDIR(st_mode):
        return "dir"
    if stat.S_ISLNK(st_mode):
        return "symlink"
    return "other"


def parents(rel: str) -> Iterator[str]:
    """``a/b/c`` -> ``a``, ``a/b`` (the root itself excluded)."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        yield "/".join(parts[:i])


class Layer:
    """The net staged changes of one transaction, resolved against the tree at ``root``."""

    def __init__(self, root: str, changes: Iterable[Op], blobs: BlobStore | None) -> None:
        self.root = root
        self.blobs = blobs
        net: dict[str, Op] = {}
        for op in changes:
            assert op.op in OP_KINDS, f"unknown op {op.op!r} for {op.path}"
            net[op.path] = op  # the latest op on a path wins, as in Tx.changes()
        assert len(net) <= CHANGES_MAX
        self.writes: dict[str, tuple[str, int, int]] = {}  # rel -> (digest, mode, size)
        self.links: dict[str, str] = {}  # rel -> target
        self.mkdirs: dict[str, int] = {}  # rel -> mode
        self.deletes: set[str] = set()
        for rel, op in net.items():
            if op.op == "write":
                assert op.blob is not None and blobs is not None, f"write of {rel} has no blob"
                mode = op.mode if op.mode is not None else self._tree_file_mode(rel)
                self.writes[rel] = (op.blob, mode, op.size)
            elif op.op == "symlink":
                assert op.target is not None, f"symlink {rel} has no target"
                self.links[rel] = op.target
            elif op.op == "mkdir":
                self.mkdirs[rel] = op.mode if op.mode is not None else DIR_MODE_NEW
            else:
                self.deletes.add(rel)
        # Directories the view has because of this transaction: the parents of what it puts,
        # and the directories it makes.
        self.write_dirs: set[str] = {d for rel in (*self.writes, *self.links, *self.mkdirs)
                                     for d in parents(rel)} | set(self.mkdirs)
        self.pruned = self._pruned_dirs()
        # Everything that is gone from the view: deleted files and the directories they empty.
        self.gone: set[str] = (self.deletes - self.write_dirs) | self.pruned
        # Directories of the tree found to be themselves (no link on the way): asked once per
        # directory, not once per file, during one capture (``forget_tree`` at its start).
        self._real_dirs: dict[str, bool] = {}

    def forget_tree(self) -> None:
        """Drop what was learnt of the tree (it may have changed since the last capture)."""
        self._real_dirs.clear()

    def _tree_file_mode(self, rel: str) -> int:
        try:
            st = os.lstat(os.path.join(self.root, rel))
        except OSError:
            return FILE_MODE_NEW
        return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else FILE_MODE_NEW

    def _pruned_dirs(self) -> set[str]:
        """Directories that the commit's deletes leave empty (and so removes), deepest first;
        not those that a write of this transaction needs."""
        gone = set(self.deletes)
        pruned: set[str] = set()
        candidates = {d for rel in self.deletes for d in parents(rel)} - self.write_dirs
        for d in sorted(candidates, key=lambda p: p.count("/"), reverse=True):
            try:
                names = os.listdir(os.path.join(self.root, d))
            except OSError:
                continue
            if all(f"{d}/{n}" in gone for n in names):
                gone.add(d)
                pruned.add(d)
        return pruned

    def blob_path(self, rel: str) -> str:
        assert self.blobs is not None
        return self.blobs.path(self.writes[rel][0])

    def whiteouts(self) -> list[str]:
        """The paths an overlay lower layer must hide: the topmost of each gone subtree that
        the tree has (a file written and deleted again by the transaction never was there: a
        whiteout would make the layer show its parent directory). Not where the layer puts a
        file or link of its own: that hides the tree's emptied directory by itself."""
        return sorted(p for p in self.gone if not any(q in self.gone for q in parents(p))
                      and p not in self.writes and p not in self.links
                      and os.path.lexists(os.path.join(self.root, p)))

    # -- what the view showed before a command ran --------------------------------------------

    def is_gone(self, rel: str) -> bool:
        if rel in self.gone:
            return True
        return any(p in self.gone or p in self.writes or p in self.links for p in parents(rel))

    def empty_dir(self, rel: str) -> bool:
        """Did the view show ``rel`` as a directory with nothing in it, not even ignored
        files? (Removing such a directory is a delete of the directory itself.)"""
        seen = self.before(rel)
        if seen is None or seen.kind != "dir":
            return False
        prefix = rel + "/"
        if any(p.startswith(prefix) for p in (*self.writes, *self.links, *self.mkdirs)):
            return False
        try:
            names = os.listdir(os.path.join(self.root, rel))
        except OSError:
            return True  # made by this transaction, or gone from the tree meanwhile
        return all(self.is_gone(f"{rel}/{n}") for n in names)

    def before(self, rel: str) -> Seen | None:
        """What the view showed at ``rel`` before any command ran (None: nothing)."""
        w = self.writes.get(rel)
        if w is not None:
            return Seen("file", w[1], w[2], self.blob_path(rel))
        target = self.links.get(rel)
        if target is not None:
            return Seen("symlink", target=target)
        if self.is_gone(rel):
            return None
        if rel in self.mkdirs:
            return Seen("dir", self.mkdirs[rel])
        if rel in self.write_dirs:
            full = os.path.join(self.root, rel)
            try:
                st = os.lstat(full)
                mode = stat.S_IMODE(st.st_mode) if stat.S_ISDIR(st.st_mode) else DIR_MODE_NEW
            except OSError:
                mode = DIR_MODE_NEW
            return Seen("dir", mode)
        return self._tree(rel)

    def _tree(self, rel: str) -> Seen | None:
        """The tree's entry at ``rel``, never through a symlinked parent directory."""
        full = os.path.join(self.root, rel)
        parent = os.path.dirname(full)
        real = self._real_dirs.get(parent)
        if real is None:
            real = self._real_dirs[parent] = os.path.realpath(parent) == parent
        if not real:
            return None  # a parent is a symlink or missing: the view has nothing there
        try:
            st = os.lstat(full)
        except OSError:
            return None
        kind = _kind(st.st_mode)
        if kind == "file":
            return Seen("file", stat.S_IMODE(st.st_mode), st.st_size, full)
        if kind == "symlink":
            return Seen("symlink", target=os.readlink(full))
        return Seen(kind, stat.S_IMODE(st.st_mode))

    def lower_files(self, rel_dir: str, ignore: Ignore) -> list[str]:
        """Every non-directory path below ``rel_dir`` in the view before any command ran
        (ignored paths left out), sorted."""
        out: set[str] = set()
        prefix = rel_dir + "/"
        for rel in (*self.writes, *self.links):
            if rel.startswith(prefix) and not ignore(rel):
                out.add(rel)
        top = os.path.join(self.root, rel_dir)
        if os.path.realpath(top) == top and not self.is_gone(rel_dir):
            for dirpath, dirnames, filenames in os.walk(top):
                rel_here = os.path.relpath(dirpath, self.root)
                keep = []
                for d in dirnames:
                    r = f"{rel_here}/{d}"
                    if os.path.islink(os.path.join(dirpath, d)):
                        filenames.append(d)  # a symlink to a directory is a leaf
                    elif r not in self.gone and r not in self.writes and r not in self.links \
                            and not ignore.match_one(r):
                        keep.append(d)
                dirnames[:] = keep
                for f in filenames:
                    r = f"{rel_here}/{f}"
                    if r not in self.gone and not ignore.match_one(r):
                        out.add(r)
        return sorted(out)

    def lower_empty_dirs(self, rel_dir: str, ignore: Ignore) -> list[str]:
        """The directories at or below ``rel_dir`` that the view showed empty before any
        command ran (removing them deletes each; the directories that only held files go
        with their files' deletes, as in a commit), sorted."""
        out = {d for d in self.mkdirs
               if (d == rel_dir or d.startswith(rel_dir + "/")) and self.empty_dir(d)}
        top = os.path.join(self.root, rel_dir)
        if os.path.realpath(top) == top and not self.is_gone(rel_dir):
            for dirpath, dirnames, _ in os.walk(top):
                rel_here = os.path.relpath(dirpath, self.root)
                dirnames[:] = [d for d in dirnames
                               if not os.path.islink(os.path.join(dirpath, d))
                               and not ignore.match_one(f"{rel_here}/{d}")
                               and not self.is_gone(f"{rel_here}/{d}")]
                if not dirnames and self.empty_dir(rel_here):
                    out.add(rel_here)
        return sorted(out)

    # -- building ----------------------------------------------------------------------------

    def _dir_mode(self, rel: str) -> tuple[int, int, int] | None:
        """(mode, uid, gid) of the tree's directory at ``rel``, if there is one."""
        try:
            st = os.lstat(os.path.join(self.root, rel) if rel else self.root)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None
        return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid

    def _mkdirs(self, dest: str, rel_dir: str, made: set[str]) -> None:
        """Create ``rel_dir`` and its parents in ``dest`` with the tree's modes and owners
        (the topmost layer's directory is what the view shows); a directory the transaction
        makes gets its staged mode."""
        for d in [*parents(rel_dir + "/x")]:
            if d in made:
                continue
            path = os.path.join(dest, d)
            try:
                os.mkdir(path, DIR_MODE_NEW)
            except FileExistsError:
                if not os.path.isdir(path) or os.path.islink(path):
                    os.unlink(path)  # a file or link of the copy gives way (copy tier)
                    os.mkdir(path, DIR_MODE_NEW)
            like = self._dir_mode(d)
            if d in self.mkdirs:
                like = (self.mkdirs[d], os.geteuid(), os.getegid()) if like is None else (
                    self.mkdirs[d], like[1], like[2])
            if like is not None:
                self._match(path, like)
            else:
                os.chmod(path, DIR_MODE_NEW)
            made.add(d)

    @staticmethod
    def _match(path: str, like: tuple[int, int, int]) -> None:
        mode, uid, gid = like
        os.chmod(path, mode)
        if os.geteuid() == 0:
            st = os.lstat(path)
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.chown(path, uid, gid, follow_symlinks=False)

    def match_root(self, path: str) -> None:
        """Give ``path`` (an upper dir, or a layer's root) the mode and owner of the tree's
        root, which the view shows as its own."""
        like = self._dir_mode("")
        if like is not None:
            self._match(path, like)

    def _copy_blob(self, rel: str, path: str) -> None:
        digest, mode, _ = self.writes[rel]
        assert self.blobs is not None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
        try:
            self.blobs.copy_to(digest, fd)  # checks the hash while copying (BlobCorrupt)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def build_overlay(self, dest: str, hide: tuple[str, ...] = ()) -> None:
        """Write the layer into the empty directory ``dest`` (an overlay lower dir). ``hide``:
        names at the root that the view must not show (whiteouts), e.g. the workspace."""
        self.match_root(dest)
        made: set[str] = set()
        for rel in sorted(self.writes):
            if "/" in rel:
                self._mkdirs(dest, rel.rpartition("/")[0], made)
            self._copy_blob(rel, os.path.join(dest, rel))
        self._put_links_and_dirs(dest, made)
        for rel in self.whiteouts():
            if "/" in rel:
                self._mkdirs(dest, rel.rpartition("/")[0], made)
            os.mknod(os.path.join(dest, rel), stat.S_IFCHR | 0o600, os.makedev(0, 0))
        for name in hide:
            assert "/" not in name and not os.path.lexists(os.path.join(dest, name)), name
            if os.path.lexists(os.path.join(self.root, name)):
                os.mknod(os.path.join(dest, name), stat.S_IFCHR | 0o600, os.makedev(0, 0))

    def _put_links_and_dirs(self, dest: str, made: set[str]) -> None:
        for rel in sorted(self.mkdirs):
            self._mkdirs(dest, rel, made)
        for rel, target in sorted(self.links.items()):
            if "/" in rel:
                self._mkdirs(dest, rel.rpartition("/")[0], made)
            path = os.path.join(dest, rel)
            try:
                os.unlink(path)  # the copy tier's file or link at this path gives way
            except FileNotFoundError:
                pass
            os.symlink(target, path)

    def apply_to_copy(self, dest: str) -> None:
        """Apply the changes to ``dest``, a copy of the tree (the copy tier)."""
        for rel in sorted(self.gone, key=lambda p: p.count("/"), reverse=True):
            path = os.path.join(dest, rel)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                _rmtree(path)  # pruned: whatever the copy still holds there goes too
            else:
                os.unlink(path)
        made: set[str] = set()
        for rel in sorted(self.writes):
            if "/" in rel:
                self._mkdirs(dest, rel.rpartition("/")[0], made)
            path = os.path.join(dest, rel)
            try:
                os.unlink(path)  # never write through an existing file or link
            except FileNotFoundError:
                pass
            self._copy_blob(rel, path)
        self._put_links_and_dirs(dest, made)


def _rmtree(path: str) -> None:
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for f in filenames:
            os.unlink(os.path.join(dirpath, f))
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                os.unlink(full)
            else:
                os.rmdir(full)
    os.rmdir(path)
