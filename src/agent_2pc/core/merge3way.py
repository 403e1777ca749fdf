"""Three-way text merge, line by line (pure: no I/O).

``merge(base, ours, theirs)`` combines the change from ``base`` to ``ours`` with the change
from ``base`` to ``theirs``. Regions that only one side changed take that side; regions both
changed the same way take it once; regions both changed differently are *conflicts*: the
output holds them between git-style markers (``<<<<<<<`` ours, ``=======``, ``>>>>>>>``
theirs) and the result lists each one's line ranges.

The alignment is the ``merge3`` library's (Breezy's merge) on difflib's matcher, with its
default heuristic: in texts of 200 lines or more, lines that make up more than 1% of them
(blank lines, a lone ``}``) do not anchor a match on their own, only extend one. Without it the
matcher is quadratic in such lines (2 minutes for a 20,000-line file, against 0.3 s). A region
the heuristic leaves unaligned is compared by content, so it can only turn a clean merge into a
conflict, never merge wrongly. merge3 is imported on the first merge only.

Lines are split after ``\\n``, ``\\r\\n`` or a lone ``\\r`` and keep their ending, so CRLF files
merge as they are and a last line without a newline stays without one. A marker that would
follow such a line is put on a line of its own. Content with a NUL byte is binary (git's rule)
and is refused with NotText: a line merge of it would be meaningless.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# difflib's alignment is quadratic at worst: the largest input a merge takes (``merge``), and
# the largest file whose base staging keeps for a merge at commit (a 20,000-line file of 600 KB
# merges in 0.3 s here).
MERGE_BYTES_MAX = 2 * 1024 * 1024
MARKER_OURS, MARKER_MID, MARKER_THEIRS = b"<<<<<<<", b"=======", b">>>>>>>"


class NotText(ValueError):
    """One of the three inputs is binary (``which``: base, ours or theirs)."""

    def __init__(self, which: str) -> None:
        super().__init__(f"{which} is binary (it holds a NUL byte); only text is merged")
        self.which = which


class Span:
    """Lines ``start`` .. ``start + lines - 1`` of a text, 1-based (``lines`` may be 0: an
    empty range just before line ``start``)."""

    __slots__ = ("start", "lines")

    def __init__(self, start: int, lines: int) -> None:
        self.start = start
        self.lines = lines

    def to_json(self) -> dict[str, int]:
        return {"start": self.start, "lines": self.lines}


class Conflict:
    """One region both sides changed differently: its lines in each input, and the lines the
    markers and both sides take in the output."""

    __slots__ = ("base", "ours", "theirs", "output")

    def __init__(self, base: Span, ours: Span, theirs: Span, output: Span) -> None:
        self.base, self.ours, self.theirs, self.output = base, ours, theirs, output

    def to_json(self) -> dict[str, dict[str, int]]:
        return {"base": self.base.to_json(), "ours": self.ours.to_json(),
                "theirs": self.theirs.to_json(), "output": self.output.to_json()}


class Merged:
    """The merged content (markers included when there are conflicts) and the conflicts."""

    __slots__ = ("content", "conflicts")

    def __init__(self, content: bytes, conflicts: list[Conflict]) -> None:
        self.content = content
        self.conflicts = conflicts

    @property
    def clean(self) -> bool:
        return not self.conflicts


def is_binary(data: bytes) -> bool:
    return b"\0" in data


def split_lines(data: bytes) -> list[bytes]:
    """The lines of ``data``, each with its ending (``\\n``, ``\\r\\n`` or ``\\r``)."""
    return data.splitlines(keepends=True)


def _newline(lines: list[bytes]) -> bytes:
    """The line ending the markers take: that of the first line of ``lines`` that has one."""
    for line in lines:
        if line.endswith(b"\r\n"):
            return b"\r\n"
        if line.endswith(b"\n"):
            return b"\n"
        if line.endswith(b"\r"):
            return b"\r"
    return b"\n"


def merge(base: bytes, ours: bytes, theirs: bytes, *, label_ours: str = "ours",
          label_theirs: str = "theirs") -> Merged:
    """Merge the change base -> theirs into ours (symmetrical but for the markers' order and
    labels). NotText when an input is binary."""
    for which, data in (("base", base), ("ours", ours), ("theirs", theirs)):
        if is_binary(data):
            raise NotText(which)
    if ours == theirs or theirs == base:
        return Merged(ours, [])
    if ours == base:
        return Merged(theirs, [])
    import merge3  # ~80 ms with typing: never on the CLI's path of other commands

    b_lines, o_lines, t_lines = split_lines(base), split_lines(ours), split_lines(theirs)
    m = merge3.Merge3(b_lines, o_lines, t_lines)
    nl = _newline(o_lines) if o_lines else _newline(t_lines or b_lines)
    start = MARKER_OURS + (b" " + label_ours.encode("utf-8", "surrogateescape")
                           if label_ours else b"") + nl
    end = MARKER_THEIRS + (b" " + label_theirs.encode("utf-8", "surrogateescape")
                           if label_theirs else b"") + nl
    out: list[bytes] = []
    conflicts: list[Conflict] = []

    def put(lines: list[bytes] | Any, lo: int, hi: int, closed: bool = False) -> None:
        """Append lines[lo:hi]; ``closed``: the last one gets a newline if it has none (a
        marker follows)."""
        for i in range(lo, hi):
            out.append(lines[i])
        if closed and hi > lo and not lines[hi - 1].endswith((b"\n", b"\r")):
            out[-1] = out[-1] + nl

    for region in m.merge_regions():
        what = region[0]
        if what == "unchanged":
            put(b_lines, region[1], region[2])
        elif what in ("a", "same"):
            put(o_lines, region[1], region[2])
        elif what == "b":
            put(t_lines, region[1], region[2])
        else:
            assert what == "conflict" and len(region) == 7, region
            _, z0, z1, a0, a1, b0, b1 = region
            first = len(out) + 1
            out.append(start)
            put(o_lines, a0, a1, closed=True)
            out.append(MARKER_MID + nl)
            put(t_lines, b0, b1, closed=True)
            out.append(end)
            conflicts.append(Conflict(Span(z0 + 1, z1 - z0), Span(a0 + 1, a1 - a0),
                                      Span(b0 + 1, b1 - b0), Span(first, len(out) + 1 - first)))
    return Merged(b"".join(out), conflicts)
