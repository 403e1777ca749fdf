"""Named crash points: ``AGENT2PC_CRASH_AT=POINT`` or ``POINT:N`` kills the process there.

The process exits at once with status 137 (``os._exit``: no cleanup, no flush beyond what is
already synced) the N-th time (default: the first) it passes POINT. The crash tests are
parametrised over ``POINTS``, so a point is tested the day it is added. Add one at every fsync.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Callable

POINTS: dict[str, str] = {
    "stage.after_blob": "a staged blob is written, its stage record is not",
    "prepare.before_decision": "every participant voted yes and its temp files are synced; "
    "no decision yet",
    "commit.after_decision": "the commit decision is durable; nothing applied",
    "commit.mid_apply": "after the N-th file operation (rename or unlink) of the apply",
    "commit.before_end": "every file applied and its directory synced; no end record",
    "abort.after_decision": "the abort decision is written; scratch not cleaned",
    "wal.torn_append": "half of a log append is written (a torn tail)",
    "wal.after_truncate": "a torn tail was cut off and synced; nothing appended yet",
    "compact.after_history": "finished transactions are in history.jsonl; log not replaced",
    "compact.before_rename": "the compacted log is written and synced, not yet in place",
}

_EXIT_STATUS = 137
_armed: tuple[str, str, int] | None = None  # (raw env value, point, n)
_passes: dict[str, int] = {}


def hit(point: str, before_exit: Callable[[], object] | None = None) -> None:
    """Pass ``point``: exit here if AGENT2PC_CRASH_AT names it (and this is the N-th pass).

    ``before_exit`` runs just before the exit (to leave a half-done write behind, say).
    """
    raw = os.environ.get("AGENT2PC_CRASH_AT")
    if not raw:
        return
    assert point in POINTS, f"unregistered crash point {point}"
    global _armed
    if _armed is None or _armed[0] != raw:
        name, _, n = raw.partition(":")
        _armed = (raw, name, int(n) if n else 1)
        _passes.clear()
    if _armed[1] != point:
        return
    _passes[point] = _passes.get(point, 0) + 1
    if _passes[point] == _armed[2]:
        if before_exit is not None:
            before_exit()
        os._exit(_EXIT_STATUS)
