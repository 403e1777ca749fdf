"""The copy tier: a copy of the tree with the staged changes applied, captured by comparison.

What is copied: tracked plus untracked-not-ignored files (``git ls-files -co --exclude-standard``)
when the root is a git work tree, else everything but ``.git/`` and ``.agent-tx/``; never hard
links (tools write in place), symlinks as symlinks, modes and modification times kept. Paths the
ignore rules name are left out. Then the staged changes are applied (_layer.py).

Capture compares the copy with a picture taken before the commands ran: (kind, mode, size,
mtime, ctime, inode) per path. After building, the clock is made to tick past every ctime in
the picture, so any later write or chmod gives a file another ctime: an unchanged picture
entry means an unchanged file, with no content read. A file whose entry changed but whose size
and mode did not is compared byte for byte with what the view showed (a ``touch`` or a rewrite
with the same bytes is not a change).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time

from ._capture import Capture, Change, _Builder, other_kind, same_content

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    from ._ignore import Ignore
    from ._layer import Layer

GIT_TIMEOUT_S = 120.0
TICK_WAIT_S_MAX = 0.5
FILES_MAX = 5_000_000

if TYPE_CHECKING:
    # kind, mode, size, mtime_ns, ctime_ns, ino, symlink target
    Entry = tuple[str, int, int, int, int, int, str | None]


def list_sources(root: str, ignore: Ignore) -> list[str]:
    """The paths to copy, relative to ``root``."""
    if os.path.exists(os.path.join(root, ".git")) and shutil.which("git"):
        try:
            proc = subprocess.run(
                ["git", "-C", root, "ls-files", "-z", "-co", "--exclude-standard"],
                capture_output=True, timeout=GIT_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError):
            proc = None
        if proc is not None and proc.returncode == 0:
            names = os.fsdecode(proc.stdout).split("\0")
            return sorted({n for n in names if n and not ignore(n)})
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for d in dirnames:
            rel = f"{rel_dir}/{d}" if rel_dir else d
            if ignore.match_one(rel):
                continue
            if os.path.islink(os.path.join(dirpath, d)):
                out.append(rel)
            else:
                keep.append(d)
                out.append(rel)  # directories too: empty ones are part of the tree
        dirnames[:] = keep
        for f in filenames:
            rel = f"{rel_dir}/{f}" if rel_dir else f
            if not ignore.match_one(rel):
                out.append(rel)
        assert len(out) <= FILES_MAX, f"more than {FILES_MAX} files to copy"
    return sorted(out)


def build_copy(root: str, dest: str, layer: Layer, ignore: Ignore) -> int:
    """Copy the tree into ``dest`` (which exists and is empty); apply the layer. Returns the
    number of files copied."""
    dir_modes: dict[str, int] = {}  # rel -> mode, set last (a read-only one is filled first)
    made: set[str] = {""}
    copied = 0

    def mkdirs(rel_dir: str) -> None:
        if rel_dir in made:
            return
        parent = rel_dir.rpartition("/")[0]
        mkdirs(parent)
        os.mkdir(os.path.join(dest, rel_dir), 0o700)
        made.add(rel_dir)
        try:
            st = os.lstat(os.path.join(root, rel_dir))
            dir_modes[rel_dir] = stat.S_IMODE(st.st_mode)
        except OSError:
            dir_modes[rel_dir] = 0o755

    for rel in list_sources(root, ignore):
        src = os.path.join(root, rel)
        try:
            st = os.lstat(src)
        except OSError:
            continue  # tracked but deleted from the work tree, or gone meanwhile
        parent = rel.rpartition("/")[0]
        if stat.S_ISREG(st.st_mode):
            mkdirs(parent)
            dst = os.path.join(dest, rel)
            shutil.copyfile(src, dst, follow_symlinks=False)
            os.chmod(dst, stat.S_IMODE(st.st_mode))
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
            copied += 1
        elif stat.S_ISLNK(st.st_mode):
            mkdirs(parent)
            os.symlink(os.readlink(src), os.path.join(dest, rel))
        elif stat.S_ISDIR(st.st_mode):
            if os.path.exists(os.path.join(src, ".git")):  # a submodule: copy its files
                mkdirs(parent)
                shutil.copytree(src, os.path.join(dest, rel), symlinks=True,
                                ignore=shutil.ignore_patterns(".git"))
            else:
                mkdirs(rel)
    layer.apply_to_copy(dest)
    for rel in sorted(dir_modes, key=lambda p: p.count("/"), reverse=True):
        path = os.path.join(dest, rel)
        if os.path.isdir(path) and not os.path.islink(path):
            mode = dir_modes[rel]
            os.chmod(path, mode | 0o700 if os.geteuid() != 0 else mode)
    layer.match_root(dest)
    return copied


def picture(dest: str, ignore: Ignore) -> tuple[dict[str, Entry], dict[str, int], list[str]]:
    """(entries by path, number of entries of each directory, ignored paths) of the copy."""
    entries: dict[str, Entry] = {}
    counts: dict[str, int] = {}
    ignored: list[str] = []

    def walk(rel_dir: str) -> None:
        top = os.path.join(dest, rel_dir) if rel_dir else dest
        n = 0
        with os.scandir(top) as it:
            for e in it:
                n += 1
                rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
                if ignore.match_one(rel):
                    ignored.append(rel)
                    continue
                st = e.stat(follow_symlinks=False)
                m = st.st_mode
                if stat.S_ISDIR(m):
                    entries[rel] = ("dir", stat.S_IMODE(m), 0, 0, 0, st.st_ino, None)
                    walk(rel)
                    continue
                kind = ("file" if stat.S_ISREG(m) else "symlink" if stat.S_ISLNK(m)
                        else other_kind(m))
                target = os.readlink(e.path) if kind == "symlink" else None
                entries[rel] = (kind, stat.S_IMODE(m), st.st_size, st.st_mtime_ns,
                                st.st_ctime_ns, st.st_ino, target)
                assert len(entries) <= FILES_MAX, f"more than {FILES_MAX} paths in the copy"
        counts[rel_dir] = n

    walk("")
    return entries, counts, ignored


def wait_for_tick(scratch: str, entries: dict[str, Entry]) -> None:
    """Return once a new change to a file in ``scratch`` gets a ctime later than every ctime
    in ``entries`` (timestamps are coarse: a write in the same tick could look unchanged)."""
    newest = max((e[4] for e in entries.values()), default=0)
    probe = os.path.join(scratch, "tick")
    deadline = time.monotonic() + TICK_WAIT_S_MAX
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        n = 0
        while True:
            os.write(fd, b"x")
            n += 1
            if os.fstat(fd).st_ctime_ns > newest:
                return
            if time.monotonic() > deadline:
                raise AssertionError("the file system clock does not advance")
            time.sleep(0.0005 if n > 4 else 0)
    finally:
        os.close(fd)
        os.unlink(probe)


def capture_copy(dest: str, before: dict[str, Entry], layer: Layer, ignore: Ignore,
                 select: Callable[[str], bool] | None = None) -> Capture:
    """What the commands changed in the copy at ``dest`` since ``before`` was taken."""
    after, counts, ignored = picture(dest, ignore)
    b = _Builder(select)
    for rel, a in after.items():
        was = before.get(rel)
        kind = a[0]
        if was is not None and was[0] != kind and was[0] != "dir":
            b.delete(rel)  # a file or link replaced by something else
        if kind == "dir":
            if (was is None or was[0] != "dir") and counts.get(rel) == 0:
                b.add(Change(rel, "mkdir", mode=a[1]))
            continue
        path = os.path.join(dest, rel)
        if kind == "file":
            if was is not None and was[0] == "file":
                if a[1:6] == was[1:6]:
                    continue  # same mode, size, mtime, ctime and inode: untouched
                if a[1] == was[1] and a[2] == was[2] and (select is None or select(rel)):
                    seen = layer.before(rel)
                    if seen is not None and seen.source is not None and \
                            same_content(path, seen.source):
                        b.out.unchanged += 1
                        continue
            b.add(Change(rel, "write", mode=a[1], source=path, size=a[2]))
        elif kind == "symlink":
            if was is not None and was[0] == "symlink" and was[6] == a[6]:
                continue
            b.add(Change(rel, "symlink", target=a[6]))
        else:
            if was is None or was[0] != kind:
                b.skip(rel, kind)
    for rel, was in before.items():
        if rel not in after and (was[0] != "dir" or layer.empty_dir(rel)):
            b.delete(rel)  # a file or link, or a directory that was empty
    b.out.ignored = [rel for rel in ignored if rel not in (".git", ".agent-tx")]
    return b.finish()
