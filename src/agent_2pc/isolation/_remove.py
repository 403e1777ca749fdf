"""Removing a view's scratch without making the caller wait.

A small directory is deleted at once. A large one (an upper dir full of build output, a copy of
the tree) is renamed out of the way at once — into the workspace's trash/ when there is one,
else next to itself — and deleted by a detached process: deleting many files is slow on some
file systems (discard mounts), and nobody should wait for it.
"""

from __future__ import annotations

import os
import stat
import subprocess

INLINE_ENTRIES_MAX = 256
SPAWN_TIMEOUT_S = 30.0


def _small(path: str) -> bool:
    """Does the tree at ``path`` hold at most INLINE_ENTRIES_MAX entries?"""
    n = 0
    stack = [path]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for e in it:
                n += 1
                if n > INLINE_ENTRIES_MAX:
                    return False
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
    return True


def rmtree(path: str) -> None:
    """Delete ``path`` and everything below it; directories without write or search
    permission for us (an overlay work dir is mode 000) are opened up first."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
        os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)
    with os.scandir(path) as it:
        entries = list(it)
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            rmtree(e.path)
        else:
            try:
                os.unlink(e.path)
            except FileNotFoundError:
                pass
    os.rmdir(path)


def delete_in_background(path: str) -> None:
    """Start a detached ``rm -rf`` of ``path``; the shell exits at once, so the deleter
    belongs to init (no zombie in a long-lived caller) and nobody waits for it."""
    # Not root: directories the commands made read-only must be opened up first.
    opener = "" if os.geteuid() == 0 else 'chmod -R u+rwx -- "$0"; '
    script = f'({opener}rm -rf -- "$0") </dev/null >/dev/null 2>&1 &'
    subprocess.run(["/bin/sh", "-c", script, path],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False, timeout=SPAWN_TIMEOUT_S)


def discard(path: str, trash_dir: str | None = None) -> None:
    """Make ``path`` disappear now; delete it now when small, else in the background."""
    if not os.path.lexists(path):
        return
    if _small(path):
        rmtree(path)
        return
    name = f"{os.path.basename(path)}.trash-{os.urandom(4).hex()}"
    aside = os.path.join(trash_dir, name) if trash_dir else os.path.join(
        os.path.dirname(path), name)
    try:
        os.rename(path, aside)
    except OSError:  # another file system than the trash: rename next to itself
        aside = os.path.join(os.path.dirname(path), name)
        os.rename(path, aside)
    delete_in_background(aside)
