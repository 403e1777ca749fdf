"""SHA-256 of bytes and files, cheap to import.

hashlib's OpenSSL binding costs about 3 ms to import, a tenth of a CLI call's budget, while the
builtin ``_sha256`` costs 0.2 ms but hashes at ~140 MB/s against OpenSSL's ~1.1 GB/s. Small
inputs use the builtin; large ones import hashlib on first need.
"""

from __future__ import annotations

import _sha256  # type: ignore[import-not-found]
import os

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any

CHUNK = 1 << 20
BIG = 1 << 20  # from this size on, OpenSSL's speed pays for its import


def hasher(size_hint: int = 0) -> Any:
    if size_hint >= BIG:
        import hashlib

        return hashlib.sha256()
    return _sha256.sha256()


def sha256_bytes(data: bytes | memoryview) -> str:
    h = hasher(len(data))
    h.update(data)
    return str(h.hexdigest())


def sha256_fd(fd: int) -> tuple[str, int]:
    """Hash an open file from its start; return (hex digest, size)."""
    size = os.fstat(fd).st_size
    h = hasher(size)
    offset = 0
    while True:
        chunk = os.pread(fd, CHUNK, offset)
        if not chunk:
            break
        h.update(chunk)
        offset += len(chunk)
    return str(h.hexdigest()), offset


def link_fingerprint(target: str) -> str:
    """What a symbolic link to ``target`` is, as a staged op's ``pre`` and prepare compare it:
    ``symlink:`` and the sha256 of the target's bytes (core/states.py)."""
    return "symlink:" + sha256_bytes(os.fsencode(target))
