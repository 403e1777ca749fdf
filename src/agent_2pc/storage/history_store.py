"""The history in segments: read from its end, found by tid, kept to a bounded size.

history.jsonl is the open segment: compaction appends to it (history.py). Once it holds
``SEGMENT_BYTES``, compaction seals it: it records the segment in ``history/index.json`` (its
number, lines, the smallest and largest tid it holds, the hash before its first line and of
its last line), then renames history.jsonl to ``history/<seq>.jsonl``; the next append starts
a new history.jsonl chained to the sealed segment's last line. Retention then cuts the oldest
sealed segments that hold none of the latest ``KEEP`` finished transactions: the index first
records, as its ``base``, the number of the newest segment cut and the hash of its last line
(where the chain of what is kept starts, so ``log --verify`` still checks everything kept),
then the files are removed. A crash between the two leaves files that the index no longer
names; the next seal removes them. A crash after the index names a new segment and before
the rename leaves the index naming a file that is not there, whose lines are still in
history.jsonl: readers skip it, the next seal drops it and seals again.

Reading costs what is read: ``newest_first`` reads the files backwards in blocks and stops when
its caller does; ``lookup`` reads the open segment and only the sealed segments whose tid range
holds the tid (tids begin with their creation time, so a segment's range is narrow, except for
the transactions that stayed open long).
"""

from __future__ import annotations

import json
import os
import re

from .. import crashpoints
from .durable import fsync_dir, rename, write_atomic

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Generator, Iterator

# A sealed segment holds about 5,000 transactions (~210 bytes a line): the open one, read
# whole by a lookup, stays small, and so does any sealed one a lookup reads.
SEGMENT_BYTES = int(os.environ.get("AGENT2PC_HISTORY_SEGMENT_BYTES", 1 << 20))
# The history keeps at least the latest KEEP finished transactions (in whole segments);
# 0 keeps everything.
KEEP = int(os.environ.get("AGENT2PC_HISTORY_KEEP", 100_000))
_BLOCK = 64 * 1024
_TID = re.compile(rb'"tid":"([^"\\]*)"')
_pread = os.pread  # tests count the bytes read through it


def _lines_backward(fd: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line) of the non-empty lines of ``fd`` before ``end``, last first."""
    pos, rest = end, b""
    while pos > 0:
        start = max(0, pos - _BLOCK)
        block = _pread(fd, pos - start, start) + rest
        pos = start
        parts = block.split(b"\n")
        if pos > 0:
            rest, parts = parts[0], parts[1:]
            off = start + len(rest) + 1
        else:
            rest, off = b"", start
        offs = []
        for part in parts:
            offs.append(off)
            off += len(part) + 1
        for o, part in zip(reversed(offs), reversed(parts), strict=True):
            if part:
                yield o, part
    if rest:
        yield 0, rest


def _complete_end(fd: int) -> int:
    """Where the file's complete lines end (a line cut short by a crash is not one)."""
    size = os.fstat(fd).st_size
    if size and _pread(fd, 1, size - 1) != b"\n":
        from .history import last_newline

        return last_newline(fd, size)
    return size


class NotInHistory(LookupError):
    """``before`` names no line of the history."""


def _may_hold(seg: dict[str, Any] | None, tid: str) -> bool:
    """Can the segment hold ``tid`` (history.jsonl: always)?"""
    return seg is None or str(seg.get("min", "")) <= tid <= str(seg.get("max", "\uffff"))


def _find(fd: int, end: int, tid: str) -> tuple[int, dict[str, Any]] | None:
    """(offset, line) of the latest line of ``tid`` in the file's first ``end`` bytes."""
    needle = f'"tid":"{tid}"'.encode()
    data = _pread(fd, end, 0)
    at = data.rfind(needle)
    while at != -1:
        start = data.rfind(b"\n", 0, at) + 1
        stop = data.find(b"\n", at)
        obj = parse(data[start:stop if stop != -1 else None])
        if obj is not None and obj["tid"] == tid:
            return start, obj
        at = data.rfind(needle, 0, at)
    return None


def parse(line: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None  # a line cut short by a crash during append; it is written again
    return obj if isinstance(obj, dict) and isinstance(obj.get("tid"), str) else None


class Store:
    """history.jsonl and history/ of one workspace."""

    def __init__(self, current: str, head: str | None = None) -> None:
        self.current = current
        self.head = head
        self.dir = os.path.join(os.path.dirname(current), "history")
        self.index_path = os.path.join(self.dir, "index.json")

    # -- the index -----------------------------------------------------------------------

    def index(self) -> dict[str, Any]:
        """``{base, segments}``: ``base`` null or ``{through, hash, lines}`` (what retention
        cut); ``segments`` oldest first, each ``{seq, lines, bytes, min, max, prev, hash}``."""
        try:
            with open(self.index_path, "rb") as f:
                index = json.loads(f.read())
            if isinstance(index, dict) and isinstance(index.get("segments"), list):
                return index
        except FileNotFoundError:
            pass
        except ValueError:
            pass  # damaged: the segments are still read (as their files say); verify fails
        return {"base": None, "segments": self._listed()}

    def _listed(self) -> list[dict[str, Any]]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        seqs = sorted(int(n[:-6]) for n in names if n.endswith(".jsonl") and n[:-6].isdigit())
        return [{"seq": s, "lines": 0, "min": "", "max": "\uffff"} for s in seqs]

    def segment_path(self, seq: int) -> str:
        return os.path.join(self.dir, f"{seq:08d}.jsonl")

    def start_hash(self, index: dict[str, Any] | None = None) -> str | None:
        """The hash the open segment's first line chains to, when segments were sealed."""
        index = self.index() if index is None else index
        if index["segments"]:
            return str(index["segments"][-1].get("hash") or "") or None
        base = index.get("base")
        return str(base["hash"]) if base else None

    # -- reading ---------------------------------------------------------------------------

    def files_newest_first(self, holding: str | None = None
                           ) -> Iterator[tuple[dict[str, Any] | None, int]]:
        """(the segment's index entry, or None for history.jsonl; an open fd), newest first;
        each fd is closed when the next one is asked for. The open segment is opened before
        the index is read: a seal in between makes a segment seen twice (the caller keeps a
        tid once), never missed. ``holding``: only the segments whose tid range may hold that
        tid (the others are not opened: a million transactions are 500 segments)."""
        try:
            fd = os.open(self.current, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1
        segments = self.index()["segments"]
        try:
            if fd != -1:
                yield None, fd
        finally:
            if fd != -1:
                os.close(fd)
        for seg in reversed(segments):
            if holding is not None and not _may_hold(seg, holding):
                continue
            try:
                fd = os.open(self.segment_path(seg["seq"]), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # cut by retention meanwhile, or a seal not finished
            try:
                yield seg, fd
            finally:
                os.close(fd)

    def newest_first(self, before: str | None = None
                     ) -> Generator[dict[str, Any], None, None]:
        """The history's lines, newest first, a tid once (its latest line). With ``before``:
        the lines older than the latest line of that tid (found as ``locate`` finds it, in
        the same open files); NotInHistory if it is not there."""
        seen: set[str] = set()
        found = before is None
        for seg, fd in self.files_newest_first():
            end = _complete_end(fd)
            if not found:
                hit = _find(fd, end, str(before)) if _may_hold(seg, str(before)) else None
                if hit is None:
                    continue
                found, end = True, hit[0]
            for _, line in _lines_backward(fd, end):
                obj = parse(line)
                if obj is None or obj["tid"] in seen:
                    continue
                seen.add(obj["tid"])
                yield obj
        if not found:
            raise NotInHistory(before)

    def lookup(self, tid: str) -> dict[str, Any] | None:
        """The latest line of ``tid``, or None. Reads the open segment and the sealed ones
        whose tid range holds ``tid``."""
        for _, fd in self.files_newest_first(holding=tid):
            hit = _find(fd, _complete_end(fd), tid)
            if hit is not None:
                return hit[1]
        return None

    # -- sealing and retention (the caller holds the log's lock) ---------------------------

    def seal_if_due(self, keep: int | None = None) -> bool:
        """Seal the open segment once it holds SEGMENT_BYTES; then apply retention. Otherwise
        only remove the files of segments a crash left after retention cut them."""
        try:
            size = os.path.getsize(self.current)
        except FileNotFoundError:
            size = 0
        if size < SEGMENT_BYTES:
            if os.path.exists(self.index_path):
                self._remove_cut(self.index())
            return False
        self.seal(keep)
        return True

    def seal(self, keep: int | None = None) -> None:
        from .history import _write_head, line_hash

        index = self.index()
        segments = [s for s in index["segments"] if os.path.exists(self.segment_path(s["seq"]))]
        base = index.get("base")
        with open(self.current, "rb") as f:
            data = f.read()
        data = data[:data.rfind(b"\n") + 1]  # a torn last line stays for the next append
        if not data:
            return
        lines = data.split(b"\n")[:-1]
        first, last = parse(lines[0]) or {}, parse(lines[-1]) or {}
        if not last.get("hash") or last["hash"] != line_hash(last):
            return  # not chained yet (an earlier version's lines): sealed after the next append
        seq = max([s["seq"] for s in segments] + [base["through"] if base else 0]) + 1
        tids = [t.decode("utf-8", "replace") for t in _TID.findall(data)]
        meta = {"seq": seq, "lines": len(lines), "bytes": len(data),
                "min": min(tids, default=""), "max": max(tids, default=""),
                "prev": first.get("prev"), "hash": last["hash"]}
        os.makedirs(self.dir, exist_ok=True)
        self._write_index({"base": base, "segments": segments + [meta]})
        crashpoints.hit("history.seal.after_index")
        if os.path.getsize(self.current) != len(data):
            os.truncate(self.current, len(data))  # a torn line: written again by compaction
        rename(self.current, self.segment_path(seq))
        fsync_dir(self.dir)
        fsync_dir(os.path.dirname(self.current))
        if self.head is not None:
            _write_head(self.head, 0, str(meta["hash"]))
        self.retain(KEEP if keep is None else keep)

    def retain(self, keep: int) -> int:
        """Cut the oldest sealed segments that hold none of the latest ``keep`` finished
        transactions (0: keep all). Returns the number of segments cut."""
        if keep <= 0:
            return 0
        index = self.index()
        segments = index["segments"]
        held, cut_at = 0, 0
        for i in range(len(segments) - 1, -1, -1):
            if held >= keep:
                cut_at = i + 1
                break
            held += int(segments[i].get("lines") or 0)
        cut, kept = segments[:cut_at], segments[cut_at:]
        if cut:
            base = index.get("base") or {"lines": 0}
            newest = cut[-1]
            index = {"base": {"through": newest["seq"], "hash": newest.get("hash"),
                              "lines": int(base.get("lines") or 0)
                              + sum(int(s.get("lines") or 0) for s in cut)},
                     "segments": kept}
            self._write_index(index)
            crashpoints.hit("history.trim.after_index")
        self._remove_cut(index)
        return len(cut)

    def _remove_cut(self, index: dict[str, Any]) -> None:
        """Remove the segment files at or below the base (cut by retention)."""
        base = index.get("base")
        if not base:
            return
        for name in os.listdir(self.dir):
            if name.endswith(".jsonl") and name[:-6].isdigit() and int(name[:-6]) <= int(
                    base["through"]):
                try:
                    os.unlink(os.path.join(self.dir, name))
                except FileNotFoundError:
                    pass

    def _write_index(self, index: dict[str, Any]) -> None:
        write_atomic(self.index_path, json.dumps(index, separators=(",", ":")).encode())
