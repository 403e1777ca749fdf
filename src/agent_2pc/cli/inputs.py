"""What the options name: input files (or ``-`` for stdin) and JSON values.

Every option that reads a file goes through ``open_source`` (sources.py: a missing file, a
directory, a name too long: ``usage``); every option that carries JSON, inline or in a file,
through ``load_json`` (core/jsonin.py: bounded size and depth, UTF-8, no NaN).
"""

from __future__ import annotations

import os

from ..errors import UsageError
from ..sources import open_source

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..errors import Agent2PCError


def read_input(path: str, what: str = "", limit: int | None = None) -> bytes:
    """The bytes of file ``path`` (``-``: standard input); with ``limit``, at most limit + 1
    of them (the caller's own check then finds a larger file too large)."""
    import sys

    fd = sys.stdin.fileno() if path == "-" else open_source(path, what)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read() if limit is None else f.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what or path}: {exc.strerror}", path=path) from None
    finally:
        if path != "-":
            os.close(fd)


def load_json(text: str | None = None, path: str | None = None, what: str = "the value",
              error: Callable[[str], Agent2PCError] = UsageError) -> Any:
    """A JSON value given inline (``text``) or in a file (``path``, ``-`` for stdin)."""
    from ..core.jsonin import JSON_BYTES_MAX, loads

    if path is not None:
        return loads(read_input(path, what, JSON_BYTES_MAX), what, error)
    assert text is not None
    return loads(text, what, error)
