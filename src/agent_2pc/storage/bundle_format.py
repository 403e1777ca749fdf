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

from ..core.confine import TID_RE, is_blob_name, path_problem
from ..core.states import DIR_FINGERPRINT, OP_KINDS
from ..errors import InvalidBundle, Tampered
from .hashing import hasher

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import IO, Any

FORMAT = "agent-2pc-bundle"
VERSION = 1
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


class Limits:
    """What a bundle may hold; a bundle past any of them is refused before it is read."""

    __slots__ = ("file_bytes_max", "manifest_bytes_max", "blob_bytes_max", "total_bytes_max",
                 "ops_max", "reads_max", "savepoints_max", "checks_max")

    def __init__(self, file_bytes_max: int = 4 << 30, manifest_bytes_max: int = 64 << 20,
                 blob_bytes_max: int = 256 << 20, total_bytes_max: int = 4 << 30,
                 ops_max: int = 200_000, reads_max: int = 200_000, savepoints_max: int = 10_000,
                 checks_max: int = 1_000) -> None:
        self.file_bytes_max = file_bytes_max
        self.manifest_bytes_max = manifest_bytes_max
        self.blob_bytes_max = blob_bytes_max
        self.total_bytes_max = total_bytes_max
        self.ops_max = ops_max
        self.reads_max = reads_max
        self.savepoints_max = savepoints_max
        self.checks_max = checks_max


LIMITS = Limits()


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


# -- the manifest ------------------------------------------------------------------------------

_OP_KEYS = frozenset({"path", "op", "via", "blob", "size", "mode", "pre", "target"})
_TOP_KEYS = frozenset({"format", "version", "tid", "label", "origin", "ops", "reads",
                       "savepoints", "checks", "blobs"})
LABEL_CHARS_MAX = 200
NAME_CHARS_MAX = 200
VIA_CHARS_MAX = 32


def check_manifest(m: Any, limits: Limits = LIMITS) -> None:
    """InvalidBundle unless ``m`` is a version-1 manifest whose every path, link and size may
    be imported (docs/format.md, "Bundles")."""
    if type(m) is not dict:
        raise InvalidBundle("the manifest is not a JSON object")
    if m.get("format") != FORMAT:
        raise InvalidBundle(f"the manifest's format is {m.get('format')!r}, not {FORMAT!r}")
    version = m.get("version")
    if type(version) is not int or version != VERSION:
        raise InvalidBundle(f"the bundle is of format version {version!r}; this agent-2pc "
                            f"reads version {VERSION} (a newer agent-2pc wrote it: upgrade)",
                            version=version if type(version) is int else None)
    extra = set(m) - _TOP_KEYS
    missing = _TOP_KEYS - set(m)
    if extra or missing:
        raise InvalidBundle(f"the manifest has unknown fields {sorted(extra)} or lacks "
                            f"{sorted(missing)}")
    if type(m["tid"]) is not str or TID_RE.fullmatch(m["tid"]) is None:
        raise InvalidBundle(f"the manifest's tid {str(m['tid'])[:80]!r} is not one agent-2pc "
                            "makes")
    _check_str(m["label"], "the label", LABEL_CHARS_MAX, null=True)
    _check_origin(m["origin"])
    sizes = _check_blobs(m["blobs"], limits)
    ops = _check_list(m["ops"], "ops", limits.ops_max)
    used: set[str] = set()
    pres: dict[str, Any] = {}
    for op in ops:
        _check_op(op, sizes, pres)
        if op["blob"] is not None:
            used.add(op["blob"])
    if used != set(sizes):
        raise InvalidBundle("the manifest lists blobs no write names")
    for rd in _check_list(m["reads"], "reads", limits.reads_max):
        if type(rd) is not dict or set(rd) != {"path", "sha256"}:
            raise InvalidBundle("a read is not {path, sha256}")
        _check_path(rd["path"])
        _check_fingerprint(rd["sha256"], rd["path"])
    _check_savepoints(m["savepoints"], len(ops), len(m["reads"]), limits)
    for chk in _check_list(m["checks"], "checks", limits.checks_max):
        _check_check(chk)


def _check_list(value: Any, what: str, most: int) -> list[Any]:
    if type(value) is not list:
        raise InvalidBundle(f"the manifest's {what} is not a list")
    if len(value) > most:
        raise InvalidBundle(f"the manifest has {len(value)} {what}, more than {most}")
    return value


def _check_str(value: Any, what: str, most: int, null: bool = False) -> None:
    if value is None and null:
        return
    if type(value) is not str or len(value) > most or (not null and not value):
        raise InvalidBundle(f"{what} is not a string of at most {most} characters")


def _check_origin(origin: Any) -> None:
    if type(origin) is not dict or set(origin) != {"workspace", "created_at"}:
        raise InvalidBundle("the manifest's origin is not {workspace, created_at}")
    _check_str(origin["workspace"], "the origin's workspace", 200, null=True)
    _check_str(origin["created_at"], "the origin's created_at", 40)


def _check_blobs(blobs: Any, limits: Limits) -> dict[str, int]:
    sizes: dict[str, int] = {}
    total = 0
    previous = ""
    for b in _check_list(blobs, "blobs", limits.ops_max):
        if type(b) is not dict or set(b) != {"sha256", "size"}:
            raise InvalidBundle("a blob is not {sha256, size}")
        digest, size = b["sha256"], b["size"]
        if not is_blob_name(digest) or digest <= previous:
            raise InvalidBundle("the blobs are not distinct sha256 names in ascending order")
        if type(size) is not int or not 0 <= size <= limits.blob_bytes_max:
            raise InvalidBundle(f"the blob {digest} declares {size!r} bytes: a size from 0 to "
                                f"{limits.blob_bytes_max}")
        total += size
        if total > limits.total_bytes_max:
            raise InvalidBundle(f"the blobs add up to more than {limits.total_bytes_max} bytes")
        sizes[digest] = size
        previous = digest
    return sizes


def _check_path(path: Any) -> str:
    why = path_problem(path)
    if why is not None:
        raise InvalidBundle(f"the bundle names a path that may not be imported: {why}",
                            path=path if isinstance(path, str) else None)
    assert isinstance(path, str)
    return path


def _check_fingerprint(fp: Any, path: str) -> None:
    if fp is None or fp == DIR_FINGERPRINT:
        return
    if isinstance(fp, str) and fp.startswith("symlink:"):
        fp = fp[len("symlink:"):]
    if not is_blob_name(fp):
        raise InvalidBundle(f"the base hash of {path!r} is not a fingerprint", path=path)


def link_problem(path: str, target: Any) -> str | None:
    """Why a link at ``path`` to ``target`` points out of the root (or into .git/,
    .agent-tx/), or is no target; None when it stays inside."""
    if type(target) is not str or not target or "\0" in target or len(target) > 4096:
        return f"the link {path!r} has no valid target"
    if target.startswith("/"):
        return f"the link {path!r} points to the absolute path {target!r}, out of the root"
    parts = path.split("/")[:-1]
    for part in target.split("/"):
        if part == "..":
            if not parts:
                return f"the link {path!r} points out of the root ({target!r})"
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    if parts and path_problem("/".join(parts)) is not None:
        return f"the link {path!r} points into .git/ or .agent-tx/ ({target!r})"
    return None


def _check_op(op: Any, sizes: dict[str, int], pres: dict[str, Any]) -> None:
    if type(op) is not dict or set(op) != _OP_KEYS:
        raise InvalidBundle(f"an op is not {{{', '.join(sorted(_OP_KEYS))}}}")
    path = _check_path(op["path"])
    kind, blob, size, mode = op["op"], op["blob"], op["size"], op["mode"]
    if kind not in OP_KINDS:
        raise InvalidBundle(f"{path!r} has the unknown operation {kind!r}", path=path)
    _check_str(op["via"], "an op's via", VIA_CHARS_MAX)
    if mode is not None and (type(mode) is not int or not 0 <= mode <= 0o777):
        raise InvalidBundle(f"{path!r} has the mode {mode!r} (permission bits only)", path=path)
    if type(size) is not int:
        raise InvalidBundle(f"the size of {path!r} is not an integer", path=path)
    if kind == "write":
        if type(blob) is not str or blob not in sizes or size != sizes[blob]:
            raise InvalidBundle(f"the write of {path!r} names a blob the bundle lacks, or "
                                "another size", path=path)
    elif blob is not None or size != 0:
        raise InvalidBundle(f"the {kind} of {path!r} carries content", path=path)
    if kind == "symlink":
        why = link_problem(path, op["target"])
        if why is not None:
            raise InvalidBundle(why, path=path)
    elif op["target"] is not None:
        raise InvalidBundle(f"the {kind} of {path!r} has a link target", path=path)
    _check_fingerprint(op["pre"], path)
    if pres.setdefault(path, op["pre"]) != op["pre"]:
        raise InvalidBundle(f"the ops on {path!r} disagree on its base hash", path=path)


def _check_savepoints(sps: Any, n_ops: int, n_reads: int, limits: Limits) -> None:
    last = (0, 0)
    names = set()
    for sp in _check_list(sps, "savepoints", limits.savepoints_max):
        if type(sp) is not dict or set(sp) != {"name", "ops", "reads"}:
            raise InvalidBundle("a savepoint is not {name, ops, reads}")
        _check_str(sp["name"], "a savepoint's name", NAME_CHARS_MAX)
        at = (sp["ops"], sp["reads"])
        if (type(at[0]) is not int or type(at[1]) is not int or not last[0] <= at[0] <= n_ops
                or not last[1] <= at[1] <= n_reads or sp["name"] in names):
            raise InvalidBundle(f"the savepoint {sp['name']!r} is out of order or repeated")
        names.add(sp["name"])
        last = at


def _check_check(chk: Any) -> None:
    keys = {"command", "options", "passed", "exit_code", "timed_out", "current"}
    if type(chk) is not dict or set(chk) != keys:
        raise InvalidBundle(f"a check is not {{{', '.join(sorted(keys))}}}")
    cmd = chk["command"]
    if not (type(cmd) is str or (type(cmd) is list and all(type(a) is str for a in cmd))):
        raise InvalidBundle("a check's command is not a string or a list of strings")
    if (type(chk["options"]) is not dict or type(chk["passed"]) is not bool
            or type(chk["timed_out"]) is not bool or type(chk["current"]) is not bool
            or not (chk["exit_code"] is None or type(chk["exit_code"]) is int)):
        raise InvalidBundle("a check's options, passed, exit_code, timed_out or current has "
                            "the wrong type")
