"""Unified diffs: parse them and apply them to bytes, all or nothing.

Pure: ``apply_patch`` sees files only through the ``read`` callback and returns the changes it
would make; it never writes. Content is handled as bytes end to end, so CRLF line endings and
non-UTF-8 text survive untouched.

A ``Hunk`` line is its one-byte prefix (``b" "``, ``b"-"`` or ``b"+"``) followed by the line's
exact bytes including its terminator; a line the patch marks ``\\ No newline at end of file`` has
no terminator. Joining the bodies of one side therefore gives that side's bytes exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

from ..errors import InvalidPatch, NotFound, PatchRejected

MAX_PATCH_BYTES = 64 * 1024 * 1024
MAX_FILES_PER_PATCH = 10_000
MAX_HUNKS_PER_FILE = 100_000
MAX_LINE_BYTES = 1024 * 1024
# Bounds the work spent looking for the closest partial match when reporting a rejected hunk.
MAX_DIAGNOSTIC_COMPARISONS = 2_000_000
# How much of a line an error message quotes.
QUOTE_CHARS = 120

MODE_REGULAR = 0o100644
MODE_EXECUTABLE = 0o100755
_ACCEPTED_MODES = {0o100644: MODE_REGULAR, 0o100664: MODE_REGULAR, 0o100755: MODE_EXECUTABLE}

_HUNK_HEADER = re.compile(rb"@@ -(\d{1,10})(?:,(\d{1,10}))? \+(\d{1,10})(?:,(\d{1,10}))? @@")
_TRAILING_TIMESTAMP = re.compile(
    rb"\s+(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?: [+-]\d{4})?)\s*$"
)
_TIMESTAMP = re.compile(
    rb"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.\d+)?(?: ([+-])(\d\d)(\d\d))?"
)
_BINARY_NOTICE = re.compile(rb"Binary files (.+) and (.+) differ")
_C_ESCAPES = {
    ord("a"): 7, ord("b"): 8, ord("t"): 9, ord("n"): 10, ord("v"): 11, ord("f"): 12,
    ord("r"): 13, ord('"'): 34, ord("\\"): 92,
}
_DEV_NULL = b"/dev/null"

Read = Callable[[str], bytes | None]
Change = tuple[str, bytes | None, int | None]


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: tuple[bytes, ...]

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_len} +{self.new_start},{self.new_len} @@"

    def old_side(self) -> list[bytes]:
        return [line[1:] for line in self.lines if line[:1] != b"+"]

    def new_side(self) -> list[bytes]:
        return [line[1:] for line in self.lines if line[:1] != b"-"]


@dataclass(frozen=True)
class FilePatch:
    """One file's section of a patch; a ``None`` path is /dev/null (creation or deletion).

    ``new_mode`` is a git mode (0o100644 or 0o100755) or None when the mode does not change.
    ``auto_strip`` marks a plain (non-git) modification or deletion: its paths are as written
    and ``apply_patch`` picks the strip level (0 or 1) by which file exists, patching in place.
    """

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]
    new_mode: int | None = None
    binary: bool = False
    auto_strip: bool = False

    @property
    def display_path(self) -> str:
        return self.new_path or self.old_path or "?"


# -- parsing -----------------------------------------------------------------------------------


def parse_patch(text: str | bytes) -> list[FilePatch]:
    """Parse a unified diff (git-style or plain, one or many files) into file sections.

    Prose before, between and after the file sections is ignored; a text without any file
    section is ``InvalidPatch``. Binary sections parse as ``binary=True`` (apply rejects them).
    """
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
    if len(data) > MAX_PATCH_BYTES:
        raise InvalidPatch(
            f"patch is {len(data)} bytes; the limit is {MAX_PATCH_BYTES} bytes: split it",
            size=len(data), limit=MAX_PATCH_BYTES,
        )
    if not data.strip():
        raise InvalidPatch("patch is empty: expected a unified diff")
    lines = split_lines(data)
    for number, line in enumerate(lines, 1):
        if len(line) > MAX_LINE_BYTES:
            raise InvalidPatch(
                f"line {number} of the patch is {len(line)} bytes long; the limit is "
                f"{MAX_LINE_BYTES} bytes", line=number, limit=MAX_LINE_BYTES,
            )
    files = _Parser(lines).parse()
    if not files:
        raise InvalidPatch(
            "no file sections found in the patch: expected 'diff --git a/PATH b/PATH' or "
            "'--- PATH' followed by '+++ PATH', then '@@ -start,count +start,count @@' hunks"
        )
    return files


class _Parser:
    """A cursor over the patch's lines; ``i`` is the 0-based index of the next line."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines
        self.i = 0
        self.files: list[FilePatch] = []

    def parse(self) -> list[FilePatch]:
        while self.i < len(self.lines):
            line = self.lines[self.i]
            if line.startswith(b"diff --git "):
                self._add(self._git_section())
            elif self._at_plain_header():
                self._add(self._plain_section())
            elif _BINARY_NOTICE.fullmatch(_strip_eol(line)):
                self._add(self._binary_notice())
            elif line.startswith(b"@@ "):
                raise InvalidPatch(
                    f"line {self.i + 1}: hunk header {_quote(line)} is not preceded by a file "
                    f"header ('--- a/PATH' and '+++ b/PATH', or 'diff --git a/PATH b/PATH')",
                    line=self.i + 1,
                )
            else:
                self.i += 1  # prose, commit message, 'index' lines of plain diffs, ...
        return self.files

    def _add(self, fp: FilePatch) -> None:
        self.files.append(fp)
        if len(self.files) > MAX_FILES_PER_PATCH:
            raise InvalidPatch(
                f"patch touches more than {MAX_FILES_PER_PATCH} files: split it",
                limit=MAX_FILES_PER_PATCH,
            )

    def _at_plain_header(self) -> bool:
        i = self.i
        return (i + 1 < len(self.lines) and self.lines[i].startswith(b"--- ")
                and self.lines[i + 1].startswith(b"+++ "))

    def _at_section_start(self) -> bool:
        return self.lines[self.i].startswith(b"diff --git ") or self._at_plain_header()

    def _git_section(self) -> FilePatch:
        start = self.i + 1
        names = _split_git_names(_strip_eol(self.lines[self.i])[len(b"diff --git "):])
        self.i += 1
        meta = self._git_extended_headers()
        if meta.binary:
            while self.i < len(self.lines) and not self._at_section_start():
                self.i += 1
            old, new = names or (None, None)
            return _binary_patch(old, new)
        minus = plus = None
        has_minus_plus = self._at_plain_header()
        if has_minus_plus:
            minus = _header_path(self.lines[self.i], self.i + 1)[0]
            plus = _header_path(self.lines[self.i + 1], self.i + 2)[0]
            self.i += 2
        elif names is None and not (meta.rename_from and meta.rename_to):
            raise InvalidPatch(
                f"line {start}: cannot tell the file names from the 'diff --git' line; add "
                f"'--- a/PATH' and '+++ b/PATH' lines", line=start,
            )
        else:
            minus, plus = names or (None, None)
        where = _display(plus or minus)
        hunks = self._hunks(where)
        if not hunks and not (meta.created or meta.deleted or meta.rename_to or meta.new_mode):
            raise InvalidPatch(
                f"line {start}: the section for {where} changes nothing (no hunks, no mode "
                f"change, no creation, deletion or rename)", line=start, path=where,
            )
        if meta.rename_from and meta.rename_to:
            src = _clean_path(meta.rename_from, start)
            dst = _clean_path(meta.rename_to, start)
            return FilePatch(src, dst, hunks, meta.new_mode)
        return _resolve_paths(minus, plus, meta.created or minus is None,
                              meta.deleted or plus is None, hunks, meta.new_mode, start, True)

    def _git_extended_headers(self) -> _GitMeta:
        meta = _GitMeta()
        while self.i < len(self.lines):
            line = _strip_eol(self.lines[self.i])
            number = self.i + 1
            if line.startswith(b"new file mode "):
                meta.created = True
                meta.new_mode = _parse_mode(line[len(b"new file mode "):], number)
            elif line.startswith(b"deleted file mode "):
                meta.deleted = True
                _parse_mode(line[len(b"deleted file mode "):], number)
            elif line.startswith(b"new mode "):
                meta.new_mode = _parse_mode(line[len(b"new mode "):], number)
            elif line.startswith(b"old mode "):
                _parse_mode(line[len(b"old mode "):], number)
            elif line.startswith(b"rename from "):
                meta.rename_from = _unquote_path(line[len(b"rename from "):])
            elif line.startswith(b"rename to "):
                meta.rename_to = _unquote_path(line[len(b"rename to "):])
            elif line.startswith((b"copy from ", b"copy to ")):
                raise InvalidPatch(
                    f"line {number}: copies ('copy from'/'copy to') are not supported; create "
                    f"the new file with its full content instead", line=number,
                )
            elif line == b"GIT binary patch" or _BINARY_NOTICE.fullmatch(line):
                meta.binary = True
            elif not line.startswith((b"index ", b"similarity index ", b"dissimilarity index ")):
                return meta
            self.i += 1
        return meta

    def _plain_section(self) -> FilePatch:
        start = self.i + 1
        minus, minus_epoch = _header_path(self.lines[self.i], start)
        plus, plus_epoch = _header_path(self.lines[self.i + 1], start + 1)
        self.i += 2
        where = _display(plus or minus)
        hunks = self._hunks(where)
        if not hunks:
            raise InvalidPatch(
                f"line {start}: the section for {where} has no hunks: expected a line like "
                f"'@@ -start,count +start,count @@' after '+++'", line=start, path=where,
            )
        # GNU diff -N marks an absent file with the epoch as its timestamp.
        created = minus is None or (minus_epoch and all(h.old_len == 0 for h in hunks))
        deleted = plus is None or (plus_epoch and all(h.new_len == 0 for h in hunks))
        return _resolve_paths(minus, plus, created, deleted, hunks, None, start, False)

    def _binary_notice(self) -> FilePatch:
        match = _BINARY_NOTICE.fullmatch(_strip_eol(self.lines[self.i]))
        assert match is not None
        self.i += 1
        return _binary_patch(match.group(1), match.group(2))

    def _hunks(self, where: str) -> tuple[Hunk, ...]:
        hunks: list[Hunk] = []
        while self.i < len(self.lines) and self.lines[self.i].startswith(b"@@"):
            hunks.append(self._hunk(where, len(hunks) + 1))
            if len(hunks) > MAX_HUNKS_PER_FILE:
                raise InvalidPatch(
                    f"the section for {where} has more than {MAX_HUNKS_PER_FILE} hunks",
                    path=where, limit=MAX_HUNKS_PER_FILE,
                )
            self._skip_blank_lines_before_hunk()
        if hunks:
            self._check_hunk_end(where, len(hunks), hunks[-1])
        return tuple(hunks)

    def _skip_blank_lines_before_hunk(self) -> None:
        """Hand-written patches often separate hunks with blank lines: allow that."""
        j = self.i
        while j < len(self.lines) and not self.lines[j].strip():
            j += 1
        if j < len(self.lines) and self.lines[j].startswith(b"@@"):
            self.i = j

    def _hunk(self, where: str, index: int) -> Hunk:
        number = self.i + 1
        header_line = self.lines[self.i]
        match = _HUNK_HEADER.match(header_line)
        if match is None:
            raise InvalidPatch(
                f"line {number}: malformed hunk header {_quote(header_line)} in {where}: "
                f"expected '@@ -start,count +start,count @@'", line=number, path=where,
            )
        old_start, new_start = int(match.group(1)), int(match.group(3))
        old_len = 1 if match.group(2) is None else int(match.group(2))
        new_len = 1 if match.group(4) is None else int(match.group(4))
        header = f"@@ -{old_start},{old_len} +{new_start},{new_len} @@"
        self.i += 1
        body: list[bytes] = []
        old_left, new_left = old_len, new_len
        while old_left or new_left:
            line = self.lines[self.i] if self.i < len(self.lines) else b""
            if line in (b"\n", b"\r\n"):
                line = b" " + line  # an empty context line whose space was trimmed
            kind = line[:1]
            if kind == b"\\":
                self._no_newline(body, where, index)
                continue
            fits = {b" ": old_left and new_left, b"-": old_left, b"+": new_left}.get(kind)
            if not fits:
                raise self._count_error(where, index, header, old_len - old_left,
                                        new_len - new_left)
            body.append(line)
            old_left -= kind != b"+"
            new_left -= kind != b"-"
            self.i += 1
        if self.i < len(self.lines) and self.lines[self.i].startswith(b"\\"):
            self._no_newline(body, where, index)
        hunk = Hunk(old_start, old_len, new_start, new_len, tuple(body))
        _check_unterminated_last(hunk, where, index, number)
        return hunk

    def _no_newline(self, body: list[bytes], where: str, index: int) -> None:
        number = self.i + 1
        marker = self.lines[self.i]
        if not body or not body[-1].endswith(b"\n"):
            raise InvalidPatch(
                f"line {number}: '\\ No newline at end of file' in hunk {index} of {where} does "
                f"not follow a hunk line", line=number, path=where, hunk=index,
            )
        crlf_patch = marker.endswith(b"\r\n") and body[-1].endswith(b"\r\n")
        body[-1] = body[-1][:-2] if crlf_patch else body[-1][:-1]
        self.i += 1

    def _count_error(self, where: str, index: int, header: str, old_seen: int,
                     new_seen: int) -> InvalidPatch:
        number = self.i + 1
        found = (f"line {number} is {_quote(self.lines[self.i])}" if self.i < len(self.lines)
                 else "the patch ends")
        return InvalidPatch(
            f"line {number}: hunk {index} of {where} does not match its header {header}: after "
            f"{old_seen} old and {new_seen} new line(s) {found}. Each hunk line starts with ' ', "
            f"'-' or '+'; the header counts the ' ' and '-' lines (old) and the ' ' and '+' "
            f"lines (new)", line=number, path=where, hunk=index, header=header,
        )

    def _check_hunk_end(self, where: str, index: int, hunk: Hunk) -> None:
        """A hunk line right after a complete hunk means the header undercounts."""
        if self.i >= len(self.lines) or self._at_section_start():
            return
        line = self.lines[self.i]
        if line[:1] in (b" ", b"-", b"+") and _strip_eol(line) != b"-- ":  # '-- ' signs emails
            number = self.i + 1
            raise InvalidPatch(
                f"line {number}: {_quote(line)} follows hunk {index} of {where} "
                f"({hunk.header}) but that hunk's header counts are already used up; fix the "
                f"counts", line=number, path=where, hunk=index, header=hunk.header,
            )


@dataclass
class _GitMeta:
    created: bool = False
    deleted: bool = False
    new_mode: int | None = None
    rename_from: bytes | None = None
    rename_to: bytes | None = None
    binary: bool = False


def _check_unterminated_last(hunk: Hunk, where: str, index: int, number: int) -> None:
    """Only the last line of each side may lack its newline."""
    for side in (hunk.old_side(), hunk.new_side()):
        if any(not line.endswith(b"\n") for line in side[:-1]):
            raise InvalidPatch(
                f"line {number}: hunk {index} of {where} marks a line '\\ No newline at end of "
                f"file' that is not the last line of its side", line=number, path=where,
                hunk=index,
            )


def _resolve_paths(minus: bytes | None, plus: bytes | None, created: bool, deleted: bool,
                   hunks: tuple[Hunk, ...], new_mode: int | None, number: int,
                   git: bool) -> FilePatch:
    """Paths for a section; the strip level is fixed here unless it needs the files to decide.

    ``minus`` and ``plus`` are the names as written (None for /dev/null).
    """
    old_name = None if minus is None else _clean_path(minus, number)
    new_name = None if plus is None else _clean_path(plus, number)
    prefixed = _looks_prefixed(old_name, new_name)
    old = None if created else old_name
    new = None if deleted else new_name
    if old is None and new is None:
        raise InvalidPatch(
            f"line {number}: the section neither keeps nor creates a file (both sides are "
            f"/dev/null)", line=number,
        )
    if old is None:
        assert new is not None
        return FilePatch(None, _strip(new, 1) if prefixed else new, hunks, new_mode)
    if git and prefixed:
        return FilePatch(_strip(old, 1), None if new is None else _strip(new, 1), hunks,
                         new_mode)
    return FilePatch(old, new, hunks, new_mode, auto_strip=True)


def _binary_patch(old: bytes | None, new: bytes | None) -> FilePatch:
    def name(raw: bytes | None) -> str | None:
        return None if raw is None or raw == _DEV_NULL else _display(_unquote_path(raw))
    return FilePatch(name(old), name(new), (), binary=True)


def _header_path(line: bytes, number: int) -> tuple[bytes | None, bool]:
    """The name on a '--- ' or '+++ ' line (None for /dev/null) and whether its date is 0."""
    rest = _strip_eol(line)[4:]
    stamp = b""
    if rest.startswith(b'"'):
        name, after = _unquote(rest, number)
        stamp = after.strip()
    elif b"\t" in rest:
        name, stamp = rest.split(b"\t", 1)
    else:
        match = _TRAILING_TIMESTAMP.search(rest)
        name, stamp = (rest[:match.start()], match.group(1)) if match else (rest.rstrip(), b"")
    if name == _DEV_NULL:
        return None, False
    if not name:
        raise InvalidPatch(f"line {number}: no file name after {_quote(line[:3])}", line=number)
    return name, _is_epoch(stamp)


def _is_epoch(stamp: bytes) -> bool:
    match = _TIMESTAMP.match(stamp.strip())
    if match is None:
        return False
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        moment = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
    except ValueError:
        return False
    offset = 0
    if match.group(7):
        offset = (int(match.group(8)) * 60 + int(match.group(9))) * 60
        offset = -offset if match.group(7) == b"-" else offset
    return moment.timestamp() - offset == 0


def _split_git_names(rest: bytes) -> tuple[bytes, bytes] | None:
    """The two names of a 'diff --git' line, or None when spaces make them ambiguous."""
    try:
        if rest.startswith(b'"'):
            first, after = _unquote(rest, 0)
            after = after.lstrip(b" ")
            second = _unquote(after, 0)[0] if after.startswith(b'"') else after
            return first, second
        if b' "' in rest:
            first, after = rest.split(b' "', 1)
            return first, _unquote(b'"' + after, 0)[0]
    except InvalidPatch:
        return None
    spaces = [k for k, byte in enumerate(rest) if byte == 0x20]
    for k in spaces:
        first, second = rest[:k], rest[k + 1:]
        if first.partition(b"/")[2] == second.partition(b"/")[2]:
            return first, second
    if len(spaces) == 1:
        return rest[:spaces[0]], rest[spaces[0] + 1:]
    return None


def _unquote_path(raw: bytes) -> bytes:
    return _unquote(raw, 0)[0] if raw.startswith(b'"') else raw


def _unquote(raw: bytes, number: int) -> tuple[bytes, bytes]:
    """Decode a C-quoted name as git writes it; returns it and the text after the quote."""
    out = bytearray()
    k = 1
    while k < len(raw):
        byte = raw[k]
        if byte == 0x22:  # closing quote
            return bytes(out), raw[k + 1:]
        if byte == 0x5C and k + 1 < len(raw):
            escaped = raw[k + 1]
            if 0x30 <= escaped <= 0x37:
                octal = raw[k + 1:k + 4]
                out.append(int(octal, 8) & 0xFF)
                k += 1 + len(octal)
                continue
            out.append(_C_ESCAPES.get(escaped, escaped))
            k += 2
            continue
        out.append(byte)
        k += 1
    raise InvalidPatch(f"line {number}: unterminated quoted file name {_quote(raw)}", line=number)


def _clean_path(raw: bytes, number: int) -> str:
    """A relative path with '.' and empty components dropped; absolute and '..' are refused."""
    path = _decode(raw)
    if path.startswith("/") or "\\" in path or "\0" in path:
        raise InvalidPatch(
            f"line {number}: file name {path!r} must be a relative path with '/' separators",
            line=number, path=path,
        )
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise InvalidPatch(
            f"line {number}: file name {path!r} contains '..'", line=number, path=path,
        )
    if not parts:
        raise InvalidPatch(f"line {number}: empty file name {path!r}", line=number, path=path)
    return "/".join(parts)


def _parse_mode(raw: bytes, number: int) -> int:
    text = raw.strip()
    if text == b"120000":
        raise InvalidPatch(f"line {number}: symbolic links are not supported", line=number)
    if text == b"160000":
        raise InvalidPatch(f"line {number}: submodules are not supported", line=number)
    mode = int(text, 8) if re.fullmatch(rb"[0-7]{6}", text) else None
    if mode not in _ACCEPTED_MODES:
        raise InvalidPatch(
            f"line {number}: unsupported file mode {_quote(text)}: expected 100644 or 100755",
            line=number,
        )
    return _ACCEPTED_MODES[mode]


# -- applying ----------------------------------------------------------------------------------


def apply_patch(patch: str | bytes | list[FilePatch], read: Read) -> list[Change]:
    """Apply ``patch`` to the files ``read`` returns; all or nothing.

    Returns ``(path, new_content_or_None_for_delete, git_mode_or_None)``, one entry per touched
    path in order of first touch, with the final content after every section. Raises
    ``InvalidPatch`` or ``PatchRejected`` and returns nothing if any part fails.
    """
    files = patch if isinstance(patch, list) else parse_patch(patch)
    view = _View(read)
    for fp in files:
        _apply_file(fp, view)
    return view.changes()


class _View:
    """The caller's files with this patch's earlier sections applied on top."""

    def __init__(self, read: Read) -> None:
        self._read = read
        self._content: dict[str, bytes | None] = {}
        self._modes: dict[str, int] = {}

    def get(self, path: str) -> bytes | None:
        return self._content[path] if path in self._content else self._read(path)

    def put(self, path: str, content: bytes | None, mode: int | None) -> None:
        self._content[path] = content
        if content is None:
            self._modes.pop(path, None)
        elif mode is not None:
            self._modes[path] = mode

    def changes(self) -> list[Change]:
        return [(path, content, self._modes.get(path)) for path, content in self._content.items()]


def _apply_file(fp: FilePatch, view: _View) -> None:
    if fp.binary:
        raise InvalidPatch(
            f"binary patches are not supported ({fp.display_path}): write the file's whole "
            f"content instead", path=fp.display_path,
        )
    old, new = _choose_target(fp, view) if fp.auto_strip else (fp.old_path, fp.new_path)
    if old is None:
        assert new is not None
        if view.get(new) is not None:
            raise PatchRejected(
                f"cannot create {new}: it already exists; patch it with a diff against its "
                f"current content instead", path=new,
            )
        view.put(new, _apply_hunks(new, b"", fp.hunks), fp.new_mode)
        return
    base = view.get(old)
    if base is None:
        raise NotFound(f"cannot patch {old}: the file does not exist", path=old)
    content = _apply_hunks(old, base, fp.hunks)
    if new is None:
        if content:
            remaining = split_lines(content)
            raise PatchRejected(
                f"cannot delete {old}: its hunks leave {len(remaining)} line(s), starting with "
                f"{_quote(remaining[0])}; a deletion must remove the whole content", path=old,
            )
        view.put(old, None, None)
    elif new != old:
        if view.get(new) is not None:
            raise PatchRejected(f"cannot rename {old} to {new}: {new} already exists", path=new)
        view.put(old, None, None)
        view.put(new, content, fp.new_mode)
    else:
        view.put(old, content, fp.new_mode)


def _choose_target(fp: FilePatch, view: _View) -> tuple[str, str | None]:
    """Strip level 0 or 1 for a plain modification or deletion: the one whose file exists."""
    assert fp.old_path is not None
    names = [fp.old_path]
    if fp.new_path is not None and fp.new_path != fp.old_path:
        names.append(fp.new_path)
    levels = (1, 0) if _looks_prefixed(fp.old_path, fp.new_path) else (0, 1)
    tried: list[str] = []
    for level in levels:
        for name in names:
            path = _strip(name, level)
            if path is None or path in tried:
                continue
            tried.append(path)
            if view.get(path) is not None:
                return path, None if fp.new_path is None else path
    raise NotFound(
        f"cannot patch {fp.old_path}: the file does not exist (tried {', '.join(tried)})",
        path=tried[0], tried=tried,
    )


def _looks_prefixed(old: str | None, new: str | None) -> bool:
    """True when the names carry a leading component to strip (a/ b/, or orig/ vs new/)."""
    names = [name for name in (old, new) if name is not None]
    if any("/" not in name for name in names):
        return False
    if old is not None and new is not None and old.split("/")[0] != new.split("/")[0]:
        return True
    return (old is None or old.startswith("a/")) and (new is None or new.startswith("b/"))


def _strip(path: str, level: int) -> str | None:
    parts = path.split("/")
    return "/".join(parts[level:]) if level < len(parts) else None


def _apply_hunks(path: str, content: bytes, hunks: tuple[Hunk, ...]) -> bytes:
    target = _Target(split_lines(content))
    out: list[bytes] = []
    pos = 0  # the first line of the old content not yet copied or replaced
    offset = 0  # where the previous hunk landed relative to where its header said
    for index, hunk in enumerate(hunks, 1):
        old = hunk.old_side()
        at, eol = target.locate(hunk, old, pos, offset)
        if at is None:
            raise _rejection(path, index, hunk, target, old, pos, offset)
        _extend(out, target.lines[pos:at], path, index - 1 or index, hunks)
        _extend(out, target.replacement(hunk, at, eol), path, index, hunks)
        pos = at + len(old)
        offset = at - _stated_index(hunk)
    _extend(out, target.lines[pos:], path, len(hunks), hunks)
    return b"".join(out)


def _extend(out: list[bytes], lines: list[bytes], path: str, index: int,
            hunks: tuple[Hunk, ...]) -> None:
    """Append lines, refusing to glue them onto a line that has no newline at end of file."""
    if lines and out and not out[-1].endswith(b"\n"):
        hunk = hunks[index - 1]
        raise PatchRejected(
            f"hunk {index} of {path} ({hunk.header}) does not apply: it leaves a line without "
            f"a newline ({_quote(out[-1])}) that is not the last line of the file",
            path=path, hunk=index, header=hunk.header,
        )
    out.extend(lines)


def _stated_index(hunk: Hunk) -> int:
    """The 0-based index the header names: insertions go after line old_start."""
    return hunk.old_start if hunk.old_len == 0 else max(hunk.old_start - 1, 0)


class _Target:
    """The lines of one file being patched, with a lazily built line-ending-blind copy."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines
        self._loose: list[bytes] | None = None

    @property
    def loose(self) -> list[bytes]:
        if self._loose is None:
            self._loose = [_loose(line) for line in self.lines]
        return self._loose

    def locate(self, hunk: Hunk, old: list[bytes], lo: int,
               offset: int) -> tuple[int | None, bytes | None]:
        """Where the hunk's old side matches, nearest the stated line first, at or after ``lo``.

        Returns (index, None) for an exact match; (index, eol) for a match that differs only in
        CRLF versus LF line endings, with ``eol`` the ending to give added lines.
        """
        expected = _stated_index(hunk) + offset
        if not old:
            return (expected if lo <= expected <= len(self.lines) else None), None
        at = _search(self.lines, old, lo, expected)
        if at is not None:
            return at, None
        if not (any(b"\r" in line for line in old)
                or any(line.endswith(b"\r\n") for line in self.lines)):
            return None, None
        at = _search(self.loose, [_loose(line) for line in old], lo, expected)
        return at, (self._dominant_eol() if at is not None else None)

    def replacement(self, hunk: Hunk, at: int, eol: bytes | None) -> list[bytes]:
        """The new side of ``hunk`` matched at ``at``: context comes from the file itself."""
        out: list[bytes] = []
        cursor = at
        for line in hunk.lines:
            kind, body = line[:1], line[1:]
            if kind != b"+":
                if kind == b" ":
                    out.append(self.lines[cursor])
                cursor += 1
            elif eol is not None and body.endswith(b"\n"):
                out.append(_loose(body)[:-1] + eol)
            else:
                out.append(body)
        return out

    def _dominant_eol(self) -> bytes:
        crlf = sum(line.endswith(b"\r\n") for line in self.lines)
        lf = sum(line.endswith(b"\n") for line in self.lines) - crlf
        return b"\r\n" if crlf > lf else b"\n"


def _search(lines: list[bytes], old: list[bytes], lo: int, expected: int) -> int | None:
    hi = len(lines) - len(old)
    if hi < lo:
        return None
    first, size = old[0], len(old)
    for at in _outward(min(max(expected, lo), hi), lo, hi):
        if lines[at] == first and lines[at:at + size] == old:
            return at
    return None


def _outward(center: int, lo: int, hi: int) -> Iterator[int]:
    """lo..hi ordered by distance from center, later positions first on ties (as GNU patch)."""
    yield center
    for distance in range(1, max(center - lo, hi - center) + 1):
        if center + distance <= hi:
            yield center + distance
        if center - distance >= lo:
            yield center - distance


def _rejection(path: str, index: int, hunk: Hunk, target: _Target, old: list[bytes],
               lo: int, offset: int) -> PatchRejected:
    """Explain a hunk that fits nowhere: the closest partial match and its first difference."""
    details: dict[str, Any] = {"path": path, "hunk": index, "header": hunk.header}
    prefix = f"hunk {index} of {path} ({hunk.header}) does not apply: "
    lines = target.lines
    expected = _stated_index(hunk) + offset
    if not old:
        after = f" and the previous hunk ends at line {lo}" if lo else ""
        return PatchRejected(
            f"{prefix}it inserts after line {expected} but the file has {len(lines)} "
            f"line(s){after}", line=expected, **details,
        )
    at, matched = _closest(target, old, lo, expected)
    number = at + matched + 1
    want = old[matched]
    found = lines[at + matched] if at + matched < len(lines) else None
    has = "the file ends there" if found is None else f"the file has {_quote(found)}"
    if matched:
        message = (f"its first {matched} line(s) match at line {at + 1}, but at line {number} "
                   f"the hunk expects {_quote(want)} and {has}")
    else:
        scope = f"after line {lo}, where the previous hunk ends" if lo else "in the file"
        message = (f"its first line {_quote(want)} occurs nowhere {scope}; at line {number}, "
                   f"where the header points, {has}")
    if found is not None and found.strip() == want.strip():
        message += " (they differ only in whitespace)"
    return PatchRejected(
        f"{prefix}{message}. Re-read the file and make the patch against its current content",
        line=number, expected=_text(want), found=None if found is None else _text(found),
        **details,
    )


def _closest(target: _Target, old: list[bytes], lo: int, expected: int) -> tuple[int, int]:
    """(index, number of leading hunk lines matching there) of the longest partial match."""
    lines, loose_old = target.loose, [_loose(line) for line in old]
    center = min(max(expected, lo), max(len(lines) - 1, lo))
    best_at, best = center, 0
    budget = MAX_DIAGNOSTIC_COMPARISONS
    for at in _outward(center, lo, len(lines) - 1):
        if budget <= 0:
            break
        matched = 0
        while (matched < len(old) and at + matched < len(lines)
               and lines[at + matched] == loose_old[matched]):
            matched += 1
        budget -= matched + 1
        if matched > best:
            best_at, best = at, matched
    return best_at, min(best, len(old) - 1)


# -- small helpers -----------------------------------------------------------------------------


def split_lines(data: bytes) -> list[bytes]:
    """Lines split on LF only, each keeping its terminator; the last may have none."""
    parts = data.split(b"\n")
    last = parts.pop()
    lines = [part + b"\n" for part in parts]
    if last:
        lines.append(last)
    return lines


def _loose(line: bytes) -> bytes:
    return line[:-2] + b"\n" if line.endswith(b"\r\n") else line


def _strip_eol(line: bytes) -> bytes:
    return line.rstrip(b"\r\n")


def _display(raw: bytes | None) -> str:
    """A file name for messages while parsing: as written, minus a git a/ or b/ prefix."""
    name = _decode(raw or b"?")
    return name[2:] if name.startswith(("a/", "b/")) else name


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _text(line: bytes) -> str:
    return _strip_eol(line).decode("utf-8", "replace")


def _quote(line: bytes) -> str:
    text = _text(line)
    return repr(text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "...")
