"""run-batch: a JSON manifest of steps run as one transaction.

    {"label": "...", "timeout_ms": 30000,
     "steps": [{"participant_id": "fs", "intent": {"type": "fs_write", "path": "a.py",
                                                   "content": "..."}}, ...]}

Step types: ``fs_write`` (path, content | content_base64, mode), ``fs_delete`` (path),
``fs_replace`` (path, old, new, all), ``fs_patch`` (patch), ``api`` (method, url, body,
headers, idempotency_key, compensate: an HTTP call sent exactly once at commit), ``command``
(command, timeout_ms, promote, sandbox, network: a check in the staged view), ``exec`` (argv,
timeout_ms: a command whose changes are staged). A step may
also be given as the intent itself (``{"type": "fs_write", ...}``). The whole manifest is
checked before the transaction begins, so a malformed one changes nothing; a step that fails
aborts the transaction, and the error names the step.
"""

from __future__ import annotations

import json

from ..errors import Agent2PCError, InvalidManifest, TransactionAborted

TYPE_CHECKING = False  # typing costs milliseconds to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any

    from .client import Agent2PC, Transaction

STEPS_MAX = 10_000
_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # step type: (required, optional)
    "fs_write": (("path",), ("content", "content_base64", "mode")),
    "fs_delete": (("path",), ()),
    "fs_replace": (("path", "old", "new"), ("all",)),
    "fs_patch": (("patch",), ()),
    "api": (("method", "url"), ("body", "headers", "idempotency_key", "compensate")),
    "command": (("command",), ("timeout_ms", "promote", "sandbox", "network")),
    "exec": (("argv",), ("timeout_ms",)),
}


def _bad(msg: str, index: int | None = None) -> InvalidManifest:
    where = f"step {index}: " if index is not None else ""
    return InvalidManifest(where + msg, step=index)


def parse_manifest(data: bytes | str | dict[str, Any]) -> dict[str, Any]:
    """Check a manifest completely; return it normalized (steps as plain intents)."""
    if isinstance(data, (bytes, str)):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise _bad(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _bad("a manifest is a JSON object with a 'steps' list")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise _bad("'steps' must be a non-empty list")
    if len(steps) > STEPS_MAX:
        raise _bad(f"more than {STEPS_MAX} steps")
    timeout_ms = data.get("timeout_ms")
    if timeout_ms is not None and (not isinstance(timeout_ms, int) or isinstance(
            timeout_ms, bool) or timeout_ms < 0):
        raise _bad("'timeout_ms' must be a whole number >= 0")
    label = data.get("label")
    if label is not None and not isinstance(label, str):
        raise _bad("'label' must be a string")
    intents = [_parse_step(i, step) for i, step in enumerate(steps)]
    return {"timeout_ms": timeout_ms, "label": label, "steps": intents}


def _parse_step(i: int, step: Any) -> dict[str, Any]:
    if not isinstance(step, dict):
        raise _bad("a step is a JSON object", i)
    intent = step.get("intent", step)
    if not isinstance(intent, dict):
        raise _bad("'intent' must be a JSON object", i)
    kind = intent.get("type")
    if kind not in _FIELDS:
        raise _bad(f"unknown step type {kind!r} (known: {', '.join(_FIELDS)})", i)
    required, optional = _FIELDS[kind]
    for name in required:
        if name not in intent:
            raise _bad(f"{kind} needs {name!r}", i)
    unknown = set(intent) - set(required) - set(optional) - {"type"}
    if unknown:
        raise _bad(f"{kind} does not take {', '.join(sorted(unknown))}", i)
    for name in required + optional:
        value = intent.get(name)
        if name in ("all",):
            if value is not None and not isinstance(value, bool):
                raise _bad(f"{name!r} must be true or false", i)
        elif name in ("body",):
            pass  # any JSON value
        elif name in ("sandbox", "network"):
            if value is not None and not isinstance(value, bool):
                raise _bad(f"{name!r} must be true or false", i)
        elif name == "timeout_ms":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise _bad("'timeout_ms' must be a whole number", i)
        elif name in ("promote", "argv"):
            if value is not None and not (isinstance(value, list) and all(
                    isinstance(v, str) for v in value)) or (name == "argv" and not value):
                raise _bad(f"{name!r} must be a list of strings", i)
        elif name in ("headers", "compensate"):
            if value is not None and not isinstance(value, dict):
                raise _bad(f"{name!r} must be a JSON object", i)
        elif name == "mode":
            if value is not None and not (isinstance(value, int) or (
                    isinstance(value, str) and value.isdigit())):
                raise _bad("'mode' is a number (420) or an octal string (\"0644\")", i)
        elif value is not None and not isinstance(value, str):
            raise _bad(f"{name!r} must be a string", i)
    if kind == "fs_write" and ("content" in intent) == ("content_base64" in intent):
        raise _bad("fs_write needs exactly one of 'content' and 'content_base64'", i)
    return dict(intent)


def _execute(tx: Transaction, intent: dict[str, Any]) -> dict[str, Any]:
    kind = intent["type"]
    if kind == "fs_write":
        if "content_base64" in intent:
            import base64
            import binascii

            try:
                data = base64.b64decode(intent["content_base64"], validate=True)
            except (binascii.Error, ValueError) as exc:
                raise InvalidManifest(f"content_base64 is not base64: {exc}") from None
        else:
            data = intent["content"].encode("utf-8")
        mode = intent.get("mode")
        if isinstance(mode, str):
            mode = int(mode, 8)
        return tx.stage_write(intent["path"], data, mode=mode)
    if kind == "fs_delete":
        return tx.stage_delete(intent["path"])
    if kind == "fs_replace":
        return tx.stage_replace(intent["path"], intent["old"], intent["new"],
                                all=bool(intent.get("all")))
    if kind == "command":
        return tx.stage_cmd(intent["command"], intent.get("timeout_ms"), intent.get("promote"),
                            bool(intent.get("sandbox")), bool(intent.get("network")))
    if kind == "exec":
        return tx.exec(intent["argv"], intent.get("timeout_ms"))
    if kind == "api":
        return tx.stage_api(intent["method"], intent["url"], intent.get("body"),
                            intent.get("headers"), intent.get("idempotency_key"),
                            intent.get("compensate"))
    assert kind == "fs_patch", kind
    return tx.stage_patch(intent["patch"])


def run_batch(client: Agent2PC, manifest: bytes | str | dict[str, Any]) -> dict[str, Any]:
    m = parse_manifest(manifest)
    tx = client.begin(timeout_ms=m["timeout_ms"], label=m["label"])
    steps: list[dict[str, Any]] = []
    for i, intent in enumerate(m["steps"]):
        try:
            result = _execute(tx, intent)
        except Agent2PCError as exc:
            steps.append({"index": i, "type": intent["type"], "ok": False,
                          "error": {"code": exc.code, "message": exc.message}})
            if tx.state() == "active":
                tx.abort(reason=f"step {i} ({intent['type']}) failed: {exc.message}")
            raise TransactionAborted(
                f"step {i} ({intent['type']}) failed: {exc.message}; {tx.tid} was aborted",
                code=exc.code, tid=tx.tid,
                result={"tid": tx.tid, "state": "aborted", "steps": steps}) from exc
        steps.append({"index": i, "type": intent["type"], "ok": True, "result": result})
    try:
        out = tx.commit()
    except TransactionAborted as exc:
        exc.details["result"] = {"tid": tx.tid, "state": "aborted", "steps": steps}
        raise
    return {"tid": tx.tid, "state": out["state"], "files": out["files"], "steps": steps}
