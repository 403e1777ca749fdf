"""Content-addressed blob store: ``objects/<first two hex>/<sha256>``; pre-images apart.

Staged content is written once, named by its SHA-256, read-only (0444), never hard-linked into
the tree. What exec captured is not even written once: the files the command wrote in the
staged view's upper layer are moved in (``put_moved``), since the view is dropped right after
(content already stored is left there). A blob is not synced when staged: prepare checks its
hash and syncs it (and its directory) before the decision record; every read checks the hash
too, so a blob damaged by a machine crash is found before it can reach the tree.

At apply, a blob that no other live transaction names is *moved* into the tree (renamed over
the target): its bytes were synced at prepare, so no copy and no new file is needed, and a
commit costs one file creation (the blob's, at staging), like the simplest durable write. A blob
still named elsewhere is copied instead. Moving races with a concurrent stager that found the
blob present and is about to name it: the mover decides under the log lock, after reading every
appended record, and a stager checks again *after* appending its record (``Pending.settle``) and
writes the blob anew if it was moved meanwhile. Garbage collection removes under the same rule.

Large blobs are read once. Staging hashes a large file while it writes it (from ``COPY_MIN`` on,
the kernel copies it while a second thread hashes the copy and the disk starts writing it: the
three overlap, so a large file is staged at about the speed of ``cp``) and marks the new blob
with the boot it was written in (an extended attribute, ``user.agent2pc.boot``). Prepare's check
of a blob's bytes against its name is there for a machine crash between staging and prepare: it
can leave a blob that was never synced with the right size and the wrong bytes. A blob written
in this boot cannot have been damaged so (the page cache holds what was written; a writeback
error since is reported by prepare's fsync, which discards the blob), so prepare syncs it
without reading it again, and takes the mark off before its fsync (the blob may be moved into
the tree). Any other blob (an older boot's, no mark, a file system without user extended
attributes) is hashed again.

Pre-images (what a commit replaced or deleted) are kept by hard link at apply time as
``preimages/<tid>.<k>``: zero-copy, named by transaction and position (a program outside any
transaction may have written into the file since prepare hashed it, so a hash name could lie).
"""

from __future__ import annotations

import errno
import itertools
import os

from ..core.confine import is_blob_name
from .durable import (
    COPY_UNSUPPORTED,
    FsyncFailed,
    copy_range,
    fsync_dir,
    fsync_fd,
    rename,
    start_writeback,
    sync_filesystems,
    write_all,
)
from .hashing import CHUNK, Follower, hasher, sha256_bytes, sha256_fd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_counter = itertools.count()

COPY_MIN = 4 << 20  # from this size on, a file is copied by the kernel and hashed beside it
COPY_CHUNK = 8 << 20  # bytes per copy_file_range, and per writeback started

FRESH_MIN = 1 << 20  # from this size on, a blob carries its boot (smaller: hashed again, cheap)
BOOT_XATTR = "user.agent2pc.boot"
_boot: list[bytes] = []


def boot_id() -> bytes:
    """This boot's id (b"" where the kernel does not tell it: then nothing is marked)."""
    if not _boot:
        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                _boot.append(f.read().strip())
        except OSError:
            _boot.append(b"")
    return _boot[0]


def _writable(fd: int, change) -> bool:  # type: ignore[no-untyped-def]
    """Run ``change(fd)`` on a read-only (0444) blob: an extended attribute needs write
    permission on the file even for its owner, so the file is made 0600 meanwhile."""
    try:
        os.fchmod(fd, 0o600)
        try:
            change(fd)
        finally:
            os.fchmod(fd, 0o444)
        return True
    except OSError:
        return False


def mark_written_now(fd: int) -> None:
    """Mark the blob open on ``fd`` as written in this boot (best effort: no mark, no skip)."""
    boot = boot_id()
    if boot:
        _writable(fd, lambda fd: os.setxattr(fd, BOOT_XATTR, boot))


def take_mark(fd: int) -> bool:
    """Was the blob open on ``fd`` written in this boot? Takes the mark off either way (the
    blob may be moved into the tree, where it has no business)."""
    try:
        mark = os.getxattr(fd, BOOT_XATTR)
    except OSError:
        return False
    _writable(fd, lambda fd: os.removexattr(fd, BOOT_XATTR))
    return bool(boot_id()) and mark == boot_id()


class BlobCorrupt(Exception):
    """A blob's bytes do not hash to its name (or it is missing)."""

    def __init__(self, digest: str, why: str) -> None:
        super().__init__(f"blob {digest[:12]} is {why}")
        self.digest = digest


def _copy_following(src: int, dst: int, follower: Follower, expected: int) -> tuple[int, bool]:
    """Copy ``src`` (from its position) to ``dst`` by copy_file_range, telling ``follower``
    and starting the writeback after each chunk: (bytes copied, whether that is all of it;
    False when the kernel cannot copy between these two files, or stopped short of the
    ``expected`` size, as some file systems' copy does: the caller streams the rest)."""
    size = 0
    while True:
        try:
            n = copy_range(src, dst, COPY_CHUNK)
        except OSError as exc:
            if exc.errno in COPY_UNSUPPORTED:
                return size, False
            raise
        if not n:
            return size, size >= expected
        start_writeback(dst, size, n)
        size += n
        follower.advance(size)


def _stream(src: int, dst: int, h: Any, follower: Follower | None, size: int) -> int:
    """Read ``src`` to its end and write it to ``dst`` (which holds ``size`` bytes already),
    hashing it into ``h`` or telling ``follower``; the writeback of a big stream is started
    every ``COPY_CHUNK``. The total size."""
    buf = bytearray(CHUNK)  # one buffer, read into again and again: no 1 MiB allocation (an
    view = memoryview(buf)  # mmap, page faults, an munmap) per chunk
    kicked = size
    while True:
        n = os.readv(src, [buf])
        if not n:
            return size
        chunk = view[:n]
        if h is not None:
            h.update(chunk)
        write_all(dst, chunk)
        size += n
        if follower is not None:
            follower.advance(size)
        if size - kicked >= COPY_CHUNK:
            start_writeback(dst, kicked, size - kicked)
            kicked = size


_token: list[tuple[int, str]] = []  # (pid, random suffix): drawn once per process, not per name


def _tmp_name() -> str:
    pid = os.getpid()
    if not _token or _token[0][0] != pid:  # first use, or a forked child
        _token[:] = [(pid, os.urandom(4).hex())]
    return f"{pid}-{next(_counter)}-{_token[0][1]}"


class Pending:
    """A blob just staged: call ``settle()`` once its stage record is appended."""

    __slots__ = ("store", "digest", "size", "_data", "_tmp", "_source")

    def __init__(self, store: BlobStore, digest: str, size: int, data: bytes | None = None,
                 tmp: str | None = None, source: str | None = None) -> None:
        self.store, self.digest, self.size = store, digest, size
        self._data, self._tmp = data, tmp
        self._source = source  # a file that holds the content until settle (put_moved)

    def settle(self) -> None:
        """Make sure the blob exists now that a record names it (it may have been moved away
        by a commit, or collected, between our check and our append)."""
        present = self.store.has(self.digest, self.size, likely=True)
        if self._tmp is not None:
            if present:
                os.unlink(self._tmp)
            else:
                rename(self._tmp, self.store.path(self.digest))
            self._tmp = None
        elif not present and self._source is not None:
            fd = os.open(self._source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                again = self.store.put_fd(fd)
            finally:
                os.close(fd)
            if again.digest != self.digest:
                again.discard()
                raise BlobCorrupt(self.digest, f"no longer what {self._source} holds")
            again.settle()
        elif not present:
            assert self._data is not None
            self.store.write(self._data, self.digest)
        self._data = self._source = None

    def discard(self) -> None:
        """The record was not appended: drop what only we were keeping."""
        if self._tmp is not None:
            try:
                os.unlink(self._tmp)
            except FileNotFoundError:
                pass
            self._tmp = None


class BlobStore:
    def __init__(self, objects_dir: str, preimages_dir: str) -> None:
        self.dir = objects_dir
        self.tmp_dir = os.path.join(objects_dir, "tmp")
        self.preimages = preimages_dir
        self._dev: int | None = None  # the store's file system (put_moved)

    def path(self, digest: str) -> str:
        """Where the blob ``digest`` lives. A name that is not 64 lowercase hex digits (a
        forged record's) is refused here, where it would become a path."""
        if not is_blob_name(digest):
            raise BlobCorrupt(str(digest), "not a blob name")
        return os.path.join(self.dir, digest[:2], digest)

    def has(self, digest: str, size: int, likely: bool = False) -> bool:
        """Is the blob there with the right size? (A crash can leave a short one behind.)
        ``likely``: the caller expects it there (one system call then, not two)."""
        path = self.path(digest)
        if not likely and not os.access(path, os.F_OK, effective_ids=True):  # new content's
            return False  # usual answer, with no exception raised and caught to get it
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        return st.st_size == size

    def write(self, data: bytes, digest: str) -> None:
        tmp = os.path.join(self.tmp_dir, _tmp_name())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        try:
            write_all(fd, data)
            if len(data) >= FRESH_MIN:
                mark_written_now(fd)
        finally:
            os.close(fd)
        rename(tmp, self.path(digest))

    def put_bytes(self, data: bytes) -> Pending:
        if len(data) >= COPY_MIN:
            return self._put_big_bytes(data)
        digest = sha256_bytes(data)
        if not self.has(digest, len(data)):
            self.write(data, digest)
        return Pending(self, digest, len(data), data=data)

    def _put_big_bytes(self, data: bytes) -> Pending:
        """``put_bytes`` of a large content: a second thread hashes it while this one writes
        it, its writeback started chunk by chunk (as ``put_fd``); the temp file is named as
        the blob once the hash is known (and dropped at settle if the blob was there)."""
        import hashlib
        import threading

        view = memoryview(data)
        h = hashlib.sha256()
        hashing = threading.Thread(target=h.update, args=(view,), name="agent2pc-hash",
                                   daemon=True)
        hashing.start()
        tmp = os.path.join(self.tmp_dir, _tmp_name())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
            try:
                for offset in range(0, len(view), COPY_CHUNK):
                    chunk = view[offset:offset + COPY_CHUNK]
                    write_all(fd, chunk)
                    start_writeback(fd, offset, len(chunk))
                mark_written_now(fd)
            finally:
                os.close(fd)
        except BaseException:
            hashing.join()
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        hashing.join()
        return self._link_in(tmp, str(h.hexdigest()), len(data))

    def put_fd(self, src: int) -> Pending:
        """Stream everything readable from ``src`` into a blob (pipes and files alike; the
        content is never held whole in memory). The temp file is kept, linked, until settle.

        A regular file from ``COPY_MIN`` on is copied by the kernel (copy_file_range), while
        a second thread hashes the copy behind it (hashing.Follower), and its writeback is
        started chunk by chunk, so that prepare's fsync finds it mostly written: the copy,
        the hash and the disk's writing overlap. Anything else (a pipe, a small file, two
        files the kernel cannot copy between) is read, hashed and written chunk by chunk."""
        import stat

        tmp = os.path.join(self.tmp_dir, _tmp_name())
        st = os.fstat(src)
        big = stat.S_ISREG(st.st_mode) and st.st_size >= COPY_MIN
        fd = os.open(tmp, (os.O_RDWR if big else os.O_WRONLY) | os.O_CREAT | os.O_EXCL
                     | os.O_CLOEXEC, 0o444)
        follower = Follower(fd) if big else None
        try:
            if follower is not None:
                expected = st.st_size - os.lseek(src, 0, os.SEEK_CUR)
                size, all_copied = _copy_following(src, fd, follower, expected)
                if not all_copied:
                    size = _stream(src, fd, None, follower, size)
                digest, hashed = follower.finish()
                follower = None
                assert hashed == size, (hashed, size)
            else:
                h = hasher(st.st_size if stat.S_ISREG(st.st_mode) else CHUNK)  # pipe: any size
                size = _stream(src, fd, h, None, 0)
                digest = str(h.hexdigest())
            if size >= FRESH_MIN:
                mark_written_now(fd)
        except BaseException:
            if follower is not None:
                follower.close()
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return self._link_in(tmp, digest, size)

    def _link_in(self, tmp: str, digest: str, size: int, absent: bool = False) -> Pending:
        """Name the temp file ``tmp`` as the blob ``digest`` unless that blob is there
        (``absent``: the caller just found it missing); the temp name stays until ``settle``."""
        if absent or not self.has(digest, size):
            path = self.path(digest)
            try:
                os.link(tmp, path)
            except FileExistsError:  # a short one left by a crash
                os.unlink(path)
                os.link(tmp, path)
        return Pending(self, digest, size, tmp=tmp)

    def put_moved(self, path: str, spare: str | None = None) -> Pending:
        """Stage the regular file at ``path`` by moving it into the store rather than copying
        it: for a file that its owner drops right after (a staged view's upper layer, which is
        closed once its changes are staged). No new file, no copy of its bytes: one read to
        hash it, one rename. A file that is not ours alone to take (another link to it, another
        owner or file system, extended attributes such as overlayfs's own) is copied, as
        ``put_fd`` does.

        Content already stored stays where it is, unless ``spare`` (``spare-<tid>-``) is given:
        then the file is kept as ``objects/tmp/<spare><digest>-<pid>.<n>``, a spare copy that the
        apply can rename into the tree where it would otherwise have to make a copy of the
        blob (the same content at many paths: participants/fs.py, ``spares``)."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not self._movable(fd, st):
                return self.put_fd(fd)
            digest, size = sha256_fd(fd, st.st_size)
            if self.has(digest, size):  # content staged before: nothing to move (an unlink
                if spare is None:       # here would free blocks), or kept as a spare copy
                    return Pending(self, digest, size, source=path)
                kept = os.path.join(self.tmp_dir,
                                    f"{spare}{digest}-{os.getpid()}.{next(_counter)}")
                os.fchmod(fd, 0o444)  # read-only in the store, as a blob (the apply sets
                rename(path, kept)    # the target's mode)
                return Pending(self, digest, size, source=kept)
            os.fchmod(fd, 0o444)
            if size >= FRESH_MIN:
                mark_written_now(fd)  # written in this boot, by the command
        finally:
            os.close(fd)
        tmp = os.path.join(self.tmp_dir, _tmp_name())
        rename(path, tmp)
        return self._link_in(tmp, digest, size, absent=True)

    def _movable(self, fd: int, st: os.stat_result) -> bool:
        import stat

        if not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid()):
            return False
        if self._dev is None:
            self._dev = os.stat(self.dir).st_dev
        if st.st_dev != self._dev:
            return False
        try:
            return not os.listxattr(fd)
        except OSError:
            return False

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

    def make_durable(self, digests: list[str], batch: bool = False) -> None:
        """Check each blob's bytes against its name (unless it was written in this boot, see
        above) and fsync it, then fsync each fan-out directory once: after this the blobs
        survive a machine crash under their names. ``batch`` (a big transaction,
        durable.batching): one syncfs of the objects' file system instead of those fsyncs.

        A failed fsync discards every one of them: their bytes may be gone from the disk while
        the page cache still shows them, and a later fsync would succeed without writing them
        (PostgreSQL's fsyncgate). Staging the content again writes it anew."""
        fans = set()
        top = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if batch else -1
        try:
            for digest in dict.fromkeys(digests):  # once each (one content at many paths)
                try:
                    fd = os.open(self.path(digest), os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    raise BlobCorrupt(digest, "missing") from None
                try:
                    size = os.fstat(fd).st_size
                    if not (size >= FRESH_MIN and take_mark(fd)) and \
                            sha256_fd(fd, size)[0] != digest:
                        raise BlobCorrupt(digest, "damaged (its bytes do not match its hash)")
                    if not batch:
                        fsync_fd(fd)
                finally:
                    os.close(fd)
                fans.add(digest[:2])
            if batch:
                if digests:
                    sync_filesystems([top])  # the blobs and their names, in one flush
            else:
                for fan in fans:
                    fsync_dir(os.path.join(self.dir, fan))
        except FsyncFailed:
            for digest in digests:
                self.discard(digest)
            raise
        finally:
            if top >= 0:
                os.close(top)

    def copy_to(self, digest: str, dst: int) -> int:
        """Write the blob into ``dst``, checking the hash as it streams; return the size."""
        try:
            src = os.open(self.path(digest), os.O_RDONLY | os.O_CLOEXEC)
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
        if not is_blob_name(digest):
            return
        try:
            os.unlink(self.path(digest))
        except FileNotFoundError:
            pass

    def keep_preimage(self, dir_fd: int, name: str, tid: str, k: int) -> None:
        """Hard-link the file ``name`` (in ``dir_fd``) as ``preimages/<tid>.<k>``: what stood at
        the transaction's k-th path when its apply replaced or deleted it.

        Best effort: a pre-image is a backup, never needed for recovery (the log is a redo
        log), so it is not synced. Where a link is impossible (another file system), none is
        kept.
        """
        try:
            os.link(name, os.path.join(self.preimages, f"{tid}.{k}"), src_dir_fd=dir_fd,
                    follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
