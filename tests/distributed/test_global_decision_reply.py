"""The commit point's reply can be lost: the decision is read back, never guessed. A connection
cut after the server ran the decision (the reply lost) or before it (the statement lost) ends
with the store and the coordinator agreeing; a lease that expired meanwhile is never revived
into a commit."""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable

import psycopg
import pytest

from agent_2pc.distributed.store import Store


class CutOnce(Store):
    """A store whose next statement loses its connection once: ``after`` the server ran it
    (autocommit: it is done, the reply lost) or before (it never reached the server)."""

    cut: str | None = None  # "after" | "before" | None

    def call(self, fn: Callable[[Any], Any], retry: bool = True) -> Any:
        if self.cut is None:
            return super().call(fn, retry)
        when, self.cut = self.cut, None
        first = [True]

        def cut_once(conn: Any) -> Any:
            if not first[0]:
                return fn(conn)
            first[0] = False
            if when == "after":
                fn(conn)
            conn.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")

        return super().call(cut_once, retry)


@pytest.fixture
def store(store_dsn: str) -> Any:
    schema = f"a2pc_g_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    s = CutOnce(store_dsn, schema)
    try:
        yield s
    finally:
        s.close()
        with psycopg.connect(store_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _preparing(store: CutOnce, lease_ms: int = 30_000) -> str:
    gtid = f"g-test-{uuid.uuid4().hex[:8]}"
    store.gtx_create(gtid, None, 0)
    assert store.start_prepare(gtid, "me", lease_ms)
    return gtid


@pytest.mark.parametrize("when", ["after", "before"])
def test_a_commit_decision_whose_connection_was_cut_is_read_back(store, when):
    gtid = _preparing(store)
    store.cut = when
    assert store.decide_commit(gtid, "me") == "committed"
    assert store.gtx_get(gtid)["state"] == "committed"
    # and an abort afterwards (a node whose lease clock ran out, say) cannot undo it
    assert store.decide_abort(gtid, "timeout", "lease", coordinator="me") == "committed"


@pytest.mark.parametrize("when", ["after", "before"])
def test_an_abort_decision_whose_connection_was_cut_is_read_back(store, when):
    gtid = _preparing(store)
    store.cut = when
    assert store.decide_abort(gtid, "conflict", "a no vote", coordinator="me") == "aborted"
    assert store.decide_commit(gtid, "me") == "aborted"


def test_a_lease_expired_before_the_decision_is_never_revived_into_a_commit(store):
    gtid = _preparing(store, lease_ms=1)
    with psycopg.connect(store.url, autocommit=True) as conn:
        conn.execute("SELECT pg_sleep(0.05)")
    store.cut = "before"
    assert store.decide_commit(gtid, "me") == "preparing"  # not ours to commit any more
    assert not store.renew(gtid, "me", 30_000)
    # anyone may now abort it (the nodes do), and that is final
    assert store.decide_abort(gtid, "timeout", "the lease expired") == "aborted"
    assert store.decide_commit(gtid, "me") == "aborted"
