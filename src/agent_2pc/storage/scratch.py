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
        count = sum(1 for _ in zip(range(INLINE_ENTRIES_MAX + 1), os.scandir(path)))
    except FileNotFoundError:
        return
    if count <= INLINE_ENTRIES_MAX and not any(
            e.is_dir(follow_symlinks=False) for e in os.scandir(path)):
        _rmtree(path)
        return
    target = os.path.join(trash_dir, f"{os.path.basename(path)}-{os.urandom(4).hex()}")
    os.rename(path, target)
    sweep_in_background(trash_dir)


def sweep_in_background(trash_dir: str) -> None:
    """Start a detached process that empties ``trash_dir``."""
    import subprocess
    import sys

    subprocess.Popen(
        [sys.executable, "-c", "import sys; from agent_2pc.storage.scratch import empty; "
         "empty(sys.argv[1])", trash_dir],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True)


def empty(trash_dir: str) -> None:
    for e in os.scandir(trash_dir):
        _rmtree(e.path)
