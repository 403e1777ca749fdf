"""One transaction across workspaces and hosts, coordinated through Postgres (docs/distributed.md).

schema.py  the tables (one schema, created idempotently, versioned)
store.py   every SQL statement (psycopg 3, imported here only)
node.py    the serving loop of one workspace: requests in, answers out, in-doubt resolution
coordinator.py  the global transaction (GlobalClient, GlobalTransaction): the library API
"""

from .coordinator import GlobalClient, GlobalTransaction, is_global

__all__ = ["GlobalClient", "GlobalTransaction", "is_global"]
