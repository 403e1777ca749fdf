"""Named crash points: ``AGENT2PC_CRASH_AT=POINT`` or ``POINT:N`` kills the process there.

``AGENT2PC_STALL_AT=POINT[:N]`` with ``AGENT2PC_STALL_S=SECONDS`` sleeps there instead, so that
tests can look at a live process in the middle of its work (holding its locks).

The process exits at once with status 137 (``os._exit``: no cleanup, no flush beyond what is
already synced) the N-th time (default: the first) it passes POINT. The crash tests are
parametrised over ``POINTS``, so a point is tested the day it is added. Add one at every fsync.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

POINTS: dict[str, str] = {
    "stage.after_blob": "a staged blob is written, its stage record is not",
    "prepare.before_decision": "every participant voted yes and its temp files are synced; "
    "no decision yet",
    "commit.after_decision": "the commit decision is durable; nothing applied",
    "vote.before_record": "every participant voted yes for an outside coordinator; the vote "
    "record is not written (recover aborts it)",
    "vote.after_record": "the yes vote is durable: the transaction is prepared, in doubt "
    "(recover leaves it to its coordinator's decide)",
    "commit.mid_apply": "after the N-th file operation (rename or unlink) of the apply",
    "commit.before_end": "every file applied and its directory synced; no end record",
    "abort.after_decision": "the abort decision is written; scratch not cleaned",
    "wal.torn_append": "half of a log append is written (a torn tail)",
    "wal.after_truncate": "a torn tail was cut off and synced; nothing appended yet",
    "api.before_send": "an HTTP call's lease is held and logged; the request is not sent",
    "api.after_send": "an HTTP call was answered; the answer is not recorded anywhere",
    "api.after_record": "a result record of an HTTP call (or its compensation) is logged",
    "git.after_objects": "a git commit's objects are written (the vote not returned yet); no "
    "ref moved",
    "git.after_lock": "the branch is locked at its commit by git's prepared reference "
    "transaction (git/reftx.py); the vote not returned yet",
    "git.after_ref": "the branch is at the new commit (after the files); the user's index is "
    "not updated yet",
    "export.before_rename": "a bundle is written and synced under its temp name, not renamed",
    "import.after_blobs": "an imported bundle's blobs are stored; its records are not appended",
    "sql.after_gid_logged": "a SQL group's prepare is logged (synced, with its gid); no "
    "PREPARE TRANSACTION sent",
    "sql.after_prepare": "the database prepared the group's transaction; the vote not returned",
    "sql.after_commit_prepared": "COMMIT PREPARED done (after the files); not recorded in the "
    "log",
    "compact.after_history": "finished transactions are in history.jsonl; log not replaced",
    "history.seal.after_index": "the history index names a new sealed segment; history.jsonl "
    "not yet renamed to it",
    "history.trim.after_index": "the history index no longer names the segments retention "
    "cut; their files not yet removed",
    "undo.after_stage": "an undo transaction is staged (from what the undone one put); not "
    "committed",
    "compact.before_rename": "the compacted log is written and synced, not yet in place",
    "global.after_votes": "every workspace of a global transaction voted yes; no decision in "
    "the store",
    "global.after_decision": "the store holds the global commit decision; no workspace told",
    "node.after_vote": "a node's workspace voted yes (durable); the vote not in the store",
    "node.before_decide": "a node took a decision request; its workspace not decided yet",
    "node.after_decide": "a node's workspace carried out the decision; not recorded in the "
    "store",
}

_EXIT_STATUS = 137
# Read once: passing a point must cost nothing in production (it is on every step's path).
# Tests arm points in the processes they start, through the environment.
_ARMED = bool(os.environ.get("AGENT2PC_CRASH_AT") or os.environ.get("AGENT2PC_STALL_AT"))
_passes: dict[str, int] = {}  # passes counted per (spec, point)


def hit(point: str, before_exit: Callable[[], object] | None = None) -> None:
    """Pass ``point``: exit here if AGENT2PC_CRASH_AT names it (and this is the N-th pass).

    ``before_exit`` runs just before the exit (to leave a half-done write behind, say).
    """
    if not _ARMED:
        return
    crash = os.environ.get("AGENT2PC_CRASH_AT")
    stall = os.environ.get("AGENT2PC_STALL_AT")
    assert point in POINTS, f"unregistered crash point {point}"
    if crash and _due(crash, point):
        if before_exit is not None:
            before_exit()
        os._exit(_EXIT_STATUS)
    if stall and _due(stall, point):
        import time

        time.sleep(float(os.environ.get("AGENT2PC_STALL_S", "5")))


def _due(spec: str, point: str) -> bool:
    """Is this pass of ``point`` the one that ``spec`` ("POINT" or "POINT:N") names?"""
    name, _, n = spec.partition(":")
    if name != point:
        return False
    key = f"{spec}@{point}"
    _passes[key] = _passes.get(key, 0) + 1
    return _passes[key] == (int(n) if n else 1)
