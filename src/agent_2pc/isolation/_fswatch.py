"""What a governed command has done to the view so far, by looking at it: files written,
files deleted, bytes on disk. The governor's sampler calls ``sample()`` every tick.

Polling, not events, on purpose (docs/staged-view.md, "Governor"): fanotify cannot watch an
overlay mount as a whole for creations and deletions (a filesystem or mount mark with file ids
is refused with EOPNOTSUPP: overlay file handles are not decodable), inotify needs a watch on
every directory and races with directories made after the watch, and neither sees into a
FUSE daemon's writes. The upper dir, on the other hand, *is* the net effect of the command on
the view — exactly what a capture would stage — and walking it costs time proportional to what
the command wrote, not to the repo. The sampler spaces its ticks so that this walk takes a
bounded share of a core (governor.py), which bounds the detection latency too.

Counts are net: a file written then removed again, or a temp file made and deleted, is not
counted (the churn is bounded by the disk and CPU limits instead).

  UpperWatch  overlay tiers: non-directory entries of the upper dir are files written (ignored
              paths left out, as capture does); whiteouts (and opaque directories) are deletes
              of what the view showed there, a whited-out directory counting every file it
              held; bytes are the blocks allocated in the upper dir.
  CopyWatch   copy tier: the copy compared with the picture taken before the run (_copy.py):
              new or changed entries are written, missing ones deleted; bytes are the sizes of
              the written files.
"""

from __future__ import annotations

import os
import stat

from ._capture import FUSE_OPAQUE_FILE, WHITEOUT_PREFIX, _is_opaque, _is_whiteout
from ._copy import picture

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._ignore import Ignore
    from ._layer import Layer


class FsCounts:
    __slots__ = ("files_written", "deletes", "disk_bytes")

    def __init__(self, files_written: int = 0, deletes: int = 0, disk_bytes: int = 0) -> None:
        self.files_written = files_written
        self.deletes = deletes
        self.disk_bytes = disk_bytes


class UpperWatch:
    method = "sample:upper-dir"

    def __init__(self, upper: str, layer: Layer, ignore: Ignore, fuse: bool) -> None:
        self.upper = upper
        self.layer = layer
        self.ignore = ignore
        self.fuse = fuse
        self._lower: dict[str, list[str]] = {}  # memo: files below a lower directory

    def _lower_files(self, rel: str) -> list[str]:
        got = self._lower.get(rel)
        if got is None:
            got = self._lower[rel] = self.layer.lower_files(rel, self.ignore)
        return got

    def _whiteout(self, rel: str) -> int:
        seen = self.layer.before(rel)
        if seen is None:
            return 0
        return len(self._lower_files(rel)) if seen.kind == "dir" else 1

    def sample(self) -> FsCounts:
        out = FsCounts()
        opaque: list[str] = []
        present: set[str] = set()
        stack: list[tuple[str, bool]] = [("", False)]  # (rel dir, ignored)
        while stack:
            rel_dir, ignored_dir = stack.pop()
            top = os.path.join(self.upper, rel_dir) if rel_dir else self.upper
            try:
                it = os.scandir(top)
            except OSError:
                continue  # removed while we looked: the next tick sees the new state
            with it:
                for e in it:
                    name = e.name
                    rel = f"{rel_dir}/{name}" if rel_dir else name
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    ignored = ignored_dir or self.ignore.match_one(rel)
                    if stat.S_ISDIR(st.st_mode):
                        if not ignored:
                            seen = self.layer.before(rel)
                            if seen is not None and seen.kind == "dir" and \
                                    _is_opaque(e.path, self.fuse):
                                opaque.append(rel)
                        stack.append((rel, ignored))
                        continue
                    out.disk_bytes += st.st_blocks * 512
                    if self.fuse and name.startswith(WHITEOUT_PREFIX):
                        target = name[len(WHITEOUT_PREFIX):]
                        if name != FUSE_OPAQUE_FILE and target and not ignored:
                            t_rel = f"{rel_dir}/{target}" if rel_dir else target
                            out.deletes += self._whiteout(t_rel)
                        continue
                    if ignored:
                        continue
                    if _is_whiteout(st):
                        out.deletes += self._whiteout(rel)
                        continue
                    out.files_written += 1
                    if opaque:
                        present.add(rel)
        for rel in opaque:
            out.deletes += sum(1 for f in self._lower_files(rel) if f not in present)
        return out


class CopyWatch:
    method = "sample:copy-tree"

    def __init__(self, root: str, before: dict[str, Any], ignore: Ignore) -> None:
        self.root = root
        self.before = before
        self.ignore = ignore

    def sample(self) -> FsCounts:
        out = FsCounts()
        try:
            after = picture(self.root, self.ignore)[0]
        except OSError:
            return out  # changed under our feet: the next tick sees the new state
        for rel, a in after.items():
            if a[0] == "dir":
                continue
            was = self.before.get(rel)
            if was is not None and was[:6] == a[:6]:
                continue
            out.files_written += 1
            out.disk_bytes += a[2]
        for rel, was in self.before.items():
            if was[0] != "dir" and rel not in after:
                out.deletes += 1
        return out
