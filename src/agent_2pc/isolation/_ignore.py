"""Ignore rules: which paths of a view are never captured (nor copied into a copy view).

Always ignored: ``.git`` and ``.agent-tx`` at the root, and at any depth the content a commit's
prepare places next to targets on another file system (``.agent-2pc-<tid>-<k>.tmp``,
participants/fs.py). Then each pattern of the configured
list, a glob (``fnmatch``, case-sensitive, ``*`` also crosses ``/``):

- a pattern without ``/`` matches a path component at any depth (``__pycache__``, ``*.pyc``,
  ``node_modules``), like a .gitignore line without a slash;
- a pattern with a ``/`` inside is anchored at the root (``build/out``, ``docs/_build``);
- a leading or trailing ``/`` is dropped (``/dist/`` is ``dist`` anchored at the root).

A path is ignored when it or any of its parent directories matches, so everything below an
ignored directory is ignored with it.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable

ALWAYS = (".git", ".agent-tx")
PLACED_PREFIX, PLACED_SUFFIX = ".agent-2pc-", ".tmp"  # participants/fs.py: placed_name
# What a caller gets when it says nothing: caches that tools rebuild and nobody commits.
DEFAULT_IGNORE = ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis")
PATTERNS_MAX = 1000
PATTERN_CHARS_MAX = 1000


class Ignore:
    __slots__ = ("anywhere", "anchored", "patterns")

    def __init__(self, patterns: Iterable[str] = DEFAULT_IGNORE) -> None:
        if isinstance(patterns, str):
            raise TypeError("ignore patterns are a list of globs, not one string")
        self.patterns = tuple(patterns)
        assert len(self.patterns) <= PATTERNS_MAX, "too many ignore patterns"
        anywhere: list[str] = []
        anchored: list[str] = []
        for p in self.patterns:
            if not isinstance(p, str) or not p.strip("/") or len(p) > PATTERN_CHARS_MAX:
                raise ValueError(f"not an ignore pattern: {p!r}")
            anchor = p.startswith("/") or "/" in p.strip("/")
            (anchored if anchor else anywhere).append(p.strip("/"))
        self.anywhere = tuple(anywhere)
        self.anchored = tuple(anchored)

    def match_one(self, rel: str) -> bool:
        """Does ``rel`` itself match (its parents are assumed not to)? For tree walks that
        stop descending at an ignored directory."""
        if "/" not in rel and rel in ALWAYS:
            return True
        name = rel.rpartition("/")[2]
        if name.startswith(PLACED_PREFIX) and name.endswith(PLACED_SUFFIX):
            return True
        for p in self.anywhere:
            if fnmatchcase(name, p):
                return True
        for p in self.anchored:
            if fnmatchcase(rel, p):
                return True
        return False

    def __call__(self, rel: str) -> bool:
        """Is ``rel`` (a path relative to the root) or one of its parents ignored?"""
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            if self.match_one("/".join(parts[:i])):
                return True
        return False
