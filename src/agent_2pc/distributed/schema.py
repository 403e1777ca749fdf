"""The tables of the global coordinator, all in one schema (``agent2pc`` by default).

Created idempotently (under an advisory lock, so that nodes and coordinators starting together
do not race on the catalog) and versioned by a row of ``meta``. docs/distributed.md describes
every column.
"""

from __future__ import annotations

import re

SCHEMA_VERSION = 1
DEFAULT_SCHEMA = "agent2pc"
_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{0,47}")
# pg_advisory_xact_lock key of the DDL: any fixed 64-bit number; "A2PCDDL" in ASCII.
DDL_LOCK_KEY = 0x4132504344444C

GTX_STATES = ("active", "preparing", "committed", "aborted")


def check_schema(name: str) -> str:
    """A schema name: lower-case letters, digits and underscores (it is quoted anyway)."""
    from ..errors import UsageError

    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise UsageError(f"the store schema is lower-case letters, digits and underscores, "
                         f"at most 48, not {name!r}")
    return name


def ddl(schema: str) -> list[str]:
    """The statements that create the schema (each idempotent)."""
    s = f'"{check_schema(schema)}"'
    return [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value text NOT NULL)",
        f"INSERT INTO {s}.meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}') "
        "ON CONFLICT (key) DO NOTHING",
        # One row per global transaction. state: active (staging) -> preparing (a coordinator
        # holds the lease and collects votes) -> committed | aborted. The commit point is the
        # one UPDATE to committed, allowed only while the lease holds.
        f"""CREATE TABLE IF NOT EXISTS {s}.gtx (
            gtid text PRIMARY KEY,
            label text,
            created_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz,
            coordinator text,
            lease_until timestamptz,
            state text NOT NULL CHECK (state IN ('active', 'preparing', 'committed',
                                                 'aborted')),
            code text,
            reason text,
            decided_at timestamptz)""",
        # One row per workspace that joined: its local transaction and its vote.
        f"""CREATE TABLE IF NOT EXISTS {s}.gpart (
            gtid text NOT NULL REFERENCES {s}.gtx (gtid) ON DELETE CASCADE,
            workspace text NOT NULL,
            local_tid text NOT NULL,
            joined_at timestamptz NOT NULL DEFAULT now(),
            vote text CHECK (vote IN ('yes', 'no')),
            reason text,
            voted_at timestamptz,
            outcome text CHECK (outcome IN ('committed', 'aborted')),
            done_at timestamptz,
            PRIMARY KEY (gtid, workspace))""",
        # The nodes: one per workspace, alive while its heartbeat is fresh.
        f"""CREATE TABLE IF NOT EXISTS {s}.node (
            name text PRIMARY KEY,
            host text NOT NULL,
            root text NOT NULL,
            pid integer NOT NULL,
            poll_ms integer NOT NULL,
            started_at timestamptz NOT NULL DEFAULT now(),
            heartbeat_at timestamptz NOT NULL DEFAULT now(),
            stopped_at timestamptz)""",
        # The messages: a coordinator inserts, the node takes, runs and answers.
        f"""CREATE TABLE IF NOT EXISTS {s}.request (
            id bigserial PRIMARY KEY,
            rid text NOT NULL UNIQUE,
            gtid text,
            node text NOT NULL,
            kind text NOT NULL,
            params jsonb NOT NULL,
            answer jsonb,
            error jsonb,
            created_at timestamptz NOT NULL DEFAULT now(),
            taken_at timestamptz,
            taken_by integer,
            done_at timestamptz)""",
        f"CREATE INDEX IF NOT EXISTS request_pending ON {s}.request (node, id) "
        "WHERE taken_at IS NULL",
        f"CREATE INDEX IF NOT EXISTS gpart_open ON {s}.gpart (workspace) WHERE done_at IS NULL",
    ]
