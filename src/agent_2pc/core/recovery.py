"""Recovery planning: what to do with each unfinished transaction. Pure: liveness is asked of
a callback (the caller probes the transaction's lock), time and boot id are passed in.

- committing (decision commit, no end) and no live holder -> roll forward (redo the apply);
- aborting (decision abort, no end) and no live holder     -> finish the abort;
- preparing (no decision) and no live holder               -> abort: nothing in the tree changed;
- prepared (a yes vote for an outside coordinator, no decision) -> nothing, whatever the
    liveness, the boot or the deadline: it is in doubt, and only its coordinator's decision
    ends it (coordinator/outside.py);
- active, when asked (``recover``, or touching it):
    begun in an earlier boot of the machine -> abort (``interrupted``): staging is not
    synced, so a machine crash may have lost its latest records;
    past its deadline                       -> abort (``timeout``).
"""

from __future__ import annotations

from .states import ABORTING, ACTIVE, COMMITTING, PREPARING, Tx

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterable

ROLL_FORWARD, FINISH_ABORT, ABORT = "roll_forward", "finish_abort", "abort"


class Action:
    __slots__ = ("tid", "kind", "code", "reason")

    def __init__(self, tid: str, kind: str, code: str | None = None,
                 reason: str | None = None) -> None:
        self.tid = tid
        self.kind = kind
        self.code = code
        self.reason = reason

    def __repr__(self) -> str:
        return f"Action({self.kind} {self.tid}: {self.code} {self.reason})"


def stale_active(tx: Tx, now_ms: int, boot: str | None) -> Action | None:
    """Why an active transaction can no longer be used, if it can't."""
    if tx.state != ACTIVE:
        return None
    if tx.boot and boot and tx.boot != boot:
        return Action(tx.tid, ABORT, "interrupted",
                      "the machine restarted after it began; its latest staging may be lost")
    if tx.expired(now_ms):
        return Action(tx.tid, ABORT, "timeout", f"its timeout of {tx.timeout_ms} ms passed")
    return None


def plan(txs: Iterable[Tx], *, now_ms: int, boot: str | None, alive: Callable[[str], bool],
         include_active: bool) -> list[Action]:
    actions = []
    for tx in txs:
        if tx.state == COMMITTING:
            if not alive(tx.tid):
                actions.append(Action(tx.tid, ROLL_FORWARD))
        elif tx.state == ABORTING:
            if not alive(tx.tid):
                actions.append(Action(tx.tid, FINISH_ABORT))
        elif tx.state == PREPARING:
            if not alive(tx.tid):
                actions.append(Action(tx.tid, ABORT, "interrupted",
                                      "the process preparing it died before the decision"))
        elif include_active:
            act = stale_active(tx, now_ms, boot)
            if act is not None:
                actions.append(act)
    return actions
