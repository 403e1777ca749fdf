"""From what a caller typed to a path relative to the root, or a refusal.

A path is resolved as the kernel would resolve it today (symlinks followed, ``..`` applied), then
must land inside the root and outside ``.agent-tx/`` and any ``.git``. A symlink inside the root
that points inside the root is followed: staging through it stages its target, as an editor
writing through the link would. Apply re-walks every directory with O_NOFOLLOW, so a symlink
planted after staging is refused then (participants/fs.py).
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import Agent2PCError, NotAFile, PathForbidden, PathOutsideRoot, UsageError

FORBIDDEN_TOP = ".agent-tx"
FORBIDDEN_ANY = ".git"
PATH_BYTES_MAX = 4096
NAME_BYTES_MAX = 255  # a component (Linux's NAME_MAX)


def check_path_text(user_path: object, what: str = "a path") -> str:
    """The checks a path passes before it meets the file system (pure): a non-empty str of
    Unicode text (the log is UTF-8), no NUL, at most PATH_BYTES_MAX bytes and
    NAME_BYTES_MAX per component."""
    if not isinstance(user_path, str) or not user_path:
        raise UsageError(f"{what} is required (a non-empty string)")
    if "\0" in user_path:
        raise UsageError(f"{what} may not contain a NUL byte")
    try:
        encoded = user_path.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not UTF-8 text: {user_path!a}; agent-2pc "
                         "records paths as UTF-8") from None
    if len(encoded) > PATH_BYTES_MAX:
        raise UsageError(f"{what} is longer than {PATH_BYTES_MAX} bytes")
    for part in encoded.split(b"/"):
        if len(part) > NAME_BYTES_MAX:
            raise UsageError(f"{what} has a component longer than {NAME_BYTES_MAX} bytes "
                             f"({part[:40].decode('utf-8', 'replace')}...)")
    return user_path


def path_error(exc: OSError, path: str) -> Agent2PCError:
    """The contract's error for an OSError met while looking up ``path`` in the tree."""
    if exc.errno == errno.ELOOP:
        return NotAFile(f"{path!r} goes through a loop of symbolic links", path=path)
    if exc.errno == errno.ENAMETOOLONG:
        return UsageError(f"{path!r} is too long a name for the file system", path=path)
    return UsageError(f"cannot look up {path!r}: {exc.strerror or exc}", path=path)


def resolve(root: str, user_path: str) -> str:
    """Return ``user_path`` as a normalized POSIX path relative to ``root`` (a real path)."""
    check_path_text(user_path)
    try:
        real = _below_root(root, user_path)
        probe = real is None
        if real is None:
            joined = user_path if os.path.isabs(user_path) else os.path.join(root, user_path)
            real = os.path.realpath(joined)
    except OSError as exc:
        raise path_error(exc, user_path) from None
    if real != root and not real.startswith(root + os.sep):
        raise PathOutsideRoot(f"{user_path!r} resolves to {real}, outside the root {root}",
                              path=user_path)
    if probe:
        _probe(real, user_path)
    rel = os.path.relpath(real, root)
    if rel == ".":
        raise PathForbidden(f"{user_path!r} is the root itself, not a file", path=user_path)
    parts = rel.split(os.sep)
    if parts[0] == FORBIDDEN_TOP or FORBIDDEN_ANY in parts:
        raise PathForbidden(f"{user_path!r} is inside {FORBIDDEN_TOP}/ or .git/, which "
                            "transactions may not change", path=user_path)
    return "/".join(parts)


def resolve_dir(root: str, user_path: str) -> str:
    """A directory for a command to run in: as ``resolve``, but the root itself is allowed
    (returned as ""). Whether it is a directory of the staged view is the view's to check."""
    check_path_text(user_path, "the working directory")
    if os.path.normpath(user_path) == "." or (os.path.isabs(user_path) and
                                              os.path.realpath(user_path) == root):
        return ""
    return resolve(root, user_path)


def _probe(real: str, user_path: str) -> None:
    """realpath leaves a loop of links in the path it returns (and ignores other lookup
    errors): refuse what a lookup of ``real`` meets. Absent is fine (a new file)."""
    try:
        os.stat(real)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        raise path_error(exc, user_path) from None


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
