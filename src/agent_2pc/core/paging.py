"""The pages of ``list`` (library ``transactions``, the daemon's method): the newest LIST_LIMIT
by default, older ones with ``before`` (docs/cli.md, "list")."""

LIST_LIMIT = 100
LIST_LIMIT_MAX = 1_000_000
