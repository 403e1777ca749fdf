"""history.jsonl: one JSON line per finished transaction, moved out of the log by compaction.

It is derived data: compaction writes (and fsyncs) the lines before it drops the transactions'
records from the log, so a crash in between only repeats lines; readers keep the last line of a
tid. Lookups by tid scan the file, which only happens for transactions no longer in the log.
"""

from __future__ import annotations

import json
import os

from .durable import fsync_fd, write_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterator


def append(path: str, summaries: list[dict[str, Any]]) -> None:
    if not summaries:
        return
    data = "".join(json.dumps(s, ensure_ascii=False, separators=(",", ":")) + "\n"
                   for s in summaries).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        write_all(fd, data)
        fsync_fd(fd)
    finally:
        os.close(fd)


def _lines(path: str) -> Iterator[dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return
    for line in data.splitlines():
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a line cut short by a crash during append; it is written again
        if isinstance(obj, dict) and "tid" in obj:
            yield obj


def lookup(path: str, tid: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    needle = f'"tid":"{tid}"'.encode()
    found = None
    start = data.find(needle)
    while start != -1:
        line_start = data.rfind(b"\n", 0, start) + 1
        line_end = data.find(b"\n", start)
        try:
            found = json.loads(data[line_start:line_end if line_end != -1 else None])
        except (ValueError, RecursionError):
            pass
        start = data.find(needle, start + 1)
    return found


def all_entries(path: str) -> list[dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for obj in _lines(path):
        latest.pop(obj["tid"], None)
        latest[obj["tid"]] = obj
    return list(latest.values())
