"""Certificates are tamper-evident, chain to their parents, and order by vector clock; canonical
JSON follows RFC 8785 (the fast path is checked against the reference encoder)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_2pc.errors import UsageError
from agent_2pc.fence import (
    Certificate,
    EffectRequest,
    chain_problems,
    compare,
    concurrent,
    happened_before,
    verify_chain,
)
from agent_2pc.fence._canon import CanonicalError, canonical, reference

pytestmark = pytest.mark.timeout(60)


def cert(**kw: Any) -> Certificate:
    fields: dict[str, Any] = dict(intent="i1", parent=None, domain="acct", seq=3, tool="charge",
                                  args={"amount": 5}, result={"id": "ch_1"},
                                  vector_clock={"acct": 3, "other": 1},
                                  read_set=[{"domain": "other", "seq": 1}], agent="a")
    fields.update(kw)
    return Certificate.issue(**fields)


# -- tampering ----------------------------------------------------------------------------------

TAMPERED = [
    ("intent", "i2"), ("parent", "0" * 64), ("domain", "acct2"), ("seq", 4), ("seq", "3"),
    ("tool", "refund"), ("args", {"amount": 6}), ("args", {"amount": 5, "x": None}),
    ("result", {"id": "ch_2"}), ("result", None), ("vector_clock", {"acct": 3, "other": 2}),
    ("vector_clock", {"acct": 3}), ("read_set", []), ("read_set", [{"domain": "other", "seq": 2}]),
    ("agent", "b"), ("hash", "0" * 64), ("hash", None), ("hash", "é" * 64),
]


@pytest.mark.parametrize("field,value", TAMPERED, ids=[f"{f}={v!r}"[:40] for f, v in TAMPERED])
def test_tampering_any_certificate_field_fails_verify(field: str, value: Any) -> None:
    good = cert()
    assert good.verify() and good.problems() == []
    bad = good.replace(**{field: value})
    assert not bad.verify()
    assert bad.problems()


def test_tampering_a_signature_or_lacking_the_key_fails_verify() -> None:
    signed = cert(key="k1")
    assert signed.signature and signed.verify(key="k1")
    assert signed.hash == cert().hash  # the signature does not change the hash
    assert not signed.verify(key="k2")
    assert not signed.verify()  # no key at hand: nothing vouches for the signature
    flipped = signed.signature[:-1] + ("0" if signed.signature[-1] != "0" else "1")
    for forged in (flipped, "hmac-sha256:", "nonsense", 5):
        assert not signed.replace(signature=forged).verify(key="k1")
    assert not signed.replace(result="other").verify(key="k1")
    assert cert().sign("k1") == signed


def test_with_a_key_configured_a_certificate_stripped_of_its_signature_does_not_verify(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT2PC_FENCE_HMAC_KEY", raising=False)
    signed = cert(key="k1")
    # The attack: change the result, recompute the hash (anyone can), drop the signature.
    body = dict(signed.body(), result={"id": "ch_forged"})
    forged = Certificate.from_json(dict(body, hash=hashlib.sha256(canonical(body)).hexdigest()))
    assert forged.signature is None and forged.hash != signed.hash
    assert not forged.verify(key="k1")
    assert any("unsigned" in p for p in forged.problems(key="k1"))
    assert not verify_chain([forged], key="k1")
    assert not cert(key="k2").verify(key="k1")  # signed, but with another key
    monkeypatch.setenv("AGENT2PC_FENCE_HMAC_KEY", "k1")  # the key from the environment
    assert not forged.verify() and signed.verify()
    monkeypatch.delenv("AGENT2PC_FENCE_HMAC_KEY")
    assert forged.verify()  # no key anywhere: the hash is all there is to check


def test_certificate_json_roundtrip_keeps_it_verifiable() -> None:
    c = cert(key="k")
    obj = c.to_json()
    assert list(obj) == ["intent", "parent", "domain", "seq", "tool", "args", "result",
                         "vector_clock", "read_set", "agent", "hash", "signature"]
    back = Certificate.from_json(obj)
    assert back == c and back.verify(key="k")
    with pytest.raises(UsageError):
        Certificate.from_json({k: v for k, v in obj.items() if k != "seq"})
    with pytest.raises(UsageError):
        Certificate.from_json({**obj, "extra": 1})
    with pytest.raises(UsageError):
        Certificate.from_json([obj])


def test_certificate_hash_is_sha256_of_canonical_json_of_the_contract_fields() -> None:
    c = cert()
    body = {"intent": "i1", "parent": None, "domain": "acct", "seq": 3, "tool": "charge",
            "args": {"amount": 5}, "result": {"id": "ch_1"},
            "vector_clock": {"acct": 3, "other": 1},
            "read_set": [{"domain": "other", "seq": 1}], "agent": "a"}
    expected = (b'{"agent":"a","args":{"amount":5},"domain":"acct","intent":"i1","parent":null,'
                b'"read_set":[{"domain":"other","seq":1}],"result":{"id":"ch_1"},"seq":3,'
                b'"tool":"charge","vector_clock":{"acct":3,"other":1}}')
    assert canonical(body) == expected
    assert c.hash == hashlib.sha256(expected).hexdigest()


# -- chains -------------------------------------------------------------------------------------


def _chain() -> list[Certificate]:
    a = cert(intent="a", domain="A", seq=1, vector_clock={"A": 1}, read_set=[])
    b = cert(intent="b", domain="B", seq=1, parent=a.hash, vector_clock={"A": 1, "B": 1},
             read_set=[])
    c = cert(intent="c", domain="A", seq=2, parent=b.hash, vector_clock={"A": 2, "B": 1},
             read_set=[])
    return [a, b, c]


def test_chain_verification_accepts_an_intact_chain_and_refuses_a_broken_one() -> None:
    a, b, c = _chain()
    assert verify_chain([a, b, c])
    assert not verify_chain([a, c])              # a link missing
    assert not verify_chain([b, a, c])           # out of order
    assert not verify_chain([b, c])              # does not start at a root ...
    assert verify_chain([b, c], complete=False)  # ... unless asked for a tail only
    assert not verify_chain([a, b.replace(result="x"), c])  # a tampered middle
    assert not verify_chain([])
    assert chain_problems([a, c]) == ["[1] does not name [0] as its parent"]


# -- vector clocks ------------------------------------------------------------------------------


def test_vector_clock_comparison() -> None:
    assert compare({"a": 1}, {"a": 2}) == "before"
    assert compare({"a": 2}, {"a": 1}) == "after"
    assert compare({"a": 1, "b": 0}, {"a": 1}) == "equal"
    assert compare({"a": 1}, {"b": 1}) == "concurrent"
    assert compare({"a": 2, "b": 1}, {"a": 1, "b": 2}) == "concurrent"
    assert happened_before({}, {"a": 1}) and concurrent({"a": 1}, {"b": 1})


clocks = st.dictionaries(st.sampled_from("abcd"), st.integers(1, 4), max_size=4)


@settings(max_examples=300, deadline=None)
@given(clocks, clocks, clocks)
def test_vector_clock_order_is_a_partial_order(x: dict[str, int], y: dict[str, int],
                                                z: dict[str, int]) -> None:
    flip = {"before": "after", "after": "before", "equal": "equal", "concurrent": "concurrent"}
    assert compare(y, x) == flip[compare(x, y)]
    if happened_before(x, y) and happened_before(y, z):
        assert happened_before(x, z)


# -- canonical JSON ------------------------------------------------------------------------------


def test_integer_and_float_spellings_share_a_fingerprint() -> None:
    fp = EffectRequest(intent="x", args={"n": 1, "m": 100, "z": 0}).fingerprint
    assert EffectRequest(intent="x", args={"n": 1.0, "m": 1e2, "z": -0.0}).fingerprint == fp
    assert canonical(1.0) == canonical(1) == b"1"
    assert canonical(1.5) == b"1.5" and canonical(1e21) == b"1e+21"
    assert EffectRequest(intent="x", args={"n": True}).fingerprint != \
        EffectRequest(intent="x", args={"n": 1}).fingerprint  # true is not 1


def test_key_order_does_not_change_the_fingerprint() -> None:
    a = EffectRequest(intent="x", args={"b": 1, "a": {"y": 2, "x": [3, {"q": 1, "p": 2}]}})
    b = EffectRequest(intent="x", args={"a": {"x": [3, {"p": 2, "q": 1}], "y": 2}, "b": 1})
    assert a.fingerprint == b.fingerprint
    assert canonical({"b": 1, "a": 2}) == b'{"a":2,"b":1}'


def test_unicode_is_kept_literal_and_keys_sort_by_utf16_code_units() -> None:
    assert canonical("é€😀") == '"é€😀"'.encode()
    assert canonical("\n\t\"\\\x01\u2028") == b'"\\n\\t\\"\\\\\\u0001\xe2\x80\xa8"'
    # U+1F600 is D83D DE00 in UTF-16, which sorts before U+FFFF (code point order disagrees).
    assert canonical({"\uffff": 1, "\U0001F600": 2}) == '{"😀":2,"\uffff":1}'.encode()
    # No Unicode normalisation: NFC and NFD spellings are different intents' arguments.
    assert canonical("\u00e9") != canonical("e\u0301")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 2**53, -(2**53),
                                   {1: 2}, b"bytes", {1.5}, "\ud800", {"k": object()}])
def test_values_without_a_canonical_form_are_rejected(value: Any) -> None:
    with pytest.raises(CanonicalError):
        canonical(value)


def test_nan_in_arguments_is_bad_input() -> None:
    with pytest.raises(UsageError) as info:
        EffectRequest(intent="x", args={"price": float("nan")})
    assert info.value.code == "usage" and info.value.exit_status == 2


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=20)


@settings(max_examples=500, deadline=None)
@given(json_values)
def test_fast_canonical_json_matches_the_rfc8785_reference(value: Any) -> None:
    try:
        expected = reference(value)
    except CanonicalError:
        with pytest.raises(CanonicalError):
            canonical(value)
        return
    assert canonical(value) == expected


def test_the_worked_example_in_docs_fence_md_is_a_vector() -> None:
    invoice = Certificate.issue(
        intent="invoice-42", parent=None, domain="acct:7", seq=1, tool="stripe.charge",
        args={"amount": 500, "currency": "eur"}, result={"charge": "ch_1"},
        vector_clock={"acct:7": 1}, read_set=[{"domain": "acct:7", "seq": 0}],
        agent="agent-a", key="k3y")
    assert invoice.hash == "701ced7f8e82bb7858878add8618b9d746592a8acef2e7295f69476560b3da34"
    assert invoice.signature == ("hmac-sha256:"
                                 "14944f973159be2e00f273401ba0222cfa2c094d2bc05d582b31c4168282d34b")
    receipt = Certificate.issue(
        intent="receipt-42", parent=invoice.hash, domain="mail", seq=1, tool="smtp.send",
        args={"to": "a@example.com"}, result={"message_id": "m-9"},
        vector_clock={"acct:7": 1, "mail": 1}, read_set=[], agent="agent-b", key="k3y")
    assert receipt.hash == "d1cee3de2075bf4459866e7fd5be36eeb52d80850917ee0767aca205df4aed8a"
    assert verify_chain([invoice, receipt], key="k3y")
