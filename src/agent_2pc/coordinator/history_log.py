"""``log``: the workspace's finished transactions, newest first, each chained to the one before
by SHA-256 (storage/history.py); ``log --verify`` checks the chain (docs/collaboration.md,
"Undo and log"; docs/format.md, "history.jsonl").

The history holds what compaction moved out of the log; transactions that finished since are
still in the log, and are shown with the ``prev`` and ``hash`` their history line will get
(compaction writes them in the order they ended, after the history's last line), and
``compacted: false``.
"""

from __future__ import annotations

import os

from ..errors import Tampered, UsageError
from ..storage import history
from .answers import summary

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .journal import Journal

LIMIT_MAX = 1_000_000
# What a log entry shows of a history line (``changes`` is what undo needs: not shown).
FIELDS = ("tid", "label", "state", "created_at", "files", "checks", "code", "reason",
          "undoes", "diverged", "effects", "commit", "branch")


def entries(journal: Journal, limit: int | None = None) -> list[dict[str, Any]]:
    """The log's entries, newest first (at most ``limit``). Reads the history from its end,
    as far as the page needs."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or not 0 < limit <= LIMIT_MAX):
        raise UsageError(f"`limit` must be a whole number from 1 to {LIMIT_MAX}",
                         params=("limit",))
    with journal.log.lock:  # no compaction moves lines between what we read of both
        journal.refresh()
        pending = [summary(tx) for tx in journal.finished()]
        prev, written = _tip(journal, {s["tid"] for s in pending})
        pending = history.seal([s for s in pending if s["tid"] not in written], prev)
        undone_by: dict[str, str] = {}
        out: list[dict[str, Any]] = []
        lines = journal.history.newest_first()
        for line, compacted in [(ln, False) for ln in reversed(pending)] + [(None, True)]:
            for ln in (lines if line is None else (line,)):
                if limit is not None and len(out) >= limit:
                    break
                entry = {k: ln.get(k) for k in FIELDS if k in ln}
                entry["at"] = ln.get("ended_at")
                entry["hash"], entry["prev"] = ln.get("hash"), ln.get("prev")
                if not compacted:
                    entry["compacted"] = False
                entry["undone_by"] = undone_by.get(str(ln["tid"]))  # undos end later
                undoes = ln.get("undoes")
                if undoes and ln.get("state") == "committed":
                    undone_by.setdefault(undoes, ln["tid"])
                out.append(entry)
        lines.close()
    return out


def _tip(journal: Journal, pending: set[str]) -> tuple[str, set[str]]:
    """The hash the next history line chains to, and the tids of ``pending`` already at the
    end of history.jsonl (a compaction that crashed before it replaced the log wrote them)."""
    store = journal.history
    try:
        fd = os.open(store.current, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return store.start_hash() or history.GENESIS, set()
    try:
        size = os.fstat(fd).st_size
        end = size
        if size and os.pread(fd, 1, size - 1) != b"\n":  # a torn line, cut at the next append
            end = history.last_newline(fd, size)
        if end == 0:
            return store.start_hash() or history.GENESIS, set()
        return history.tip(fd, end, pending)
    finally:
        os.close(fd)


def verify(journal: Journal) -> dict[str, Any]:
    """``{verified, unchained}``, or Tampered naming the first line that fails the chain."""
    layout = journal.layout
    with journal.log.lock:
        try:
            return history.verify(layout.history, layout.history_head)
        except history.ChainBroken as exc:
            raise Tampered(str(exc), line=exc.line, tid=exc.tid) from None
