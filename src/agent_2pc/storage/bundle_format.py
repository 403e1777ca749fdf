"""The bundle file (``.a2pc``): bytes <-> a manifest and its blobs. Pure but for the file
object it is handed (docs/format.md, "Bundles", has the byte table)::

    gzip member 1 (RFC 1952): the fixed 10-byte header below (no name, mtime 0), raw
    deflate, CRC-32 and size of the tar stream
      tar stream (POSIX ustar; every header fixed: mode 0644, uid/gid 0, mtime 0, no names)
        manifest.json     canonical JSON: what the transaction staged, read, checked
        blobs/<sha256>    the content of each write, once per distinct content, sorted by hash
        seal              the sha256 (hex, then "\\n") of every tar byte before its header
      two zero blocks     the tar end
    gzip member 2 (58 bytes, empty content): its extra field "A2" holds the sha256 of every
    byte of member 1, so that no byte of the file goes unchecked (deflate has bits that do
    not change what it inflates to). gzip and tar read both members as one stream.

The writer makes exactly these bytes; the reader accepts exactly these bytes (a header is
rendered again and compared, byte for byte) and never inflates more than the manifest
declares, nor more than the limits: a decompression bomb stops at the cap, before its bytes
are read. Everything that is not this layout is ``invalid_bundle``; a hash that does not match
(a blob's, the seal's, the gzip CRC) is ``tampered``.
"""

from __future__ import annotations

import json
import re
import struct
import zlib

from ..errors import InvalidBundle, Tampered
from .bundle_manifest import LIMITS, Limits, check_manifest
from .hashing import hasher

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import IO, Any

GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no flags, mtime 0, OS 255
BLOCK = 512
LEVEL = 6  # zlib's default: the same zlib gives the same bytes (reproducible)
CHUNK = 1 << 20
MANIFEST = "manifest.json"
SEAL = "seal"
SEAL_BYTES = 65  # 64 hex digits and "\n"
END = bytes(2 * BLOCK)
# Member 2: FLG.FEXTRA, mtime 0, OS 255; XLEN 36: subfield "A2", 32 bytes; then an empty
# deflate block, CRC-32 0, size 0.
CHECK_HEAD = b"\x1f\x8b\x08\x04\x00\x00\x00\x00\x00\xff" + struct.pack("<H2sH", 36, b"A2", 32)
CHECK_TAIL = b"\x03\x00" + bytes(8)
CHECK_BYTES = len(CHECK_HEAD) + 32 + len(CHECK_TAIL)


def check_member(digest: bytes) -> bytes:
    """Member 2, which carries ``digest``: the sha256 of member 1's bytes."""
    assert len(digest) == 32
    return CHECK_HEAD + digest + CHECK_TAIL


def canonical(obj: Any) -> bytes:
    """The manifest's bytes: sorted keys, no spaces, UTF-8 (RFC 8785 for a manifest, which
    holds no floats)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def tar_header(name: str, size: int) -> bytes:
    """The one ustar header a bundle member has (tests/vectors/bundle_v1.json pins it)."""
    assert len(name) < 100 and name.isascii() and 0 <= size < 8 ** 11
    h = bytearray(BLOCK)
    h[0:len(name)] = name.encode("ascii")
    h[100:108] = b"0000644\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[148:156] = b" " * 8
    h[156] = ord("0")
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _pad(size: int) -> int:
    return -size % BLOCK


# -- writing -----------------------------------------------------------------------------------

class Writer:
    """Writes a bundle through ``write`` (bytes -> None): ``member`` for the manifest and each
    blob in order, then ``close`` (the seal, the tar end, the gzip trailer)."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._out = write
        self._file_sha = hasher(CHUNK)
        self._deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY)
        self._crc = 0
        self._size = 0
        self._sha = hasher(CHUNK)
        self._write(GZIP_HEADER)

    def _write(self, data: bytes) -> None:
        self._file_sha.update(data)
        self._out(data)

    def _tar(self, data: bytes) -> None:
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        self._sha.update(data)
        out = self._deflate.compress(data)
        if out:
            self._write(out)

    def member(self, name: str, data: bytes) -> None:
        self._tar(tar_header(name, len(data)))
        self._tar(data)
        self._tar(bytes(_pad(len(data))))

    def close(self) -> None:
        seal = (self._sha.hexdigest() + "\n").encode("ascii")
        self.member(SEAL, seal)
        self._tar(END)
        self._write(self._deflate.flush())
        self._write(struct.pack("<II", self._crc, self._size & 0xFFFFFFFF))
        self._out(check_member(self._file_sha.digest()))


# -- reading -----------------------------------------------------------------------------------

class _Bounded:
    """Member 1 of the file: reads stop ``left`` bytes in, and every byte read is hashed."""

    def __init__(self, f: IO[bytes], left: int) -> None:
        self.f = f
        self.left = left
        self.sha = hasher(CHUNK)

    def read(self, n: int) -> bytes:
        data = self.f.read(min(n, self.left)) if self.left > 0 else b""
        self.left -= len(data)
        self.sha.update(data)
        return data


class _Inflate:
    """The tar stream of a bundle, inflated on demand, never past ``cap`` bytes."""

    def __init__(self, f: _Bounded, cap: int) -> None:
        self.f = f
        self.cap = cap
        self.total = 0
        self.crc = 0
        self.sha = hasher(CHUNK)
        self._d = zlib.decompressobj(-15)
        self._buf = bytearray()  # inflated, not yet read

    def _feed(self) -> bytes:
        src = self._d.unconsumed_tail
        if not src:
            src = self.f.read(CHUNK)
        return src

    def read(self, n: int, what: str) -> bytes:
        """Exactly ``n`` bytes of the tar stream (``what``: for the error). Inflates ahead a
        MiB at a time (a small ``max_length`` would copy the unconsumed input on every call),
        never past ``cap``."""
        if self.total + n > self.cap:
            raise InvalidBundle(f"the bundle holds more than its manifest declares, or more "
                                f"than {self.cap} bytes unpacked (at {what})")
        buf = self._buf
        while len(buf) < n:
            if self._d.eof:
                raise _truncated(what)
            src = self._feed()
            if not src:
                raise _truncated(what)
            want = min(max(n - len(buf), CHUNK), self.cap - self.total - len(buf))
            try:
                buf += self._d.decompress(src, want)
            except zlib.error as exc:
                raise InvalidBundle(f"the bundle's compressed stream is damaged at {what} "
                                    f"({exc})") from None
        data = bytes(buf[:n])
        del buf[:n]
        self.total += n
        self.crc = zlib.crc32(data, self.crc)
        self.sha.update(data)
        return data

    def finish(self) -> None:
        """The stream ends here: the deflate stream, then the gzip trailer, then nothing."""
        if self._buf:
            raise InvalidBundle("the bundle goes on after the tar end")
        while not self._d.eof:
            src = self._feed()
            if not src:
                raise _truncated("the end")
            try:
                out = self._d.decompress(src, 1)
            except zlib.error as exc:
                raise InvalidBundle(f"the bundle's compressed stream is damaged at its end "
                                    f"({exc})") from None
            if out:
                raise InvalidBundle("the bundle goes on after the tar end")
        rest = self._d.unused_data + self.f.read(max(0, 9 - len(self._d.unused_data)))
        if len(rest) < 8:
            raise _truncated("the gzip trailer")
        if len(rest) > 8:
            raise InvalidBundle("the bundle goes on after its gzip trailer")
        crc, size = struct.unpack("<II", rest)
        if crc != self.crc or size != self.total & 0xFFFFFFFF:
            raise Tampered("the bundle fails its gzip CRC: it was altered after export",
                           what="gzip")


def _truncated(what: str) -> InvalidBundle:
    return InvalidBundle(f"the bundle is truncated (it ends before {what})")


_SIZE_FIELD = re.compile(rb"[0-7]{11}\0")


class Reader:
    """Reads a bundle from ``f`` (``size``: its length): ``manifest()``, then ``blobs()``
    (verified, in order), then ``close()`` (the seal, the tar end, the trailer). Raises
    InvalidBundle or Tampered, never anything else, whatever the bytes."""

    def __init__(self, f: IO[bytes], size: int, limits: Limits = LIMITS) -> None:
        self.limits = limits
        if size > limits.file_bytes_max:
            raise InvalidBundle(f"the bundle is {size} bytes, more than the "
                                f"{limits.file_bytes_max} a bundle may be")
        self._f = f
        self._member1 = _Bounded(f, size - CHECK_BYTES)
        head = self._member1.read(len(GZIP_HEADER))
        if head != GZIP_HEADER:
            raise InvalidBundle("not an agent-2pc bundle: it does not begin with the gzip "
                                "header that export writes")
        cap = limits.manifest_bytes_max + 2 * BLOCK
        self._in = _Inflate(self._member1, cap)
        self._manifest: dict[str, Any] | None = None

    def _member(self, name: str, size_max: int) -> bytes:
        head = self._in.read(BLOCK, f"the header of {name}")
        if not _SIZE_FIELD.fullmatch(head[124:136]):
            raise InvalidBundle(f"the header of {name} has no size agent-2pc writes")
        size = int(head[124:135], 8)
        if head != tar_header(name, size):
            raise InvalidBundle(f"the header where {name} should be is not one agent-2pc "
                                "writes (another name, mode, owner, time or checksum)")
        if size > size_max:
            raise InvalidBundle(f"{name} is {size} bytes, more than the {size_max} it may be")
        data = self._in.read(size, name)
        self._in.read(_pad(size), f"the padding of {name}")
        return data

    def manifest(self) -> dict[str, Any]:
        raw = self._member(MANIFEST, self.limits.manifest_bytes_max)
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise InvalidBundle(f"the manifest is not JSON: {exc}") from None
        check_manifest(obj, self.limits)
        try:
            again = canonical(obj)
        except ValueError:  # NaN or Infinity in a check's options
            again = b""
        if again != raw:
            raise InvalidBundle("the manifest is not in canonical form (sorted keys, no "
                                "spaces): not written by agent-2pc export")
        blobs = obj["blobs"]
        members = sum(BLOCK + b["size"] + _pad(b["size"]) for b in blobs)
        self._in.cap = self._in.total + members + BLOCK * 2 + len(END)  # the seal, the end
        checked: dict[str, Any] = obj
        self._manifest = checked
        return checked

    def blobs(self) -> Iterator[tuple[str, bytes]]:
        """(sha256, content) of each blob, checked against its hash, in the manifest's order."""
        assert self._manifest is not None
        for entry in self._manifest["blobs"]:
            digest = entry["sha256"]
            name = "blobs/" + digest
            data = self._member(name, entry["size"])
            if len(data) != entry["size"]:
                raise InvalidBundle(f"{name} is {len(data)} bytes; the manifest says "
                                    f"{entry['size']}")
            h = hasher(len(data))
            h.update(data)
            if h.hexdigest() != digest:
                raise Tampered(f"{name} fails its sha256: the bundle was altered after export",
                               what=name)
            yield digest, data

    def close(self) -> None:
        sealed = self._in.sha.hexdigest()
        seal = self._member(SEAL, SEAL_BYTES)
        if seal != (sealed + "\n").encode("ascii"):
            raise Tampered("the bundle fails its seal (the sha256 of everything before it): "
                           "it was altered after export", what=SEAL)
        if self._in.read(len(END), "the tar end") != END:
            raise InvalidBundle("the bundle has no tar end where it should")
        self._in.finish()
        last = self._f.read(CHECK_BYTES + 1)
        if len(last) != CHECK_BYTES or last[:len(CHECK_HEAD)] != CHECK_HEAD or not last.endswith(
                CHECK_TAIL):
            raise InvalidBundle("the bundle does not end with the checksum member export "
                                "writes")
        if last[len(CHECK_HEAD):-len(CHECK_TAIL)] != self._member1.sha.digest():
            raise Tampered("the bundle fails its checksum (the sha256 of its compressed "
                           "bytes): it was altered after export", what="checksum")


def read_all(f: IO[bytes], size: int, limits: Limits = LIMITS,
             take: Callable[[str, bytes], None] | None = None) -> dict[str, Any]:
    """Read and verify a whole bundle; ``take`` is given each verified blob. The manifest."""
    reader = Reader(f, size, limits)
    manifest = reader.manifest()
    for digest, data in reader.blobs():
        if take is not None:
            take(digest, data)
    reader.close()
    return manifest
