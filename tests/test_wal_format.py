"""The write-ahead log frame (CONTRACT.md, "Write-ahead log frame"), pinned by hex vectors.

Regenerate tests/vectors/wal_frames.json with AGENT2PC_REGEN_VECTORS=1 only when the format
changes on purpose (and then the format version must change too).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_2pc.storage import wal_format

VECTORS = Path(__file__).parent / "vectors" / "wal_frames.json"

GOOD = [
    ("begin", {"type": "begin", "tid": "tx-20260101-120000-a1b2c3", "ts": 1767268800000,
               "label": None, "timeout_ms": 86400000, "boot": "b", "pid": 42}),
    ("stage", {"type": "stage", "tid": "tx-20260101-120000-a1b2c3", "ts": 1767268800001,
               "path": "src/a.py", "op": "write", "via": "write",
               "blob": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
               "size": 4, "mode": None, "pre": None}),
    ("unicode_path", {"type": "read", "tid": "tx-20260101-120000-a1b2c3", "ts": 1,
                      "path": "docs/caf\u00e9 \u2603.md", "sha256": None}),
    ("decision", {"type": "decision", "tid": "tx-20260101-120000-a1b2c3", "ts": 2,
                  "outcome": "commit"}),
]
# Records pinned one by one (not in the log the bad vectors cut): later kinds.
MORE = [
    ("vote", {"type": "vote", "tid": "tx-20260101-120000-a1b2c3", "ts": 3, "pid": 42,
              "coordinator": {"gtid": "g-1", "store": "postgresql://db.example:5432/coord"},
              "decided": {"modes": {"0": 420}}}),
]


def _vectors() -> dict:
    frames = {name: wal_format.encode(rec).hex() for name, rec in GOOD + MORE}
    log = b"".join(bytes.fromhex(frames[n]) for n, _ in GOOD)
    first = len(bytes.fromhex(frames["begin"]))
    bad_crc = bytearray(log)
    bad_crc[first + 20] ^= 0x01  # a payload byte of the second frame
    return {
        "good": [{"name": n, "record": r, "hex": frames[n]} for n, r in GOOD + MORE],
        "bad": [
            {"name": "torn_tail", "hex": log[: len(log) - 7].hex(), "records": 3,
             "damage_offset": len(log) - len(bytes.fromhex(frames["decision"])),
             "torn": True},
            {"name": "bad_crc_in_middle", "hex": bytes(bad_crc).hex(), "records": 1,
             "damage_offset": first, "torn": False},
            {"name": "length_past_end", "hex": (log + wal_format.HEADER.pack(
                b"A2PC", 1, 1000, 0) + b"{}").hex(), "records": 4, "damage_offset": len(log),
             "torn": True},
            {"name": "bad_magic_at_tail", "hex": (log + b"XXXX" + b"\0" * 20).hex(),
             "records": 4, "damage_offset": len(log), "torn": True},
        ],
    }


def load_vectors() -> dict:
    if os.environ.get("AGENT2PC_REGEN_VECTORS") == "1":
        VECTORS.parent.mkdir(exist_ok=True)
        VECTORS.write_text(json.dumps(_vectors(), indent=1, ensure_ascii=False) + "\n")
    return json.loads(VECTORS.read_text())


def test_frame_header_layout_is_the_contracts():
    frame = wal_format.encode({"type": "t", "tid": "x", "ts": 0})
    payload = b'{"type":"t","tid":"x","ts":0}'
    assert frame[:4] == b"A2PC" and frame[:4].hex() == "41325043"
    assert frame[4] == 1
    assert struct.unpack("<I", frame[5:9])[0] == len(payload)
    assert struct.unpack("<I", frame[9:13])[0] == zlib.crc32(payload)
    assert frame[13:] == payload
    assert frame.hex() == ("413250430" "11d000000" + struct.pack("<I", zlib.crc32(payload)).hex()
                           + payload.hex())


@pytest.mark.parametrize("vec", load_vectors()["good"], ids=lambda v: v["name"])
def test_encoding_matches_the_pinned_hex_vector(vec):
    assert wal_format.encode(vec["record"]).hex() == vec["hex"]
    decoded = wal_format.decode(bytes.fromhex(vec["hex"]))
    assert decoded.records == [vec["record"]] and decoded.damage is None


@pytest.mark.parametrize("vec", load_vectors()["bad"], ids=lambda v: v["name"])
def test_damaged_logs_decode_to_the_valid_prefix_and_say_where(vec):
    decoded = wal_format.decode(bytes.fromhex(vec["hex"]))
    assert len(decoded.records) == vec["records"]
    assert decoded.damage is not None
    assert decoded.damage.offset == vec["damage_offset"] == decoded.end
    assert decoded.damage.torn is vec["torn"]


def test_vectors_file_is_what_the_generator_makes():
    assert load_vectors() == json.loads(json.dumps(_vectors(), ensure_ascii=False))


def test_payload_without_type_tid_ts_is_refused():
    payload = b'{"type":"x"}'
    frame = wal_format.HEADER.pack(b"A2PC", 1, len(payload), zlib.crc32(payload)) + payload
    decoded = wal_format.decode(frame)
    assert decoded.records == [] and decoded.damage is not None


records_strategy = st.lists(
    st.fixed_dictionaries({
        "type": st.sampled_from(["begin", "stage", "read"]),
        "tid": st.text(min_size=1, max_size=12),
        "ts": st.integers(min_value=0, max_value=2**53),
        "path": st.text(max_size=40),
    }), min_size=1, max_size=6)


def _frames(records):
    frames = [wal_format.encode(r) for r in records]
    offsets = [0]
    for f in frames:
        offsets.append(offsets[-1] + len(f))
    return b"".join(frames), offsets


@settings(max_examples=60, deadline=None)
@given(records_strategy)
def test_truncation_at_every_offset_yields_a_prefix_and_a_torn_tail(records):
    log, offsets = _frames(records)
    for cut in range(len(log) + 1):
        decoded = wal_format.decode(log[:cut])
        whole = max(i for i, off in enumerate(offsets) if off <= cut)
        assert decoded.records == records[:whole]
        assert decoded.end == offsets[whole]
        if cut == offsets[whole]:
            assert decoded.damage is None
        else:
            assert decoded.damage is not None and decoded.damage.torn


@settings(max_examples=60, deadline=None)
@given(records_strategy, st.data())
def test_a_flipped_bit_is_never_decoded_as_a_record(records, data):
    log, offsets = _frames(records)
    bit = data.draw(st.integers(min_value=0, max_value=len(log) * 8 - 1))
    damaged = bytearray(log)
    damaged[bit // 8] ^= 1 << (bit % 8)
    decoded = wal_format.decode(bytes(damaged))
    k = max(i for i, off in enumerate(offsets) if off <= bit // 8)  # the frame hit
    assert decoded.records == records[:k]
    assert decoded.damage is not None and decoded.damage.offset == offsets[k]
    # Valid frames after the damaged one make it corruption, never a tail to cut off.
    assert decoded.damage.torn is (k == len(records) - 1)


def test_fingerprints_of_links_and_directories_match_the_documented_vectors():
    from agent_2pc.core.states import DIR_FINGERPRINT
    from agent_2pc.storage.hashing import link_fingerprint

    assert link_fingerprint("a.txt") == (
        "symlink:18b7cb099a9ea3f50ba899b5ba81e0d377a5f3b16f8f6eeb8b3e58cd4692b993")
    assert DIR_FINGERPRINT == "dir"
    assert link_fingerprint("caf\udce9") != link_fingerprint("café")  # raw bytes, not text
