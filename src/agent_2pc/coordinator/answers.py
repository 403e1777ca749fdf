"""What the engine answers about a decided transaction: the result of commit and abort, and
the history line of a finished one (pure: no I/O)."""

from __future__ import annotations

from ..core.states import COMMITTED, DIR_FINGERPRINT, PREPARED, Tx, effects_summary, iso_ms
from ..errors import BadState
from ..storage.hashing import link_fingerprint

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def result(tx: Tx | dict[str, Any]) -> dict[str, Any]:
    """The answer of commit (abort drops ``files``): a live transaction, or a history entry."""
    if isinstance(tx, dict):
        out = {"tid": tx["tid"], "state": tx["state"], "files": tx.get("files", [])}
        for key in ("diverged", "commit", "branch", "merged"):
            if tx.get(key):
                out[key] = tx[key]
        return out
    out = {"tid": tx.tid, "state": tx.state, "files": tx.files}
    out.update(outcome_details(tx))
    return out


def with_merged(out: dict[str, Any]) -> dict[str, Any]:
    """commit's answer: ``merged`` always there (CONTRACT.md: ``commit``)."""
    out.setdefault("merged", [])
    return out


def answer_again(tx: Tx | dict[str, Any], wanted: str) -> dict[str, Any]:
    """commit of a committed transaction, abort of an aborted one: the same answer."""
    state = tx["state"] if isinstance(tx, dict) else tx.state
    tid = tx["tid"] if isinstance(tx, dict) else tx.tid
    if state == wanted:
        return result(tx)
    if not isinstance(tx, dict) and state == PREPARED:  # its coordinator decides
        from .outside import refuse_prepared

        refuse_prepared(tx, "committed" if wanted == COMMITTED else "aborted")
    reason = tx.get("reason") if isinstance(tx, dict) else tx.reason
    why = f" ({reason})" if reason else ""
    raise BadState(f"{tid} is {state}{why}; it cannot be "
                   f"{'committed' if wanted == COMMITTED else 'aborted'}",
                   tid=tid, state=state)


def refuse_inactive(tx: Tx | dict[str, Any]) -> None:
    """BadState: only an active transaction can be changed."""
    tid = tx["tid"] if isinstance(tx, dict) else tx.tid
    state = tx["state"] if isinstance(tx, dict) else tx.state
    raise BadState(f"{tid} is {state}; only an active transaction can be changed",
                   tid=tid, state=state)


def check_summary(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a commit refused by a failing check says of that check."""
    if rec is None:
        return None
    return {k: rec.get(k) for k in ("command", "exit_code", "timed_out", "log", "tail")}


def summary(tx: Tx) -> dict[str, Any]:
    """The history line of a finished transaction."""
    out = tx.summary()
    out.update({"ended_at": iso_ms(tx.ended_ms) if tx.ended_ms else None, "files": tx.files,
                "code": tx.code, "reason": tx.reason})
    out.update(outcome_details(tx))
    checks = [rec.get("command") for rec in tx.checks.values() if rec.get("passed")]
    if checks:
        out["checks"] = checks
    if tx.undoes:
        out["undoes"] = tx.undoes
    if tx.coordinator is not None:  # decided by an outside coordinator (outside.py)
        out["coordinator"] = tx.coordinator
    if tx.state == COMMITTED:
        out["changes"] = changes(tx)
    return out


def changes(tx: Tx) -> list[dict[str, Any]]:
    """What a committed transaction did to each path, for ``undo`` (coordinator/undo.py):
    ``k`` (its pre-image is ``preimages/<tid>.<k>``), the path, the op, the fingerprints of what
    stood there before (``pre``) and after (``post``; None: nothing), and the mode it put.
    Paths the apply found changed by someone else (``diverged``) were not touched: left out."""
    modes = tx.decision_fields.get("modes") or {}
    diverged = set(tx.diverged)
    out = []
    for k, op in enumerate(tx.changes()):
        if op.path in diverged:
            continue
        post: str | None
        mode: int | None = None
        if op.op == "write":
            post = op.blob
            mode = modes.get(str(k), modes.get(k, op.mode if op.mode is not None else 0o644))
        elif op.op == "symlink":
            assert op.target is not None
            post = link_fingerprint(op.target)
        elif op.op == "mkdir":
            post, mode = DIR_FINGERPRINT, op.mode if op.mode is not None else 0o755
        else:
            post = None
        out.append({"k": k, "path": op.path, "op": op.op, "pre": op.pre, "post": post,
                    "mode": mode})
    return out


def outcome_details(tx: Tx) -> dict[str, Any]:
    """What a finished transaction's answer adds when there is something to say."""
    out: dict[str, Any] = {}
    if tx.diverged:
        out["diverged"] = tx.diverged
    calls = effects_summary(tx) if tx.effects else []
    if calls:
        out["effects"] = calls
    git = tx.decision_fields.get("git") if tx.state == COMMITTED else None
    if git:  # the git participant's commit (participants/git.py)
        out["commit"] = git["new"]
        out["branch"] = git["ref"].removeprefix("refs/heads/")
        if git.get("ignored"):  # new files git ignores: on disk, not in the commit
            out["git_ignored"] = git["ignored"]
    if tx.state == COMMITTED:  # files merged with another writer's edits (rebase.py)
        merged = [op.path for op in tx.changes() if op.via == "merge"]
        if merged:
            out["merged"] = merged
    if tx.uncompensated:
        out["uncompensated"] = tx.uncompensated
    return out
