"""The staged view: the repo as it would be after commit, for running commands against.

    from agent_2pc.isolation import StagedView

    with StagedView(root, tx.changes(), engine.blobs, scratch_dir=..., trash_dir=...) as view:
        result = view.run("pytest -q", timeout_s=600)      # RunResult
        captured = view.capture()                           # Capture: what the command changed
        for change in captured.changes:                     # Change: path, op, mode, source
            ...                                             # stream change.source before close

Tiers (``TIERS``, best first): ``overlay`` (kernel overlayfs in a private mount namespace),
``fuse-overlayfs``, ``copy``. ``probe_tiers()`` says which the host may have. Errors: an
unavailable tier that was asked for raises ``agent_2pc.errors.IsolationUnavailable``; a bad
argument ``UsageError``, ``PathOutsideRoot`` or ``NotFound``; a damaged blob
``agent_2pc.storage.blobs.BlobCorrupt``. docs/staged-view.md has the guarantees.

A run may be confined and limited: ``view.run(cmd, sandbox=True, network=False)`` runs it
under bubblewrap (``probe_sandbox()`` says whether the host can), ``view.run(cmd,
limits=Limits(procs=64, memory_mb=512, ...))`` under the governor; ``RunResult.sandbox``,
``.tripped`` and ``.governor`` say what confined it and which limit stopped it.
"""

from ._capture import Capture, Change
from ._governor import Limits
from ._ignore import DEFAULT_IGNORE, Ignore
from ._sandbox import probe_sandbox
from ._view import COPY, ENV_TIER, FUSE, OVERLAY, TIERS, RunResult, StagedView, probe_tiers

__all__ = ["COPY", "DEFAULT_IGNORE", "ENV_TIER", "FUSE", "OVERLAY", "TIERS", "Capture", "Change",
           "Ignore", "Limits", "RunResult", "StagedView", "probe_sandbox", "probe_tiers"]
