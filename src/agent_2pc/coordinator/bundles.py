"""Bundles: a live transaction exported to one file (``.a2pc``) and imported into another
workspace as a transaction of its own, ready to diff, check and commit (docs/collaboration.md;
the bytes: storage/bundle_format.py and docs/format.md, "Bundles").

A bundle carries what staging logged: every op in order (path, kind, content, mode, link
target, and ``pre``: the fingerprint of what stood at the path when it was first staged), the
reads, the savepoints, the label and origin, and a report of the checks. Import writes the
same records through the journal, in one append, so the imported transaction has the same
bases as one staged here: its commit onto a tree that moved since is a ``conflict``, never a
silent overwrite. The checks are carried as a report and not as checks of the new
transaction: a bundle is data, and its commit never runs a command the bundle names (the
reviewer runs the checks they want with stage-cmd).

Import verifies the whole bundle (every hash, the seal, every path and size) before it writes
anything; then it stores the blobs and appends the records, in one append. Importing a bundle
whose transaction is still live here answers that transaction again (``again: true``), unless
a torn append (a crash in mid-write) left only a prefix of its records: that one is aborted
and the bundle imported anew.
"""

from __future__ import annotations

import os
import stat

from .. import crashpoints
from ..core import records as log_records
from ..core.states import ACTIVE, FINISHED, Tx, iso_ms
from ..errors import InvalidBundle, IoFailed, Tampered, UsageError
from ..storage import bundle_format as fmt
from ..storage import bundle_manifest as man
from ..storage import durable
from ..storage.hashing import hasher
from .paths import resolve

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import IO, Any

    from ..storage.blobs import Pending
    from .engine import Engine


# -- export ------------------------------------------------------------------------------------

def manifest_of(engine: Engine, tx: Tx) -> dict[str, Any]:
    """The manifest of ``tx`` (active, its lock held). The same transaction gives the same
    manifest: nothing in it depends on when or where it is exported."""
    from .runs import fingerprint

    # A begin --git-branch binding is the exporter's own (which branch it watched): it stays.
    if any(eff.get("kind") != "git-branch" for eff in tx.effects):
        raise UsageError(f"{tx.tid} has staged effects (HTTP calls, SQL, a git commit), which "
                         "a bundle does not carry; export a transaction of file changes")
    sizes = {op.blob: op.size for op in tx.ops if op.blob is not None}
    current = fingerprint(tx) if tx.checks else ""
    manifest = {
        "format": man.FORMAT, "version": man.VERSION, "tid": tx.tid, "label": tx.label,
        "origin": {"workspace": _workspace_id(engine), "created_at": iso_ms(tx.created_ms)},
        "ops": [{"path": op.path, "op": op.op, "via": op.via, "blob": op.blob,
                 "size": op.size, "mode": op.mode, "pre": op.pre, "target": op.target}
                for op in tx.ops],
        "reads": [{"path": p, "sha256": h} for p, h in tx.reads],
        "savepoints": [{"name": name, "ops": n_ops, "reads": n_reads}
                       for name, n_ops, n_reads, _ in tx.savepoints],
        "checks": [{"command": c.get("command", ""), "options": c.get("options", {}),
                    "passed": bool(c.get("passed")), "exit_code": c.get("exit_code"),
                    "timed_out": bool(c.get("timed_out")),
                    "current": c.get("fingerprint") == current} for c in tx.checks.values()],
        "blobs": [{"sha256": d, "size": sizes[d]} for d in sorted(sizes)],
    }
    try:
        man.check_manifest(manifest)
    except InvalidBundle as exc:
        raise InvalidBundle(f"{tx.tid} cannot be exported: {exc.message}", **exc.details
                            ) from None
    return manifest


def _workspace_id(engine: Engine) -> str | None:
    """The workspace's id (the log header's), to tell where a bundle came from."""
    from ..storage.wal_format import read_log_header

    try:
        with open(engine.layout.wal, "rb") as f:
            return read_log_header(f.read(4096))[0]
    except OSError:
        return None


def export(engine: Engine, tid: str, path: str) -> dict[str, Any]:
    """Write ``tid`` (active) to the bundle file ``path``, atomically: a temp file in the same
    directory, synced, renamed over ``path``; a failure (a full disk) leaves no bundle under
    that name. ``{tid, path, bytes, sha256}``."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise UsageError("`path` must name the bundle file to write", params=("path",))
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise UsageError(f"{path} is a directory; give the bundle file's name",
                         params=("path",))
    if not os.path.isdir(os.path.dirname(target)):
        raise UsageError(f"there is no directory {os.path.dirname(target)} to write {path} in",
                         params=("path",))
    with engine.active(tid) as tx:
        manifest = manifest_of(engine, tx)
        size, digest = _write_file(target, manifest, lambda d: _blob(engine, tx, d))
    return {"tid": tid, "path": target, "bytes": size, "sha256": digest}


def _chunks(manifest: dict[str, Any], read_blob: Any) -> Iterator[bytes]:
    """The bundle's bytes, a member (or a MiB) at a time."""
    buf = bytearray()
    writer = fmt.Writer(buf.extend)
    writer.member(fmt.MANIFEST, fmt.canonical(manifest))
    for entry in manifest["blobs"]:
        if len(buf) >= fmt.CHUNK:
            yield bytes(buf)
            buf.clear()
        writer.member("blobs/" + entry["sha256"], read_blob(entry["sha256"]))
    writer.close()
    yield bytes(buf)


def _write_file(target: str, manifest: dict[str, Any], read_blob: Any) -> tuple[int, str]:
    directory = os.path.dirname(target)
    tmp = os.path.join(directory, f".{os.path.basename(target)}.tmp-{os.getpid()}-"
                                  f"{os.urandom(4).hex()}")
    h = hasher(fmt.CHUNK)
    size = 0
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise IoFailed.from_os_error(exc) from None
    try:
        try:
            for chunk in _chunks(manifest, read_blob):
                durable.write_all(fd, chunk)
                h.update(chunk)
                size += len(chunk)
            durable.fsync_fd(fd)
        finally:
            os.close(fd)
        crashpoints.hit("export.before_rename")
        durable.rename(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise IoFailed.from_os_error(exc) from None
        raise
    try:
        durable.fsync_dir(directory)
    except OSError as exc:
        raise IoFailed.from_os_error(exc) from None
    return size, str(h.hexdigest())


def _blob(engine: Engine, tx: Tx, digest: str) -> bytes:
    from ..storage.blobs import BlobCorrupt

    try:
        return engine.blobs.read(digest)
    except BlobCorrupt as exc:
        path = next(op.path for op in tx.ops if op.blob == digest)
        raise UsageError(f"the staged content of {path} is damaged ({exc}); stage it again "
                         "before exporting", path=path) from None


# -- import ------------------------------------------------------------------------------------

def _open_bundle(path: str) -> tuple[IO[bytes], int]:
    if not isinstance(path, str) or not path or "\0" in path:
        raise UsageError("`path` must name a bundle file (.a2pc)", params=("path",))
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed by the caller)
    except FileNotFoundError:
        raise UsageError(f"no bundle file {path}", params=("path",)) from None
    except OSError as exc:
        raise UsageError(f"cannot read the bundle {path}: {exc.strerror}",
                         params=("path",)) from None
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise UsageError(f"{path} is not a regular file", params=("path",))
    return f, st.st_size


class _Hashing:
    """A file object that hashes what is read through it (the bundle's sha256)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.h = hasher(fmt.CHUNK)

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data


def verify(path: str, limits: man.Limits = man.LIMITS) -> tuple[dict[str, Any], str]:
    """Read the bundle at ``path`` whole and check every byte of it: (manifest, the file's
    sha256). InvalidBundle or Tampered; nothing is written."""
    f, size = _open_bundle(path)
    with f:
        hashing = _Hashing(f)
        manifest = fmt.read_all(hashing, size, limits)  # type: ignore[arg-type]
        return manifest, str(hashing.h.hexdigest())


def import_bundle(engine: Engine, path: str, label: str | None = None,
                  limits: man.Limits = man.LIMITS) -> dict[str, Any]:
    """Register the bundle at ``path`` as a new active transaction of this workspace.
    ``{tid, files, again, origin, checks}``."""
    if label is not None and (not isinstance(label, str) or len(label) > man.LABEL_CHARS_MAX):
        raise UsageError(f"`label` must be a string of at most {man.LABEL_CHARS_MAX} "
                         "characters", params=("label",))
    manifest, digest = verify(path, limits)
    engine.journal.refresh()
    live = _imported(engine, manifest, digest)
    if live is not None:
        return _answer(live, manifest, again=True)
    _check_paths(engine.root, manifest)
    origin = {"tid": manifest["tid"], "bundle": digest, **manifest["origin"]}
    pending: list[Pending] = []
    try:
        _store_blobs(engine, path, digest, limits, pending)
        recs = _records(engine, manifest, label if label is not None else manifest["label"],
                        origin)
        crashpoints.hit("import.after_blobs")
        # One import of a bundle at a time: one racing this one is answered with ours.
        with engine.journal.commit_lock:
            engine.journal.refresh()
            live = _imported(engine, manifest, digest)
            if live is None:
                engine.journal.append(recs)
    except BaseException:
        for blob in pending:
            blob.discard()
        raise
    for blob in pending:
        blob.settle()
    if live is not None:
        return _answer(live, manifest, again=True)
    return _answer(engine.txs[recs[0]["tid"]], manifest, again=False)


def _imported(engine: Engine, manifest: dict[str, Any], digest: str) -> Tx | None:
    """The live transaction an import of this bundle made, if any. One that holds only a
    prefix of its records (a torn append: a crash in mid-write; it never answered anyone) is
    aborted here, and the bundle is imported anew."""
    for tx in list(engine.txs.values()):
        if tx.state in FINISHED or (tx.origin or {}).get("bundle") != digest:
            continue
        if len(tx.frames) >= _records_of(manifest):
            return tx
        engine.abort(tx.tid, "an import of this bundle was cut short; imported again")
    return None


def _records_of(m: dict[str, Any]) -> int:
    """How many records an import of ``m`` appends (begin, ops, reads, savepoints)."""
    return 1 + len(m["ops"]) + len(m["reads"]) + len(m["savepoints"])


def _check_paths(root: str, manifest: dict[str, Any]) -> None:
    """Every path of the bundle is a path of this tree: not reached through a link."""
    seen: set[str] = set()
    for row in manifest["ops"] + manifest["reads"]:
        p = row["path"]
        if p in seen:
            continue
        seen.add(p)
        if resolve(root, p) != p:
            raise InvalidBundle(f"{p!r} is reached through a symbolic link in this workspace; "
                                "the bundle cannot be imported here", path=p)


def _store_blobs(engine: Engine, path: str, digest: str, limits: man.Limits,
                 pending: list[Pending]) -> None:
    """Read the bundle again and store its blobs; it must be the file just verified."""
    def take(name: str, data: bytes) -> None:
        blob = engine.blobs.put_bytes(data)
        pending.append(blob)
        if blob.digest != name:
            raise Tampered(f"the bundle {path} changed while it was imported", what=name)

    f, size = _open_bundle(path)
    with f:
        hashing = _Hashing(f)
        fmt.read_all(hashing, size, limits, take)  # type: ignore[arg-type]
    if hashing.h.hexdigest() != digest:
        raise Tampered(f"the bundle {path} changed while it was imported", what="file")


def _records(engine: Engine, m: dict[str, Any], label: str | None,
             origin: dict[str, Any]) -> list[Any]:
    """The records of the imported transaction: begin, then the ops and reads in their order
    with each savepoint where it stood (so rollback-to works as it did)."""
    from .journal import tid_of_new_transaction
    from .twophase import DEFAULT_TIMEOUT_MS

    tid = tid_of_new_transaction(engine.txs)
    recs: list[Any] = [log_records.begin(tid, label=label, timeout_ms=DEFAULT_TIMEOUT_MS,
                                         boot=engine.journal.boot, pid=os.getpid(),
                                         origin=origin)]
    ops, reads = m["ops"], m["reads"]
    n_ops = n_reads = 0
    for sp in m["savepoints"] + [{"name": None, "ops": len(ops), "reads": len(reads)}]:
        for op in ops[n_ops:sp["ops"]]:
            recs.append(log_records.stage(tid, path=op["path"], op=op["op"], via=op["via"],
                                          blob=op["blob"], size=op["size"], mode=op["mode"],
                                          pre=op["pre"], target=op["target"]))
        for rd in reads[n_reads:sp["reads"]]:
            recs.append(log_records.read(tid, path=rd["path"], sha256=rd["sha256"]))
        n_ops, n_reads = sp["ops"], sp["reads"]
        if sp["name"] is not None:
            recs.append(log_records.savepoint(tid, name=sp["name"]))
    return recs


def _answer(tx: Tx, m: dict[str, Any], again: bool) -> dict[str, Any]:
    assert tx.state == ACTIVE or again
    return {"tid": tx.tid, "files": [op.path for op in tx.changes()], "again": again,
            "origin": tx.origin,
            "checks": [{"command": c["command"], "passed": c["passed"],
                        "exit_code": c["exit_code"], "current": c["current"]}
                       for c in m["checks"]]}
