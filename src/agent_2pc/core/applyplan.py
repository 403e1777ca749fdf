"""The apply and the redo of a decided commit as a plan: what to do with one staged change,
decided from what stands at its path. Pure (raft's split of deciding from doing): the file
participant (participants/fs.py) looks at the path, asks ``plan_step`` and carries the step out.

What stands at a path is its fingerprint (core/states.py): None (nothing), a regular file's
sha256, ``symlink:`` + the sha256 of a link's target, DIR_FINGERPRINT, or "" for anything no
op puts or that cannot be read as one (a fifo, a device, a parent that is no longer a plain
directory). ``pre`` is what stood there when the path was first staged in the transaction;
``new`` what the op puts (a write's blob, a link's fingerprint, DIR_FINGERPRINT for a mkdir).

The apply right after a decision (``redo`` False) knows what its own prepare saw, under the
same commit lock; a redo (recovery, or an apply that resumes an interrupted one) looks again,
and must be idempotent: what an earlier run already did is taken as done.

delete
  nothing there, nothing there when staged   -> NOTHING     (not reported)
  nothing there, something when staged       -> GONE        (an earlier run deleted it)
  neither what was there when staged         -> DIVERGED    (someone else's; left as it is)
  the directory that was there               -> REMOVE_DIR  (rmdir)
  the file or link that was there            -> REMOVE      (pre-image kept, unlink)
write, symlink, mkdir
  (a write or link for a staged directory expects nothing: the deletes emptied and removed it)
  write:   a redo finds the new content      -> IN_PLACE    (its mode made right)
  symlink: the new link                      -> IN_PLACE
  mkdir:   a directory (anyone's)            -> IN_PLACE    (a redo makes its mode right)
  neither what it expects nor the above      -> DIVERGED
  what it expects                            -> PUT / MAKE_DIR (what stands there, a file or
                                                 link, gives way; its pre-image is kept)
A redo that finds the new content or link in place also drops the copy that prepare placed
beside a target on another file system, if a crash kept it (``placed``).

Found only while doing, so decided there (fs.py): a parent that is no longer a plain directory
(a link swapped in after the decision), or a directory to remove that someone filled, makes a
step DIVERGED too.
"""

from __future__ import annotations

from .states import DIR_FINGERPRINT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn


class Standing:
    """What stands at a path, by the kind of its fingerprint. (Constants, not an Enum: an
    Enum class costs the CLI's start-up a few hundred microseconds.)"""

    ABSENT = "absent"
    FILE = "file"
    LINK = "symlink"
    DIR = "dir"
    OTHER = "other"  # a fifo, a device, or unreadable as a file, link or directory
    ALL = (ABSENT, FILE, LINK, DIR, OTHER)


def standing(fingerprint: str | None) -> str:
    """The Standing of ``fingerprint``."""
    if fingerprint is None:
        return Standing.ABSENT
    if fingerprint == DIR_FINGERPRINT:
        return Standing.DIR
    if fingerprint.startswith("symlink:"):
        return Standing.LINK
    return Standing.FILE if fingerprint else Standing.OTHER


class Action:
    """What a Step does (constants, as Standing)."""

    NOTHING = "nothing"        # a delete of what was never there: not reported
    GONE = "gone"              # a delete an earlier run did: reported, emptied parents pruned
    IN_PLACE = "in_place"      # the path already holds what the op puts
    DIVERGED = "diverged"      # someone outside any transaction changed it: left as it is
    REMOVE = "remove"          # unlink a file or link, its pre-image kept
    REMOVE_DIR = "remove_dir"  # rmdir an (emptied) directory
    PUT = "put"                # rename a file or link over the target
    MAKE_DIR = "make_dir"      # mkdir at the target
    ALL = (NOTHING, GONE, IN_PLACE, DIVERGED, REMOVE, REMOVE_DIR, PUT, MAKE_DIR)


class Step:
    """One decision: ``action``; ``displace``: a file or link stands where a PUT or MAKE_DIR
    goes, and gives way (its pre-image kept first); ``fix_mode``: an IN_PLACE file or directory
    gets its mode; ``drop_placed``: an IN_PLACE target's placed copy goes. Immutable."""

    __slots__ = ("action", "displace", "fix_mode", "drop_placed")
    action: str  # one of Action.ALL
    displace: bool
    fix_mode: bool
    drop_placed: bool

    def __init__(self, action: str, *, displace: bool = False, fix_mode: bool = False,
                 drop_placed: bool = False) -> None:
        assert action in Action.ALL, action
        set_field = object.__setattr__
        set_field(self, "action", action)
        set_field(self, "displace", displace)
        set_field(self, "fix_mode", fix_mode)
        set_field(self, "drop_placed", drop_placed)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"a Step is immutable (tried to set {name})")

    def _key(self) -> tuple[str, bool, bool, bool]:
        return self.action, self.displace, self.fix_mode, self.drop_placed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Step) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        flags = [f for f in ("displace", "fix_mode", "drop_placed") if getattr(self, f)]
        return f"Step({self.action.upper()}{''.join(', ' + f for f in flags)})"


NOTHING = Step(Action.NOTHING)
GONE = Step(Action.GONE)
DIVERGED = Step(Action.DIVERGED)
REMOVE = Step(Action.REMOVE)
REMOVE_DIR = Step(Action.REMOVE_DIR)


def replaces_dir(kind: str, pre: str | None) -> bool:
    """A write or link staged where a directory stood: the deletes before it removed that
    directory (prepare checked that they empty it), so the apply expects nothing there and
    looks again rather than trust what prepare saw."""
    return pre == DIR_FINGERPRINT and kind != "mkdir"


def plan_step(kind: str, new: str | None, pre: str | None, now: str | None, *, redo: bool,
              placed: bool = False) -> Step:
    """What to do with one change of ``kind`` (core/states.py OP_KINDS) that puts ``new``
    where ``pre`` stood when it was staged, now that ``now`` stands there. ``redo``: this run
    does not follow a prepare in this process (recovery, or a commit that resumes an
    interrupted one), so ``now`` was looked at again and an earlier run's work is taken as
    done; ``placed``: prepare put the content beside the target, on its file system."""
    if kind == "delete":
        if now is None:
            return NOTHING if pre is None else GONE
        if now != pre:
            return DIVERGED
        return REMOVE_DIR if now == DIR_FINGERPRINT else REMOVE
    assert kind in ("write", "symlink", "mkdir"), kind
    expected = None if replaces_dir(kind, pre) else pre
    if kind == "write" and redo and now == new:
        return Step(Action.IN_PLACE, fix_mode=True, drop_placed=placed)
    if kind == "symlink" and now == new:
        return Step(Action.IN_PLACE, drop_placed=redo and placed)
    if kind == "mkdir" and now == DIR_FINGERPRINT:
        return Step(Action.IN_PLACE, fix_mode=redo)
    if now != expected:
        return DIVERGED
    return Step(Action.MAKE_DIR if kind == "mkdir" else Action.PUT, displace=now is not None)
