"""Every log record kind has a shape (core/records.py), checked where it is built and where it is
read; a record that fails its shape is corruption, and a bug in the fold is a bug.

- Every kind, built by its builder, folds; a builder never builds a malformed record.
- A required field missing, or any field of the wrong type, is BadRecord at the fold naming the
  field, and ``corrupt_wal`` with the record's offset for a workspace whose log holds it.
- The fold's inline check of ``stage`` records (its fast path) agrees with the shape table.
- A bug in the fold (a KeyError, a TypeError) is raised as itself, never as ``corrupt_wal``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from conftest import parse_one_object, run_cli
from hostile import frame
from hypothesis import given
from hypothesis import strategies as st

from agent_2pc import Agent2PC
from agent_2pc.core import records, states
from agent_2pc.core.records import SHAPES, BadRecord, shape_problem
from agent_2pc.core.states import TRANSITIONS, IllegalTransition, Tx, apply_record
from agent_2pc.errors import CorruptWal

TID = "tx-20261202-054400-abcdef"
BLOB = "ab" * 32


def _begin() -> dict[str, Any]:
    return dict(records.begin(TID, label="l", timeout_ms=60_000, boot="b", pid=1))


def _prepare() -> dict[str, Any]:
    return dict(records.prepare(TID, pid=1))


def samples() -> dict[str, tuple[list[dict[str, Any]], dict[str, Any]]]:
    """kind -> (the records before it, a record of that kind with every field it may have)."""
    begun = [_begin()]
    prepared = [*begun, _prepare()]
    decided = [*prepared, dict(records.decision_commit(TID, modes={"0": 0o644}))]
    return {
        "begin": ([], _begin()),
        "read": (begun, dict(records.read(TID, path="a.txt", sha256=BLOB))),
        "stage": (begun, dict(records.stage(TID, path="l", op="symlink", via="exec", blob=None,
                                            size=0, mode=None, pre=None, target="a.txt"))),
        "effect": (begun, dict(records.effect(
            TID, n=0, kind="http", key="k", compensate={"method": "DELETE", "url": "u"},
            request={"method": "POST", "url": "http://x/", "headers": {}, "body": None}))),
        "result": (prepared, dict(records.result(
            TID, phase="effect", n=0, outcome="done", status=200, response={"status": 200},
            error="e", code="c", ticket={"intent": "k"}, replayed=True))),
        "check": (begun, dict(records.check(
            TID, key="k", command="true", options={}, fingerprint=BLOB, passed=True,
            exit_code=0, timed_out=False))),
        "savepoint": (begun, dict(records.savepoint(TID, name="s"))),
        "rollback": ([*begun, dict(records.savepoint(TID, name="s"))],
                     dict(records.rollback(TID, name="s"))),
        "prepare": (begun, _prepare()),
        "vote": (prepared, dict(records.vote(
            TID, pid=1, coordinator={"gtid": "g-1", "store": "postgresql://h/db"},
            decided={"modes": {"0": 0o644}, "git": {"ref": "refs/heads/main", "old": "a",
                                                   "new": "b", "prefix": ""}}))),
        "decision": (prepared, dict(records.decision_commit(
            TID, modes={"0": 0o644}, inline={"0": "aGk="}, placed={"0": ""}, code=None,
            reason=None))),
        "end": (decided, dict(records.end(TID, state="committed", files=["a.txt"],
                                          diverged=["a.txt"], uncompensated=[0]))),
    }


def fold(recs: list[dict[str, Any]]) -> dict[str, Tx]:
    txs: dict[str, Tx] = {}
    for i, rec in enumerate(recs):
        apply_record(txs, rec, str(i).encode())
    return txs


# -- built by its builder, every kind folds ----------------------------------------------------

def test_every_kind_the_fold_knows_has_a_shape() -> None:
    kinds = {kind.partition(":")[0] for kind, _ in TRANSITIONS}
    assert kinds <= set(SHAPES)
    assert set(samples()) == set(SHAPES) - {"log"}  # the header is the log's, not the fold's


@pytest.mark.parametrize("kind", sorted(set(SHAPES) - {"log"}))
def test_every_record_kind_built_by_its_builder_folds(kind: str) -> None:
    before, rec = samples()[kind]
    assert shape_problem(rec) is None
    txs = fold([*before, rec])
    assert txs[TID].frames[-1] == str(len(before)).encode()


def test_a_whole_transaction_built_by_the_builders_folds_to_its_end() -> None:
    b = records
    commit = [b.begin(TID, label=None, timeout_ms=None, boot=None, pid=1),
              b.read(TID, path="r.txt", sha256=None),
              b.stage(TID, path="w.txt", op="write", via="write", blob=BLOB, size=3, mode=0o644,
                      pre=None),
              b.stage(TID, path="d", op="mkdir", via="exec", blob=None, size=0, mode=0o755,
                      pre=None),
              b.savepoint(TID, name="s"),
              b.stage(TID, path="x.txt", op="delete", via="delete", blob=None, size=0,
                      mode=None, pre=BLOB),
              b.rollback(TID, name="s"),
              b.effect(TID, n=0, kind="http", request={"method": "GET", "url": "u"}, key="k",
                       compensate=None),
              b.check(TID, key="c", command=["true"], options={"timeout_ms": None}),
              b.prepare(TID, pid=1),
              b.result(TID, phase="effect", n=0, outcome="done", status=200),
              b.decision_commit(TID, modes={"0": 0o644}),
              b.end(TID, state="committed", files=["d", "w.txt"])]
    tx = fold(records.as_json(commit))[TID]
    assert tx.state == "committed" and [op.path for op in tx.ops] == ["w.txt", "d"]
    assert tx.files == ["d", "w.txt"] and tx.outcome == "commit"
    other = "tx-20261202-054400-000000"
    abort = [b.begin(other, label="x", timeout_ms=5, boot="b", pid=2),
             b.decision_abort(other, code="aborted", reason="by request"),
             b.end(other, state="aborted", uncompensated=[0])]
    tx = fold(records.as_json(abort))[other]
    assert (tx.state, tx.code, tx.reason, tx.uncompensated) == (
        "aborted", "aborted", "by request", [0])


def test_the_log_header_built_by_its_builder_has_its_shape_and_is_read_back() -> None:
    from agent_2pc.storage import wal_format

    rec = records.log_header("ab" * 16, ts=1)
    assert shape_problem(rec) is None
    assert wal_format.read_log_header(wal_format.log_header("ab" * 16, 1)) == (
        "ab" * 16, len(wal_format.encode(dict(rec))))


def test_a_builder_refuses_to_build_a_malformed_record() -> None:
    with pytest.raises(AssertionError, match="'path'"):
        records.stage(TID, path=5, op="write", via="write", blob=BLOB, size=1,  # type: ignore[arg-type]
                      mode=None, pre=None)
    with pytest.raises(AssertionError, match="'outcome'"):
        records.result(TID, phase="effect", n=0, outcome=None)  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="'uncompensated'"):
        records.end(TID, state="aborted", uncompensated=["0"])  # type: ignore[list-item]


def _typed_dicts() -> dict[str, dict[str, tuple[set[str], bool]]]:
    """kind -> field -> (JSON type names, required), read from the TypedDicts in records.py
    (they exist for mypy only: the module defines them under TYPE_CHECKING)."""
    import ast

    with open(records.__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    out: dict[str, dict[str, tuple[set[str], bool]]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name.endswith("Record")
                and node.name != "BadRecord"):
            continue
        fields: dict[str, tuple[set[str], bool]] = {}
        kind = None
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            text = ast.unparse(stmt.annotation)
            if stmt.target.id == "type":
                assert isinstance(stmt.annotation, ast.Subscript)  # Literal["kind"]
                kind = ast.literal_eval(stmt.annotation.slice)
                continue
            required = not text.startswith("NotRequired[")
            if not required:
                text = text[len("NotRequired["):-1]
            names = {part.strip().partition("[")[0] for part in text.split("|")}
            fields[stmt.target.id] = ({"NoneType" if n == "None" else n for n in names},
                                      required)
        assert kind is not None, node.name
        out[kind] = fields
    return out


def test_the_typed_dicts_and_the_shapes_the_fold_checks_say_the_same() -> None:
    typed = _typed_dicts()
    assert set(typed) == set(SHAPES)
    for kind, specs in SHAPES.items():
        shape = {name: ({t.__name__ for t in types}, required)
                 for name, types, required, _ in specs}
        assert shape == typed[kind], kind


# -- missing fields and wrong types are corruption ---------------------------------------------

def _required() -> list[tuple[str, str]]:
    out = [(kind, name) for kind in sorted(samples())
           for name, _, required, _ in (*records._COMMON, *SHAPES[kind]) if required]
    return out


def _wrong_value(types: tuple[type, ...]) -> Any:
    return next(v for v in (5, "5", None, True, 1.5, [1], {"a": 1}) if type(v) not in types)


def _typed() -> list[tuple[str, str, Any]]:
    out = []
    for kind in sorted(samples()):
        for name, types, _, inner in (*records._COMMON, *SHAPES[kind]):
            out.append((kind, name, _wrong_value(types)))
            if isinstance(inner, type):  # a list: one item of the wrong type
                out.append((kind, name, [_wrong_value((inner,))]))
    return out


@pytest.mark.parametrize(("kind", "field"), _required())
def test_a_missing_required_field_is_corruption_naming_it(kind: str, field: str) -> None:
    before, rec = samples()[kind]
    del rec[field]
    txs = fold(before)
    with pytest.raises(BadRecord, match=f"the field '{field}' is missing"):
        apply_record(txs, rec)


@pytest.mark.parametrize(("kind", "field", "value"), _typed())
def test_a_field_of_the_wrong_type_is_corruption_naming_it(kind: str, field: str,
                                                           value: Any) -> None:
    before, rec = samples()[kind]
    rec[field] = value
    txs = fold(before)
    with pytest.raises(BadRecord, match=f"the field '{field}'"):
        apply_record(txs, rec)


def test_a_remote_call_without_its_url_is_corruption() -> None:
    before, rec = samples()["effect"]
    del rec["request"]["url"]
    with pytest.raises(BadRecord, match="in 'request': the field 'url' is missing"):
        apply_record(fold(before), rec)


def test_an_unknown_record_type_is_corruption() -> None:
    with pytest.raises(BadRecord, match="no record type 'abort'"):
        apply_record({}, {"type": "abort", "tid": TID, "ts": 1})


def test_a_bool_is_no_number_and_a_number_no_bool() -> None:
    before, rec = samples()["stage"]
    rec["size"] = True
    with pytest.raises(BadRecord, match="'size' is bool"):
        apply_record(fold(before), rec)
    _, res = samples()["result"]
    res["replayed"] = 1
    assert shape_problem(res) is not None


# -- the stage fast path agrees with the table ---------------------------------------------------

_VALUES = st.sampled_from([None, "", "a.txt", 0, 7, True, 1.5, [], {}])
_STAGE_FIELDS = [name for name, *_ in SHAPES["stage"]]


@given(st.dictionaries(st.sampled_from(_STAGE_FIELDS), _VALUES),
       st.sampled_from([1, "1", None]), st.sampled_from([TID, 5]))
def test_the_folds_inline_stage_check_agrees_with_the_shape(fields: dict[str, Any], ts: Any,
                                                            tid: Any) -> None:
    rec = {"type": "stage", "tid": tid, "ts": ts, **fields}
    txs = fold([_begin()])
    why = shape_problem(rec)
    if why is None:
        assert apply_record(txs, rec).ops[-1].path == rec["path"]
    else:
        with pytest.raises(BadRecord):
            apply_record(txs, rec)


# -- a bug in the fold is a bug ------------------------------------------------------------------

def test_an_illegal_transition_is_still_corruption_of_its_own_kind() -> None:
    _, rec = samples()["read"]
    with pytest.raises(IllegalTransition):
        apply_record({}, rec)


def test_a_bug_in_the_fold_raises_its_own_exception_not_corruption(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kw: Any) -> Any:
        raise KeyError("a bug in the fold")

    monkeypatch.setattr(states, "Op", broken)
    with pytest.raises(KeyError, match="a bug in the fold"):
        fold(list(samples()["stage"][0]) + [samples()["stage"][1]])


def test_a_bug_in_the_fold_is_not_reported_as_corrupt_wal(
        root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = Agent2PC(root)
    tx = client.begin()
    tx.stage_write("a.txt", "a\n")
    client.engine.close()

    def broken(rec: dict[str, Any]) -> str:
        raise TypeError("a bug in the fold")

    monkeypatch.setattr(states, "record_kind", broken)  # asked for decisions and ends
    with pytest.raises(TypeError, match="a bug in the fold"):
        tx.abort()
    with pytest.raises(TypeError, match="a bug in the fold"):
        Agent2PC(root)  # reading the log again meets the same bug
    monkeypatch.undo()
    assert Agent2PC(root).transactions()[0]["state"] == "aborted"


# -- through a workspace: corrupt_wal with the record's offset ---------------------------------

@pytest.mark.parametrize(("kind", "change", "why"), [
    ("stage", {"path": None}, "the field 'path' is null"),
    ("stage", {"op": 1}, "the field 'op' is int"),
    ("begin", {"timeout_ms": "soon"}, "the field 'timeout_ms' is str"),
    ("savepoint", {"name": ["s"]}, "the field 'name' is list"),
    ("begin", {"type": ["begin"]}, "the field 'type' is list"),
    ("read", {"tid": 5}, "the field 'tid' is int"),
])
def test_a_malformed_record_in_a_workspace_is_corrupt_wal_with_its_offset(
        root: str, kind: str, change: dict[str, Any], why: str) -> None:
    client = Agent2PC(root)
    tx = client.begin()
    client.engine.close()
    rec: dict[str, Any] = dict(samples()[kind][1], tid=tx.tid)
    rec.update(change)
    wal = os.path.join(root, ".agent-tx", "wal.bin")
    offset = os.path.getsize(wal)
    with open(wal, "ab") as f:
        f.write(frame(rec))
    with pytest.raises(CorruptWal) as refused:
        Agent2PC(root)
    assert refused.value.details["offset"] == offset
    assert why in str(refused.value)
    proc = run_cli(("status",), json_out=True, root=root)
    out = parse_one_object(proc)
    assert proc.returncode == 2 and out["error"]["code"] == "corrupt_wal", out
    assert out["error"]["offset"] == offset and why in out["error"]["message"], out
