"""``undo``: take back a committed transaction T as a new transaction U (docs/collaboration.md,
"Undo and log").

What T did to each path is in its history line (``changes``, answers.py): the fingerprint of
what stood there before (``pre``) and after (``post``). What stood there before is its
pre-image, ``preimages/<T>.<k>``, the file (or link) that T's apply replaced or deleted, kept
by hard link (storage/blobs.py) for the retention of coordinator/compaction.py. U stages, per
path, the inverse: the pre-image's content and mode, its link, a directory, or a delete, each
with ``post`` as the content it was staged from. So U goes through the ordinary commit: a path
that changed since T committed makes prepare vote no (``conflict``), and whatever the commit
learns to do instead (a three-way merge) applies to an undo too. Before U is begun, the tree
is compared with T's ``post``: a path that changed already is refused at once, with nothing
written. U's own line names T (``undoes``), and U is undone like any other: undo of an undo
redoes.
"""

from __future__ import annotations

import os
import stat

from .. import crashpoints
from ..core import records as log_records
from ..core.confine import path_problem
from ..core.states import COMMITTED, DIR_FINGERPRINT, Tx
from ..errors import BadState, NotFound, Tampered, TransactionAborted, UsageError
from ..storage.hashing import link_fingerprint
from .answers import summary
from .gate import check_tid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..core.records import StageRecord
    from ..storage.blobs import Pending
    from .engine import Engine

MODE_BITS = 0o777
# The undo transaction commits right after it is staged; one that a killed process left active
# is aborted (timeout) by the next command that finds it past this.
UNDO_TIMEOUT_MS = 10 * 60 * 1000


def undo(engine: Engine, tid: str) -> dict[str, Any]:
    """Undo ``tid`` (committed) as a new transaction; its commit's answer plus ``undoes``."""
    if not isinstance(tid, str):
        raise UsageError("`tid` must be a string", params=("tid",))
    check_tid(tid)
    journal = engine.journal
    journal.refresh()
    found = journal.lookup(tid)  # UnknownTid
    entry = summary(found) if isinstance(found, Tx) else found
    if entry.get("state") != COMMITTED:
        raise BadState(f"{tid} is {entry.get('state')}; only a committed transaction can be "
                       "undone (it changed nothing)", tid=tid, state=entry.get("state"))
    changes = entry.get("changes")
    if changes is None:
        raise NotFound(f"{tid} was moved to the history by an earlier version of agent-2pc, "
                       "which did not keep what undo needs", tid=tid)
    if not isinstance(changes, list) or not all(_well_formed(ch) for ch in changes):
        raise Tampered(f"the history line of {tid} does not say what it changed in the shape "
                       "agent-2pc writes (edited?); verifying the log says where",
                       tid=tid)
    changed = [ch["path"] for ch in changes
               if engine.staging.tree_fingerprint(ch["path"]) != ch["post"]]
    if changed:
        by = _undone_by(engine, tid)
        raise TransactionAborted(
            f"{', '.join(changed)} changed since {tid} committed"
            + (f" (it was undone already, by {by})" if by else "")
            + "; undo would overwrite another writer's content, so nothing was done",
            code="conflict", paths=changed, undoes=tid)
    plan = _read_pre_images(engine, tid, changes)  # NotFound: one is gone
    pending = [blob for _, blob, _, _ in plan if blob is not None]
    new = engine.twophase.begin(UNDO_TIMEOUT_MS, label=f"undo {tid}", undoes=tid)["tid"]
    try:
        with engine.gate.active(new):
            recs: list[StageRecord] = [
                log_records.stage(new, path=ch["path"], op=op, via="undo",
                                  blob=blob.digest if blob else None,
                                  size=blob.size if blob else 0, mode=mode, pre=ch["post"],
                                  target=target)
                for ch, (op, blob, mode, target) in zip(changes, plan, strict=True)]
            engine.staging.append_staged(recs, pending)
    except BaseException:
        for blob in pending:
            blob.discard()
        engine.abort(new, f"undo of {tid} could not be staged")
        raise
    crashpoints.hit("undo.after_stage")
    out = engine.commit(new)
    out["undoes"] = tid
    return out


def _read_pre_images(engine: Engine, tid: str, changes: list[dict[str, Any]]
                     ) -> list[tuple[str, Pending | None, int | None, str | None]]:
    """(op, blob, mode, link target) per change, the pre-images read into blobs before
    anything is logged: one that is gone or not what stood there (NotFound) stops the undo
    before it is begun."""
    plan: list[tuple[str, Pending | None, int | None, str | None]] = []
    try:
        for ch in changes:
            op, source, mode, target = _inverse(engine, tid, ch)
            blob = None
            if source is not None:
                fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    blob = engine.blobs.put_fd(fd)
                finally:
                    os.close(fd)
            plan.append((op, blob, mode, target))
            if blob is not None and blob.digest != ch["pre"]:
                raise _gone(tid, ch["path"])
    except BaseException:
        for _, blob, _, _ in plan:
            if blob is not None:
                blob.discard()
        raise
    return plan


def _undone_by(engine: Engine, tid: str) -> str | None:
    """The committed undo of ``tid``, if any (read on a refusal only: it reads the history)."""
    from .history_log import entries

    for entry in entries(engine.journal):
        if entry["tid"] == tid:
            return entry.get("undone_by")
    return None


def _fingerprint(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _well_formed(ch: Any) -> bool:
    """A change as answers.changes writes it, with a path that may be written."""
    return (isinstance(ch, dict) and type(ch.get("k")) is int and ch["k"] >= 0
            and isinstance(ch.get("path"), str) and path_problem(ch["path"]) is None
            and _fingerprint(ch.get("pre")) and _fingerprint(ch.get("post")))


def _gone(tid: str, path: str) -> NotFound:
    return NotFound(f"what stood at {path} before {tid} is no longer kept (pre-images are kept "
                    "for the latest AGENT2PC_UNDO_KEEP committed transactions and for "
                    "AGENT2PC_PREIMAGE_RETENTION_S seconds; docs/collaboration.md)",
                    tid=tid, path=path)


def _inverse(engine: Engine, tid: str, ch: dict[str, Any]
             ) -> tuple[str, str | None, int | None, str | None]:
    """(op, pre-image file, mode, link target) that puts back what stood at ``ch["path"]``
    before ``tid``. NotFound when the pre-image is no longer kept (or is not a file or link
    that was there; a file's content is checked as it is read into a blob)."""
    pre, path = ch["pre"], ch["path"]
    if pre is None:
        return "delete", None, None, None
    if pre == DIR_FINGERPRINT:
        return "mkdir", None, 0o755, None
    source = os.path.join(engine.layout.preimages, f"{tid}.{ch['k']}")
    gone = _gone(tid, path)
    try:
        st = os.lstat(source)
    except FileNotFoundError:
        raise gone from None
    if pre.startswith("symlink:"):
        if not stat.S_ISLNK(st.st_mode):
            raise gone
        target = os.readlink(source)
        if link_fingerprint(target) != pre:
            raise gone
        return "symlink", None, None, target
    if not stat.S_ISREG(st.st_mode):
        raise gone
    return "write", source, stat.S_IMODE(st.st_mode) & MODE_BITS, None
