"""Capture: what commands changed in a view, as a list of changes relative to the repo root.

Overlay tiers read the upper directory, where everything the commands wrote landed:
- a regular file is a ``write`` (content and mode: a chmod copies the file up, so it shows
  here too) unless it has exactly the content and mode the view showed before (a ``touch``,
  a rewrite with the same bytes: nothing to stage);
- a whiteout (character device 0/0; fuse-overlayfs also writes ``.wh.NAME`` files) is a
  ``delete`` of what the view showed there; a whited-out directory is a delete of every file
  below it;
- an opaque directory (the commands removed a directory and made a new one at its place) hides
  everything below it in the lower layers: each hidden file is a delete;
- a symbolic link is a ``symlink`` (with its target); a new directory left empty is a ``mkdir``;
- anything else (fifo, socket, device) is listed under ``skipped``.
A rename shows as a delete and a write (redirect_dir=off: the kernel copies instead of
recording a redirect). Directory modes are not captured (the transaction holds files).

The copy tier compares the copy with the picture taken before the commands ran (_copy.py) and
yields the same shapes.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ._ignore import Ignore
    from ._layer import Layer

OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque", "user.fuseoverlayfs.opaque")
FUSE_OPAQUE_FILE = ".wh..wh..opq"
WHITEOUT_PREFIX = ".wh."
COMPARE_CHUNK = 1 << 20
ENTRIES_MAX = 10_000_000  # a capture larger than this is a runaway command: refuse to list it


class Change:
    """One captured change. ``op``: write | delete | symlink | mkdir.

    write: ``mode`` and ``source``, a file to stream the content from (valid until the view is
    closed), ``size`` in bytes. symlink: ``target``. mkdir: ``mode``. delete: only ``path``.
    """

    __slots__ = ("path", "op", "mode", "source", "target", "size")

    def __init__(self, path: str, op: str, mode: int | None = None, source: str | None = None,
                 target: str | None = None, size: int | None = None) -> None:
        self.path = path
        self.op = op
        self.mode = mode
        self.source = source
        self.target = target
        self.size = size

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "op": self.op}
        if self.mode is not None:
            out["mode"] = self.mode
        if self.size is not None:
            out["bytes"] = self.size
        if self.target is not None:
            out["target"] = self.target
        return out

    def __repr__(self) -> str:
        return f"Change({self.op} {self.path})"


class Capture:
    """``changes``: deletes first, then writes, symlinks and mkdirs, each sorted by path.
    ``skipped``: [{path, kind}] for other file types. ``ignored``: the topmost ignored paths
    that the commands wrote. ``unchanged``: files rewritten with the same content and mode."""

    __slots__ = ("changes", "skipped", "ignored", "unchanged")

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.skipped: list[dict[str, str]] = []
        self.ignored: list[str] = []
        self.unchanged = 0

    def to_json(self) -> dict[str, Any]:
        return {"captured": [c.to_json() for c in self.changes], "skipped": self.skipped,
                "ignored": self.ignored, "unchanged": self.unchanged}

    def by_path(self) -> dict[str, Change]:
        return {c.path: c for c in self.changes}


class _Builder:
    def __init__(self, select: Callable[[str], bool] | None) -> None:
        self.select = select
        self.deletes: dict[str, Change] = {}
        self.others: dict[str, Change] = {}
        self.out = Capture()
        self.count = 0

    def _bump(self) -> None:
        self.count += 1
        if self.count > ENTRIES_MAX:
            raise OverflowError(f"more than {ENTRIES_MAX} changed paths: not captured")

    def delete(self, rel: str) -> None:
        if self.select is None or self.select(rel):
            self._bump()
            self.deletes[rel] = Change(rel, "delete")

    def add(self, change: Change) -> None:
        if self.select is None or self.select(change.path):
            self._bump()
            self.deletes.pop(change.path, None)
            self.others[change.path] = change

    def skip(self, rel: str, kind: str) -> None:
        if self.select is None or self.select(rel):
            self.out.skipped.append({"path": rel, "kind": kind})

    def finish(self) -> Capture:
        self.out.changes = ([self.deletes[p] for p in sorted(self.deletes)] +
                            [self.others[p] for p in sorted(self.others)])
        self.out.skipped.sort(key=lambda s: s["path"])
        self.out.ignored.sort()
        return self.out


def other_kind(st_mode: int) -> str:
    if stat.S_ISFIFO(st_mode):
        return "fifo"
    if stat.S_ISSOCK(st_mode):
        return "socket"
    if stat.S_ISCHR(st_mode):
        return "char_device"
    if stat.S_ISBLK(st_mode):
        return "block_device"
    return "unknown"


def same_content(a: str, b: str) -> bool:
    """Do the files ``a`` and ``b`` hold the same bytes? (Callers compare sizes first.)"""
    try:
        fa = os.open(a, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fb = os.open(b, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            while True:
                ca = os.read(fa, COMPARE_CHUNK)
                cb = os.read(fb, COMPARE_CHUNK)
                if ca != cb:
                    return False
                if not ca:
                    return True
        finally:
            os.close(fb)
    finally:
        os.close(fa)


def _is_opaque(path: str, fuse: bool) -> bool:
    if fuse and os.path.lexists(os.path.join(path, FUSE_OPAQUE_FILE)):
        return True
    for name in OPAQUE_XATTRS:
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
                raise
    return False


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def capture_upper(upper: str, layer: Layer, ignore: Ignore, *, fuse: bool,
                  select: Callable[[str], bool] | None = None) -> Capture:
    """What the commands changed, read from an overlay upper directory."""
    b = _Builder(select)
    present: set[str] = set()  # every path the upper dir holds
    opaque_dirs: list[str] = []

    def whiteout(rel: str) -> None:
        seen = layer.before(rel)
        if seen is None:
            return
        if seen.kind == "dir":
            for f in layer.lower_files(rel, ignore):
                b.delete(f)
            for d in layer.lower_empty_dirs(rel, ignore):
                b.delete(d)
        else:
            b.delete(rel)

    def walk(rel_dir: str, new: bool) -> int:
        """Capture the upper directory ``rel_dir``; return how many entries it holds. ``new``:
        the view had no directory there before the commands ran, so nothing below it either
        (a package install's thousands of files: no lookup of what was there)."""
        top = os.path.join(upper, rel_dir) if rel_dir else upper
        with os.scandir(top) as it:
            entries = sorted(it, key=lambda e: e.name)
        held = 0
        for e in entries:
            name = e.name
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if name.startswith(WHITEOUT_PREFIX) and fuse:
                target = name[len(WHITEOUT_PREFIX):]
                if (e.is_file(follow_symlinks=False) and target and
                        not target.startswith(WHITEOUT_PREFIX) and target != ".opq"):
                    t_rel = f"{rel_dir}/{target}" if rel_dir else target
                    if not ignore(t_rel):
                        whiteout(t_rel)
                continue  # fuse-overlayfs metadata (whiteout files, opaque markers)
            held += 1
            if ignore.match_one(rel):
                if not (rel_dir == "" and name in (".git", ".agent-tx")):
                    b.out.ignored.append(rel)
                continue
            st = e.stat(follow_symlinks=False)
            if _is_whiteout(st):
                whiteout(rel)
                continue
            seen = None if new else layer.before(rel)
            if stat.S_ISDIR(st.st_mode):
                was_dir = seen is not None and seen.kind == "dir"
                if seen is not None and not was_dir:
                    b.delete(rel)  # a file or link replaced by a directory
                if was_dir and _is_opaque(e.path, fuse):
                    opaque_dirs.append(rel)
                present.add(rel)
                inner = walk(rel, not was_dir)
                if not was_dir and inner == 0:
                    b.add(Change(rel, "mkdir", mode=stat.S_IMODE(st.st_mode)))
                continue
            present.add(rel)
            if seen is not None and seen.kind == "dir":  # a directory replaced by a file or link
                for f in layer.lower_files(rel, ignore):
                    b.delete(f)
                for d in layer.lower_empty_dirs(rel, ignore):
                    b.delete(d)
            if stat.S_ISREG(st.st_mode):
                mode = stat.S_IMODE(st.st_mode)
                if (seen is not None and seen.kind == "file" and seen.mode == mode and
                        seen.size == st.st_size and (b.select is None or b.select(rel)) and
                        seen.source is not None and same_content(e.path, seen.source)):
                    b.out.unchanged += 1
                    continue
                b.add(Change(rel, "write", mode=mode, source=e.path, size=st.st_size))
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(e.path)
                if seen is not None and seen.kind == "symlink" and seen.target == target:
                    continue
                b.add(Change(rel, "symlink", target=target))
            else:
                b.skip(rel, other_kind(st.st_mode))
        return held

    layer.forget_tree()
    walk("", False)
    _hidden_by_opaque_dirs(b, layer, ignore, opaque_dirs, present)
    return b.finish()


def _hidden_by_opaque_dirs(b: _Builder, layer: Layer, ignore: Ignore, opaque_dirs: list[str],
                           present: set[str]) -> None:
    """Deletes of what the view showed below each directory the commands removed and made
    again (an opaque one), but what the upper directory holds again."""
    for rel in opaque_dirs:
        for f in layer.lower_files(rel, ignore):
            if f not in present:
                b.delete(f)
        for d in layer.lower_empty_dirs(rel, ignore):
            if d != rel and d not in present:
                b.delete(d)

