"""The participants of a workspace, in the order the engine drives them.

Adding a participant: one module in this package that implements ``base.Participant``, and
one line below (docs/design.md, "Adding a participant"). The order is the order of the votes
and of the applies: the files go first, so that a conflict aborts before any remote call is
made. The git participant goes between them: its prepare writes only objects no ref names; then
Postgres, whose prepared transactions roll back, before the calls that cannot be taken back.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..storage.blobs import BlobStore
    from ..storage.workspace import Layout
    from .base import Participant


def participants_for(layout: Layout, blobs: BlobStore) -> list[Participant]:
    """A new list of the workspace's participants (one engine holds one)."""
    from .api import ApiParticipant
    from .fs import FileParticipant
    from .git import GitParticipant
    from .postgres import PostgresParticipant

    participants: list[Participant] = [
        FileParticipant(layout.root, blobs),
        GitParticipant(layout.root, layout.tx_dir, blobs),
        PostgresParticipant(),
        ApiParticipant.in_workspace(layout.dir),
    ]
    owned = [kind for p in participants for kind in p.kinds]
    assert len(owned) == len(set(owned)), f"two participants own one kind: {owned}"
    return participants
