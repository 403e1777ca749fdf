"""What may be applied of a transaction read from the log: only what staging could have written.

The log is data, not instructions. A workspace that came with a repository, or a record
appended by anything but agent-2pc, may name any path; so before a transaction is prepared,
redone, undone or cleaned up, every field that will become a path or a file's content is
checked here, and a transaction that fails is corruption (the engine reports it with the
record's offset and applies nothing). Pure: no I/O.

A path is confined when it is what ``coordinator/paths.py`` gives at staging: relative,
``/``-separated, no empty, ``.`` or ``..`` component, no ``.git`` component anywhere, not
``.agent-tx`` or below it, no NUL. (A symbolic link on the way is the file participant's
business: it walks every directory with O_NOFOLLOW at the moment it writes.)
"""

from __future__ import annotations

import re

from .states import DIR_FINGERPRINT, OP_KINDS, Tx

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TID_RE = re.compile(r"tx-\d{8}-\d{6}-[0-9a-f]{6}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
FORBIDDEN_TOP = ".agent-tx"
FORBIDDEN_ANY = ".git"
PATH_BYTES_MAX = 4096
TARGET_BYTES_MAX = 4096
MODE_MAX = 0o7777
_BAD_PARTS = frozenset({"", ".", "..", FORBIDDEN_ANY})


def path_problem(path: Any) -> str | None:
    """Why ``path`` (from the log) is not a path staging could have produced; None if it is."""
    if not isinstance(path, str) or not path:
        return f"the path {path!r} is not a non-empty string"
    if "\0" in path or len(path) > PATH_BYTES_MAX:
        return f"the path {path[:80]!r} holds a NUL byte or is too long"
    parts = path.split("/")
    if parts[0] == FORBIDDEN_TOP:
        return f"the path {path!r} is inside {FORBIDDEN_TOP}/"
    if not _BAD_PARTS.isdisjoint(parts):
        return (f"the path {path!r} is absolute, not normalized, or inside .git/ (a component "
                "is empty, '.', '..' or '.git')")
    return None


def name_problem(name: str, top: bool) -> str | None:
    """Why one component of a path may not be opened or written (``top``: directly under the
    root); the file participant asks at the moment it writes."""
    if name in _BAD_PARTS or "/" in name or "\0" in name or (top and name == FORBIDDEN_TOP):
        return f"{name!r} is not a component a transaction may write"
    return None


def is_blob_name(digest: Any) -> bool:
    return isinstance(digest, str) and _HEX64.fullmatch(digest) is not None


def _fingerprint_problem(fp: Any) -> bool:
    if fp is None or fp == DIR_FINGERPRINT:
        return False
    if isinstance(fp, str) and fp.startswith("symlink:"):
        fp = fp[len("symlink:"):]
    return not is_blob_name(fp)


def _mode_ok(mode: Any) -> bool:
    return type(mode) is int and 0 <= mode <= MODE_MAX


class Problem:
    """What is wrong, and which record says it (``match``: fields that pick the record out of
    the transaction's records, so the engine can give its offset)."""

    __slots__ = ("why", "match")

    def __init__(self, why: str, match: dict[str, Any]) -> None:
        self.why = why
        self.match = match


def tx_problem(tx: Tx, paths: bool = True) -> Problem | None:
    """The first reason why ``tx`` may not be applied as the log describes it, or None.

    Checks the tid (it names scratch, claims, pre-images and placed files) and, with
    ``paths`` (not needed to abort a transaction that never prepared: that touches no path),
    every op (path, kind, blob name, mode, link target, fingerprint), every recorded read, and
    a commit decision's ``modes``, ``inline`` and ``placed``.
    """
    if not isinstance(tx.tid, str) or TID_RE.fullmatch(tx.tid) is None:
        return Problem(f"the transaction id {tx.tid!r} is not one agent-2pc makes",
                       {"type": "begin"})
    if not paths:
        return None
    changes = tx.changes()
    for op in tx.ops:
        why = _op_problem(op)
        if why is not None:
            return Problem(why, {"type": "stage", "path": op.path})
    for path, digest in tx.reads:
        why = path_problem(path)
        if why is None and _fingerprint_problem(digest):
            why = f"the recorded hash of {path!r} is not a fingerprint"
        if why is not None:
            return Problem(why, {"type": "read", "path": path})
    if tx.outcome == "commit":
        why = _decision_problem(tx.decision_fields, changes)
        if why is not None:
            return Problem(why, {"type": "decision"})
    elif tx.voted:  # what a commit decision would carry (a vote for an outside coordinator)
        why = _decision_problem(tx.voted, changes)
        if why is not None:
            return Problem(why, {"type": "vote"})
    return None


def _op_problem(op: Any) -> str | None:
    why = path_problem(op.path)
    if why is not None:
        return why
    if op.op not in OP_KINDS:
        return f"{op.path!r} has the unknown operation {op.op!r}"
    if op.op == "write" and not (is_blob_name(op.blob) and type(op.size) is int
                                 and op.size >= 0):
        return f"the write of {op.path!r} names {op.blob!r}, which is not a blob"
    if op.mode is not None and not _mode_ok(op.mode):
        return f"{op.path!r} has the mode {op.mode!r}"
    if op.op == "symlink" and not (isinstance(op.target, str) and op.target
                                   and "\0" not in op.target
                                   and len(op.target) <= TARGET_BYTES_MAX):
        return f"the link {op.path!r} has the target {op.target!r}"
    if _fingerprint_problem(op.pre):
        return f"the recorded pre-image of {op.path!r} is not a fingerprint"
    return None


def _keys(field: Any, name: str, changes: list[Any], kinds: tuple[str, ...]
          ) -> tuple[dict[int, Any] | None, str | None]:
    """A decision's {"k": value} field, keys checked to name the k-th change of ``kinds``."""
    if field is None:
        return {}, None
    if not isinstance(field, dict):
        return None, f"its {name} is not an object"
    out: dict[int, Any] = {}
    for key, value in field.items():
        if not (isinstance(key, str) and key.isdigit() and key.isascii()
                and int(key) < len(changes) and changes[int(key)].op in kinds):
            return None, f"its {name} names the change {key!r}, which it has not"
        out[int(key)] = value
    return out, None


def _decision_problem(fields: dict[str, Any], changes: list[Any]) -> str | None:
    modes, why = _keys(fields.get("modes"), "modes", changes, ("write",))
    if why is None:
        assert modes is not None
        bad = [k for k, m in modes.items() if not _mode_ok(m)]
        if bad:
            why = f"its mode for {changes[bad[0]].path!r} is {modes[bad[0]]!r}"
    if why is None:
        inline, why = _keys(fields.get("inline"), "inline", changes, ("write",))
        if why is None:
            assert inline is not None
            bad = [k for k, v in inline.items() if not isinstance(v, str)]
            if bad:
                why = f"its inline content of {changes[bad[0]].path!r} is not text"
    if why is None:
        placed, why = _keys(fields.get("placed"), "placed", changes, ("write", "symlink"))
        if why is None:
            assert placed is not None
            for k, home in placed.items():
                path = changes[k].path
                if not isinstance(home, str) or (
                        home and (path_problem(home) is not None
                                  or not path.startswith(home + "/"))):
                    why = f"it places {path!r} in {home!r}, not a directory on its way"
                    break
    return None if why is None else f"the commit decision: {why}"
