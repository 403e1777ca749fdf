"""Persistence models: which subsets of a trace's operations a machine crash may leave on disk.

Each model sorts the operations into *streams* whose operations persist in order (a crash
keeps a prefix of each stream), says which barriers force a prefix to be on disk, which
operation needs which other one, and how the last write of a stream may be torn.

``posix`` -- the weakest model POSIX allows (and that real file systems come close to: btrfs
  logs only the fsynced inode; XFS and ext4 with data=writeback expose zeroed blocks):
  every file's content and attributes (writes, truncations, chmod) are one stream, every
  directory's entries another; an fsync makes its own file's stream (or its directory's
  entries) durable up to it and nothing else; streams are independent, so unsynced
  operations are reordered across files freely; a created or renamed name is not durable
  until its directory is fsynced; the last kept write of a file may be torn (a prefix of it,
  cut at a 512-byte sector, or its whole range zeroed: size updated, data not). One
  restriction: a rename across directories may leave both names, never neither (every file
  system journals a rename as one operation).
``ext4`` -- ext4 with data=ordered (the default): every metadata operation (names,
  truncation, chmod) goes through one journal, in order, so a crash keeps a prefix of all of
  them together; file content goes to disk separately (delayed allocation), each file's in
  order, and never ahead of the metadata that precedes it on that file (a write after a
  truncation needs the truncation); a write that extends a file shows only with its new
  size, which is journaled when the data is written back, after every metadata operation
  that came before the write; an fsync commits the journal up to the last metadata
  operation on that inode and the file's content; the last write may be torn at a 4 KiB page.

A sync is a barrier for every stream, a syncfs for every stream of its file system (and, on
the root's, for ext4's journal). A failed fsync or syncfs (EIO) is no barrier, and what it was
to sync is *unsure*: it may be lost even after later fsyncs of the same file succeed (the
kernel marked the pages clean; PostgreSQL's fsyncgate), so a crash may drop each unsure
operation on its own.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

from .fsmodel import Op

SECTOR = 512
PAGE = 4096


@dataclass
class State:
    """A crash state: the operations kept (indices), a torn write, the window of crash points
    it is valid for (``[c_min, c_max]``: the number of operations that had happened)."""

    kept: frozenset[int]
    torn: tuple[int, int, bool] | None = None  # (op index, bytes kept, rest zeroed)
    c_min: int = 0
    c_max: int = 0
    why: str = ""
    rank: int = 9  # how likely it is to break something (checked first when low): see RANKS
    lost_unsure: bool = False  # it drops an operation that a failed fsync was to sync


# The explorer checks states in this order when it cannot check them all: what a crash most
# often exposes first (ALICE's experience: a single missing fsync, a single reordering).
RANKS = {"only what was synced": 0, "all but the unsynced tail of": 1,
         "everything written": 2, "only": 3, "a prefix of": 4, "random": 5}


@dataclass
class Streams:
    """The streams of one model over one trace."""

    members: dict[object, list[int]] = field(default_factory=dict)  # stream -> op indices
    stream_of: dict[int, object] = field(default_factory=dict)
    # per stream: ascending (barrier op index, floor) -- after the barrier, at least ``floor``
    # operations of the stream are on disk
    floors: dict[object, list[tuple[int, int]]] = field(default_factory=dict)
    needs: dict[int, list[int]] = field(default_factory=dict)  # op -> ops it needs kept
    unsure: set[int] = field(default_factory=set)
    barriers: list[int] = field(default_factory=list)

    def add(self, stream: object, i: int) -> None:
        self.members.setdefault(stream, []).append(i)
        self.stream_of[i] = stream

    def floor_at(self, stream: object, c: int) -> int:
        """Operations of ``stream`` that are surely on disk when ``c`` operations happened."""
        fl = self.floors.get(stream)
        if not fl:
            return 0
        k = bisect.bisect_left(fl, (c, -1))  # barriers with index < c
        return fl[k - 1][1] if k else 0

    def count_before(self, stream: object, c: int) -> int:
        return bisect.bisect_left(self.members.get(stream, []), c)

    def floor_up(self, stream: object, at: int, floor: int) -> None:
        fl = self.floors.setdefault(stream, [])
        prev = fl[-1][1] if fl else 0
        if floor > prev:
            fl.append((at, floor))


class Model:
    name = ""

    def streams(self, ops: list[Op]) -> Streams:
        raise NotImplementedError

    def tears(self, op: Op) -> list[tuple[int, bool]]:
        """Ways the write ``op`` may be torn: (bytes kept, rest zeroed)."""
        raise NotImplementedError


def _sync_all(st: Streams, op: Op) -> None:
    """A sync (every stream) or a syncfs (the streams of its file system's inodes, and the
    root's journal when it is the root's file system): a barrier, or, failed, no barrier and
    everything it was to sync unsure."""
    inos = op.info.get("inos")
    for s in list(st.members):
        if inos is not None:
            on = op.info.get("root_dev") if s == "M" else (
                isinstance(s, tuple) and s[1] in inos)  # type: ignore[operator]
            if not on:
                continue
        if op.failed:
            _unsure_before(st, s, op.index)
        else:
            st.floor_up(s, op.index, st.count_before(s, op.index))
    if not op.failed:
        st.barriers.append(op.index)


def _unsure_before(st: Streams, stream: object, at: int) -> None:
    """A failed fsync at ``at``: the stream's operations not yet surely synced are unsure."""
    floor = st.floor_at(stream, at)
    for i in st.members.get(stream, [])[floor:]:
        if i < at:
            st.unsure.add(i)


class Posix(Model):
    name = "posix"

    def streams(self, ops: list[Op]) -> Streams:
        st = Streams()
        for op in ops:
            i = op.index
            if op.kind in ("write", "trunc", "chmod"):
                st.add(("i", op.ino), i)
            elif op.kind in ("link", "unlink", "rename"):
                st.add(("d", op.dir), i)
                if op.kind == "unlink" and op.couple is not None:
                    st.needs.setdefault(i, []).append(op.couple)  # never neither name
            elif op.kind == "fsync":
                targets = [("i", op.ino), ("d", op.ino)]
                for s in targets:
                    if op.failed:
                        _unsure_before(st, s, i)
                    else:
                        st.floor_up(s, i, st.count_before(s, i))
                if not op.failed:
                    st.barriers.append(i)
            elif op.kind == "sync":
                _sync_all(st, op)
        return st

    def tears(self, op: Op) -> list[tuple[int, bool]]:
        n = len(op.data)
        cuts = sorted({c - op.off for c in range((op.off // SECTOR + 1) * SECTOR,
                                                  op.off + n, SECTOR)} | {n // 2})
        cuts = [c for c in cuts if 0 < c < n]
        out = [(cuts[0], False), (cuts[-1], False)] if cuts else []
        if op.info.get("extends"):
            out.append((0, True))  # the size grew, the data did not arrive: zeros
        return list(dict.fromkeys(out))


class Ext4Ordered(Model):
    name = "ext4"

    def streams(self, ops: list[Op]) -> Streams:
        st = Streams()
        last_meta: dict[int, int] = {}  # inode -> index of its last metadata operation
        truncs: dict[int, list[int]] = {}
        meta_before = -1  # the last metadata operation so far
        for op in ops:
            i = op.index
            if op.kind == "write":
                st.add(("w", op.ino), i)
                if truncs.get(op.ino):  # the data of a write after a truncation needs it
                    st.needs.setdefault(i, []).append(truncs[op.ino][-1])
                if op.info.get("extends") and meta_before >= 0:
                    # the new size is journaled when the data is written back, in a later
                    # transaction than every metadata operation before the write
                    st.needs.setdefault(i, []).append(meta_before)
            elif op.kind in ("trunc", "chmod", "link", "unlink", "rename"):
                st.add("M", i)
                meta_before = i
                if op.couple is not None:  # a rename across directories: one journal entry
                    st.needs.setdefault(i, []).append(op.couple)
                for ino in (op.ino, op.dir):
                    if ino is not None:
                        last_meta[ino] = i
                if op.kind == "trunc":
                    truncs.setdefault(op.ino, []).append(i)  # type: ignore[arg-type]
            elif op.kind == "fsync":
                assert op.ino is not None
                if op.failed:
                    _unsure_before(st, ("w", op.ino), i)
                    continue
                st.floor_up(("w", op.ino), i, st.count_before(("w", op.ino), i))
                if op.ino in last_meta:
                    st.floor_up("M", i, st.count_before("M", last_meta[op.ino] + 1))
                st.barriers.append(i)
            elif op.kind == "sync":
                _sync_all(st, op)
        return st

    def tears(self, op: Op) -> list[tuple[int, bool]]:
        n = len(op.data)
        cuts = [c - op.off for c in range((op.off // PAGE + 1) * PAGE, op.off + n, PAGE)]
        cuts = [c for c in cuts if 0 < c < n]
        return [(cuts[0], False), (cuts[-1], False)] if len(cuts) > 1 else \
            [(c, False) for c in cuts]


MODELS: dict[str, Model] = {"ext4": Ext4Ordered(), "posix": Posix()}


class Generator:
    """Crash states of one trace under one model.

    Crash points: just before each barrier and at the end (between two barriers every state
    of an earlier point stays possible, so these points see them all). At each point, every
    stream keeps between its floor and everything it had; when the combinations are more
    than ``per_point_max``, the extremes and single-stream deviations are taken, then random
    ones (seeded).
    """

    def __init__(self, ops: list[Op], model: Model, seed: int = 0,
                 per_point_max: int = 64) -> None:
        self.ops = ops
        self.model = model
        self.st = model.streams(ops)
        self.rng = random.Random(seed)
        self.per_point_max = per_point_max
        self.points = sorted(set(self.st.barriers) | {len(ops)})

    def states(self) -> list[State]:
        out = []
        for c in self.points:
            out.extend(self._at(c))
        return out

    def _ranges(self, c: int) -> dict[object, tuple[int, int]]:
        out = {}
        for s in self.st.members:
            n = self.st.count_before(s, c)
            if n:
                out[s] = (min(self.st.floor_at(s, c), n), n)
        return out

    def _at(self, c: int) -> list[State]:
        ranges = self._ranges(c)
        free = {s: r for s, r in ranges.items() if r[0] < r[1]}
        fixed = {s: r[1] for s, r in ranges.items() if r[0] == r[1]}
        total = 1
        for lo, hi in free.values():
            total *= hi - lo + 1
            if total > self.per_point_max:
                break
        choices: list[tuple[dict[object, int], str]] = []
        self.enumerated = total <= self.per_point_max
        if total <= self.per_point_max:
            choices = [(k, _name(k, free)) for k in _product(free)]
        else:
            top = {s: hi for s, (lo, hi) in free.items()}
            low = {s: lo for s, (lo, hi) in free.items()}
            choices.append((top, "everything written"))
            choices.append((low, "only what was synced"))
            for s, (lo, hi) in free.items():
                choices.append(({**top, s: lo}, f"all but the unsynced tail of {s}"))
                choices.append(({**low, s: hi}, f"only {s} beyond the synced"))
                if hi - lo > 1:
                    for k in range(lo + 1, hi):
                        choices.append(({**top, s: k}, f"a prefix of {s}"))
            while len(choices) < self.per_point_max * 2:
                choices.append(({s: self.rng.randint(lo, hi) for s, (lo, hi) in free.items()},
                                "random"))
        out = []
        seen: set[frozenset[int]] = set()
        for k, why in choices:
            counts = {**fixed, **k}
            counts = self._repair(counts, ranges)
            kept = self._kept(counts)
            for kept2 in self._unsure_variants(kept):
                if kept2 in seen:
                    continue
                seen.add(kept2)
                states = [self._state(kept2, None, c, why),
                          *self._torn(kept2, counts, ranges, c, why)]
                for st in states:
                    st.lost_unsure = kept2 != kept
                out.extend(states)
        return out

    def _kept(self, counts: dict[object, int]) -> frozenset[int]:
        kept: set[int] = set()
        for s, k in counts.items():
            kept.update(self.st.members[s][:k])
        return frozenset(kept)

    def _repair(self, counts: dict[object, int], ranges: dict[object, tuple[int, int]]
                ) -> dict[object, int]:
        """Make the kept set honour ``needs``: cut a stream before an operation whose need is
        not kept, or (when it is below the floor) keep the need."""
        counts = dict(counts)
        for _ in range(64):
            kept = self._kept(counts)
            bad = [(i, r) for i in kept for r in self.st.needs.get(i, []) if r not in kept]
            if not bad:
                return counts
            i, r = min(bad)
            s = self.st.stream_of[i]
            pos = self.st.members[s].index(i)
            if pos >= ranges[s][0]:
                counts[s] = pos
            else:
                rs = self.st.stream_of[r]
                counts[rs] = max(counts.get(rs, 0), self.st.members[rs].index(r) + 1)
        raise AssertionError("needs do not settle")

    def _unsure_variants(self, kept: frozenset[int]) -> list[frozenset[int]]:
        unsure = sorted(kept & self.st.unsure)
        if not unsure:
            return [kept]
        out = [kept, kept - set(unsure)]
        for i in unsure:
            out.append(kept - {i})
        return out

    def _torn(self, kept: frozenset[int], counts: dict[object, int],
              ranges: dict[object, tuple[int, int]], c: int, why: str) -> list[State]:
        """Variants of ``kept`` whose last write of a stream is torn: every one when the
        point is enumerated whole or for "everything written", else one drawn at random."""
        tears = []
        for s, k in counts.items():
            if k == 0 or k <= ranges.get(s, (0, 0))[0]:
                continue  # nothing beyond the floor: the last kept write is whole
            last = self.st.members[s][k - 1]
            if self.ops[last].kind != "write":
                continue
            for n, zero in self.model.tears(self.ops[last]):
                tears.append((s, (last, n, zero)))
        if tears and why != "everything written" and self.enumerated is False:
            tears = [self.rng.choice(tears)]
        return [self._state(kept, t, c, f"{why}; torn {s}") for s, t in tears]

    def _state(self, kept: frozenset[int], torn: tuple[int, int, bool] | None, c: int,
               why: str) -> State:
        c_min = max(kept) + 1 if kept else 0
        # a torn write is not on disk whole: no barrier after it may have happened
        c_max = self._valid_until(kept - {torn[0]} if torn else kept, c)
        rank = next((r for prefix, r in RANKS.items() if why.startswith(prefix)), 5)
        return State(kept, torn, c_min, c_max, why, rank + (1 if torn else 0))

    def _valid_until(self, kept: frozenset[int], c: int) -> int:
        """The largest number of happened operations for which ``kept`` is still possible
        (floors only rise)."""
        limit = len(self.ops)
        for s, fl in self.st.floors.items():
            members = self.st.members.get(s, [])
            have = sum(1 for i in members if i in kept)
            for at, floor in fl:
                if at >= c and floor > have:
                    # the first barrier at or after c that needs more of s than kept
                    need = members[:floor]
                    if not set(need) <= kept | self.st.unsure:
                        limit = min(limit, at)
                    break
        return limit


def _name(k: dict[object, int], free: dict[object, tuple[int, int]]) -> str:
    """What an enumerated choice is, in the words of the sampled ones."""
    low = [s for s, (lo, hi) in free.items() if k[s] == lo]
    top = [s for s, (lo, hi) in free.items() if k[s] == hi]
    if len(low) == len(free):
        return "only what was synced"
    if len(top) == len(free):
        return "everything written"
    if len(low) == 1 and len(top) == len(free) - 1:
        return f"all but the unsynced tail of {low[0]}"
    if len(top) == 1 and len(low) == len(free) - 1:
        return f"only {top[0]} beyond the synced"
    return "random"


def _product(free: dict[object, tuple[int, int]]) -> list[dict[object, int]]:
    out: list[dict[object, int]] = [{}]
    for s, (lo, hi) in free.items():
        out = [{**d, s: k} for d in out for k in range(lo, hi + 1)]
    return out
