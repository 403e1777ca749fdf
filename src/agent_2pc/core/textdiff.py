"""Render one file's change as a git-style unified diff.

The text round-trips: ``apply_patch`` and ``git apply`` both turn the old content into the new
one exactly (CRLF endings and a missing final newline included). Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Iterator

from .patch import split_lines as _split_lines

CONTEXT_LINES = 3
BINARY_SNIFF_BYTES = 8000
# Above these sizes (of the part left after trimming the common prefix and suffix) the changed
# region is shown as removed whole and added whole instead of being matched line by line.
MAX_MATCHER_LINES = 20_000
MAX_MATCHER_BYTES = 4 * 1024 * 1024
# Lines unique to both sides anchor the match (as in patience diff); difflib's matcher, which
# is quadratic, only runs on the regions between anchors whose size product is below this.
MAX_DIFFLIB_CELLS = 2_000_000

MODE_REGULAR = 0o100644
MODE_EXECUTABLE = 0o100755
MODE_SYMLINK = 0o120000  # git's mode of a symbolic link, whose content is its target
NO_NEWLINE = "\\ No newline at end of file\n"
_C_ESCAPES = {'"': '\\"', "\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}

Opcode = tuple[str, int, int, int, int]


@dataclass(frozen=True)
class FileDiff:
    path: str
    status: str  # "added" | "modified" | "deleted"
    additions: int
    deletions: int
    text: str  # "" when nothing changed
    binary: bool


def diff_file(path: str, old: bytes | None, new: bytes | None, old_mode: int | None = None,
              new_mode: int | None = None) -> FileDiff:
    """The change from ``old`` to ``new`` (None: the file is absent) as a git-style diff.

    Modes may be full st_mode values or permission bits; git knows only 100644, 100755 and
    120000 (a symbolic link: pass S_IFLNK, and the target as content), so any execute bit of
    a file means 100755. A mode change is shown only when both modes are given.
    """
    if old is None and new is None:
        raise AssertionError(f"diff_file({path!r}): the file is absent on both sides")
    status = "added" if old is None else "deleted" if new is None else "modified"
    a_name = "/dev/null" if old is None else _quote_path("a/" + path)
    b_name = "/dev/null" if new is None else _quote_path("b/" + path)
    header = [f"diff --git {_quote_path('a/' + path)} {_quote_path('b/' + path)}\n"]
    header += _mode_lines(status, old_mode, new_mode)
    if not (_is_text(old) and _is_text(new)):
        text = "".join(header) + f"Binary files {a_name} and {b_name} differ\n"
        changed = old != new or len(header) > 1
        return FileDiff(path, status, 0, 0, text if changed else "", True)
    old_lines, new_lines = _split_lines(old or b""), _split_lines(new or b"")
    ops = _opcodes(old_lines, new_lines)
    hunks = [_hunk(group, old_lines, new_lines) for group in _groups(ops)]
    if not hunks and len(header) == 1:
        return FileDiff(path, status, 0, 0, "", False)
    if hunks:
        header += [_file_line("---", a_name), _file_line("+++", b_name)]
    deletions = sum(i2 - i1 for tag, i1, i2, _, _ in ops if tag != "equal")
    additions = sum(j2 - j1 for tag, _, _, j1, j2 in ops if tag != "equal")
    return FileDiff(path, status, additions, deletions, "".join(header) + "".join(hunks), False)


def _mode_lines(status: str, old_mode: int | None, new_mode: int | None) -> list[str]:
    if status == "added":
        return [f"new file mode {_git_mode(new_mode):o}\n"]
    if status == "deleted":
        return [f"deleted file mode {_git_mode(old_mode):o}\n"]
    if old_mode is None or new_mode is None or _git_mode(old_mode) == _git_mode(new_mode):
        return []
    return [f"old mode {_git_mode(old_mode):o}\n", f"new mode {_git_mode(new_mode):o}\n"]


def _git_mode(mode: int | None) -> int:
    if mode is not None and mode & 0o170000 == 0o120000:  # S_IFLNK
        return MODE_SYMLINK
    return MODE_EXECUTABLE if mode is not None and mode & 0o111 else MODE_REGULAR


def _file_line(marker: str, name: str) -> str:
    # git ends a name containing a space with a tab so that parsers know where it stops.
    tab = "\t" if " " in name else ""
    return f"{marker} {name}{tab}\n"


def _is_text(content: bytes | None) -> bool:
    if content is None:
        return True
    if b"\0" in content[:BINARY_SNIFF_BYTES]:
        return False
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _opcodes(a: list[bytes], b: list[bytes]) -> list[Opcode]:
    """difflib-style opcodes (equal/replace/delete/insert) covering the whole of a and b."""
    ops: list[Opcode] = []
    i = j = 0
    for ai, bj, size in _matching_blocks(a, b) + [(len(a), len(b), 0)]:
        if i < ai or j < bj:
            tag = "replace" if i < ai and j < bj else "delete" if i < ai else "insert"
            ops.append((tag, i, ai, j, bj))
        if size and ops and ops[-1][0] == "equal" and ops[-1][2] == ai:
            ops[-1] = ("equal", ops[-1][1], ai + size, ops[-1][3], bj + size)
        elif size:
            ops.append(("equal", ai, ai + size, bj, bj + size))
        i, j = ai + size, bj + size
    return ops


def _matching_blocks(a: list[bytes], b: list[bytes]) -> list[tuple[int, int, int]]:
    """Sorted, disjoint (i, j, size) runs with a[i:i+size] == b[j:j+size]."""
    blocks: list[tuple[int, int, int]] = []
    prefix, suffix = _common_ends(a, b, 0, len(a), 0, len(b))
    blocks.append((0, 0, prefix))
    blocks.append((len(a) - suffix, len(b) - suffix, suffix))
    a_end, b_end = len(a) - suffix, len(b) - suffix
    middle = a[prefix:a_end], b[prefix:b_end]
    if (max(map(len, middle)) > MAX_MATCHER_LINES
            or max(sum(map(len, side)) for side in middle) > MAX_MATCHER_BYTES):
        return [block for block in blocks if block[2]]
    # An explicit stack of regions instead of recursion: nesting depth is data-dependent.
    regions = [(prefix, a_end, prefix, b_end)]
    while regions:
        alo, ahi, blo, bhi = regions.pop()
        head, tail = _common_ends(a, b, alo, ahi, blo, bhi)
        blocks += [(alo, blo, head), (ahi - tail, bhi - tail, tail)]
        alo, blo, ahi, bhi = alo + head, blo + head, ahi - tail, bhi - tail
        if alo == ahi or blo == bhi:
            continue
        anchors = _unique_anchors(a, b, alo, ahi, blo, bhi)
        if not anchors:
            blocks += _difflib_blocks(a, b, alo, ahi, blo, bhi)
            continue
        for i, j in anchors:
            blocks.append((i, j, 1))
            regions.append((alo, i, blo, j))
            alo, blo = i + 1, j + 1
        regions.append((alo, ahi, blo, bhi))
    return sorted(block for block in blocks if block[2])


def _common_ends(a: list[bytes], b: list[bytes], alo: int, ahi: int, blo: int,
                 bhi: int) -> tuple[int, int]:
    """Lengths of the common prefix and (non-overlapping) common suffix of two regions."""
    head = 0
    while alo + head < ahi and blo + head < bhi and a[alo + head] == b[blo + head]:
        head += 1
    tail = 0
    while (tail < min(ahi - alo, bhi - blo) - head
           and a[ahi - 1 - tail] == b[bhi - 1 - tail]):
        tail += 1
    return head, tail


def _unique_anchors(a: list[bytes], b: list[bytes], alo: int, ahi: int, blo: int,
                    bhi: int) -> list[tuple[int, int]]:
    """The longest in-order chain of lines occurring exactly once in each region."""
    seen_a: dict[bytes, int] = {}
    for i in range(alo, ahi):
        seen_a[a[i]] = -1 if a[i] in seen_a else i
    seen_b: dict[bytes, int] = {}
    for j in range(blo, bhi):
        seen_b[b[j]] = -1 if b[j] in seen_b else j
    pairs = sorted((i, seen_b[line]) for line, i in seen_a.items()
                   if i >= 0 and seen_b.get(line, -1) >= 0)
    return _longest_increasing(pairs)


def _longest_increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest subsequence of pairs (sorted by i) whose j values increase (patience)."""
    tops: list[int] = []  # j at the top of each pile
    top_index: list[int] = []  # index into pairs of each pile's top
    back: list[int] = []  # for each pair, the index of its predecessor (-1 for none)
    for index, (_, j) in enumerate(pairs):
        pile = bisect_left(tops, j)
        back.append(top_index[pile - 1] if pile else -1)
        if pile == len(tops):
            tops.append(j)
            top_index.append(index)
        else:
            tops[pile], top_index[pile] = j, index
    chain: list[tuple[int, int]] = []
    index = top_index[-1] if top_index else -1
    while index >= 0:
        chain.append(pairs[index])
        index = back[index]
    return chain[::-1]


def _difflib_blocks(a: list[bytes], b: list[bytes], alo: int, ahi: int, blo: int,
                    bhi: int) -> list[tuple[int, int, int]]:
    """difflib's matching blocks for a small region; none (a coarse replace) for a big one."""
    if (ahi - alo) * (bhi - blo) > MAX_DIFFLIB_CELLS:
        return []
    import difflib

    matcher = difflib.SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
    return [(alo + i, blo + j, size) for i, j, size in matcher.get_matching_blocks() if size]


def _groups(ops: list[Opcode]) -> Iterator[list[Opcode]]:
    """Changes with CONTEXT_LINES of context, merged when their contexts touch (as difflib)."""
    n = CONTEXT_LINES
    codes = list(ops)
    if not codes:
        return
    tag, i1, i2, j1, j2 = codes[0]
    if tag == "equal":
        codes[0] = tag, max(i1, i2 - n), i2, max(j1, j2 - n), j2
    tag, i1, i2, j1, j2 = codes[-1]
    if tag == "equal":
        codes[-1] = tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)
    group: list[Opcode] = []
    for tag, i1, i2, j1, j2 in codes:
        if tag == "equal" and i2 - i1 > 2 * n:
            group.append((tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)))
            yield group
            group = []
            i1, j1 = max(i1, i2 - n), max(j1, j2 - n)
        group.append((tag, i1, i2, j1, j2))
    if any(op[0] != "equal" for op in group):
        yield group


def _hunk(group: list[Opcode], a: list[bytes], b: list[bytes]) -> str:
    """One hunk's text, header first."""
    out = [f"@@ -{_range(group[0][1], group[-1][2])} +{_range(group[0][3], group[-1][4])} @@\n"]
    for tag, i1, i2, j1, j2 in group:
        if tag == "equal":
            out += [_line(" ", line) for line in a[i1:i2]]
        else:
            out += [_line("-", line) for line in a[i1:i2]]
            out += [_line("+", line) for line in b[j1:j2]]
    return "".join(out)


def _range(start: int, stop: int) -> str:
    """A hunk header range as git writes it: 'start,len', 'start' for one line, 0-based empty."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"


def _line(prefix: str, line: bytes) -> str:
    text = line.decode("utf-8")
    return prefix + text if text.endswith("\n") else prefix + text + "\n" + NO_NEWLINE


def _quote_path(name: str) -> str:
    """C-quote a name as git does when it holds quotes, backslashes, controls or bad UTF-8."""
    raw = name.encode("utf-8", "surrogateescape")
    try:
        text, escape_high = raw.decode("utf-8"), False
    except UnicodeDecodeError:
        text, escape_high = raw.decode("latin-1"), True  # one char per byte, each escaped
    escaped = "".join(_escape_char(char, escape_high) for char in text)
    return name if escaped == text else f'"{escaped}"'


def _escape_char(char: str, escape_high: bool) -> str:
    code = ord(char)
    if char in _C_ESCAPES:
        return _C_ESCAPES[char]
    if code < 0x20 or code == 0x7F or (escape_high and code >= 0x80):
        return f"\\{code:03o}"
    return char
