"""Forged workspaces, as an attacker writes them: log frames built by hand from the format in
docs/format.md (not with agent-2pc's own encoder), and a git repository that ships them.

    frame(record) -> bytes                      one log frame
    forged_commit(ops, tid=..., decision=...)   the records of a transaction decided commit
                                                and never applied: begin, stage..., prepare,
                                                decision (small files inline, as prepare
                                                writes them)
    write_forged_workspace(repo, records)       a .agent-tx/ holding those records, with what
                                                git needs to carry it (no empty directories)
    forged_clone(base)                          base/victim/clone: a clone of base/upstream, a
                                                repository that commits such a .agent-tx/ (a
                                                decided commit of ../OUTSIDE.txt and
                                                .git/hooks/post-merge, mode 0755)
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import subprocess
import zlib
from typing import Any

TID = "tx-20260101-000000-abcdef"
PAYLOAD = b"#!/bin/sh\necho pwned > /tmp/agent-2pc-pwned\n"


def frame(record: dict[str, Any]) -> bytes:
    payload = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
    return struct.pack("<4sBII", b"A2PC", 1, len(payload), zlib.crc32(payload)) + payload


def stage(path: str, content: bytes = PAYLOAD, *, tid: str = TID, mode: int = 0o755,
          **extra: Any) -> dict[str, Any]:
    rec = {"type": "stage", "tid": tid, "ts": 1, "path": path, "op": "write", "via": "write",
           "blob": hashlib.sha256(content).hexdigest(), "size": len(content), "mode": mode,
           "pre": None}
    rec.update(extra)
    return rec


def forged_commit(stages: list[dict[str, Any]], *, tid: str = TID,
                  decision: dict[str, Any] | None = None,
                  contents: dict[str, bytes] | None = None) -> list[dict[str, Any]]:
    """begin, the stage records, prepare, and a commit decision carrying each written file's
    mode and (from ``contents``, path -> bytes; PAYLOAD by default) its content inline."""
    for rec in stages:
        rec["tid"] = tid
    order = sorted(stages, key=lambda r: r["path"])
    fields: dict[str, Any] = {"modes": {}, "inline": {}}
    for k, rec in enumerate(order):
        if rec["op"] == "write":
            data = (contents or {}).get(rec["path"], PAYLOAD)
            fields["modes"][str(k)] = rec["mode"]
            fields["inline"][str(k)] = base64.b64encode(data).decode()
    fields.update(decision or {})
    return ([{"type": "begin", "tid": tid, "ts": 1, "label": "innocent", "timeout_ms": None,
              "boot": None, "pid": 1}]
            + stages
            + [{"type": "prepare", "tid": tid, "ts": 1, "pid": 1},
               {"type": "decision", "tid": tid, "ts": 1, "outcome": "commit", **fields}])


def write_forged_workspace(repo: str, records: list[dict[str, Any]]) -> None:
    """``repo/.agent-tx/`` as a repository can ship it: every file agent-2pc opens, a
    placeholder in each directory it needs (git carries no empty directory)."""
    ws = os.path.join(repo, ".agent-tx")
    for sub in ("objects/tmp", "preimages", "tx", "trash"):
        os.makedirs(os.path.join(ws, sub), exist_ok=True)
        with open(os.path.join(ws, sub, ".keep"), "w"):
            pass
    with open(os.path.join(ws, "FORMAT"), "w") as f:
        f.write("agent-2pc workspace 1\n")
    for name in ("lock", "commit.lock", "txlocks"):
        with open(os.path.join(ws, name), "w"):
            pass
    with open(os.path.join(ws, "wal.bin"), "wb") as f:
        f.write(b"".join(frame(r) for r in records))


def _git(*args: str, cwd: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    subprocess.run(["git", "-c", "user.name=a", "-c", "user.email=a@example.com", *args],
                   cwd=cwd, check=True, capture_output=True, env=env, timeout=30)


def forged_clone(base: str) -> str:
    upstream = os.path.join(base, "upstream")
    os.makedirs(upstream)
    _git("init", "-q", cwd=upstream)
    with open(os.path.join(upstream, "README.md"), "w") as f:
        f.write("a harmless project\n")
    write_forged_workspace(upstream, forged_commit(
        [stage("../OUTSIDE.txt"), stage(".git/hooks/post-merge")]))
    _git("add", "-A", cwd=upstream)
    _git("commit", "-qm", "initial", cwd=upstream)
    os.makedirs(os.path.join(base, "victim"))
    clone = os.path.join(base, "victim", "clone")
    _git("clone", "-q", upstream, clone, cwd=base)
    assert os.path.isfile(os.path.join(clone, ".agent-tx", "wal.bin"))  # git carried it
    return clone


def attack_failed(clone: str) -> bool:
    """Nothing of forged_clone's decision was written."""
    return not (os.path.exists(os.path.join(os.path.dirname(clone), "OUTSIDE.txt"))
                or os.path.exists(os.path.join(clone, ".git", "hooks", "post-merge")))
