"""Content-addressed blob store: ``objects/<first two hex>/<sha256>``; pre-images apart.

Staged content is written once, named by its SHA-256, and never changed (blobs are read-only
files and are never hard-linked anywhere, so no other program can write into one). A blob is
not fsynced when staged: durability is bought at prepare, where the content is copied into a
synced temp file before the decision record (docs/design.md, "Where the fsyncs are"). Every read
checks the hash, so a blob damaged by a machine crash is found before it can reach the tree.

Pre-images (what a commit replaced or deleted) are kept by hard link at apply time in
``preimages/<tid>/<k>``: zero-copy, and apart from ``objects/`` because such a link shares its
inode with the user's file until the rename over it. Were it deduplicated against staged content,
a program writing into that file in that instant could change staged bytes.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat

from .durable import write_all
from .hashing import CHUNK, hasher, sha256_bytes

_counter = itertools.count()


class BlobCorrupt(Exception):
    """A blob's bytes do not hash to its name (or it is missing)."""

    def __init__(self, digest: str, why: str) -> None:
        super().__init__(f"blob {digest[:12]} is {why}")
        self.digest = digest


def _tmp_name() -> str:
    return f"{os.getpid()}-{next(_counter)}-{os.urandom(4).hex()}"


class BlobStore:
    def __init__(self, objects_dir: str, preimages_dir: str) -> None:
        self.dir = objects_dir
        self.tmp_dir = os.path.join(objects_dir, "tmp")
        self.preimages = preimages_dir

    def path(self, digest: str) -> str:
        return os.path.join(self.dir, digest[:2], digest)

    def _has(self, digest: str, size: int) -> bool:
        """Is the blob there with the right size? (A crash can leave a short one behind.)"""
        try:
            st = os.stat(self.path(digest))
        except FileNotFoundError:
            return False
        return st.st_size == size

    def _touch(self, digest: str) -> None:
        """Refresh a reused blob's ctime, so garbage collection's grace period starts again."""
        try:
            os.chmod(self.path(digest), 0o444)
        except FileNotFoundError:
            pass

    def _install(self, tmp: str, digest: str) -> None:
        os.chmod(tmp, 0o444)
        os.rename(tmp, self.path(digest))

    def put_bytes(self, data: bytes) -> str:
        digest = sha256_bytes(data)
        if self._has(digest, len(data)):
            self._touch(digest)
            return digest
        tmp = os.path.join(self.tmp_dir, _tmp_name())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        self._install(tmp, digest)
        return digest

    def put_fd(self, src: int) -> tuple[str, int]:
        """Stream everything readable from ``src`` into a blob; return (digest, size).

        Works for pipes (stdin) and files alike; content is never held whole in memory.
        """
        tmp = os.path.join(self.tmp_dir, _tmp_name())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        st = os.fstat(src)
        h = hasher(st.st_size if stat.S_ISREG(st.st_mode) else CHUNK)  # a pipe: size unknown
        size = 0
        try:
            while True:
                chunk = os.read(src, CHUNK)
                if not chunk:
                    break
                h.update(chunk)
                write_all(fd, chunk)
                size += len(chunk)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        digest = str(h.hexdigest())
        if self._has(digest, size):
            os.unlink(tmp)
            self._touch(digest)
        else:
            self._install(tmp, digest)
        return digest, size

    def read(self, digest: str) -> bytes:
        """The blob's bytes, checked against its name."""
        try:
            with open(self.path(digest), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise BlobCorrupt(digest, "missing") from None
        if sha256_bytes(data) != digest:
            raise BlobCorrupt(digest, "damaged (its bytes do not match its hash)")
        return data

    def copy_to(self, digest: str, dst: int) -> int:
        """Write the blob into ``dst``, checking the hash as it streams; return the size."""
        try:
            src = os.open(self.path(digest), os.O_RDONLY)
        except FileNotFoundError:
            raise BlobCorrupt(digest, "missing") from None
        try:
            h = hasher(os.fstat(src).st_size)
            size = 0
            while True:
                chunk = os.read(src, CHUNK)
                if not chunk:
                    break
                h.update(chunk)
                write_all(dst, chunk)
                size += len(chunk)
        finally:
            os.close(src)
        if h.hexdigest() != digest:
            raise BlobCorrupt(digest, "damaged (its bytes do not match its hash)")
        return size

    def discard(self, digest: str) -> None:
        """Drop a damaged blob so that the next stage of that content writes it afresh."""
        try:
            os.unlink(self.path(digest))
        except FileNotFoundError:
            pass

    def keep_preimage(self, dir_fd: int, name: str, tid: str, k: int) -> None:
        """Hard-link the file ``name`` (in ``dir_fd``) as ``preimages/<tid>/<k>``: what stood at
        the transaction's k-th path when its apply replaced or deleted it.

        Best effort: a pre-image is a backup, never needed for recovery (the log is a redo
        log), so it is not synced. Where a link is impossible (another file system), none is
        kept. It is named by transaction and position, not by hash: a program outside any
        transaction may have written into the file since prepare hashed it.
        """
        directory = os.path.join(self.preimages, tid)
        try:
            os.mkdir(directory)
        except FileExistsError:
            pass
        try:
            os.link(name, os.path.join(directory, str(k)), src_dir_fd=dir_fd,
                    follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
