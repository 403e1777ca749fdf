"""Staging: the steps that add changes to an active transaction, and the staged view.

The staged view of a path is the content its latest staged op gives it, else the tree's. Every
step validates everything first and appends its records last, in one append: a step that fails
has changed nothing.
"""

from __future__ import annotations

import os
import stat

from .. import crashpoints
from ..core import records as log_records
from ..core.merge3way import MERGE_BYTES_MAX
from ..core.states import DIR_FINGERPRINT, Op, Tx, iso_ms
from ..errors import (
    AmbiguousMatch,
    NoMatch,
    NotAFile,
    NotFound,
    TransactionAborted,
    UnknownSavepoint,
    UsageError,
)
from ..storage.blobs import BlobCorrupt, BlobStore, Pending
from ..storage.hashing import link_fingerprint, sha256_bytes, sha256_fd
from .paths import path_error, resolve

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Callable

    from ..core.records import StageRecord
    from ..participants.base import EffectStager, Participant
    from .gate import Gate
    from .journal import Journal

NAME_CHARS_MAX = 200
_MISSING, _FILE, _OTHER = 0, 1, 2  # what the tree has at a path (Staging._tree_is)
DIFF_BYTES_MAX = 8 << 20  # larger files are summarized by size, not read for a text diff
MODE_MAX = 0o777  # permission bits only: setuid, setgid and sticky are never staged
MODE_SPECIAL = 0o7000


def check_mode(mode: object, what: str = "mode") -> int | None:
    """The one check of a file mode, whoever gives it (CLI, library, run-batch, MCP): None, or
    permission bits (0 to 0o777). setuid, setgid and sticky bits are refused, not stripped: a
    transaction never makes a file that runs with its owner's rights."""
    if mode is None:
        return None
    if isinstance(mode, bool) or not isinstance(mode, int) or mode < 0 or mode > 0o7777:
        raise UsageError(f"{what} must be permission bits like 0644 or 0755, not {mode!r}")
    if mode & MODE_SPECIAL:
        raise UsageError(f"{what} {mode:04o} has setuid, setgid or sticky bits "
                         f"({mode & MODE_SPECIAL:04o}); agent-2pc stages permission bits only "
                         f"(like {mode & MODE_MAX:04o})")
    return mode


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > NAME_CHARS_MAX:
        raise UsageError(f"a savepoint name is 1 to {NAME_CHARS_MAX} characters")
    return name


class Staging:
    """Everything that stages, reads the staged view, or describes a transaction."""

    def __init__(self, root: str, blobs: BlobStore, journal: Journal, gate: Gate,
                 participants: list[Participant]) -> None:
        self.root = root
        self.blobs = blobs
        self.journal = journal
        self.gate = gate
        self.participants = participants

    # -- the tree and the view ---------------------------------------------------------------

    def _tree_fd(self, rel: str) -> int | None:
        """An open descriptor of the regular file at ``rel``; None when absent."""
        opened = self._tree_open(rel)
        return None if opened is None else opened[0]

    def _tree_open(self, rel: str) -> tuple[int, os.stat_result] | None:
        """The regular file at ``rel``, open, and its fstat; None when absent."""
        try:
            fd = os.open(os.path.join(self.root, rel), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except IsADirectoryError:
            raise NotAFile(f"{rel} is a directory", path=rel) from None
        except OSError as exc:  # a loop of links, a name too long, ... made after resolve
            raise path_error(exc, rel) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise NotAFile(f"{rel} is not a regular file", path=rel)
        return fd, st

    def _tree_read(self, rel: str) -> bytes | None:
        fd = self._tree_fd(rel)
        if fd is None:
            return None
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read()
        finally:
            os.close(fd)

    def _tree_digest(self, rel: str) -> tuple[str | None, int | None]:
        opened = self._tree_open(rel)
        if opened is None:
            return None, None
        fd, st = opened
        try:
            return sha256_fd(fd, st.st_size)[0], stat.S_IMODE(st.st_mode)
        finally:
            os.close(fd)

    def _blob(self, op: Op) -> bytes:
        assert op.blob is not None
        try:
            return self.blobs.read(op.blob)
        except BlobCorrupt as exc:
            self.blobs.discard(op.blob)
            raise TransactionAborted(f"the staged content of {op.path}: {exc}; stage it again",
                                     code="corrupt_blob") from None

    def _view_read(self, tx: Tx, rel: str) -> bytes | None:
        op = tx.staged(rel)
        if op is None:
            return self._tree_read(rel)
        if op.op == "symlink":
            raise NotAFile(f"{rel} is a symbolic link staged in this transaction (to "
                           f"{op.target!r}); use its target's path", path=rel)
        if op.op == "mkdir":
            raise NotAFile(f"{rel} is a directory in this transaction", path=rel)
        return None if op.op == "delete" else self._blob(op)

    def _view_blocks(self, tx: Tx, rel: str, puts: dict[str, str] | None,
                     memo: dict[str, int] | None) -> bool:
        """Does the staged view (and ``puts``: the ops of the step being built, path -> op)
        hold a file or a link at ``rel``, so that nothing can go below it?"""
        kind = puts.get(rel) if puts else None
        if kind is None:
            op = tx.staged(rel)
            kind = op.op if op is not None else None
        if kind is not None:
            return kind in ("write", "symlink")
        return self._tree_is(rel, memo) == _FILE

    def _tree_is(self, rel: str, memo: dict[str, int] | None) -> int:
        """What the tree has at ``rel``, links followed: _MISSING, _FILE or _OTHER; asked of
        the file system once per path in one step of many files (``memo``)."""
        known = memo.get(rel) if memo is not None else None
        if known is not None:
            return known
        try:
            st = os.stat(os.path.join(self.root, rel))
            kind = _FILE if stat.S_ISREG(st.st_mode) else _OTHER
        except (FileNotFoundError, NotADirectoryError):
            kind = _MISSING
        except OSError:
            kind = _OTHER
        if memo is not None:
            memo[rel] = kind
        return kind

    def tree_lacks_parent(self, rel: str, memo: dict[str, int]) -> bool:
        """Is a directory on the way to ``rel`` missing from the tree, so that nothing is at
        ``rel`` either? Answered from ``memo`` (filled by ``check_placeable``) when it can."""
        parent = rel.rpartition("/")[0]
        return bool(parent) and self._tree_is(parent, memo) == _MISSING

    def check_placeable(self, tx: Tx, rel: str, puts: dict[str, str] | None = None,
                        kind: str = "write", memo: dict[str, int] | None = None) -> None:
        """A file (or link, or with ``kind`` mkdir a directory) may go at ``rel`` in the
        staged view: no parent is a file or link; a file or link replaces a directory of the
        tree only when the view has emptied it (every file below deleted: a commit's deletes
        then remove it before the file goes in). ``memo``: what the tree has at the parents,
        kept by a caller placing many files (a capture)."""
        parts = rel.split("/")
        parent_missing = False
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if self._view_blocks(tx, prefix, puts, memo):
                raise NotAFile(f"{prefix} is a file, so {rel} cannot be created", path=rel)
            if memo is not None and not parent_missing:  # then rel is no directory of it
                parent_missing = self._tree_is(prefix, memo) == _MISSING
        if kind == "mkdir":
            return
        staged = tx.staged(rel)
        if staged is not None and staged.op == "mkdir":
            raise NotAFile(f"{rel} is a directory in this transaction", path=rel)
        full = os.path.join(self.root, rel)
        if not parent_missing and os.path.isdir(full) and not os.path.islink(full):
            left = self._left_in(tx, rel, puts)
            if left is not None:
                raise NotAFile(f"{rel} is a directory (holding {left}, which this transaction "
                               "does not delete)", path=rel)
        if tx.holds_below(rel):
            below = rel + "/"
            first = next(p for p, op in sorted(tx.latest_ops().items())
                         if op.op != "delete" and p.startswith(below))
            raise NotAFile(f"{rel} is a directory in this transaction ({first} is staged)",
                           path=rel)

    def _view_has_dir(self, tx: Tx, rel_dir: str) -> bool:
        """Is ``rel_dir`` a directory of the staged view: the root, a directory the
        transaction made or put something below, or a directory of the tree?"""
        if not rel_dir:
            return True
        op = tx.staged(rel_dir)
        if op is not None and op.op != "delete":
            return op.op == "mkdir"
        if tx.holds_below(rel_dir):
            return True
        return self._tree_kind(rel_dir) == "dir"

    def _left_in(self, tx: Tx, rel_dir: str, puts: dict[str, str] | None) -> str | None:
        """The first path below the tree's directory ``rel_dir`` that the staged view (and
        ``puts``) still holds; None when the view has emptied it."""
        from ..participants.fs import first_left

        def deleted(rel: str) -> bool:
            kind = puts.get(rel) if puts else None
            if kind is None:
                op = tx.staged(rel)
                kind = op.op if op is not None else None
            return kind == "delete"

        return first_left(self.root, rel_dir, deleted)

    def _pre(self, tx: Tx, rel: str) -> str | None:
        op = tx.staged(rel)
        if op is not None:
            return op.pre
        full = os.path.join(self.root, rel)
        if os.path.isdir(full) and not os.path.islink(full):
            return DIR_FINGERPRINT  # an emptied directory a file replaces (check_placeable)
        return self._tree_digest(rel)[0]

    def _pre_kept(self, tx: Tx, rel: str, pending: list[Pending]) -> str | None:
        """``_pre`` of a path about to be written; when it is first staged, the file's
        content is read once, hashed and kept as its base (as ``keep_base`` does)."""
        op = tx.staged(rel)
        if op is not None:
            return op.pre
        full = os.path.join(self.root, rel)
        if os.path.isdir(full) and not os.path.islink(full):
            return DIR_FINGERPRINT
        opened = self._tree_open(rel)
        if opened is None:
            return None
        fd, st = opened
        try:
            if st.st_size > MERGE_BYTES_MAX:
                return sha256_fd(fd, st.st_size)[0]
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(MERGE_BYTES_MAX + 1)
            if len(data) > MERGE_BYTES_MAX:  # it grew meanwhile: not kept
                os.lseek(fd, 0, os.SEEK_SET)
                return sha256_fd(fd)[0]
        finally:
            os.close(fd)
        if b"\0" not in data:
            pending.append(self.blobs.put_bytes(data))
            return pending[-1].digest
        return sha256_bytes(data)

    def keep_base(self, tx: Tx, rel: str, pre: str | None, pending: list[Pending]) -> None:
        """The first write of a file: keep the content it is staged from (``pre``) as a blob,
        so that a commit that finds the file changed by another writer can merge the two
        edits (coordinator/rebase.py); the op's ``pre`` names it (core/states.named_blobs).
        Best effort, never synced: a file larger than MERGE_BYTES_MAX, binary, or changed
        since it was hashed is not kept, and such a commit is a conflict, as without merge."""
        if pre is None or len(pre) != 64 or tx.staged(rel) is not None:
            return
        opened = self._tree_open(rel)
        if opened is None:
            return
        fd, st = opened
        try:
            if st.st_size > MERGE_BYTES_MAX:
                return
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(MERGE_BYTES_MAX + 1)
        finally:
            os.close(fd)
        if b"\0" in data or sha256_bytes(data) != pre:
            return
        pending.append(self.blobs.put_bytes(data))

    def _tree_kind(self, rel: str) -> str | None:
        """What the tree holds at ``rel`` itself, a link not followed: file, symlink, dir, or
        None when nothing is there. Other kinds are NotAFile."""
        try:
            mode = os.lstat(os.path.join(self.root, rel)).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise path_error(exc, rel) from None
        if stat.S_ISREG(mode):
            return "file"
        if stat.S_ISLNK(mode):
            return "symlink"
        if stat.S_ISDIR(mode):
            return "dir"
        raise NotAFile(f"{rel} is not a regular file, link or directory", path=rel)

    def _tree_node(self, rel: str) -> tuple[str | None, bytes | None, int | None]:
        """(kind, content, mode) of what the tree holds at ``rel`` itself (``_tree_kind``):
        a file's content and permission bits, a link's target bytes and S_IFLNK, nothing more
        for a directory or nothing."""
        kind = self._tree_kind(rel)
        full = os.path.join(self.root, rel)
        if kind == "symlink":
            return kind, os.fsencode(os.readlink(full)), stat.S_IFLNK | 0o777
        if kind != "file":
            return kind, None, None
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                return kind, f.read(), stat.S_IMODE(os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    def tree_fingerprint(self, rel: str) -> str | None:
        """The fingerprint of what the tree holds at ``rel`` itself (participants/fs.py)."""
        kind = self._tree_kind(rel)
        full = os.path.join(self.root, rel)
        if kind == "symlink":
            return link_fingerprint(os.readlink(full))
        if kind != "file":
            return DIR_FINGERPRINT if kind == "dir" else None
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            return sha256_fd(fd)[0]
        finally:
            os.close(fd)

    # -- steps -------------------------------------------------------------------------------

    def record_read(self, tid: str, path: str) -> dict[str, Any]:
        rel = resolve(self.root, path)
        with self.gate.active(tid):
            digest, _ = self._tree_digest(rel)
            self.journal.append([log_records.read(tid, path=rel, sha256=digest)])
        return {"path": rel, "sha256": digest}

    def read(self, tid: str, path: str) -> bytes | None:
        """The staged view's content of ``path`` (None: absent). When it comes from the tree,
        its hash is recorded as a read, so the commit aborts if the file changes meanwhile."""
        rel = resolve(self.root, path)
        with self.gate.active(tid) as tx:
            if tx.staged(rel) is not None:
                return self._view_read(tx, rel)
            data = self._tree_read(rel)
            digest = None if data is None else sha256_bytes(data)
            self.journal.append([log_records.read(tid, path=rel, sha256=digest)])
            return data

    def stage_write(self, tid: str, path: str, content: bytes | None = None, *,
                    src_fd: int | None = None, mode: int | None = None,
                    via: str = "write", create_dirs: bool = True) -> dict[str, Any]:
        """Stage ``content`` (bytes) or everything readable from ``src_fd`` (streamed).
        Missing parent directories are made at commit, unless ``create_dirs`` is false: then
        the parent must be a directory of the staged view (``not_found`` otherwise)."""
        assert (content is None) != (src_fd is None)
        mode = check_mode(mode)
        rel = resolve(self.root, path)
        with self.gate.active(tid) as tx:
            self.check_placeable(tx, rel)
            parent = rel.rpartition("/")[0]
            if not create_dirs and not self._view_has_dir(tx, parent):
                raise NotFound(f"{parent} is not a directory in the staged view (and "
                               f"create_dirs is false), so {rel} cannot be written",
                               path=rel)
            pending: list[Pending] = []
            pre = self._pre_kept(tx, rel, pending)
            if content is not None:
                blob = self.blobs.put_bytes(content)
            else:
                assert src_fd is not None
                blob = self.blobs.put_fd(src_fd)
            pending.append(blob)
            crashpoints.hit("stage.after_blob")
            self.append_staged([self.stage_record(tid, rel, "write", via, blob.digest,
                                                  blob.size, mode, pre)], pending)
        return {"path": rel, "op": "write", "bytes": blob.size}

    def append_staged(self, records: Sequence[StageRecord], blobs: list[Pending]) -> None:
        """Append stage records, then settle their blobs (which a commit or garbage collection
        may have taken away between our check and our append; storage/blobs.py)."""
        try:
            self.journal.append(records)
        except BaseException:
            for blob in blobs:
                blob.discard()
            raise
        for blob in blobs:
            blob.settle()

    def stage_record(self, tid: str, rel: str, op: str, via: str, blob: str | None,
                     size: int, mode: int | None, pre: str | None) -> StageRecord:
        """A ``stage`` record of ``tid`` (the steps of runs.py build theirs here too)."""
        # Permission bits only: a mode given by a caller passed check_mode; one captured from
        # a command (exec, promote: a file it chmod'ed u+s, a directory that inherited g+s)
        # loses its setuid, setgid and sticky bits here.
        return log_records.stage(tid, path=rel, op=op, via=via, blob=blob, size=size,
                                 mode=None if mode is None else mode & MODE_MAX, pre=pre)

    def stage_delete(self, tid: str, path: str) -> dict[str, Any]:
        rel = resolve(self.root, path)
        with self.gate.active(tid) as tx:
            op = tx.staged(rel)
            exists = (op.op != "delete") if op is not None else self._tree_fd_exists(rel)
            if not exists:
                raise NotFound(f"{rel} does not exist in the staged view", path=rel)
            self.journal.append([self.stage_record(tid, rel, "delete", "delete", None, 0,
                                                   None, self._pre(tx, rel))])
        return {"path": rel, "op": "delete"}

    def _tree_fd_exists(self, rel: str) -> bool:
        fd = self._tree_fd(rel)
        if fd is None:
            return False
        os.close(fd)
        return True

    def stage_replace(self, tid: str, path: str, old: str | bytes, new: str | bytes,
                      all: bool = False) -> dict[str, Any]:
        # surrogateescape: the CLI hands over non-UTF-8 argument bytes that way.
        old_b = old.encode("utf-8", "surrogateescape") if isinstance(old, str) else old
        new_b = new.encode("utf-8", "surrogateescape") if isinstance(new, str) else new
        if not old_b:
            raise UsageError("`old` must not be empty", params=("old",))
        rel = resolve(self.root, path)
        with self.gate.active(tid) as tx:
            content = self._view_read(tx, rel)
            if content is None:
                raise NotFound(f"{rel} does not exist in the staged view", path=rel)
            count = content.count(old_b)
            if count == 0:
                raise NoMatch(f"`old` does not occur in {rel}", path=rel, params=("old",))
            if count > 1 and not all:
                raise AmbiguousMatch(f"`old` occurs {count} times in {rel}; make it unique "
                                     "with more context, or set `all`", path=rel,
                                     matches=count, params=("old", "all"))
            updated = content.replace(old_b, new_b)
            blob = self.blobs.put_bytes(updated)
            pending = [blob]
            pre = self._pre_kept(tx, rel, pending)
            self.append_staged([self.stage_record(tid, rel, "write", "replace", blob.digest,
                                                  blob.size, None, pre)], pending)
        return {"path": rel, "op": "replace", "replacements": count}

    def stage_patch(self, tid: str, patch: str | bytes) -> dict[str, Any]:
        from ..core.patch import apply_patch

        with self.gate.active(tid) as tx:
            def read(p: str) -> bytes | None:
                rel = resolve(self.root, p)  # a path outside the root or in .git/ is refused
                if os.path.isdir(os.path.join(self.root, rel)):
                    return None
                return self._view_read(tx, rel)

            results = apply_patch(patch, read)
            records = []
            pending: list[Pending] = []
            files = []
            for p, content, mode in results:
                rel = resolve(self.root, p)
                if content is None:
                    records.append(self.stage_record(tid, rel, "delete", "patch", None, 0,
                                                     None, self._pre(tx, rel)))
                else:
                    self.check_placeable(tx, rel)
                    pre = self._pre_kept(tx, rel, pending)
                    blob = self.blobs.put_bytes(content)
                    pending.append(blob)
                    records.append(self.stage_record(
                        tid, rel, "write", "patch", blob.digest, blob.size,
                        None if mode is None else check_mode(mode & MODE_MAX), pre))
                files.append(rel)
            self.append_staged(records, pending)
        return {"files": files}

    def stage_effect(self, tid: str, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        """Stage one remote effect of ``kind`` (e.g. an HTTP call) for the participant that
        owns the kind (participants/base.py, EffectStager): it checks ``args`` completely
        before anything is logged, then gives the ``effect`` record's fields; one append."""
        return self.log_effect(tid, kind, self.check_effect(kind, args))

    def check_effect(self, kind: str, args: dict[str, Any]) -> Any:
        """The owning participant's check of an effect's ``args`` (nothing logged)."""
        return self._effect_stager(kind).check_effect(kind, args)

    def log_effect(self, tid: str, kind: str, checked: Any) -> dict[str, Any]:
        """Log an effect that ``check_effect`` passed; its staged answer."""
        stager = self._effect_stager(kind)
        with self.gate.active(tid) as tx:
            n = len(tx.effects)
            rec = log_records.effect(tid, n=n, kind=kind, **stager.effect_fields(tid, n, checked))
            self.journal.append([rec])
        return stager.staged_answer(log_records.as_json([rec])[0])

    def _effect_stager(self, kind: str) -> EffectStager:
        for participant in self.participants:
            if kind in participant.kinds and hasattr(participant, "check_effect"):
                stager: EffectStager = participant  # type: ignore[assignment]
                return stager
        raise UsageError(f"no participant stages effects of kind {kind!r}")

    def savepoint(self, tid: str, name: str) -> dict[str, Any]:
        name = _check_name(name)
        with self.gate.active(tid):
            self.journal.append([log_records.savepoint(tid, name=name)])
        return {"name": name}

    def rollback_to(self, tid: str, name: str) -> dict[str, Any]:
        name = _check_name(name)
        with self.gate.active(tid) as tx:
            if all(s[0] != name for s in tx.savepoints):
                known = ", ".join(s[0] for s in tx.savepoints) or "none"
                raise UnknownSavepoint(f"{tid} has no savepoint {name!r} (it has: {known})",
                                       name=name)
            self.journal.append([log_records.rollback(tid, name=name)])
        return {"name": name}

    # -- looking -----------------------------------------------------------------------------

    def diff(self, tid: str, stat_only: bool = False) -> dict[str, Any]:
        from ..core.textdiff import diff_file

        with self.gate.locked(tid) as tx:
            if isinstance(tx, dict) or tx.state in ("committed", "aborted"):
                return {"files": [], "diff": ""}  # a finished transaction changes nothing more
            files = []
            texts = []
            for op in tx.changes():
                for row, text in self.diff_of(tx, op, diff_file):
                    files.append(row)
                    texts.append(text)
        if stat_only:
            return {"files": files, "diff": stat_text(files)}
        return {"files": files, "diff": "".join(texts)}

    def diff_of(self, tx: Tx, op: Op, diff_file: Callable[..., Any]
                ) -> list[tuple[dict[str, Any], str]]:
        """The rows and text of one staged change's diff (a file too big to diff: a summary
        by size). Read-only: the monitor shows a diff with it too."""
        big = self._too_big_to_diff(op)
        if big is not None:
            return [(big, f"Large file {op.path}: {big['status']} "
                          f"({big['old_bytes']} -> {big['new_bytes']} bytes)\n")]
        return list(self._diff_op(tx, op, diff_file))

    def _diff_op(self, tx: Tx, op: Op, diff_file: Callable[..., Any]
                 ) -> list[tuple[dict[str, Any], str]]:
        """The rows and git-style texts of one net change. A link is diffed as git does
        (mode 120000, its target as content); a directory has a row (``kind: directory``)
        and a ``# empty directory added: path/`` line, which git apply and patch skip."""
        old_kind, old, old_mode = self._tree_node(op.path)
        new_kind: str | None = None
        new: bytes | None = None
        new_mode: int | None = None
        if op.op == "write":
            new_kind, new = "file", self._blob(op)
            new_mode = op.mode or (old_mode if old_kind == "file" else None) or 0o644
        elif op.op == "symlink":
            assert op.target is not None
            new_kind, new, new_mode = "symlink", os.fsencode(op.target), stat.S_IFLNK | 0o777
        elif op.op == "mkdir":
            new_kind = "dir"
        out: list[tuple[dict[str, Any], str]] = []
        if old_kind == new_kind and old == new and old_mode == new_mode:
            return out
        sides = [(old_kind, old, old_mode, new_kind, new, new_mode)]
        if old_kind is not None and new_kind is not None and old_kind != new_kind:
            # A change of type is a deletion and an addition, as git shows it.
            sides = [(old_kind, old, old_mode, None, None, None),
                     (None, None, None, new_kind, new, new_mode)]
        for ok, ob, om, nk, nb, nm in sides:
            if ok == "dir" or nk == "dir":
                status = "added" if nk else "deleted"
                # git has no way to show an empty directory; git apply and patch skip a
                # line of this kind between diffs.
                out.append(({"path": op.path, "status": status, "additions": 0,
                             "deletions": 0, "kind": "directory"},
                            f"# empty directory {status}: {op.path}/\n"))
                continue
            fd = diff_file(op.path, ob, nb, om if ob is not None else None, nm)
            row = {"path": op.path, "status": fd.status, "additions": fd.additions,
                   "deletions": fd.deletions}
            if "symlink" in (ok, nk):
                row["kind"] = "symlink"
            out.append((row, fd.text))
        return out

    def _too_big_to_diff(self, op: Op) -> dict[str, Any] | None:
        try:
            st = os.lstat(os.path.join(self.root, op.path))
            old_size: int | None = st.st_size if stat.S_ISREG(st.st_mode) else None
        except OSError:
            old_size = None
        new_size = op.size if op.op == "write" else None
        if max(old_size or 0, new_size or 0) <= DIFF_BYTES_MAX:
            return None
        status = "added" if old_size is None else "deleted" if new_size is None else "modified"
        return {"path": op.path, "status": status, "additions": 0, "deletions": 0,
                "old_bytes": old_size or 0, "new_bytes": new_size or 0}

    def status(self, tid: str | None = None) -> dict[str, Any]:
        if tid is None:
            self.journal.refresh()
            rows = [tx.summary() for tx in self.journal.txs.values() if tx.state not in
                    ("committed", "aborted")]
            rows.sort(key=lambda r: (r["created_at"], r["tid"]))
            out: dict[str, Any] = {"transactions": rows}
            from .outside import in_doubt

            waiting = in_doubt(self.journal.txs.values())
            if waiting:  # prepared: their coordinators decide (outside.py)
                out["in_doubt"] = waiting
            return out
        with self.gate.locked(tid) as tx:
            if isinstance(tx, dict):
                return {"transactions": [tx]}
            row = tx.summary()
            for participant in self.participants:
                row.update(participant.describe(tx))
            row["savepoints"] = [s[0] for s in tx.savepoints]
            if tx.origin is not None:
                row["origin"] = tx.origin  # imported from a bundle (coordinator/bundles.py)
            if tx.deadline_ms and tx.coordinator is None:  # a prepared one never expires
                row["expires_at"] = iso_ms(tx.deadline_ms)
            if tx.reason:
                row["code"], row["reason"] = tx.code, tx.reason
            if tx.coordinator is not None:  # voted for an outside coordinator (outside.py)
                row["coordinator"] = tx.coordinator
                row["prepared_ms"] = tx.voted_ms
            return {"transactions": [row]}


def stat_text(files: list[dict[str, Any]]) -> str:
    """``git diff --stat``-like summary."""
    if not files:
        return ""
    width = max(len(f["path"]) + 1 for f in files)
    lines = [f" {f['path'] + '/':<{width}} | directory {f['status']}" if
             f.get("kind") == "directory" else
             f" {f['path']:<{width}} | +{f['additions']} -{f['deletions']}" for f in files]
    adds = sum(f["additions"] for f in files)
    dels = sum(f["deletions"] for f in files)
    lines.append(f" {len(files)} file{'s' if len(files) != 1 else ''} changed, "
                 f"{adds} insertions(+), {dels} deletions(-)")
    return "\n".join(lines) + "\n"
