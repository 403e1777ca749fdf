"""The bundle file (.a2pc, docs/format.md "Bundles"): its bytes are pinned by a test vector, and
the reader refuses everything else with invalid_bundle or tampered, never another exception:
every flipped byte, every truncation, random mutations, hostile manifests (paths out of the
root or into .git/ and .agent-tx/, links pointing out, unknown versions) and decompression
bombs, which stop at the cap before their bytes are inflated.

Regenerate the vector (after a deliberate format change, with a new version) with
AGENT2PC_REGEN_VECTORS=1.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from agent_2pc.errors import InvalidBundle, Tampered
from agent_2pc.storage import bundle_format as fmt
from agent_2pc.storage.bundle_manifest import LIMITS, Limits

VECTORS = Path(__file__).resolve().parent / "vectors"
TID = "tx-20260101-000000-abcdef"
HELLO, BYE = b"hello\n", b"bye\x00binary\xff\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def op(path: str, kind: str = "write", blob: bytes | None = HELLO, **over: Any) -> dict:
    row = {"path": path, "op": kind, "via": kind, "blob": sha(blob) if blob is not None else None,
           "size": len(blob) if blob is not None else 0, "mode": None, "pre": None,
           "target": None}
    row.update(over)
    return row


def manifest(ops: list[dict], contents: list[bytes], **over: Any) -> dict:
    m = {"format": "agent-2pc-bundle", "version": 1, "tid": TID, "label": "vector",
         "origin": {"workspace": "0123456789abcdef0123456789abcdef",
                    "created_at": "2026-01-01T00:00:00.000Z"},
         "ops": ops, "reads": [{"path": "read.txt", "sha256": sha(b"read\n")}],
         "savepoints": [{"name": "s1", "ops": 1, "reads": 0}],
         "checks": [{"command": "pytest -q", "options": {"timeout_ms": 600000},
                     "passed": True, "exit_code": 0, "timed_out": False, "current": True}],
         "blobs": sorted(({"sha256": sha(b), "size": len(b)} for b in set(contents)),
                         key=lambda b: b["sha256"])}
    m.update(over)
    return m


def build(m: dict, blobs: list[bytes], manifest_bytes: bytes | None = None) -> bytes:
    """A bundle as export writes it (the manifest as given: not checked here)."""
    out = bytearray()
    w = fmt.Writer(out.extend)
    w.member(fmt.MANIFEST, manifest_bytes if manifest_bytes is not None else fmt.canonical(m))
    by_digest = {sha(b): b for b in blobs}
    for entry in m["blobs"]:
        w.member("blobs/" + entry["sha256"], by_digest[entry["sha256"]])
    w.close()
    return bytes(out)


def vector_parts() -> tuple[dict, list[bytes]]:
    ops = [op("a.txt", pre=sha(b"old a\n")),
           op("dir/b.bin", blob=BYTE_BLOB, mode=0o755),
           op("gone.txt", "delete", None, pre=sha(b"gone\n")),
           op("link", "symlink", None, target="dir/b.bin"),
           op("a.txt", blob=BYE, pre=sha(b"old a\n"), via="replace")]
    blobs = [HELLO, BYTE_BLOB, BYE]
    return manifest(ops, blobs), blobs


BYTE_BLOB = bytes(range(256))


def read(data: bytes, limits: Limits = LIMITS) -> dict:
    return fmt.read_all(io.BytesIO(data), len(data), limits)


def gz(tar: bytes) -> bytes:
    """``tar`` in the gzip framing export uses (a correct CRC and checksum member: only the
    seal and the blobs' hashes can object)."""
    c = zlib.compressobj(fmt.LEVEL, zlib.DEFLATED, -15)
    member1 = (fmt.GZIP_HEADER + c.compress(tar) + c.flush()
               + struct.pack("<II", zlib.crc32(tar), len(tar) & 0xFFFFFFFF))
    return member1 + fmt.check_member(hashlib.sha256(member1).digest())


def tar_of(bundle: bytes) -> bytes:
    return gzip.decompress(bundle)  # both members, as gzip and tar read them


# -- the vector ----------------------------------------------------------------------------------

def test_the_vector_pins_the_bytes_of_a_version_1_bundle():
    m, blobs = vector_parts()
    data = build(m, blobs)
    meta_path, bin_path = VECTORS / "bundle_v1.json", VECTORS / "bundle_v1.a2pc"
    if os.environ.get("AGENT2PC_REGEN_VECTORS") == "1":
        bin_path.write_bytes(data)
        meta_path.write_text(json.dumps({
            "sha256": sha(data), "bytes": len(data), "tar_sha256": sha(tar_of(data)),
            "zlib": zlib.ZLIB_RUNTIME_VERSION, "manifest": m}, indent=1) + "\n")
    meta = json.loads(meta_path.read_text())
    vector = bin_path.read_bytes()
    assert sha(vector) == meta["sha256"] and len(vector) == meta["bytes"]
    # The uncompressed tar stream is the format: the same on every zlib.
    assert sha(tar_of(data)) == meta["tar_sha256"] == sha(tar_of(vector))
    if zlib.ZLIB_RUNTIME_VERSION == meta["zlib"]:
        assert data == vector  # and with the same zlib, the very same file
    assert read(vector) == meta["manifest"] == m


def test_every_tar_header_is_the_fixed_ustar_header():
    h = fmt.tar_header("seal", 65)
    assert h[:4] == b"seal" and h[100:108] == b"0000644\0" and h[124:136] == b"00000000101\0"
    assert h[136:148] == b"00000000000\0" and h[156:157] == b"0" and h[257:265] == b"ustar\x0000"
    assert int(h[148:154], 8) == sum(h[:148]) + 8 * 32 + sum(h[156:])
    tar = tar_of(build(*vector_parts()))
    assert tar.endswith(bytes(1024)) and len(tar) % 512 == 0


def test_the_seal_is_the_sha256_of_the_tar_bytes_before_it():
    tar = tar_of(build(*vector_parts()))
    body = tar[:-1024]
    seal_header = body[-1024:-512]
    assert seal_header[:4] == b"seal"
    assert body[-512:-512 + 65] == (sha(body[:-1024]) + "\n").encode()


# -- damage --------------------------------------------------------------------------------------

def test_every_flipped_bit_of_the_file_is_refused():
    # Deflate has bits that do not change what it inflates to: the checksum member sees them.
    data = build(*vector_parts())
    for i in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            with pytest.raises((InvalidBundle, Tampered)):
                read(bytes(bad))


def regions(tar: bytes) -> dict[str, tuple[int, int]]:
    """Byte ranges of the tar stream: each member's header and content, and the end."""
    out, pos = {}, 0
    while pos < len(tar) - 1024:
        name = tar[pos:pos + 100].rstrip(b"\0").decode()
        size = int(tar[pos + 124:pos + 135], 8)
        out[f"header {name}"] = (pos, pos + 512)
        out[f"content {name}"] = (pos + 512, pos + 512 + size)
        pos += 512 + size + (-size % 512)
    out["end"] = (pos, len(tar))
    return out


def test_a_flip_in_any_region_of_the_tar_stream_is_refused_content_flips_as_tampered():
    tar = tar_of(build(*vector_parts()))
    for region, (start, end) in regions(tar).items():
        for i in range(start, end, max(1, (end - start) // 40)):
            bad = bytearray(tar)
            bad[i] ^= 0x20
            with pytest.raises((InvalidBundle, Tampered)) as caught:
                read(gz(bytes(bad)))
            if region.startswith("content blobs/") or region == "content seal":
                assert caught.type is Tampered, (region, i)


def test_an_edited_manifest_in_canonical_form_fails_the_seal():
    m, blobs = vector_parts()
    tar = bytearray(tar_of(build(m, blobs)))
    at = tar.index(b'"label":"vector"')
    tar[at:at + 16] = b'"label":"vectoR"'
    with pytest.raises(Tampered, match="seal"):
        read(gz(bytes(tar)))


def test_every_truncation_is_invalid_bundle():
    data = build(*vector_parts())
    for n in range(len(data)):
        with pytest.raises(InvalidBundle):
            read(data[:n])


def test_bytes_after_the_end_are_refused():
    data = build(*vector_parts())
    with pytest.raises(InvalidBundle, match="goes on"):
        read(data + b"\0")


def test_random_mutations_give_invalid_bundle_or_tampered_never_another_exception():
    rng = random.Random(1402)
    seeds = [build(*vector_parts())]
    seeds.append(gz(tar_of(seeds[0])))
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            if not data:
                break
            i = rng.randrange(len(data))
            kind = rng.randrange(5)
            if kind == 0:
                data[i] = rng.randrange(256)
            elif kind == 1:
                del data[i:i + rng.randint(1, 64)]
            elif kind == 2:
                data[i:i] = os.urandom(rng.randint(1, 64))
            elif kind == 3:
                data = data[:i]
            else:
                j = rng.randrange(len(data))
                data[i], data[j] = data[j], data[i]
        try:
            read(bytes(data))
        except (InvalidBundle, Tampered):
            pass


def test_random_mutations_of_the_tar_stream_give_invalid_bundle_or_tampered():
    rng = random.Random(2604)
    tar = tar_of(build(*vector_parts()))
    for _ in range(1500):
        data = bytearray(tar)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(data))
            data[i] = rng.randrange(256)
        try:
            read(gz(bytes(data)))
        except (InvalidBundle, Tampered):
            pass


# -- hostile manifests -----------------------------------------------------------------------------

@pytest.mark.parametrize("path", [
    "../outside.txt", "/etc/passwd", "a/../../x", ".git/config", "sub/.git/hooks/pre-commit",
    ".agent-tx/wal.bin", ".agent-tx", "", "a//b", "./a", "a/", "nul\0byte"])
def test_a_path_out_of_the_root_or_into_git_or_agent_tx_is_refused(path):
    m = manifest([op(path)], [HELLO], reads=[], savepoints=[])
    with pytest.raises(InvalidBundle, match="may not be imported"):
        read(build(m, [HELLO]))


@pytest.mark.parametrize("target", [
    "/etc/passwd", "../../outside", "../../../x", "sub/../../../x", "../.git/config",
    "../.agent-tx/wal.bin", "d/../.git"])
def test_a_link_pointing_out_of_the_root_or_into_git_is_refused(target):
    m = manifest([op("dir/link", "symlink", None, target=target)], [], reads=[],
                 savepoints=[])
    with pytest.raises(InvalidBundle, match="link"):
        read(build(m, []))


@pytest.mark.parametrize("target", ["../a.txt", "sibling", "./x/../y", "../dir/z"])
def test_a_link_that_stays_inside_is_accepted(target):
    m = manifest([op("dir/link", "symlink", None, target=target)], [], reads=[],
                 savepoints=[])
    assert read(build(m, []))["ops"][0]["target"] == target


@pytest.mark.parametrize("version", [0, 2, 99, "1", None])
def test_an_unknown_version_is_refused_and_says_which(version):
    m = manifest([op("a.txt")], [HELLO], version=version)
    with pytest.raises(InvalidBundle, match="version") as caught:
        read(build(m, [HELLO]))
    if version == 2:
        assert caught.value.details["version"] == 2


@pytest.mark.parametrize("change", [
    {"mode": 0o4755}, {"mode": True}, {"size": 99}, {"op": "chmod"}, {"pre": "nothex"},
    {"via": ""}, {"target": "x"}, {"blob": ["x"]}, {"extra": 1}])
def test_a_malformed_op_is_refused(change):
    row = op("a.txt")
    row.update(change)
    with pytest.raises(InvalidBundle):
        read(build(manifest([row], [HELLO]), [HELLO]))


@pytest.mark.parametrize("over", [
    {"savepoints": [{"name": "s", "ops": 5, "reads": 0}]},
    {"savepoints": [{"name": "s", "ops": 1, "reads": 0}, {"name": "s", "ops": 1, "reads": 0}]},
    {"reads": [{"path": "../x", "sha256": None}]},
    {"checks": [{"command": 1}]},
    {"tid": "tx-../../etc"},
    {"label": "x" * 201},
    {"unknown": True},
    {"blobs": []}])
def test_a_malformed_manifest_is_refused(over):
    m = manifest([op("a.txt")], [HELLO], **over)
    blobs = [HELLO] if m["blobs"] else []
    with pytest.raises(InvalidBundle):
        read(build(m, blobs))


def test_a_manifest_not_in_canonical_form_is_refused():
    m = manifest([op("a.txt")], [HELLO])
    with pytest.raises(InvalidBundle, match="canonical"):
        read(build(m, [HELLO], json.dumps(m, indent=1).encode()))


def test_a_manifest_with_nan_is_refused_not_crashed():
    m = manifest([op("a.txt")], [HELLO])
    raw = fmt.canonical(m).replace(b'"timeout_ms":600000', b'"timeout_ms":NaN')
    with pytest.raises(InvalidBundle):
        read(build(m, [HELLO], raw))


# -- sizes ---------------------------------------------------------------------------------------

def test_a_declared_size_past_the_limit_is_refused_before_any_blob_is_read():
    big = b"\0" * (2 << 20)
    m = manifest([op("big.bin", blob=big)], [big], reads=[], savepoints=[])
    data = build(m, [big])
    with pytest.raises(InvalidBundle, match="size from 0 to"):
        read(data, Limits(blob_bytes_max=1 << 20))
    with pytest.raises(InvalidBundle, match="add up"):
        read(data, Limits(total_bytes_max=1 << 20))


def test_a_decompression_bomb_stops_at_the_declared_size():
    # 64 MiB of zeros compress to ~64 KiB; the manifest declares a 6-byte blob.
    m = manifest([op("a.txt")], [HELLO], reads=[], savepoints=[])
    tar = bytearray(tar_of(build(m, [HELLO])))
    start = tar.index(b"blobs/")
    bomb_header = fmt.tar_header("blobs/" + sha(HELLO), 64 << 20)
    bomb = bytes(tar[:start]) + bomb_header + bytes(64 << 20)
    data = gz(bomb)
    assert len(data) < (1 << 20)
    with pytest.raises(InvalidBundle) as caught:
        read(data)
    assert "more than" in str(caught.value)


def test_a_bundle_past_the_file_limit_is_refused_unread():
    data = build(*vector_parts())
    with pytest.raises(InvalidBundle, match="bytes, more than"):
        read(data, Limits(file_bytes_max=len(data) - 1))


def test_an_oversized_manifest_is_refused_before_it_is_inflated():
    m, blobs = vector_parts()
    with pytest.raises(InvalidBundle, match="manifest.json is"):
        read(build(m, blobs), Limits(manifest_bytes_max=100))


def test_not_a_bundle_at_all_is_invalid_bundle():
    for data in (b"", b"hello", b"PK\x03\x04" + bytes(100), fmt.GZIP_HEADER[:5],
                 b"\x1f\x8b\x08\x08" + bytes(100)):
        with pytest.raises(InvalidBundle):
            read(data)
