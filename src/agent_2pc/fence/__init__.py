"""The effect fence: exactly-once side effects across threads, processes and hosts.

    from agent_2pc.fence import open_fence, EffectRequest, Fresh, Replay
    fence = open_fence("sqlite:///path/fence.db", lease_ttl=60.0, result_ttl=86400.0)
    adm = fence.prepare(EffectRequest(intent="charge-42", domain="acct:7", tool="stripe.charge",
                                      args={"amount": 500}, agent="agent-a"))
    if isinstance(adm, Fresh):     # run the effect, then record it
        cert = fence.commit(adm.ticket, {"charge": "ch_1"})
    else:                          # Replay: done before; do not run it
        cert = adm.cert

Refusals raise FenceRefusal (``intent_in_flight``, ``intent_fenced``, ``intent_conflict``,
``read_set_stale``, ``domain_race``, ``stale_lease``). docs/fence.md explains the guarantees.

Stores: ``memory://`` (a private ledger; ``memory://NAME`` is shared by name inside the
process), ``sqlite:///abs/path.db`` (every process of one host), ``postgresql://...`` (many
hosts; ``?fence_schema=NAME`` keeps the tables in their own schema). Only the Postgres store
imports psycopg.
"""

from __future__ import annotations

import _thread

from ..errors import UsageError
from ._cert import (
    HMAC_KEY_ENV,
    Certificate,
    chain_problems,
    compare,
    concurrent,
    happened_before,
    verify_chain,
)
from ._fence import Fence
from ._types import AbortResult, EffectRequest, Fresh, Replay, Ticket

__all__ = [
    "AbortResult",
    "Certificate",
    "EffectRequest",
    "Fence",
    "Fresh",
    "HMAC_KEY_ENV",
    "Replay",
    "Ticket",
    "chain_problems",
    "compare",
    "concurrent",
    "happened_before",
    "open_fence",
    "verify_chain",
]

_named_memory: dict[str, object] = {}
_named_lock = _thread.allocate_lock()


def _sqlite_path(url: str) -> str:
    path = url[len("sqlite://"):].split("?", 1)[0]
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if not path:
        raise UsageError(f"no path in the store URL {url!r} (sqlite:///abs/path.db)")
    return path


def open_fence(url: str, lease_ttl: float = 60.0, result_ttl: float = 86400.0, *,
               hmac_key: bytes | str | None = None, schema: str | None = None) -> Fence:
    """Open the fence over the store at ``url`` (times in seconds).

    ``hmac_key`` (else $AGENT2PC_FENCE_HMAC_KEY) signs new certificates. ``schema`` (Postgres
    only) puts the tables in that schema, created when missing.
    """
    if not isinstance(url, str):
        raise UsageError("the store URL must be a string")
    from ._fence import LEASE_TTL_S_MAX, RESULT_TTL_S_MAX, _ttl

    _ttl("lease_ttl", lease_ttl, LEASE_TTL_S_MAX)  # before a store is opened (and leaked)
    _ttl("result_ttl", result_ttl, RESULT_TTL_S_MAX)
    if schema is not None and not url.startswith(("postgresql://", "postgres://")):
        raise UsageError("schema= is for Postgres stores")
    if url.startswith("memory://"):
        from ._memory import MemoryStore

        name = url[len("memory://"):]
        if not name:
            store = MemoryStore(url)
        else:
            with _named_lock:
                store = _named_memory.get(name)  # type: ignore[assignment]
                if store is None:
                    store = _named_memory[name] = MemoryStore(url)
        return Fence(store, lease_ttl=lease_ttl, result_ttl=result_ttl, hmac_key=hmac_key)
    if url.startswith("sqlite://"):
        from ._sqlite import SqliteStore

        return Fence(SqliteStore(url, _sqlite_path(url)), lease_ttl=lease_ttl,
                     result_ttl=result_ttl, hmac_key=hmac_key)
    if url.startswith(("postgresql://", "postgres://")):
        from ._postgres import PostgresStore

        return Fence(PostgresStore(url, schema=schema), lease_ttl=lease_ttl,
                     result_ttl=result_ttl, hmac_key=hmac_key)
    raise UsageError(f"unknown store URL {url!r}: use memory://, sqlite:///path or "
                     "postgresql://...")
