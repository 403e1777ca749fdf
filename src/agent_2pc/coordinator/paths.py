"""From what a caller typed to a path relative to the root, or a refusal.

A path is resolved as the kernel would resolve it today (symlinks followed, ``..`` applied), then
must land inside the root and outside ``.agent-tx/`` and any ``.git``. A symlink inside the root
that points inside the root is followed: staging through it stages its target, as an editor
writing through the link would. Apply re-walks every directory with O_NOFOLLOW, so a symlink
planted after staging is refused then (participants/fs.py).
"""

from __future__ import annotations

import os
import stat

from ..errors import PathForbidden, PathOutsideRoot, UsageError

FORBIDDEN_TOP = ".agent-tx"
FORBIDDEN_ANY = ".git"
PATH_BYTES_MAX = 4096


def resolve(root: str, user_path: str) -> str:
    """Return ``user_path`` as a normalized POSIX path relative to ``root`` (a real path)."""
    if not isinstance(user_path, str) or not user_path:
        raise UsageError("a path is required")
    if "\0" in user_path:
        raise UsageError("a path may not contain a NUL byte")
    if len(user_path.encode("utf-8", "surrogateescape")) > PATH_BYTES_MAX:
        raise UsageError(f"path longer than {PATH_BYTES_MAX} bytes")
    real = _below_root(root, user_path)
    if real is None:
        joined = user_path if os.path.isabs(user_path) else os.path.join(root, user_path)
        real = os.path.realpath(joined)
    if real != root and not real.startswith(root + os.sep):
        raise PathOutsideRoot(f"{user_path!r} resolves to {real}, outside the root {root}",
                              path=user_path)
    rel = os.path.relpath(real, root)
    if rel == ".":
        raise PathForbidden(f"{user_path!r} is the root itself, not a file", path=user_path)
    parts = rel.split(os.sep)
    if parts[0] == FORBIDDEN_TOP or FORBIDDEN_ANY in parts:
        raise PathForbidden(f"{user_path!r} is inside {FORBIDDEN_TOP}/ or .git/, which "
                            "transactions may not change", path=user_path)
    return "/".join(parts)


def _below_root(root: str, user_path: str) -> str | None:
    """The real path of a relative ``user_path`` without ``..`` whose components below the
    (real) root are no symlinks: what realpath gives, for one lstat per component instead of
    one per component from ``/``. None: ask realpath (a link on the way, ``..``, absolute)."""
    if user_path.startswith("/"):
        return None
    parts = [p for p in user_path.split("/") if p and p != "."]
    if not parts or ".." in parts:
        return None
    path = root
    for i, part in enumerate(parts):
        path = f"{path}/{part}"
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return "/".join([path, *parts[i + 1:]])  # realpath keeps what does not exist
        if stat.S_ISLNK(st.st_mode):
            return None
    return path
