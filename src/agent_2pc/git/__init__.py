"""agent-2pc and git: the pre-commit gate (hooks.py). docs/git.md is the guide.

Git is driven as a subprocess (``git rev-parse``) with a clean environment, never as a library:
the answer is then git's own (core.hooksPath, worktrees, submodules), whatever its version.
"""
