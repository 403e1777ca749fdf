"""history.jsonl: one JSON line per finished transaction, moved out of the log by compaction.

Compaction writes (and fsyncs) the lines before it drops the transactions' records from the
log. A crash in between leaves lines that the next compaction finds at the end of the file
and does not write again; a line cut short by a crash (no newline yet) is cut off before the
next append (its transaction is still in the log). Readers keep the last line of a tid.
Reading from the end, finding a tid, sealing the file into segments and retention are
history_store.py's.

The lines form a hash chain (docs/format.md, "history.jsonl"): each line carries ``prev``, the
``hash`` of the line before it, and its own ``hash``, the SHA-256 of the canonical JSON (RFC
8785) of the line without ``hash``. The first chained line's ``prev`` is the SHA-256 of every
byte before it: of nothing (``GENESIS``) in a new workspace, of the lines that an earlier
version wrote without hashes otherwise, so that those are covered too. ``history.head`` holds
the size of the file and the hash of its last line after the latest append, so that lines cut
off the end are found as well (``verify``).
"""

from __future__ import annotations

import json
import os

from .durable import fsync_fd, rename, write_all
from .hashing import hasher, sha256_bytes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterator

GENESIS = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256(b"")
_TAIL_BLOCK = 64 * 1024

_canon = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                          allow_nan=False).encode


def line_hash(entry: dict[str, Any]) -> str:
    """The SHA-256 of the canonical JSON of ``entry`` without its ``hash``. A history line
    holds strings, integers, booleans, nulls, lists and objects with ASCII keys, and no floats:
    for those, sorted keys and no whitespace are exactly RFC 8785's bytes
    (tests/test_undo_and_log.py checks against the rfc8785 package)."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    return sha256_bytes(_canon(body).encode("utf-8"))


def seal(summaries: list[dict[str, Any]], prev: str) -> list[dict[str, Any]]:
    """The lines for ``summaries`` chained after a line whose hash is ``prev`` (pure)."""
    out = []
    for s in summaries:
        line = {k: v for k, v in s.items() if k not in ("prev", "hash")}
        line["prev"] = prev
        prev = line["hash"] = line_hash(line)
        out.append(line)
    return out


def _tail(fd: int, size: int) -> Iterator[bytes]:
    """The complete lines of the file, last first, read backwards in blocks."""
    end, rest = size, b""
    while end > 0:
        start = max(0, end - _TAIL_BLOCK)
        block = os.pread(fd, end - start, start) + rest
        end = start
        lines = block.split(b"\n")
        rest = lines[0] if end > 0 else b""
        for line in reversed(lines[1:] if end > 0 else lines):
            if line:
                yield line
    if rest:
        yield rest


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def tip(fd: int, size: int, pending: set[str]) -> tuple[str, set[str]]:
    """(the hash the next line chains to, the tids of ``pending`` already at the end of the
    file: a compaction that crashed before it replaced the log wrote them)."""
    written: set[str] = set()
    last: dict[str, Any] | None = None
    first = True
    for line in _tail(fd, size):
        obj = _parse(line)
        if first:
            last, first = obj, False
        if obj is None or obj.get("tid") not in pending:
            break
        written.add(obj["tid"])
    if last is not None and isinstance(last.get("hash"), str):
        return last["hash"], written
    # An unchained file (an earlier version's lines, or none): the chain starts from its bytes.
    h = hasher(size)
    offset = 0
    while offset < size:
        chunk = os.pread(fd, min(1 << 20, size - offset), offset)
        if not chunk:
            break
        h.update(chunk)
        offset += len(chunk)
    return str(h.hexdigest()), written


def append(path: str, summaries: list[dict[str, Any]], head: str | None = None,
           start: str | None = None) -> int:
    """Chain and append the lines of ``summaries`` (those not already at the end of the file)
    and sync them; then record the new end in ``head``. Returns the number of lines written.
    ``start``: the hash an empty file's first line chains to (the last line of the sealed
    segments, history_store.py). The caller holds the log's lock (compactions are serial)."""
    if not summaries:
        return 0
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            cut = last_newline(fd, size)  # a line cut short by a crash: written again below
            os.ftruncate(fd, cut)
            fsync_fd(fd)
            size = cut
        prev, written = tip(fd, size, {s["tid"] for s in summaries})
        if size == 0 and start:
            prev = start
        lines = seal([s for s in summaries if s["tid"] not in written], prev)
        if lines:
            data = "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
                           for line in lines).encode("utf-8")
            write_all(fd, data)
            fsync_fd(fd)
            size += len(data)
            prev = lines[-1]["hash"]
    finally:
        os.close(fd)
    if head is not None:
        _write_head(head, size, prev)
    return len(lines)


def last_newline(fd: int, size: int) -> int:
    end = size
    while end > 0:
        start = max(0, end - _TAIL_BLOCK)
        at = os.pread(fd, end - start, start).rfind(b"\n")
        if at != -1:
            return start + at + 1
        end = start
    return 0


def _write_head(path: str, size: int, last_hash: str) -> None:
    """``{bytes, hash}``: where the chain ended after the latest append. Not synced: a head
    lost by a machine crash is an older one, which ``verify`` accepts (lines past it are
    checked by the chain alone)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, json.dumps({"bytes": size, "hash": last_hash}).encode() + b"\n")
    finally:
        os.close(fd)
    rename(tmp, path)


class ChainBroken(Exception):
    """A history line that fails the chain: ``line`` (1-based), its ``tid`` if readable."""

    def __init__(self, line: int, tid: str | None, why: str) -> None:
        super().__init__(f"history.jsonl line {line}" + (f" ({tid})" if tid else "") + f": {why}")
        self.line, self.tid, self.why = line, tid, why


def verify(path: str, head: str | None = None) -> dict[str, int]:
    """Check the chain of the whole history (the sealed segments kept, then history.jsonl):
    ``{verified, unchained}`` (chained lines checked; lines an earlier version wrote without
    hashes, covered by the first chained line's ``prev``), and ``trimmed`` once retention cut
    lines (their count; the index keeps the last one's hash as the chain's start), or
    ChainBroken naming the first line that fails (numbered from the first line kept). A last
    line without its newline (a crash during an append, before the log was replaced) is not
    counted."""
    from .history_store import Store

    store = Store(path)
    index = store.index()
    base = index.get("base")
    state = _Chain(str(base["hash"]) if base and base.get("hash") else None)
    segments = index["segments"]
    sealed_end: tuple[int, str | None] | None = None  # the last sealed segment's (size, hash)
    for i, seg in enumerate(segments):
        try:
            with open(store.segment_path(seg["seq"]), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if i == len(segments) - 1:
                continue  # a seal interrupted before its rename: the lines are in path
            raise ChainBroken(state.n + 1, None, f"sealed segment {seg['seq']} of the "
                              "history is missing (removed by hand?)") from None
        state.feed(data)
        sealed_end = (len(data), state.prev)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        data = b""
    ends: dict[int, str] = {}
    if state.prev is not None:
        ends[0] = state.prev
    end = state.feed(data, ends)
    if head is not None:
        _check_head(head, ends, end, state.n, sealed_end)
    out = {"verified": state.verified, "unchained": state.unchained}
    if base:
        out["trimmed"] = int(base.get("lines") or 0)
    return out


class _Chain:
    """The chain checked so far, line by line, across files."""

    def __init__(self, prev: str | None) -> None:
        self.prev = prev
        self.prefix = hasher(0)
        self.n = self.verified = self.unchained = 0

    def feed(self, data: bytes, ends: dict[int, str] | None = None) -> int:
        """Check the complete lines of ``data``; returns where they end. ``ends`` gets the
        byte offset after each chained line -> its hash."""
        end = data.rfind(b"\n") + 1
        offset = 0
        for line in data[:end].split(b"\n")[:-1]:
            self.n += 1
            n = self.n
            obj = _parse(line)
            tid = obj.get("tid") if obj is not None and isinstance(obj.get("tid"), str) else None
            chained = obj is not None and "hash" in obj
            if self.prev is None and not chained:
                self.prefix.update(line + b"\n")  # before the chain began
                self.unchained += 1
            else:
                if obj is None:
                    raise ChainBroken(n, None, "not a JSON object (edited or damaged)")
                if not chained:
                    raise ChainBroken(n, tid, "no hash inside the chain (added or edited)")
                want_prev = str(self.prefix.hexdigest()) if self.prev is None else self.prev
                if obj.get("prev") != want_prev:
                    raise ChainBroken(n, tid, "its prev is not the hash of the line before it "
                                      "(a line was deleted, moved or inserted before it)")
                if obj["hash"] != line_hash(obj):
                    raise ChainBroken(n, tid, "its hash does not match its content (edited)")
                self.prev = obj["hash"]
                self.verified += 1
            offset += len(line) + 1
            if ends is not None and self.prev is not None and chained:
                ends[offset] = self.prev
        return end


def _check_head(head: str, ends: dict[int, str], size: int, lines: int,
                sealed_end: tuple[int, str | None] | None = None) -> None:
    try:
        with open(head, "rb") as f:
            mark = json.loads(f.read())
        want, last = int(mark["bytes"]), str(mark["hash"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return  # no head (no chained append yet, or lost): the chain alone
    if sealed_end == (want, last):
        return  # the head of the file that was sealed since (a crash before the head moved)
    if want > size:
        raise ChainBroken(lines + 1, None, f"the history ends at byte {size}, but it held "
                          f"{want} bytes after the latest compaction (lines were cut off "
                          "its end)")
    if ends.get(want) != last:
        raise ChainBroken(lines, None, f"the line that ended at byte {want} after the latest "
                          "compaction is not there any more (edited, deleted or moved)")
