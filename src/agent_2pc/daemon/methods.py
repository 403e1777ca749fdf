"""The protocol's methods: a library operation each, its parameters by name, its JSON answer.

One table serves both sides: the daemon calls it on its engine, and the client on an
in-process engine when no daemon answers, so both give the same answers and errors. Content
travels as text (``content``, ``old``, ``new``, ``patch``) or base64 (the same name with
``_b64``); ``read`` answers ``{content_b64}`` (null: the file is absent).
"""

from __future__ import annotations

import base64
import binascii

from ..core.paging import LIST_LIMIT
from ..errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..coordinator.engine import Engine

_STR = (str,)
_OPT_STR = (str, type(None))
_OPT_INT = (int, type(None))
_BOOL = (bool,)
_OPT_DICT = (dict, type(None))
_ANY = (object,)


class Method:
    __slots__ = ("name", "run", "params", "required", "tid")

    def __init__(self, name: str, run: Callable[[Engine, dict[str, Any]], Any],
                 params: dict[str, tuple[type, ...]], required: tuple[str, ...] = ()) -> None:
        self.name, self.run, self.params, self.required = name, run, params, required
        self.tid = "tid" in required  # works on one transaction (its lock is taken first)


def check_params(method: Method, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` without its nulls (a null is the default); UsageError naming the first
    unknown, missing or mistyped parameter."""
    params = {k: v for k, v in params.items() if v is not None}
    for key, value in params.items():
        kinds = method.params.get(key)
        if kinds is None:
            raise UsageError(f"{method.name}: unknown parameter `{key}` (it takes "
                             f"{', '.join(method.params) or 'none'})", params=(key,))
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds
                                             and object not in kinds):
            want = " or ".join(k.__name__ for k in kinds if k is not type(None))
            raise UsageError(f"{method.name}: `{key}` must be {want}, not "
                             f"{type(value).__name__}", params=(key,))
    for key in method.required:
        if params.get(key) is None:
            raise UsageError(f"{method.name}: `{key}` is required", params=(key,))
    return params


def run_method(engine: Engine, name: str, params: dict[str, Any]) -> Any:
    """Call method ``name`` on ``engine`` (what the daemon does; the client too, with no
    daemon)."""
    method = METHODS.get(name)
    if method is None:
        raise UsageError(f"no method {name!r}")
    return method.run(engine, check_params(method, params))


def _bytes_of(params: dict[str, Any], name: str, required: bool = True) -> bytes | str | None:
    """``name`` as given (text), or its ``name_b64`` decoded; not both."""
    text, b64 = params.get(name), params.get(name + "_b64")
    if text is not None and b64 is not None:
        raise UsageError(f"give `{name}` or `{name}_b64`, not both", params=(name,))
    if b64 is not None:
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise UsageError(f"`{name}_b64` is not base64", params=(name + "_b64",)) from None
    if text is None and required:
        raise UsageError(f"`{name}` (or `{name}_b64`) is required", params=(name,))
    return text  # type: ignore[no-any-return]


def _stage_write(e: Engine, p: dict[str, Any]) -> Any:
    content = _bytes_of(p, "content")
    data = content.encode("utf-8") if isinstance(content, str) else content
    return e.stage_write(p["tid"], p["path"], data, mode=p.get("mode"),
                         create_dirs=p.get("create_dirs", True))


def _read(e: Engine, p: dict[str, Any]) -> Any:
    data = e.read(p["tid"], p["path"])
    return {"path": p["path"],
            "content_b64": None if data is None else base64.b64encode(data).decode("ascii")}


def _git_commit(e: Engine, p: dict[str, Any]) -> Any:
    return e.git_commit(p["tid"], p["message"], p.get("author"), p.get("branch"),
                        not p.get("no_verify", False), p.get("sign"))


def _m(name: str, run: Callable[[Engine, dict[str, Any]], Any],
       required: tuple[str, ...] = (), **params: tuple[type, ...]) -> Method:
    for key in required:
        params.setdefault(key, _STR)
    return Method(name, run, params, required)


_TP = ("tid", "path")
METHODS: dict[str, Method] = {m.name: m for m in (
    _m("begin", lambda e, p: e.begin(p.get("timeout_ms"), p.get("label"),
                                     p.get("git_branch")),
       timeout_ms=_OPT_INT, label=_OPT_STR, git_branch=_OPT_STR),
    _m("commit", lambda e, p: e.commit(p["tid"], p.get("merge", True)), ("tid",), merge=_BOOL),
    _m("git_commit", _git_commit, ("tid", "message"), author=_OPT_STR, branch=_OPT_STR,
       no_verify=_BOOL, sign=(bool, type(None))),
    _m("abort", lambda e, p: e.abort(p["tid"], p.get("reason")), ("tid",), reason=_OPT_STR),
    _m("recover", lambda e, p: e.recover()),
    _m("compact", lambda e, p: e.compact(p.get("gc", True)), gc=_BOOL),
    _m("transactions", lambda e, p: e.transactions(
        p.get("state"), finished=p.get("finished", True),
        limit=p["limit"] if "limit" in p else LIST_LIMIT, before=p.get("before")),
       state=_OPT_STR, finished=_BOOL, limit=_OPT_INT, before=_OPT_STR),
    _m("status", lambda e, p: e.status(p.get("tid")), tid=_OPT_STR),
    _m("record_read", lambda e, p: e.record_read(p["tid"], p["path"]), _TP),
    _m("read", _read, _TP),
    _m("stage_write", _stage_write, _TP, content=_OPT_STR, content_b64=_OPT_STR,
       mode=_OPT_INT, create_dirs=_BOOL),
    _m("stage_delete", lambda e, p: e.stage_delete(p["tid"], p["path"]), _TP),
    _m("stage_replace", lambda e, p: e.stage_replace(
        p["tid"], p["path"], _bytes_of(p, "old"), _bytes_of(p, "new"), p.get("all", False)),
       _TP, old=_OPT_STR, old_b64=_OPT_STR, new=_OPT_STR, new_b64=_OPT_STR, all=_BOOL),
    _m("stage_patch", lambda e, p: e.stage_patch(p["tid"], _bytes_of(p, "patch")), ("tid",),
       patch=_OPT_STR, patch_b64=_OPT_STR),
    _m("stage_api", lambda e, p: e.stage_api(
        p["tid"], p["method"], p["url"], p.get("body"), p.get("headers"),
        p.get("idempotency_key"), p.get("compensate")), ("tid", "method", "url"),
       body=_ANY, headers=_OPT_DICT, idempotency_key=_OPT_STR, compensate=_OPT_DICT),
    _m("stage_effect", lambda e, p: e.stage_effect(p["tid"], p["kind"], p["args"]),
       ("tid", "kind", "args"), args=(dict,)),
    _m("savepoint", lambda e, p: e.savepoint(p["tid"], p["name"]), ("tid", "name")),
    _m("rollback_to", lambda e, p: e.rollback_to(p["tid"], p["name"]), ("tid", "name")),
    _m("diff", lambda e, p: e.diff(p["tid"], p.get("stat", False)), ("tid",), stat=_BOOL),
)}
