"""What the file participant merges at commit instead of voting ``conflict``.

A file the transaction writes was changed by another writer since it was staged (what stands
there is not the op's ``pre``). When both are text and the two edits do not overlap, the
transaction's edit is *rebased* onto the other writer's content: a three-way merge with the
content the op was staged from as base (kept by staging, coordinator/staging.keep_base), what
is on disk now as ours, the staged content as theirs (core/merge3way.py). The merged content
becomes the op's new content and what is on disk now its new ``pre``: coordinator/rebase.py
stages it, so that prepare, the decision, apply and a redo after a crash all carry the merged
content exactly as they carry any staged write.

No merge, and the answer stays ``conflict``, when: the edits overlap; a file is binary or
larger than MERGE_BYTES_MAX; its base was not kept; the transaction recorded a read of the
file (its edit was decided on what it read); the change is not a write of a file's content
(a delete, a link, a directory, a file the transaction creates), or the other writer deleted
the file or put something else than a file there.
"""

from __future__ import annotations

import errno
import os
import stat

from ..core.merge3way import MERGE_BYTES_MAX, NotText, merge
from ..core.states import DIR_FINGERPRINT
from ..storage.blobs import BlobCorrupt
from ..storage.hashing import sha256_bytes
from .fs import Dirs, PathChanged, _short, current, split

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..core.states import Op, Tx
    from ..storage.blobs import BlobStore


class Rebased:
    """One file merged: the op's new content and new ``pre`` (what is on disk now)."""

    __slots__ = ("op", "content", "now", "now_content")

    def __init__(self, op: Op, content: bytes, now: str, now_content: bytes) -> None:
        self.op = op
        self.content = content
        self.now = now
        self.now_content = now_content


class NotMerged(Exception):
    """A changed file that is not merged: the commit is a conflict, for ``reason``."""

    def __init__(self, path: str, reason: str) -> None:
        sep = " " if reason.startswith("(") else ", "
        super().__init__(f"{path} changed since it was staged{sep}{reason}; the other "
                         "writer's content is kept")
        self.path = path


class StaleRead(NotMerged):
    """A recorded read no longer holds: the commit is a conflict whatever merges."""

    def __init__(self, path: str) -> None:
        Exception.__init__(self, f"{path} changed since it was read (this transaction's "
                           "edits were decided on what it read); nothing is merged")
        self.path = path


def _read_now(dirs: Dirs, path: str) -> tuple[str, bytes] | None:
    """(sha256, content) of the regular file at ``path``, never following a link; None when
    it is larger than MERGE_BYTES_MAX."""
    parent, name = split(path)
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                 dir_fd=dirs.open(parent))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PathChanged(f"{path} is no longer a regular file")
        if st.st_size > MERGE_BYTES_MAX:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MERGE_BYTES_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > MERGE_BYTES_MAX:
        return None
    return sha256_bytes(data), data


def _what(fingerprint: str | None) -> str:
    if fingerprint is None:
        return "deleted"
    if fingerprint == DIR_FINGERPRINT:
        return "replaced by a directory"
    return "replaced by a symbolic link"


def plan(root: str, blobs: BlobStore, tx: Tx) -> list[Rebased]:
    """The merges that would let ``tx`` commit over what other writers changed: one per
    changed file, none when nothing changed. NotMerged names the first changed path that
    cannot be merged (then nothing is merged)."""
    read_paths = {p for p, _ in tx.reads}
    out: list[Rebased] = []
    dirs = Dirs(root, remember_missing=True)  # it only looks: a new tree is asked about once
    try:
        for path, digest in tx.reads:
            if current(dirs, path)[0] != digest:
                raise StaleRead(path)
        for op in tx.changes():
            now, _ = current(dirs, op.path)
            if now == op.pre or (op.op == "mkdir" and now == DIR_FINGERPRINT):
                continue
            out.append(_merge_one(dirs, blobs, op, now, op.path in read_paths))
    except PathChanged:
        return []  # a directory on the way is no longer one: prepare votes no, and says why
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise
        return []  # it changed again while read: prepare votes no
    finally:
        dirs.close()
    return out


def _merge_one(dirs: Dirs, blobs: BlobStore, op: Op, now: str | None, was_read: bool
               ) -> Rebased:
    """Merge the changed file of ``op`` (``now``: its fingerprint on disk), or NotMerged."""
    was = f"(it was {_short(op.pre)}, now {_short(now)})"
    if op.op != "write":
        raise NotMerged(op.path, f"{was}, and this transaction {op.op}s it: only a file's "
                        "content is merged")
    if op.pre is None or len(op.pre) != 64:
        raise NotMerged(op.path, f"{was}, and this transaction creates it (another writer "
                        "created it too)" if op.pre is None else f"{was}: only a file's "
                        "content is merged")
    if now is None or len(now) != 64:
        raise NotMerged(op.path, f"{was}: it was {_what(now)}")
    if was_read:
        raise NotMerged(op.path, "and this transaction recorded a read of it (its edit was "
                        "decided on what it read): not merged")
    read = _read_now(dirs, op.path)
    if read is None:
        raise NotMerged(op.path, f"and it is larger than {MERGE_BYTES_MAX} bytes: not merged")
    now, ours = read
    try:
        base = blobs.read(op.pre)
    except BlobCorrupt:
        raise NotMerged(op.path, "and the content it was staged from was not kept (binary, "
                        f"or larger than {MERGE_BYTES_MAX} bytes): not merged") from None
    assert op.blob is not None
    try:
        theirs = blobs.read(op.blob)
    except BlobCorrupt as exc:
        raise NotMerged(op.path, f"and its staged content is damaged ({exc})") from None
    try:
        merged = merge(base, ours, theirs, label_ours="now", label_theirs="staged")
    except NotText as exc:
        side = {"base": "the content it was staged from", "ours": "the other writer's "
                "content", "theirs": "the staged content"}[exc.which]
        raise NotMerged(op.path, f"and {side} is binary: not merged") from None
    if merged.conflicts:
        first = merged.conflicts[0].ours
        lines = (f"line {first.start}" if first.lines <= 1 else
                 f"lines {first.start}-{first.start + first.lines - 1}")
        n = len(merged.conflicts)
        raise NotMerged(op.path, f"and the two edits overlap ({n} conflicting region"
                        f"{'s' if n != 1 else ''}, the first at {lines} of its content "
                        "now)")
    return Rebased(op, merged.content, now, ours)
