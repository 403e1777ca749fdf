"""The engine drives a list of participants (participants/base.py) without knowing their kinds:
a participant added to the list is asked to vote, carries its fields in the decision, applies,
is undone after an abort, and describes itself in status."""

from __future__ import annotations

from typing import Any

import pytest

from agent_2pc import Agent2PC
from agent_2pc.core.states import Tx
from agent_2pc.errors import TransactionAborted
from agent_2pc.participants.base import YES, Applied, Vote


class Recording:
    """A participant that owns nothing and writes down every call the engine makes."""

    kinds = frozenset({"recording"})

    def __init__(self, name: str, vote: Vote = YES) -> None:
        self.name = name
        self.vote = vote
        self.calls: list[tuple[str, Any]] = []

    def prepare(self, tx: Tx, ctx: Any) -> Vote:
        self.calls.append(("prepare", ctx.tid))
        return self.vote

    def decision_fields(self, tid: str) -> dict[str, Any]:
        self.calls.append(("decision_fields", tid))
        return {f"{self.name}_token": "for a redo"}

    def apply(self, tx: Tx, ctx: Any, redo: bool) -> Applied:
        self.calls.append(("apply", redo))
        return Applied()

    def undo(self, tx: Tx, ctx: Any) -> dict[str, Any]:
        self.calls.append(("undo", tx.tid))
        return {}

    def forget(self, tid: str) -> None:
        self.calls.append(("forget", tid))

    def close(self) -> None:
        self.calls.append(("close", None))

    def describe(self, tx: Tx) -> dict[str, Any]:
        return {self.name: "described"}


def test_a_listed_participant_votes_carries_its_decision_fields_and_applies(tmp_path):
    client = Agent2PC.init(tmp_path)
    extra = Recording("extra")
    client.engine.participants.append(extra)
    tx = client.begin()
    tx.stage_write("a.txt", "new\n")
    assert client.status(tx.tid)["transactions"][0]["extra"] == "described"
    assert tx.commit()["state"] == "committed"
    assert (tmp_path / "a.txt").read_text() == "new\n"
    assert extra.calls == [("prepare", tx.tid), ("decision_fields", tx.tid),
                           ("apply", False)]
    decision = client.engine.txs[tx.tid].decision_fields
    assert decision["extra_token"] == "for a redo" and "modes" in decision
    client.engine.close()
    assert extra.calls[-1] == ("close", None)


def test_a_no_vote_aborts_asks_no_later_participant_and_undoes_every_one(tmp_path):
    client = Agent2PC.init(tmp_path)
    refusing = Recording("refusing", Vote.no("conflict", "the recording says no"))
    later = Recording("later")
    client.engine.participants.extend([refusing, later])
    tx = client.begin()
    tx.stage_write("a.txt", "new\n")
    with pytest.raises(TransactionAborted) as caught:
        tx.commit()
    assert caught.value.code == "conflict" and "the recording says no" in str(caught.value)
    assert not (tmp_path / "a.txt").exists()
    assert ("prepare", tx.tid) not in later.calls
    for participant in (refusing, later):
        assert ("forget", tx.tid) in participant.calls
        assert ("undo", tx.tid) in participant.calls
    assert client.status(tx.tid)["transactions"][0]["state"] == "aborted"


class Notes(Recording):
    """A participant that stages effects of its own kind ("note") through the engine's one
    step for effects, as a new remote participant would (participants/base.py EffectStager)."""

    kinds = frozenset({"note"})

    def check_effect(self, kind: str, args: dict[str, Any]) -> Any:
        from agent_2pc.errors import UsageError

        if not isinstance(args.get("text"), str):
            raise UsageError("a note has a `text`", params=("text",))
        return args["text"]

    def effect_fields(self, tid: str, n: int, checked: Any) -> dict[str, Any]:
        return {"request": {"text": checked}, "key": f"note-{tid}-{n}", "compensate": None}

    def staged_answer(self, effect: dict[str, Any]) -> dict[str, Any]:
        return {"n": effect["n"], "text": effect["request"]["text"]}

    def prepare(self, tx: Tx, ctx: Any) -> Vote:
        self.calls.append(("prepare", [e["request"]["text"] for e in tx.effects
                                       if e["kind"] in self.kinds]))
        return self.vote


def test_a_new_participant_stages_its_own_effects_and_the_api_participant_leaves_them(tmp_path):
    # One class and its place in the list: the engine stages its effects, logs and folds them,
    # and asks it to vote on them; the API participant (kind http) sends none of them.
    client = Agent2PC.init(tmp_path)
    notes = Notes("notes")
    client.engine.participants.append(notes)
    tx = client.begin()
    assert client.engine.stage_effect(tx.tid, "note", {"text": "hello"}) == {
        "n": 0, "text": "hello"}
    with pytest.raises(Exception) as bad:
        client.engine.stage_effect(tx.tid, "note", {"text": 3})
    assert getattr(bad.value, "code", None) == "usage"
    with pytest.raises(Exception) as unknown:
        client.engine.stage_effect(tx.tid, "telegram", {})
    assert getattr(unknown.value, "code", None) == "usage"
    tx.stage_write("a.txt", "new\n")
    assert "effects" not in client.status(tx.tid)["transactions"][0]  # no HTTP call staged
    assert tx.commit()["state"] == "committed"
    assert notes.calls[0] == ("prepare", ["hello"])
    assert client.engine.txs[tx.tid].results == {}  # nothing was sent
