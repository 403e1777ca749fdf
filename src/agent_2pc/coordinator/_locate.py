"""Where the workspace is, and whether this process may change it.

Kept apart from client.py so that a command that only needs the root (``fence``) does not
import the engine. Inside a staged view the workspace is out of reach by design
(docs/staged-view.md): the answer then says so rather than failing somewhere deep inside.
"""

from __future__ import annotations

import os

from ..errors import NotInitialized, WorkspaceReadOnly
from ..storage.workspace import DIRNAME, find_root


def locate_root(explicit: str | None = None, cwd: str | None = None) -> str:
    """``find_root``, saying why when a command in a staged view finds no workspace."""
    try:
        return find_root(explicit, cwd=cwd)
    except NotInitialized as exc:
        view = os.environ.get("AGENT2PC_VIEW")
        if not view:
            raise
        raise NotInitialized(f"{exc.message} (inside a staged view ({view}) the workspace's "
                             f"{DIRNAME}/ is hidden: a check or an exec'd command cannot "
                             "change it; exec stages what the command writes)") from None


def check_writable(root: str) -> None:
    """Refuse a workspace we cannot write (every command may recover or append), with the
    reason rather than an OSError from deep inside: inside a staged view .agent-tx/ is
    read-only by design (docs/staged-view.md)."""
    ws = os.path.join(root, DIRNAME)
    if os.access(ws, os.W_OK):
        return
    view = os.environ.get("AGENT2PC_VIEW")
    why = (f"inside a staged view ({view}), {DIRNAME}/ is read-only: a check or an exec'd "
           "command cannot change the workspace (exec stages what the command writes; run "
           "agent-2pc from outside the view)" if view else
           "a read-only file system, or no permission")
    raise WorkspaceReadOnly(f"the workspace {ws} cannot be written here: {why}", root=root)
