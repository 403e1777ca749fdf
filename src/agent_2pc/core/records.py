"""The log's records, each kind with its shape: built here, checked where built and where read.

A record is a JSON object (docs/format.md, "Records"). Each kind has

- a ``TypedDict`` (``BeginRecord``, ``StageRecord``, ...) for mypy: defined under
  ``TYPE_CHECKING`` only, since importing ``typing`` costs the CLI milliseconds at start-up;
- a builder (``begin(tid, ...)``, ``stage(tid, ...)``, ...) that stamps ``type``, ``tid`` and
  ``ts`` and checks the result against the kind's shape: a builder that makes a record of the
  wrong shape is a bug (AssertionError), and such a record never reaches the log;
- a row of ``SHAPES``, what the fold (core/states.py) checks every record against before it
  reads one field of it. A record that fails is corruption (``BadRecord``, which the engine
  reports as ``corrupt_wal``); once a record passed, a KeyError or TypeError in the fold is a
  bug in the fold, and is raised as one. tests/test_record_shapes.py holds the TypedDicts and
  SHAPES to the same fields, types and required-ness.

A shape checks JSON types, not values: which paths, blob names and modes may be applied is
core/confine.py's business, asked when a transaction is about to be applied. Fields a shape does
not name are allowed (formats grow by adding fields); an optional field may be absent, and when
present has its type. ``bool`` is not an ``int`` here (JSON ``true`` is no size).
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, Literal, NotRequired, TypedDict, Union

    class _Common(TypedDict):
        tid: str
        ts: int  # milliseconds since the epoch

    class LogHeaderRecord(_Common):  # the log's first frame (storage/wal_format.py)
        type: Literal["log"]
        workspace: str

    class BeginRecord(_Common):
        type: Literal["begin"]
        label: NotRequired[str | None]
        timeout_ms: NotRequired[int | None]
        boot: NotRequired[str | None]
        pid: NotRequired[int]
        origin: NotRequired[dict[str, Any]]  # an imported bundle's (coordinator/bundles.py)
        undoes: NotRequired[str]

    class ReadRecord(_Common):
        type: Literal["read"]
        path: str
        sha256: NotRequired[str | None]  # a fingerprint; None: absent

    class StageRecord(_Common):
        type: Literal["stage"]
        path: str
        op: str  # one of states.OP_KINDS
        via: NotRequired[str | None]
        blob: NotRequired[str | None]
        size: NotRequired[int]
        mode: NotRequired[int | None]
        pre: NotRequired[str | None]
        target: NotRequired[str | None]

    class EffectRecord(_Common):
        type: Literal["effect"]
        n: int
        kind: NotRequired[str]
        request: dict[str, Any]  # {method, url, headers, body}: SHAPES checks method and url
        key: str
        compensate: NotRequired[dict[str, Any] | None]

    class ResultRecord(_Common):
        type: Literal["result"]
        phase: str  # effect | compensate
        n: int
        outcome: str
        status: NotRequired[int | None]
        response: NotRequired[dict[str, Any] | None]
        error: NotRequired[str | None]
        code: NotRequired[str | None]
        ticket: NotRequired[dict[str, Any]]
        replayed: NotRequired[bool]

    class CheckRecord(_Common):
        type: Literal["check"]
        key: str
        command: NotRequired[str | list[str]]
        options: NotRequired[dict[str, Any]]
        fingerprint: NotRequired[str]
        passed: NotRequired[bool]
        exit_code: NotRequired[int | None]
        timed_out: NotRequired[bool]

    class SavepointRecord(_Common):
        type: Literal["savepoint"]
        name: str

    class RollbackRecord(_Common):
        type: Literal["rollback"]
        name: str

    class PrepareRecord(_Common):
        type: Literal["prepare"]
        pid: NotRequired[int]

    class VoteRecord(_Common):
        type: Literal["vote"]
        pid: NotRequired[int]
        coordinator: dict[str, Any]  # who decides (the caller's JSON object, no secrets)
        decided: NotRequired[dict[str, Any]]  # what the commit decision will carry (redo)

    class DecisionRecord(_Common):
        type: Literal["decision"]
        outcome: str  # commit | abort
        code: NotRequired[str | None]
        reason: NotRequired[str | None]
        modes: NotRequired[dict[str, int]]
        inline: NotRequired[dict[str, str]]
        placed: NotRequired[dict[str, str]]
        git: NotRequired[dict[str, Any]]

    class EndRecord(_Common):
        type: Literal["end"]
        state: str  # committed | aborted
        files: NotRequired[list[str]]
        diverged: NotRequired[list[str]]
        uncompensated: NotRequired[list[int]]

    AnyRecord = Union[LogHeaderRecord, BeginRecord, ReadRecord, StageRecord, EffectRecord,
                      ResultRecord, CheckRecord, SavepointRecord, RollbackRecord,
                      PrepareRecord, VoteRecord, DecisionRecord, EndRecord]
    # A field's spec: (name, the JSON types it may have, required, what is inside it: the
    # type of a list's items or the spec of an object's fields, or None).
    Spec = tuple[str, tuple[type, ...], bool, Any]


class BadRecord(Exception):
    """A record that fails its kind's shape: a missing field, a field of the wrong type, an
    unknown kind. Corruption (the log did not come from agent-2pc as it is), not a bug."""

    def __init__(self, rec: Any, why: str) -> None:
        tid = rec.get("tid") if isinstance(rec, dict) else None
        kind = rec.get("type") if isinstance(rec, dict) else None
        super().__init__(f"malformed {kind!r} record of {tid!r}: {why}")
        self.tid = tid if isinstance(tid, str) else None
        self.why = why


_S = (str,)
_S_N = (str, type(None))
_I = (int,)
_I_N = (int, type(None))
_B = (bool,)
_D = (dict,)
_D_N = (dict, type(None))
_L = (list,)

_REQUEST: tuple[Spec, ...] = (("method", _S, True, None), ("url", _S, True, None),
                              ("headers", _D, False, None))
# An effect's request, by the effect's kind (a record without a kind is an HTTP call: logs
# before participants could stage effects of their own kinds).
EFFECT_REQUESTS: dict[str, tuple[Spec, ...]] = {
    "http": _REQUEST,
    "git": (("message", _S, True, None), ("author", _S_N, False, None),  # participants/git.py
            ("branch", _S, True, None), ("prefix", _S, True, None),
            ("sign", _B, False, None)),
    "git-branch": (("branch", _S, True, None), ("base", _S, True, None),  # begin --git-branch
                   ("prefix", _S, True, None)),
    "sql": (("dsn", _S, True, None), ("sql", _S, True, None),  # participants/postgres.py
            ("rows_affected", _I, False, None)),
}
# What a commit decision carries for the git participant's redo (participants/git.py).
_GIT_DECIDED: tuple[Spec, ...] = (("ref", _S, True, None), ("old", _S, True, None),
                                  ("new", _S, True, None), ("prefix", _S, True, None),
                                  ("ignored", _L, False, None))
# What a vote keeps for the commit decision it may get (the decision's redo fields).
_VOTE_DECIDED: tuple[Spec, ...] = (("modes", _D, False, None), ("inline", _D, False, None),
                                   ("placed", _D, False, None),
                                   ("git", _D, False, _GIT_DECIDED))
# kind -> the specs of its fields besides type, tid and ts (which every record has).
SHAPES: dict[str, tuple[Spec, ...]] = {
    "log": (("workspace", _S, True, None),),
    "begin": (("label", _S_N, False, None), ("timeout_ms", _I_N, False, None),
              ("boot", _S_N, False, None), ("pid", _I, False, None),
              ("origin", _D, False, None),
              ("undoes", _S, False, None)),
    "read": (("path", _S, True, None), ("sha256", _S_N, False, None)),
    "stage": (("path", _S, True, None), ("op", _S, True, None), ("via", _S_N, False, None),
              ("blob", _S_N, False, None), ("size", _I, False, None),
              ("mode", _I_N, False, None), ("pre", _S_N, False, None),
              ("target", _S_N, False, None)),
    "effect": (("n", _I, True, None), ("kind", _S, False, None),
               ("request", _D, True, None), ("key", _S, True, None),
               ("compensate", _D_N, False, None)),
    "result": (("phase", _S, True, None), ("n", _I, True, None), ("outcome", _S, True, None),
               ("status", _I_N, False, None), ("response", _D_N, False, None),
               ("error", _S_N, False, None), ("code", _S_N, False, None),
               ("ticket", _D, False, None), ("replayed", _B, False, None)),
    "check": (("key", _S, True, None), ("command", (str, list), False, None),
              ("options", _D, False, None), ("fingerprint", _S, False, None),
              ("passed", _B, False, None), ("exit_code", _I_N, False, None),
              ("timed_out", _B, False, None)),
    "savepoint": (("name", _S, True, None),),
    "rollback": (("name", _S, True, None),),
    "prepare": (("pid", _I, False, None),),
    "vote": (("pid", _I, False, None), ("coordinator", _D, True, None),
             ("decided", _D, False, _VOTE_DECIDED)),
    "decision": (("outcome", _S, True, None), ("code", _S_N, False, None),
                 ("reason", _S_N, False, None), ("modes", _D, False, None),
                 ("inline", _D, False, None), ("placed", _D, False, None),
                 ("git", _D, False, _GIT_DECIDED)),
    "end": (("state", _S, True, None), ("files", _L, False, str),
            ("diverged", _L, False, str), ("uncompensated", _L, False, int)),
}
_COMMON: tuple[Spec, ...] = (("type", _S, True, None), ("tid", _S, True, None),
                             ("ts", _I, True, None))
_MISSING = object()


def shape_problem(rec: Any) -> str | None:
    """What is wrong with the shape of ``rec`` (a decoded payload), or None if nothing is."""
    if type(rec) is not dict:
        return f"it is a {type(rec).__name__}, not an object"
    why = _fields_problem(rec, _COMMON)
    if why is not None:
        return why
    specs = SHAPES.get(rec["type"])
    if specs is None:
        return f"there is no record type {rec['type']!r}"
    why = _fields_problem(rec, specs)
    if why is None and rec["type"] == "effect":
        request_specs = EFFECT_REQUESTS.get(rec.get("kind", "http"))
        if request_specs is not None:
            why = _fields_problem(rec["request"], request_specs)
            return None if why is None else f"in 'request': {why}"
    return why


def _fields_problem(obj: dict[str, Any], specs: tuple[Spec, ...]) -> str | None:
    for name, types, required, inner in specs:
        value = obj.get(name, _MISSING)
        if value is _MISSING:
            if required:
                return f"the field {name!r} is missing"
            continue
        if type(value) not in types:
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            return f"the field {name!r} is {_json_type(value)}, not {want}"
        if inner is None:
            continue
        if type(value) is list:
            bad = next((v for v in value if type(v) is not inner), _MISSING)
            if bad is not _MISSING:
                return f"the field {name!r} holds {_json_type(bad)}, not only {inner.__name__}"
        elif type(value) is dict:
            why = _fields_problem(value, inner)
            if why is not None:
                return f"in {name!r}: {why}"
    return None


def _json_type(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {str(value)[:40]!r}"


def check_shape(rec: Any) -> None:
    """Raise BadRecord unless ``rec`` has the shape of its kind."""
    why = shape_problem(rec)
    if why is not None:
        raise BadRecord(rec, why)


def _check_built(rec: Any) -> None:
    """A record a builder made: its shape is checked here, and a wrong one is a bug."""
    why = shape_problem(rec)
    if why is not None:
        raise AssertionError(f"built a malformed {rec.get('type')!r} record: {why}")


def as_json(recs: Sequence[AnyRecord]) -> list[dict[str, Any]]:
    """Records as the log writes and the fold reads them: JSON objects (the same objects; a
    TypedDict is a dict at run time, and mypy needs to be told)."""
    untyped: Any = recs
    objects: list[dict[str, Any]] = untyped if type(recs) is list else list(untyped)
    return objects


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- builders, one per kind (docs/format.md, "Records") ------------------------------------------

def log_header(workspace: str, *, ts: int) -> LogHeaderRecord:
    """The first frame of a log: the workspace it belongs to (storage/wal_format.py)."""
    rec: LogHeaderRecord = {"type": "log", "tid": "", "ts": ts, "workspace": workspace}
    _check_built(rec)
    return rec


def begin(tid: str, *, label: str | None, timeout_ms: int | None, boot: str | None,
          pid: int, origin: dict[str, Any] | None = None, undoes: str | None = None
          ) -> BeginRecord:
    """``origin`` is written for a transaction imported from a bundle only; ``undoes``: the
    transaction this one takes back (coordinator/undo.py), written only then."""
    rec: BeginRecord = {"type": "begin", "tid": tid, "ts": now_ms(), "label": label,
                        "timeout_ms": timeout_ms, "boot": boot, "pid": pid}
    if origin is not None:
        rec["origin"] = origin
    if undoes is not None:
        rec["undoes"] = undoes
    _check_built(rec)
    return rec


def read(tid: str, *, path: str, sha256: str | None) -> ReadRecord:
    rec: ReadRecord = {"type": "read", "tid": tid, "ts": now_ms(), "path": path,
                       "sha256": sha256}
    _check_built(rec)
    return rec


def stage(tid: str, *, path: str, op: str, via: str, blob: str | None, size: int,
          mode: int | None, pre: str | None, target: str | None = None) -> StageRecord:
    """``target`` is written for a symlink only (other ops have no such field)."""
    rec: StageRecord = {"type": "stage", "tid": tid, "ts": now_ms(), "path": path, "op": op,
                        "via": via, "blob": blob, "size": size, "mode": mode, "pre": pre}
    if target is not None:
        rec["target"] = target
    _check_built(rec)
    return rec


def effect(tid: str, *, n: int, kind: str, request: dict[str, Any], key: str,
           compensate: dict[str, Any] | None) -> EffectRecord:
    rec: EffectRecord = {"type": "effect", "tid": tid, "ts": now_ms(), "n": n, "kind": kind,
                         "request": request, "key": key, "compensate": compensate}
    _check_built(rec)
    return rec


def result(tid: str, *, phase: str, n: int, outcome: str, **more: Any) -> ResultRecord:
    """What one attempt at a remote call (or its compensation) came to; ``more``: status,
    response, error, code, ticket, replayed (participants/api.py)."""
    rec: Any = {"type": "result", "tid": tid, "ts": now_ms(), "phase": phase, "n": n,
                "outcome": outcome, **more}
    _check_built(rec)
    built: ResultRecord = rec
    return built


def check(tid: str, *, key: str, **run: Any) -> CheckRecord:
    """One run of a check; ``run``: command, options, fingerprint and the run's result."""
    rec: Any = {"type": "check", "tid": tid, "ts": now_ms(), "key": key, **run}
    _check_built(rec)
    built: CheckRecord = rec
    return built


def savepoint(tid: str, *, name: str) -> SavepointRecord:
    rec: SavepointRecord = {"type": "savepoint", "tid": tid, "ts": now_ms(), "name": name}
    _check_built(rec)
    return rec


def rollback(tid: str, *, name: str) -> RollbackRecord:
    rec: RollbackRecord = {"type": "rollback", "tid": tid, "ts": now_ms(), "name": name}
    _check_built(rec)
    return rec


def prepare(tid: str, *, pid: int) -> PrepareRecord:
    rec: PrepareRecord = {"type": "prepare", "tid": tid, "ts": now_ms(), "pid": pid}
    _check_built(rec)
    return rec


def vote(tid: str, *, pid: int, coordinator: dict[str, Any],
         decided: dict[str, Any]) -> VoteRecord:
    """The yes vote of a transaction an outside coordinator decides (coordinator/twophase.py,
    ``prepare_and_vote``): ``coordinator`` names it; ``decided`` is what the participants'
    commit decision will carry (``decision_commit``'s fields), kept so that any process can
    decide."""
    rec: VoteRecord = {"type": "vote", "tid": tid, "ts": now_ms(), "pid": pid,
                       "coordinator": coordinator, "decided": decided}
    _check_built(rec)
    return rec


def decision_commit(tid: str, **redo: Any) -> DecisionRecord:
    """The commit point; ``redo``: modes, inline, placed (participants/fs.py)."""
    rec: Any = {"type": "decision", "tid": tid, "ts": now_ms(), "outcome": "commit", **redo}
    _check_built(rec)
    built: DecisionRecord = rec
    return built


def decision_abort(tid: str, *, code: str, reason: str) -> DecisionRecord:
    rec: DecisionRecord = {"type": "decision", "tid": tid, "ts": now_ms(), "outcome": "abort",
                           "code": code, "reason": reason}
    _check_built(rec)
    return rec


def end(tid: str, *, state: str, files: list[str] | None = None,
        diverged: list[str] | None = None, uncompensated: list[int] | None = None,
        **undone: Any) -> EndRecord:
    """``diverged`` and ``uncompensated`` are written only when not empty; ``undone``: what
    another participant's undo adds (participants/base.py)."""
    rec: EndRecord = {"type": "end", "tid": tid, "ts": now_ms(), "state": state,
                      "files": files or []}
    if diverged:
        rec["diverged"] = diverged
    if uncompensated:
        rec["uncompensated"] = uncompensated
    if undone:
        extra: Any = rec
        extra.update(undone)
    _check_built(rec)
    return rec
