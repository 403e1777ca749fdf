"""Injected I/O failures: ``AGENT2PC_FAULT_AT=SITE[:N][=ERRNO]`` makes the N-th (default the
first) pass of SITE fail with ERRNO (default EIO; ENOSPC, EDQUOT, EROFS... by name).

A site is where the storage layer asks the kernel to write, sync (fsync, syncfs) or rename: the
function that called the one durable helper (storage/durable.py), and which helper, e.g.
``log.append:fsync`` (the log's fsync after an append) or ``fs._put:rename``. Sites are named
from the caller's frame when a fault is armed, so call sites need no names; ``SITES`` lists
them all, and an unlisted one fails an assertion the day it is added
(tests/test_fsync_failures.py is parametrised over the list, like the crash tests over
crashpoints.POINTS).

A failed write writes half of its bytes first (a disk that fills up mid-write); a failed fsync
or rename does nothing. ``AGENT2PC_FAULT_AT=record:FILE`` fails nothing and appends every site
passed to FILE (one per line): that is how the tests learn which step reaches which site.

Armed only through the environment, read once: an unarmed process pays one test of a module
global per durable call.
"""

from __future__ import annotations

import errno as _errno
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

SITES: dict[str, str] = {
    "workspace.init:write": "init writes FORMAT (temp file)",
    "workspace.init:fsync": "init syncs FORMAT",
    "workspace.init:rename": "init renames FORMAT into place",
    "workspace.init:fsync_dir": "init syncs the new directories",
    "log.append:write": "an append to the log (begin, stage, prepare, decision, end ...)",
    "log.append:fsync": "the fsync after an append that must be durable (a commit decision, "
                        "an API call's sending record)",
    "log.sync:fsync": "the log synced before prepare places content on another file system",
    "log.set_aside:write": "a torn tail copied aside before it is cut",
    "log._truncate:fsync": "the log synced after a torn tail is cut",
    "log.replace:write": "compaction writes the new log",
    "log.replace:fsync": "compaction syncs the new log",
    "log.replace:rename": "compaction renames the new log over the old one",
    "log.replace:fsync_dir": "compaction syncs .agent-tx/ after the rename",
    "history.append:write": "compaction appends finished transactions to history.jsonl",
    "history.append:fsync": "compaction syncs history.jsonl (also after cutting a torn line)",
    "history._write_head:write": "compaction writes history.head (temp file)",
    "history._write_head:rename": "compaction renames history.head into place",
    "journal.move_finished_to_history:fsync_dir": "compaction syncs preimages/ before the "
                                                 "history names them (undo)",
    "blobs.write:write": "staging writes a blob (temp file)",
    "blobs.write:rename": "staging renames a blob into objects/",
    "blobs._stream:write": "staging streams a blob (from a small file, stdin, exec's "
                           "capture)",
    "blobs._copy_following:write": "staging copies a large file into a blob "
                                   "(copy_file_range)",
    "blobs._put_big_bytes:write": "staging writes a large content given as bytes (an edit "
                                  "of a large file, the library's stage_write)",
    "blobs.put_moved:rename": "exec's capture moves a file of the staged view into the "
                              "blob store (or keeps it as a spare copy)",
    "blobs.copy_to:write": "a blob copied (a copy to rename over a target; content placed "
                           "on another file system)",
    "blobs.make_durable:fsync": "prepare syncs a blob too big for the decision",
    "blobs.make_durable:fsync_dir": "prepare syncs a blob's fan-out directory",
    "blobs.make_durable:syncfs": "prepare of a big transaction syncs the blobs' file system "
                                 "once instead of each blob (durable.batching)",
    "fs._make_claim:write": "a small file's content written from the decision (a redo)",
    "fs._make_claim:fsync": "a copy synced before it is renamed over a target",
    "fs._make_claim:rename": "a copy renamed from its .part name",
    "fs._place:fsync": "prepare syncs content placed on another file system, then its "
                       "directory",
    "fs._put:fsync": "the apply syncs a file's content or mode before its rename",
    "fs._put:rename": "the apply renames a file, a link or placed content over a target",
    "fs._apply_in:fsync": "the apply syncs every directory it touched",
    "fs._apply_in:syncfs": "the apply of a big transaction syncs the file systems of the "
                           "directories it touched once, before the end record",
    "fs._renames:syncfs": "the apply of a big transaction syncs what it wrote (copies, small "
                          "files' blobs, modes, new directories) once, before its renames",
    "fs._renames:rename": "the apply of a big transaction renames a file into the tree, "
                          "after that syncfs",
    "fs._take_spare:rename": "the apply of a big transaction takes a spare copy that exec's "
                             "capture kept (the same content at many paths) as the copy to "
                             "rename over a target",
    "fs._ensure_mode:fsync": "a mode set on a file already in place (a redo), synced",
    "fs._sync_made_dirs:fsync": "the apply syncs the directories it made before a big file's "
                                "blob leaves objects/",
    "bundles._write_file:write": "export writes a bundle (a temp file beside -o)",
    "bundles._write_file:fsync": "export syncs the bundle",
    "bundles._write_file:rename": "export renames the bundle to its name",
    "bundles._write_file:fsync_dir": "export syncs the bundle's directory",
    "workspace._log_id:write": "trust gives a log without a header one (a new file)",
    "workspace._log_id:fsync": "... syncs it",
    "workspace._log_id:rename": "... renames it over the log",
    "workspace._log_id:fsync_dir": "... and syncs .agent-tx/",
    "_sqlite.sync:fsync": "the fence's SQLite store syncs its WAL after deferred commits",
    "_sqlite.sync:fsync_dir": "... and the directory of a new WAL",
}

_ERRNOS = {"EIO": _errno.EIO, "ENOSPC": _errno.ENOSPC, "EDQUOT": _errno.EDQUOT,
           "EROFS": _errno.EROFS}
_SPEC = os.environ.get("AGENT2PC_FAULT_AT", "")
ARMED = bool(_SPEC)
_passes: dict[str, int] = {}
_HERE = (os.path.join("storage", "durable.py"), os.sep + "faults.py")


def arm(spec: str) -> None:
    """Arm (or disarm, with "") as AGENT2PC_FAULT_AT does at import: for a child forked from
    a process that imported agent-2pc already (the tests' fork server)."""
    global _SPEC, ARMED
    _SPEC, ARMED = spec, bool(spec)
    _passes.clear()


def _site(kind: str) -> str:
    """``module.function:kind`` of the first caller outside durable.py (lambdas skipped)."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.endswith(_HERE)
                                 or frame.f_code.co_name == "<lambda>"):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return f"?:{kind}"
    module = frame.f_globals.get("__name__", "?").rpartition(".")[2]
    return f"{module}.{frame.f_code.co_name}:{kind}"


def hit(kind: str, partial: Callable[[], object] | None = None) -> None:
    """Pass a site of ``kind`` (write, fsync, fsync_dir, syncfs, rename); raise OSError when
    the armed spec names it and this is the pass it names. ``partial`` runs first (half a write)."""
    site = _site(kind)
    if _SPEC.startswith("record:"):
        with open(_SPEC[len("record:"):], "a", encoding="utf-8") as f:
            f.write(site + "\n")
        return
    assert site in SITES, f"unregistered fault site {site}: add it to faults.SITES"
    name, _, err = _SPEC.partition("=")
    head, _, n = name.rpartition(":")  # sites hold a colon: SITE or SITE:N
    if n.isdigit():
        name = head
    else:
        n = ""
    if name != site:
        return
    _passes[site] = _passes.get(site, 0) + 1
    if _passes[site] != (int(n) if n else 1):
        return
    code = _ERRNOS.get(err or "EIO")
    if code is None:
        raise ValueError(f"AGENT2PC_FAULT_AT: unknown errno {err!r} (one of {sorted(_ERRNOS)})")
    if partial is not None:
        partial()
    raise OSError(code, f"{os.strerror(code)} (injected at {site})")
