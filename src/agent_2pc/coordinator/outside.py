"""Transactions an outside coordinator decides (issue 17): the local half of a global commit.

A workspace takes part in a transaction that spans several workspaces and databases as a
two-phase-commit participant:

  vote     prepare exactly as commit does (every participant votes, stale checks run); on a no
           the transaction aborts (TransactionAborted, as commit); on a yes a ``vote`` record
           naming the coordinator is appended and synced: the transaction is *prepared*, in
           doubt, and the locks are released.
  decide   the coordinator's outcome, from any process: commit (the decision record carries
           what the vote kept, then the apply, as a redo) or abort (the participants' undo).

A prepared transaction is not a crash: recovery, the reaper, timeouts and reboots leave it
alone; only ``decide`` ends it (docs/design.md, "Prepared, in doubt"). What this module holds
is the part that needs no lock: the coordinator's check, the in-doubt list, the isolation
check a later prepare asks.
"""

from __future__ import annotations

import json

from ..core.states import PREPARED, Tx
from ..errors import BadState, UsageError
from ..participants.base import Vote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable

COORDINATOR_BYTES_MAX = 4096
OUTCOMES = ("commit", "abort")
# Names of fields that hold secrets: never written to the log.
_SECRET_WORDS = ("password", "passwd", "secret", "token", "apikey", "api_key")


def check_coordinator(coordinator: Any) -> dict[str, Any]:
    """The coordinator as the vote record keeps it: a JSON object of at most 4 KiB that names
    who decides (e.g. ``{"gtid": "g-...", "store": "postgresql://host:5432/db"}``), holding no
    password: a URL with one, a conninfo ``password=`` or a field named like a secret is
    refused (usage), since the log is not a place for secrets."""
    if isinstance(coordinator, str):
        try:
            coordinator = json.loads(coordinator)
        except ValueError as exc:
            raise UsageError(f"`coordinator` is a JSON object: {exc}",
                             params=("coordinator",)) from None
    if not isinstance(coordinator, dict) or not coordinator:
        raise UsageError("`coordinator` is a JSON object that names who decides the "
                         "transaction, e.g. {\"gtid\": \"g-1\", \"store\": "
                         "\"postgresql://host/db\"}", params=("coordinator",))
    try:
        text = json.dumps(coordinator, sort_keys=True, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"`coordinator` must be plain JSON: {exc}",
                         params=("coordinator",)) from None
    if len(text.encode("utf-8", "surrogatepass")) > COORDINATOR_BYTES_MAX:
        raise UsageError(f"`coordinator` is at most {COORDINATOR_BYTES_MAX} bytes of JSON",
                         params=("coordinator",))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError("`coordinator` must be Unicode text", params=("coordinator",)) from None
    where = _secret_in(coordinator, "coordinator")
    if where is not None:
        raise UsageError(
            f"`coordinator` holds a password ({where}), which would be written to the "
            "transaction log: name the store without it (a password belongs in PGPASSWORD or "
            "~/.pgpass)", params=("coordinator",))
    decoded: dict[str, Any] = json.loads(text)  # a copy: the caller's object is not kept
    return decoded


def _secret_in(value: Any, where: str) -> str | None:
    """Where in ``value`` a secret is, if anywhere."""
    if isinstance(value, dict):
        for key, item in value.items():
            low = str(key).lower().replace("-", "_")
            if any(word in low for word in _SECRET_WORDS):
                return f"{where}.{key}"
            found = _secret_in(item, f"{where}.{key}")
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _secret_in(item, f"{where}[{i}]")
            if found is not None:
                return found
    elif isinstance(value, str):
        if _url_password(value) or "password=" in value.lower().replace(" ", ""):
            return where
    return None


def _url_password(text: str) -> bool:
    if "://" not in text:
        return False
    from urllib.parse import urlsplit

    try:
        return urlsplit(text.strip()).password is not None
    except ValueError:
        return False


def check_outcome(outcome: Any) -> str:
    if outcome not in OUTCOMES:
        raise UsageError(f"the outcome is commit or abort, not {outcome!r}",
                         params=("outcome",))
    assert isinstance(outcome, str)
    return outcome


def shown(coordinator: dict[str, Any] | None) -> str:
    """The coordinator as messages name it."""
    if not coordinator:
        return "an unknown coordinator"
    gtid = coordinator.get("gtid")
    text = json.dumps(coordinator, sort_keys=True, ensure_ascii=False)
    if isinstance(gtid, str) and len(text) > 200:
        return f"global transaction {gtid}"
    return text


def in_doubt_row(tx: Tx) -> dict[str, Any]:
    """One line of the in-doubt list."""
    return {"tid": tx.tid, "coordinator": tx.coordinator, "prepared_ms": tx.voted_ms,
            "files": [op.path for op in tx.changes()]}


def in_doubt(txs: Iterable[Tx]) -> list[dict[str, Any]]:
    """The prepared transactions, oldest vote first."""
    rows = [in_doubt_row(tx) for tx in txs if tx.state == PREPARED]
    rows.sort(key=lambda r: (r["prepared_ms"] or 0, r["tid"]))
    return rows


def refuse_prepared(tx: Tx, what: str) -> None:
    """BadState for a step only the coordinator may take on a prepared transaction."""
    raise BadState(
        f"{tx.tid} is prepared (it voted yes for {shown(tx.coordinator)}) and in doubt: "
        f"its coordinator decides it; it cannot be {what} here. If that coordinator is lost "
        "for good, an operator may decide it by hand: 'agent-2pc decide' with its tid and "
        "commit or abort (docs/cli.md, decide)",
        tid=tx.tid, state=tx.state, coordinator=tx.coordinator)


def prepared_overlap(tx: Tx, txs: Iterable[Tx]) -> Vote | None:
    """A no (``conflict``) when ``tx`` changes or read a path that a prepared transaction
    changes, or changes a path that one read, or commits onto the git branch one will move:
    the prepared one holds them until its coordinator decides."""
    mine_changed = {op.path for op in tx.ops}
    mine = mine_changed | {p for p, _ in tx.reads}
    my_refs = {"refs/heads/" + eff["request"]["branch"] for eff in tx.effects
               if eff.get("kind") == "git"}
    for other in txs:
        if other.state != PREPARED or other.tid == tx.tid:
            continue
        shared = sorted(mine.intersection(op.path for op in other.ops)) or sorted(
            mine_changed.intersection(p for p, _ in other.reads))
        git = other.voted.get("git")
        if not shared and isinstance(git, dict) and git.get("ref") in my_refs:
            shared = [f"the git branch {str(git['ref']).removeprefix('refs/heads/')}"]
        if shared:
            return Vote.no("conflict", (
                f"{shared[0]} is held by {other.tid}, which is prepared and waits for the "
                f"decision of {shown(other.coordinator)}; try again after it is decided"))
    return None
