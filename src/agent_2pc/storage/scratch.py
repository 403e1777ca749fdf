"""Removal of scratch directories and garbage without making anyone wait.

Deleting many files is slow on some file systems (discard mounts), so a large tree is renamed
into ``trash/`` at once and deleted by a detached process. A small one is deleted inline.
"""

from __future__ import annotations

import os

INLINE_ENTRIES_MAX = 64


def _rmtree(path: str) -> None:
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        os.unlink(path)
        return
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            _rmtree(e.path)
        else:
            try:
                os.unlink(e.path)
            except FileNotFoundError:
                pass
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass


def discard(path: str, trash_dir: str) -> None:
    """Make ``path`` disappear now; delete its content now or in the background."""
    try:
        with os.scandir(path) as it:
            entries = [e for _, e in zip(range(INLINE_ENTRIES_MAX + 1), it, strict=False)]
    except FileNotFoundError:
        return
    if len(entries) <= INLINE_ENTRIES_MAX and not any(
            e.is_dir(follow_symlinks=False) for e in entries):
        _rmtree(path)
        return
    target = os.path.join(trash_dir, f"{os.path.basename(path)}-{os.urandom(4).hex()}")
    os.rename(path, target)
    sweep_in_background(trash_dir)


def sweep_in_background(trash_dir: str) -> None:
    """Start a detached process that empties ``trash_dir``.

    The shell starts it in the background and exits at once, so the sweeper belongs to init,
    not to us: no zombie is left in a long-lived caller, and nobody waits for it.
    """
    import subprocess
    import sys

    code = "import sys; from agent_2pc.storage.scratch import empty; empty(sys.argv[1])"
    subprocess.run(["/bin/sh", "-c", '"$0" -c "$1" "$2" </dev/null >/dev/null 2>&1 &',
                    sys.executable, code, trash_dir], check=False, timeout=30)


def empty(trash_dir: str) -> None:
    for e in os.scandir(trash_dir):
        _rmtree(e.path)
