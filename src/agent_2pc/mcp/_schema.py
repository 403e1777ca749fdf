"""JSON Schemas of the tools: the input model's, and the output's (success joined with failure).

Every schema is self-contained (no ``$ref``: some clients validate with draft-07 tools that do
not know ``$defs``) and has no ``title`` keys (they cost the model tokens and say nothing the
property names do not).

An output schema reads, for a tool whose success result has fields F:

    {"type": "object",
     "properties": {"ok": boolean, "error": ERROR},
     "required": ["ok"],
     "anyOf": [{"properties": {"ok": {"const": true}, F...},
                "required": ["ok", F required...]},
               {"properties": {"ok": {"const": false}, "error": ERROR},
                "required": ["ok", "error"]}]}

(the failure branch also names tid and state, which a "no" that aborted a transaction carries),
so that both kinds of answer validate: a success, and a "no" (the CLI's exit 1: a conflict, a
failed check, a fence refusal), which is a normal result with ``ok: false``. The root is an
object, as the protocol revisions up to 2025-11-25 require.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Why the answer is no: code (the contract's error code) and message; some "
                   "codes add details (path, matches, ...).",
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
    "required": ["code", "message"],
}
OK_SCHEMA: dict[str, Any] = {
    "type": "boolean", "description": "true: done, with the fields of the success branch; "
                                      "false: the answer is no (see error)"}
# What a "no" may carry besides the error: the transaction it aborted, and the run's result
# for a failed check or exec (exit_code, tail, ...).
FAILURE_EXTRA: dict[str, Any] = {
    "tid": {"type": "string"},
    "state": {"type": "string", "description": "\"aborted\" when the no aborted the "
                                              "transaction"},
}
_NAMED = frozenset({"properties", "$defs", "definitions", "patternProperties"})


def _clean(node: Any, defs: dict[str, Any], named: bool = False, depth: int = 0) -> Any:
    """Inline ``$ref``s into ``defs`` and drop ``title`` keys (not property names)."""
    assert depth < 64, "schema nested too deep (a recursive model?)"
    if isinstance(node, list):
        return [_clean(v, defs, False, depth + 1) for v in node]
    if not isinstance(node, dict):
        return node
    if named:
        return {k: _clean(v, defs, False, depth + 1) for k, v in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str):
        assert ref.startswith("#/$defs/"), ref
        target = _clean(defs[ref[len("#/$defs/"):]], defs, False, depth + 1)
        siblings = {k: _clean(v, defs, k in _NAMED, depth + 1) for k, v in node.items()
                    if k not in ("$ref", "title")}
        return {**target, **siblings}
    return {k: _clean(v, defs, k in _NAMED, depth + 1) for k, v in node.items()
            if k not in ("title", "$defs")}


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON Schema, self-contained and without titles."""
    raw = model.model_json_schema(by_alias=True)
    out: dict[str, Any] = _clean(raw, raw.get("$defs", {}))
    return out


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model_schema(model)
    schema.setdefault("properties", {})
    assert schema.get("type") == "object", model
    return schema


def output_schema(*arms: type[BaseModel]) -> dict[str, Any]:
    """The outputSchema of a tool whose success result is one of ``arms``."""
    assert arms
    branches = []
    for arm in arms:
        schema = model_schema(arm)
        branches.append({"properties": {"ok": {"const": True}, **schema.get("properties", {})},
                         "required": ["ok", *schema.get("required", [])]})
    branches.append({"properties": {"ok": {"const": False}, "error": ERROR_SCHEMA,
                                    **FAILURE_EXTRA},
                     "required": ["ok", "error"]})
    return {"type": "object", "properties": {"ok": OK_SCHEMA, "error": ERROR_SCHEMA},
            "required": ["ok"], "anyOf": branches}
