"""The write-ahead log frame: bytes <-> records. Pure: no I/O.

| offset | size | field                                                        |
|--------|------|--------------------------------------------------------------|
| 0      | 4    | magic, the bytes 41 32 50 43 ("A2PC")                        |
| 4      | 1    | format version, 1                                            |
| 5      | 4    | payload length N, u32 little-endian                          |
| 9      | 4    | CRC-32 (IEEE, as zlib.crc32) of the payload, u32 little-endian|
| 13     | N    | payload: a UTF-8 JSON object with at least type, tid, ts     |

Reading a buffer yields the valid records up to the first bad frame. A bad frame is a *torn
tail* when no valid frame follows it anywhere in the buffer (a writer died mid-append, or the
machine lost the unsynced end of the file): the reader's owner may cut it off. Otherwise it is
*corruption*: a damaged record with valid ones after it. Nobody may guess past it; the offset is
reported. tests/vectors/ holds hex test vectors of good and bad frames.
"""

from __future__ import annotations

import json
import struct
import zlib

from ..core import records

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAGIC = b"A2PC"
VERSION = 1
HEADER = struct.Struct("<4sBII")
HEADER_SIZE = HEADER.size  # 13
PAYLOAD_SIZE_MAX = 16 << 20  # records name blobs; they never carry file content
_loads = json.loads


def _not_json(obj: Any) -> Any:
    raise TypeError(f"a record holds a {type(obj).__name__}, which is not JSON")


# The C encoder, built once: JSONEncoder.encode builds a new one for every call, which is a
# third of the cost of a log append here. No circular-reference check (records are trees),
# compact separators, UTF-8 text (not \u escapes), NaN refused. Same bytes as json.dumps.
# ``_chunks(record, 0)`` gives the text in pieces; encode() calls it directly (a log append is
# dear enough that a Python call less shows).
_c_make = getattr(json.encoder, "c_make_encoder", None)
if _c_make is not None:
    _chunks = _c_make(None, _not_json, json.encoder.encode_basestring, None, ":", ",",
                      False, False, False)
else:  # pragma: no cover - an interpreter without the C accelerator
    _py_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)

    def _chunks(record: dict[str, Any], _level: int) -> list[str]:
        return [_py_encoder.encode(record)]


class Damage:
    """A bad frame at ``offset``: ``torn`` (nothing valid follows) or corruption."""

    __slots__ = ("offset", "reason", "torn")

    def __init__(self, offset: int, reason: str, torn: bool) -> None:
        self.offset = offset
        self.reason = reason
        self.torn = torn


class Decoded:
    __slots__ = ("records", "frames", "end", "damage")

    def __init__(self, records: list[dict[str, Any]], frames: list[memoryview], end: int,
                 damage: Damage | None) -> None:
        self.records = records
        self.frames = frames  # each record's whole frame, as read (compaction copies them)
        self.end = end  # offset just past the last valid frame
        self.damage = damage


def encode(record: dict[str, Any]) -> bytes:
    """One frame for ``record`` (which must have type, tid and ts)."""
    assert "type" in record and "tid" in record and "ts" in record, record
    payload = "".join(_chunks(record, 0)).encode("utf-8")
    assert len(payload) <= PAYLOAD_SIZE_MAX, len(payload)
    return HEADER.pack(MAGIC, VERSION, len(payload), zlib.crc32(payload)) + payload


# The first frame of a workspace's log names the workspace (a random id, also in TRUST): a log
# file that something else put there (git checks out ignored files over the user's) lacks it.
# The log consumes it when it opens the file; nobody else sees it.
LOG_HEADER_TYPE = "log"


def log_header(workspace_id: str, ts: int) -> bytes:
    header = records.log_header(workspace_id, ts=ts)  # of type LOG_HEADER_TYPE
    return encode(records.as_json([header])[0])


def read_log_header(buf: bytes | memoryview) -> tuple[str | None, int]:
    """(the workspace id, the header's length) when ``buf`` begins with a log header;
    (None, 0) when it does not."""
    rec, end, _ = _frame_at(buf, 0)
    if rec is None or rec.get("type") != LOG_HEADER_TYPE or not isinstance(
            rec.get("workspace"), str):
        return None, 0
    return rec["workspace"], end


def _frame_at(buf: bytes | memoryview, offset: int) -> tuple[dict[str, Any] | None, int, str]:
    """Decode the frame at ``offset``: (record, next offset, "") or (None, offset, reason)."""
    size = len(buf)
    if size - offset < HEADER_SIZE:
        return None, offset, "incomplete header"
    magic, version, length, crc = HEADER.unpack_from(buf, offset)
    if magic != MAGIC:
        return None, offset, "bad magic"
    if version != VERSION:
        return None, offset, f"unknown format version {version}"
    if length > PAYLOAD_SIZE_MAX:
        return None, offset, f"payload length {length} over the limit"
    start = offset + HEADER_SIZE
    end = start + length
    if end > size:
        return None, offset, "payload runs past the end"
    payload = bytes(buf[start:end])
    if zlib.crc32(payload) != crc:
        return None, offset, "CRC mismatch"
    try:
        record = _loads(payload)
    except (ValueError, RecursionError):  # nested past the parser's depth: not ours either
        return None, offset, "payload is not JSON"
    if not isinstance(record, dict) or not all(k in record for k in ("type", "tid", "ts")):
        return None, offset, "payload lacks type, tid or ts"
    return record, end, ""


def _framing_error(buf: bytes | memoryview, offset: int, size: int) -> str | None:
    """Why the frame at ``offset`` is not well framed (header, length, CRC), or None."""
    if size - offset < HEADER_SIZE:
        return "incomplete header"
    magic, version, length, crc = HEADER.unpack_from(buf, offset)
    if magic != MAGIC:
        return "bad magic"
    if version != VERSION:
        return f"unknown format version {version}"
    if length > PAYLOAD_SIZE_MAX:
        return f"payload length {length} over the limit"
    end = offset + HEADER_SIZE + length
    if end > size:
        return "payload runs past the end"
    if zlib.crc32(buf[offset + HEADER_SIZE:end]) != crc:
        return "CRC mismatch"
    return None


def decode(buf: bytes | memoryview, start: int = 0) -> Decoded:
    """Decode every frame of ``buf`` from ``start``; classify the first bad one, if any.

    Frames are checked one by one (header, length, CRC); their payloads are then parsed in
    one json.loads of a JSON array, which is several times faster than a call per record
    (recovery reads a whole log). A payload that breaks that parse is found by parsing them
    one by one, and is a bad frame like any other.
    """
    view = memoryview(buf)
    size = len(view)
    offset = start
    starts: list[int] = []
    payloads: list[memoryview] = []
    reason = None
    unpack, crc32 = HEADER.unpack_from, zlib.crc32  # the hot loop of recovery
    while offset < size:
        if size - offset >= HEADER_SIZE:
            magic, version, length, crc = unpack(view, offset)
            end = offset + HEADER_SIZE + length
            if (magic == MAGIC and version == VERSION and length <= PAYLOAD_SIZE_MAX
                    and end <= size):
                payload = view[offset + HEADER_SIZE:end]
                if crc32(payload) == crc:
                    starts.append(offset)
                    payloads.append(payload)
                    offset = end
                    continue
        reason = _framing_error(view, offset, size)
        assert reason is not None
        break
    records = _parse_all(payloads)
    if len(records) < len(starts):  # a payload that is not a record: the frame is bad
        offset = starts[len(records)]
        del starts[len(records):]
        reason = "payload is not a JSON object with type, tid and ts"
    # Each frame is a view into ``buf`` (no copy): compaction writes them back as they are.
    frames = [view[a:a + HEADER_SIZE + len(p)] for a, p in zip(starts, payloads, strict=False)]
    if reason is None:
        return Decoded(records, frames, offset, None)
    torn = not _valid_frame_after(buf, offset)
    return Decoded(records, frames, offset, Damage(offset, reason, torn))


def _is_record(obj: Any) -> bool:
    return isinstance(obj, dict) and "type" in obj and "tid" in obj and "ts" in obj


def _parse_all(payloads: list[memoryview]) -> list[dict[str, Any]]:
    """The records of ``payloads``, up to the first that is not one."""
    if not payloads:
        return []
    try:
        parsed = _loads(b"[" + b",".join(payloads) + b"]")
        if len(parsed) == len(payloads) and all(_is_record(r) for r in parsed):
            return parsed  # type: ignore[no-any-return]
    except (ValueError, RecursionError):
        pass
    out = []
    for p in payloads:
        try:
            rec = _loads(bytes(p))
        except (ValueError, RecursionError):
            break
        if not _is_record(rec):
            break
        out.append(rec)
    return out


def _valid_frame_after(buf: bytes | memoryview, offset: int) -> bool:
    """Is there a valid frame anywhere after the bad one at ``offset``?"""
    data = bytes(buf)
    probe = data.find(MAGIC, offset + 1)
    while probe != -1:
        if _frame_at(data, probe)[0] is not None:
            return True
        probe = data.find(MAGIC, probe + 1)
    return False
