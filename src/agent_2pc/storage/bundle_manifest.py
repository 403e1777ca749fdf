"""The manifest of a bundle (``manifest.json``, docs/format.md "Bundles"): what a version-1
manifest holds, and the one check of it, which export runs on what it is about to write and
import on what it read, before anything is written. Pure.

Every field is required and typed; a field version 1 does not know is refused (a format that
adds one is a new version). Paths, link targets and sizes are checked here: a path that leaves
the root or reaches ``.git``/``.agent-tx``, a link that points out, a size past the limits.
"""

from __future__ import annotations

from ..core.confine import TID_RE, is_blob_name, path_problem
from ..core.states import DIR_FINGERPRINT, OP_KINDS
from ..errors import InvalidBundle

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FORMAT = "agent-2pc-bundle"
VERSION = 1


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
