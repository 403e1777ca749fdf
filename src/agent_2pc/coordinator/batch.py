"""run-batch: a JSON manifest of steps run as one transaction (docs/cli.md has the field table).

    {"label": "...", "timeout_ms": 30000,
     "git_branch": "main", "git_commit": {"message": "...", "author": "N <E>"},
     "steps": [{"participant_id": "fs_route",
                "intent": {"type": "fs_write", "path": "src/a.rs", "content": "...",
                           "create_dirs": true}},
               {"participant_id": "cmd_test",
                "intent": {"type": "command", "command": "cargo test", "working_dir": ".",
                           "env": {}}}]}

A step may also be the intent itself (``{"type": "fs_write", ...}``). ``FIELDS`` below is the
whole shape: every field a step type takes, its check, and whether it is required; anything
else is refused. The whole manifest is checked before the transaction begins -- types, modes,
base64, paths (also against the root), commands, HTTP calls -- so a malformed one is
``invalid_manifest`` (or the path's own code) naming the step and the field, and leaves nothing
in the log. A step that fails aborts the transaction, and the error names the step.

``timeout_ms`` is the whole batch's: the transaction aborts with ``timeout`` if it is not
committed within it, and a command or exec step gets at most the time that is left.
"""

from __future__ import annotations

import os
import re
import time

from ..core import jsonin
from ..errors import (
    Agent2PCError,
    InputError,
    InvalidManifest,
    IoFailed,
    TransactionAborted,
)
from ..participants.api import http_call
from .paths import check_path_text, resolve, resolve_dir
from .runs import TIMEOUT_MS_DEFAULT, _glob_matcher, _timeout_s, check_env
from .runs import _command as check_command
from .staging import check_mode
from .twophase import TIMEOUT_MS_MAX

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from .client import Agent2PC, Transaction

STEPS_MAX = 10_000
ID_CHARS_MAX = 200
MANIFEST_KEYS = ("label", "steps", "timeout_ms", "git_branch", "git_commit")
GIT_COMMIT_KEYS = ("message", "author", "no_verify", "sign")
STEP_KEYS = ("participant_id", "intent")
_OCTAL = re.compile(r"[0-7]{1,8}")


# -- field checks: each returns the value to use, or raises an InputError ---------------------


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidManifest(f"must be a string, not {_kind(value)}")
    return value


def _nonempty(value: Any) -> str:
    if not _text(value):
        raise InvalidManifest("may not be empty")
    return value  # type: ignore[no-any-return]


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidManifest(f"must be true or false, not {_kind(value)}")
    return value


def _path(value: Any) -> str:
    return check_path_text(_text(value), "the path")


def _working_dir(value: Any) -> str:
    return check_path_text(_text(value), "the working directory")


def _base64(value: Any) -> bytes:
    import base64
    import binascii

    try:
        return base64.b64decode(_text(value), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidManifest(f"is not base64: {exc}") from None


def _mode(value: Any) -> int:
    """A number (420) or an octal string ("0644"); then the one mode check (staging.py)."""
    if isinstance(value, str):
        if not _OCTAL.fullmatch(value):
            raise InvalidManifest(f"must be octal digits like \"0644\", not {value!r}")
        value = int(value, 8)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise InvalidManifest(f"must be a number (420) or an octal string (\"0644\"), not "
                              f"{_kind(value)}")
    return check_mode(value, "the mode")  # type: ignore[return-value]


def _timeout(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidManifest(f"must be a whole number of milliseconds, not {_kind(value)}")
    _timeout_s(value)
    return int(value)


def _source_file(value: Any) -> str:
    """A file to stage the content of (fs_write's ``content_file``): a regular file that this
    process can read, named relative to the current directory. Checked before anything
    begins; read, streamed, when its step runs."""
    import stat

    if not isinstance(value, str) or not value or "\0" in value:
        raise InvalidManifest(f"must be the path of a file, not {_kind(value)}")
    try:
        st = os.stat(value)
    except OSError as exc:
        raise InvalidManifest(f"cannot read {value}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidManifest(f"cannot read {value}: not a regular file")
    if not os.access(value, os.R_OK):
        raise InvalidManifest(f"cannot read {value}: permission denied")
    return value


def _argv(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise InvalidManifest("must be a non-empty list of strings")
    return check_command(value)  # type: ignore[return-value]


def _globs(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidManifest("must be a list of strings")
    _glob_matcher(value)
    return value


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidManifest(f"must be a JSON object of NAME: value, not {_kind(value)}")
    return check_env(value)


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidManifest(f"must be a JSON object, not {_kind(value)}")
    return value


def _any(value: Any) -> Any:
    return value


# Every field of every step type: name -> (required, check). "type" is implied.
FIELDS: dict[str, dict[str, tuple[bool, Callable[[Any], Any]]]] = {
    "fs_write": {"path": (True, _path), "content": (False, _text),
                 "content_base64": (False, _base64), "content_file": (False, _source_file),
                 "mode": (False, _mode), "create_dirs": (False, _flag)},
    "fs_delete": {"path": (True, _path)},
    "fs_replace": {"path": (True, _path), "old": (True, _nonempty), "new": (True, _text),
                   "all": (False, _flag)},
    "fs_patch": {"patch": (True, _nonempty)},
    "command": {"command": (True, check_command), "timeout_ms": (False, _timeout),
                "promote": (False, _globs), "sandbox": (False, _flag),
                "network": (False, _flag), "working_dir": (False, _working_dir),
                "env": (False, _env)},
    "exec": {"argv": (True, _argv), "timeout_ms": (False, _timeout)},
    "api": {"method": (True, _text), "url": (True, _text), "body": (False, _any),
            "headers": (False, _object), "idempotency_key": (False, _text),
            "compensate": (False, _object)},
    "sql": {"dsn": (True, _nonempty), "sql": (True, _nonempty)},
}
_CONTENT_FIELDS = ("content", "content_base64", "content_file")
_PATH_FIELDS = {"fs_write": "path", "fs_delete": "path", "fs_replace": "path",
                "command": "working_dir"}


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a fraction", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _where(index: int | None, pid: str | None, field: str | None) -> str:
    where = "" if index is None else f"step {index}" + (f" ({pid})" if pid else "") + ": "
    return where + (f"'{field}': " if field else "")


def _bad(msg: str, index: int | None = None, pid: str | None = None,
         field: str | None = None) -> InvalidManifest:
    details: dict[str, Any] = {"step": index}
    if field:
        details["field"] = field
    return InvalidManifest(_where(index, pid, field) + msg, **details)


# -- the manifest ------------------------------------------------------------------------------


def parse_manifest(data: bytes | str | dict[str, Any]) -> dict[str, Any]:
    """Check a manifest completely (pure: no file system); return it normalized: steps as
    ``{"index", "participant_id", "type", "intent"}``, the intent's values checked (content
    as bytes, mode as a number)."""
    if isinstance(data, (bytes, str)):
        data = jsonin.loads(data, "the manifest", _bad)
    else:
        jsonin.check(data, "the manifest", _bad)
    if not isinstance(data, dict):
        raise _bad("a manifest is a JSON object with a 'steps' list")
    unknown = sorted(set(data) - set(MANIFEST_KEYS))
    if unknown:
        raise _bad(f"the manifest does not take {', '.join(map(repr, unknown))} (it takes "
                   f"{', '.join(MANIFEST_KEYS)})")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise _bad("'steps' must be a non-empty list")
    if len(steps) > STEPS_MAX:
        raise _bad(f"more than {STEPS_MAX} steps")
    timeout_ms = data.get("timeout_ms")
    if timeout_ms is not None:
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not (
                0 <= timeout_ms <= TIMEOUT_MS_MAX):
            raise _bad(f"must be a whole number of milliseconds from 0 (none) to "
                       f"{TIMEOUT_MS_MAX}, not {timeout_ms!r}", field="timeout_ms")
    label = data.get("label")
    if label is not None and (not isinstance(label, str) or len(label) > 200):
        raise _bad("must be a string of at most 200 characters", field="label")
    git_branch = data.get("git_branch")
    if git_branch is not None and (not isinstance(git_branch, str) or not git_branch):
        raise _bad("must be a branch name", field="git_branch")
    return {"timeout_ms": timeout_ms, "label": label, "git_branch": git_branch,
            "git_commit": _git_commit(data.get("git_commit")),
            "steps": [_parse_step(i, step) for i, step in enumerate(steps)]}


def _git_commit(value: Any) -> dict[str, Any] | None:
    """The manifest's ``git_commit``: end with git-commit ({message, author?, no_verify?,
    sign?}) instead of commit."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("must be an object {message, author?, no_verify?, sign?}",
                   field="git_commit")
    unknown = sorted(set(value) - set(GIT_COMMIT_KEYS))
    if unknown:
        raise _bad(f"does not take {', '.join(map(repr, unknown))} (it takes "
                   f"{', '.join(GIT_COMMIT_KEYS)})", field="git_commit")
    try:
        out: dict[str, Any] = {"message": _nonempty(value.get("message", ""))}
        if value.get("author") is not None:
            out["author"] = _text(value["author"])
        out["verify"] = not _flag(value.get("no_verify", False))
        if value.get("sign") is not None:
            out["sign"] = _flag(value["sign"])
    except InputError as exc:
        raise _bad(exc.message, field="git_commit") from None
    return out


def _parse_step(i: int, step: Any) -> dict[str, Any]:
    if not isinstance(step, dict):
        raise _bad("a step is a JSON object", i)
    pid = step.get("participant_id")
    if pid is not None and (not isinstance(pid, str) or not 0 < len(pid) <= ID_CHARS_MAX):
        raise _bad(f"must be a string of 1 to {ID_CHARS_MAX} characters", i,
                   field="participant_id")
    if "intent" in step:
        unknown = sorted(set(step) - set(STEP_KEYS))
        if unknown:
            raise _bad(f"a step takes participant_id and intent, not "
                       f"{', '.join(map(repr, unknown))}", i, pid)
        intent = step["intent"]
        if not isinstance(intent, dict):
            raise _bad("must be a JSON object", i, pid, "intent")
    else:  # the intent itself, with perhaps its participant_id
        intent = {k: v for k, v in step.items() if k != "participant_id"}
    kind = intent.get("type")
    if kind not in FIELDS:
        raise _bad(f"unknown step type {kind!r} (known: {', '.join(FIELDS)})", i, pid)
    fields = FIELDS[kind]
    unknown = sorted(set(intent) - set(fields) - {"type"})
    if unknown:
        raise _bad(f"{kind} does not take {', '.join(map(repr, unknown))} (it takes "
                   f"{', '.join(fields)})", i, pid)
    out: dict[str, Any] = {"type": kind}
    for name, (required, check) in fields.items():
        if name not in intent:
            if required:
                raise _bad(f"{kind} needs {name!r}", i, pid)
            continue
        try:
            out[name] = check(intent[name])
        except InputError as exc:
            raise _bad(exc.message, i, pid, name) from None
    try:
        _whole(kind, out)
    except InputError as exc:
        raise _bad(exc.message, i, pid) from None
    return {"index": i, "participant_id": pid, "type": kind, "intent": out}


def _whole(kind: str, intent: dict[str, Any]) -> None:
    """The rules between fields of one step."""
    if kind == "fs_write" and sum(k in intent for k in _CONTENT_FIELDS) != 1:
        raise InvalidManifest("fs_write needs exactly one of 'content', 'content_base64' and "
                              "'content_file'")
    if kind == "command" and intent.get("network") and not intent.get("sandbox"):
        raise InvalidManifest("'network' only makes sense with 'sandbox': true")
    if kind == "api":
        http_call(intent["method"], intent["url"], intent.get("body"), intent.get("headers"),
                  intent.get("idempotency_key"), intent.get("compensate"))
    if kind == "sql":  # the DSN (no password) and the statements (no BEGIN/COMMIT)
        from ..participants.postgres import check_dsn, check_sql

        check_dsn(intent["dsn"])
        check_sql(intent["sql"])
    if kind == "fs_patch":
        from ..core.patch import parse_patch

        parse_patch(intent["patch"])


def _check_paths(root: str, steps: list[dict[str, Any]]) -> None:
    """Resolve every step's path against the root before anything begins: a path outside
    the root, in .git/ or through a loop of links is refused with its own code, naming the
    step."""
    for s in steps:
        field = _PATH_FIELDS.get(s["type"])
        if field is None or field not in s["intent"]:
            continue
        try:
            (resolve_dir if field == "working_dir" else resolve)(root, s["intent"][field])
        except InputError as exc:
            exc.message = _where(s["index"], s["participant_id"], field) + exc.message
            exc.args = (exc.message,)
            exc.details.update(step=s["index"], field=field)
            raise


# -- running -----------------------------------------------------------------------------------


def _execute(tx: Transaction, kind: str, intent: dict[str, Any], left_ms: int | None
             ) -> dict[str, Any]:
    if kind == "fs_write":
        if "content_file" in intent:  # streamed, as stage-write --from-file; a file gone
            # since the manifest was checked is a usage error (sources.py)
            return tx.stage_write_file(intent["path"], intent["content_file"],
                                       mode=intent.get("mode"),
                                       create_dirs=intent.get("create_dirs", True))
        data = intent["content_base64"] if "content_base64" in intent else \
            intent["content"].encode("utf-8")
        return tx.stage_write(intent["path"], data, mode=intent.get("mode"),
                              create_dirs=intent.get("create_dirs", True))
    if kind == "fs_delete":
        return tx.stage_delete(intent["path"])
    if kind == "fs_replace":
        return tx.stage_replace(intent["path"], intent["old"], intent["new"],
                                all=intent.get("all", False))
    if kind == "fs_patch":
        return tx.stage_patch(intent["patch"])
    if kind == "command":
        timeout_ms = intent.get("timeout_ms")
        if left_ms is not None:
            timeout_ms = _within(timeout_ms or TIMEOUT_MS_DEFAULT, left_ms)
        return tx.stage_cmd(intent["command"], timeout_ms, intent.get("promote"),
                            intent.get("sandbox", False), intent.get("network", False),
                            working_dir=intent.get("working_dir"), env=intent.get("env"))
    if kind == "exec":
        return tx.exec(intent["argv"], _within(intent.get("timeout_ms"), left_ms))
    if kind == "sql":
        return tx.stage_sql(intent["dsn"], intent["sql"])
    assert kind == "api", kind
    return tx.stage_api(intent["method"], intent["url"], intent.get("body"),
                        intent.get("headers"), intent.get("idempotency_key"),
                        intent.get("compensate"))


def _within(timeout_ms: int | None, left_ms: int | None) -> int | None:
    """A step's timeout, cut to what is left of the batch's (None: none)."""
    if left_ms is None:
        return timeout_ms
    return left_ms if timeout_ms is None else min(timeout_ms, left_ms)


def run_batch(client: Agent2PC, manifest: bytes | str | dict[str, Any]) -> dict[str, Any]:
    m = parse_manifest(manifest)
    _check_paths(client.root, m["steps"])
    deadline = time.monotonic() + m["timeout_ms"] / 1000 if m["timeout_ms"] else None
    tx = client.begin(timeout_ms=m["timeout_ms"], label=m["label"], git_branch=m["git_branch"])
    done: list[dict[str, Any]] = []
    for s in m["steps"]:
        i, kind, pid = s["index"], s["type"], s["participant_id"]
        row: dict[str, Any] = {"index": i, "type": kind}
        if pid is not None:
            row["participant_id"] = pid
        name = f"step {i} ({pid}: {kind})" if pid else f"step {i} ({kind})"
        try:
            left_ms = None if deadline is None else int((deadline - time.monotonic()) * 1000)
            if left_ms is not None and left_ms <= 0:
                raise TransactionAborted(f"the batch's timeout_ms ({m['timeout_ms']}) ran out "
                                         "before it", code="timeout")
            result = _execute(tx, kind, s["intent"], left_ms)
        except (Agent2PCError, OSError) as raised:  # the disk's refusal aborts it too
            exc = raised if isinstance(raised, Agent2PCError) else \
                IoFailed.from_os_error(raised)
            done.append({**row, "ok": False, "error": {"code": exc.code,
                                                       "message": exc.message}})
            if tx.state() == "active":
                tx.abort(reason=f"{name} failed: {exc.message}")
            raise TransactionAborted(
                f"{name} failed: {exc.message}; {tx.tid} was aborted",
                code=exc.code, tid=tx.tid,
                result={"tid": tx.tid, "state": "aborted", "steps": done}) from raised
        done.append({**row, "ok": True, "result": result})
    try:
        out = tx.git_commit(**m["git_commit"]) if m["git_commit"] else tx.commit()
    except TransactionAborted as exc:
        exc.details["result"] = {"tid": tx.tid, "state": "aborted", "steps": done}
        raise
    except Agent2PCError as exc:  # git-commit's hooks or bad input: it stays active, abort
        if tx.state() == "active":
            tx.abort(reason=f"git_commit failed: {exc.message}")
        raise TransactionAborted(f"git_commit failed: {exc.message}; {tx.tid} was aborted",
                                 code=exc.code, tid=tx.tid,
                                 result={"tid": tx.tid, "state": "aborted", "steps": done}
                                 ) from exc
    git = {k: out[k] for k in ("commit", "branch", "hooks") if k in out}
    return {"tid": tx.tid, "state": out["state"], "files": out["files"], "steps": done, **git}
