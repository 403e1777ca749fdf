"""Kept captures: what a failed terminal session changed, set aside for the user to stage.

An ``exec`` that fails stages nothing (the contract). On a terminal, that would throw away a
whole interactive session because its last command failed, or because the terminal closed:
so when a session on a pseudo-terminal fails, is interrupted or times out after changing
files, its capture is *kept* instead, in the transaction's scratch directory, and the answer
says how many changes were kept and how to stage them (``agent-2pc stage-kept --tid T``).

    .agent-tx/tx/<tid>/kept/
      capture.json     {version, command, exit_code, timed_out, fingerprint, changes, skipped}
      files/<n>        the content of the n-th change when it is a write

Each change holds what the transaction had staged at its path when the session began
(``was``: [op, blob, mode, target] or null); ``stage-kept`` refuses (``bad_state``) when any
of them was staged differently since, since the session never saw that. Only the last kept
capture of a transaction is kept; it goes with the transaction's scratch when the transaction
ends. Content is hard-linked from the view's upper directory where it can be (same file
system), else copied.
"""

from __future__ import annotations

import json
import os
import shutil

from ..errors import BadState, NotFound
from ..isolation import Change
from ..isolation._remove import discard

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..core.states import Op, Tx
    from ..isolation import Capture

VERSION = 1
DIRNAME = "kept"
MANIFEST = "capture.json"
MANIFEST_BYTES_MAX = 256 << 20


def _was(op: Op | None) -> list[Any] | None:
    return None if op is None else [op.op, op.blob, op.mode, op.target]


def keep(tx_dir: str, trash: str, tx: Tx, fingerprint: str, cap: Capture,
         run: dict[str, Any]) -> dict[str, Any] | None:
    """Set ``cap`` aside in ``tx_dir``/kept (replacing an earlier one); return what the
    answer says about it, or None when the session changed nothing."""
    if not cap.changes:
        return None
    os.makedirs(tx_dir, exist_ok=True)
    tmp = os.path.join(tx_dir, f"{DIRNAME}-new-{os.getpid()}-{os.urandom(4).hex()}")
    os.makedirs(os.path.join(tmp, "files"))
    rows = []
    for n, c in enumerate(cap.changes):
        row: dict[str, Any] = {"path": c.path, "op": c.op, "mode": c.mode, "target": c.target,
                               "size": c.size, "was": _was(tx.staged(c.path)), "file": None}
        if c.op == "write":
            assert c.source is not None
            row["file"] = f"files/{n}"
            dest = os.path.join(tmp, row["file"])
            try:
                os.link(c.source, dest)
            except OSError:  # another file system (the copy tier), or no links here
                shutil.copyfile(c.source, dest, follow_symlinks=False)
        rows.append(row)
    manifest = {"version": VERSION, "command": run["command"], "exit_code": run["exit_code"],
                "timed_out": run["timed_out"], "fingerprint": fingerprint, "changes": rows,
                "skipped": [dict(s) for s in cap.skipped]}
    with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    final = os.path.join(tx_dir, DIRNAME)
    if os.path.lexists(final):
        discard(final, trash)
    os.rename(tmp, final)
    return summary(manifest)


def summary(manifest: dict[str, Any]) -> dict[str, Any]:
    return {"changes": len(manifest["changes"]),
            "paths": [c["path"] for c in manifest["changes"]][:20],
            "exit_code": manifest["exit_code"], "timed_out": manifest["timed_out"]}


def load(tx_dir: str, tid: str) -> tuple[dict[str, Any], list[Change]]:
    """The kept capture of ``tid``: (manifest, changes whose sources are the kept files)."""
    base = os.path.join(tx_dir, DIRNAME)
    try:
        with open(os.path.join(base, MANIFEST), encoding="utf-8") as f:
            manifest = json.loads(f.read(MANIFEST_BYTES_MAX))
    except FileNotFoundError:
        raise NotFound(f"{tid} has no kept capture (a failed terminal session of exec keeps "
                       "one)", tid=tid) from None
    if manifest.get("version") != VERSION:
        raise BadState(f"the kept capture of {tid} has an unknown format", tid=tid)
    changes = [Change(row["path"], row["op"], mode=row["mode"], target=row["target"],
                      size=row["size"],
                      source=None if row["file"] is None else os.path.join(base, row["file"]))
               for row in manifest["changes"]]
    return manifest, changes


def check_fits(manifest: dict[str, Any], tx: Tx, fingerprint: str) -> None:
    """Refuse when the transaction staged a path of the capture differently since."""
    if manifest["fingerprint"] == fingerprint:
        return
    for row in manifest["changes"]:
        if _was(tx.staged(row["path"])) != row["was"]:
            raise BadState(f"{row['path']} was staged again since the session that changed "
                           "it: its kept change would overwrite that; stage it by hand "
                           f"(the kept files are in {os.path.join(DIRNAME, 'files')})",
                           tid=tx.tid, path=row["path"])


def drop(tx_dir: str, trash: str) -> None:
    base = os.path.join(tx_dir, DIRNAME)
    if os.path.lexists(base):
        discard(base, trash)
