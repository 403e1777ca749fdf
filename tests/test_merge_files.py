"""``merge --base B --ours O --theirs T --output F``: the three-way merge of files, and the pure
merge under it (core/merge3way.py), checked against a naive merge over random cases."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import parse_one_object, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_2pc import Agent2PC
from agent_2pc.core.merge3way import NotText, merge
from agent_2pc.errors import BinaryContent, MergeConflict

BASE = b"".join(b"line %d\n" % i for i in range(1, 21))


def edit(text: bytes, line: int, new: bytes) -> bytes:
    lines = text.splitlines(keepends=True)
    lines[line - 1] = new
    return b"".join(lines)


def files(tmp_path: Path, base: bytes, ours: bytes, theirs: bytes) -> None:
    (tmp_path / "ancestor.rs").write_bytes(base)
    (tmp_path / "committed.rs").write_bytes(ours)
    (tmp_path / "staged.rs").write_bytes(theirs)


def merge_cli(tmp_path: Path, *args: str) -> tuple[int, dict]:
    proc = run_cli(args, json_out=True, cwd=str(tmp_path))
    return proc.returncode, parse_one_object(proc)


def test_the_product_example_merges_non_overlapping_edits_verbatim(tmp_path: Path):
    ours = edit(BASE, 2, b"line two (committed)\n")
    theirs = edit(BASE, 18, b"line eighteen (staged)\n")
    files(tmp_path, BASE, ours, theirs)
    proc = subprocess.run(["agent-2pc", "merge", "--base", "ancestor.rs", "--ours",
                           "committed.rs", "--theirs", "staged.rs", "--output", "merged.rs"],
                          cwd=tmp_path, capture_output=True, timeout=60,
                          env={**os.environ, "PATH": os.path.dirname(_console()) + ":" +
                               os.environ.get("PATH", "")})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "merged.rs").read_bytes() == edit(ours, 18, b"line eighteen (staged)\n")
    status, out = merge_cli(tmp_path, "merge", "--base", "ancestor.rs", "--ours",
                            "committed.rs", "--theirs", "staged.rs", "--output", "m2.rs")
    assert status == 0 and out == {"ok": True, "conflicts": 0, "output": "m2.rs"}


def _console() -> str:
    import sys

    return os.path.join(os.path.dirname(sys.executable), "agent-2pc")


def test_overlapping_edits_exit_1_with_markers_and_the_conflicting_ranges(tmp_path: Path):
    files(tmp_path, BASE, edit(BASE, 5, b"ours five\n"), edit(BASE, 5, b"theirs five\n"))
    status, out = merge_cli(tmp_path, "merge", "--base", "ancestor.rs", "--ours",
                            "committed.rs", "--theirs", "staged.rs", "--output", "merged.rs")
    assert status == 1 and out["ok"] is False
    assert out["error"]["code"] == "merge_conflict" and out["conflicts"] == 1
    assert out["ranges"] == [{"base": {"start": 5, "lines": 1},
                              "ours": {"start": 5, "lines": 1},
                              "theirs": {"start": 5, "lines": 1},
                              "output": {"start": 5, "lines": 5}}]
    merged = (tmp_path / "merged.rs").read_bytes().splitlines()
    assert merged[4:9] == [b"<<<<<<< committed.rs", b"ours five", b"=======", b"theirs five",
                           b">>>>>>> staged.rs"]
    assert merged[:4] == BASE.splitlines()[:4] and merged[9:] == BASE.splitlines()[5:]


def test_a_binary_input_is_refused_and_nothing_is_written(tmp_path: Path):
    files(tmp_path, BASE, b"\x00\x01binary\n", edit(BASE, 3, b"x\n"))
    status, out = merge_cli(tmp_path, "merge", "--base", "ancestor.rs", "--ours",
                            "committed.rs", "--theirs", "staged.rs", "--output", "merged.rs")
    assert status == 2 and out["error"]["code"] == "binary_content"
    assert "--ours committed.rs is binary" in out["error"]["message"]
    assert not (tmp_path / "merged.rs").exists()


def test_a_missing_input_or_an_unwritable_output_is_a_usage_error(tmp_path: Path):
    files(tmp_path, BASE, BASE, BASE)
    status, out = merge_cli(tmp_path, "merge", "--base", "nope.rs", "--ours", "committed.rs",
                            "--theirs", "staged.rs", "--output", "merged.rs")
    assert status == 2 and out["error"]["code"] == "usage" and "nope.rs" in out["error"][
        "message"]
    status, out = merge_cli(tmp_path, "merge", "--base", "ancestor.rs", "--ours",
                            "committed.rs", "--theirs", "staged.rs", "--output",
                            "no/such/dir/merged.rs")
    assert status == 2 and out["error"]["code"] == "usage"
    status, out = merge_cli(tmp_path, "merge", "--base", "ancestor.rs", "--ours", ".",
                            "--theirs", "staged.rs", "--output", "merged.rs")
    assert status == 2 and out["error"]["code"] == "usage"
    status, out = merge_cli(tmp_path, "merge", "--base", "ancestor.rs", "--ours",
                            "committed.rs", "--output", "merged.rs")
    assert status == 2 and out["error"]["code"] == "usage" and "--theirs" in out["error"][
        "message"]
    assert sorted(os.listdir(tmp_path)) == ["ancestor.rs", "committed.rs", "staged.rs"]


def test_crlf_files_merge_with_their_line_endings(tmp_path: Path):
    base = BASE.replace(b"\n", b"\r\n")
    ours = edit(base, 1, b"first\r\n")
    theirs = edit(base, 20, b"last\r\n")
    merged = merge(base, ours, theirs)
    assert merged.clean and merged.content == edit(ours, 20, b"last\r\n")
    conflicted = merge(base, edit(base, 7, b"a\r\n"), edit(base, 7, b"b\r\n"))
    assert b"<<<<<<< ours\r\na\r\n=======\r\nb\r\n>>>>>>> theirs\r\n" in conflicted.content


def test_a_last_line_without_newline_stays_so_and_markers_get_their_own_lines():
    base = b"a\nb\nc"
    merged = merge(base, b"A\nb\nc", b"a\nb\nC")
    assert merged.clean and merged.content == b"A\nb\nC"
    both = merge(base, b"a\nb\nours", b"a\nb\ntheirs")
    assert both.content == b"a\nb\n<<<<<<< ours\nours\n=======\ntheirs\n>>>>>>> theirs\n"
    assert len(both.conflicts) == 1 and both.conflicts[0].ours.start == 3


def test_the_output_may_be_one_of_the_inputs_and_keeps_its_mode(tmp_path: Path):
    ours = edit(BASE, 2, b"two\n")
    files(tmp_path, BASE, ours, edit(BASE, 19, b"nineteen\n"))
    (tmp_path / "committed.rs").chmod(0o755)
    out = Agent2PC.merge_files(tmp_path / "ancestor.rs", tmp_path / "committed.rs",
                               tmp_path / "staged.rs", tmp_path / "committed.rs")
    assert out["conflicts"] == 0
    assert (tmp_path / "committed.rs").read_bytes() == edit(ours, 19, b"nineteen\n")
    assert (tmp_path / "committed.rs").stat().st_mode & 0o777 == 0o755
    assert sorted(os.listdir(tmp_path)) == ["ancestor.rs", "committed.rs", "staged.rs"]


def test_the_library_raises_merge_conflict_and_binary_content(tmp_path: Path):
    files(tmp_path, BASE, edit(BASE, 4, b"x\n"), edit(BASE, 4, b"y\n"))
    p = [tmp_path / n for n in ("ancestor.rs", "committed.rs", "staged.rs", "out.rs")]
    try:
        Agent2PC.merge_files(*p)
    except MergeConflict as exc:
        assert exc.code == "merge_conflict" and exc.exit_status == 1
        assert exc.details["result"]["conflicts"] == 1
    else:
        raise AssertionError("overlapping edits merged without a conflict")
    (tmp_path / "staged.rs").write_bytes(b"\0")
    try:
        Agent2PC.merge_files(*p)
    except BinaryContent as exc:
        assert exc.exit_status == 2
    else:
        raise AssertionError("a binary file was merged")
    try:
        merge(b"a\n", b"a\n", b"\0")
    except NotText as exc:
        assert exc.which == "theirs"


@st.composite
def two_disjoint_edits(draw: st.DrawFn) -> tuple[list[bytes], tuple[int, int, list[bytes]],
                                                 tuple[int, int, list[bytes]]]:
    """A base of distinct lines and two edits (start, end, new lines) with at least one
    unchanged line between them. (Repeated lines make any line merge's alignment a guess,
    git's too.)"""
    n = draw(st.integers(3, 30))
    base = [b"base %d\n" % i for i in range(n)]
    cut = draw(st.integers(1, n - 2))
    a0 = draw(st.integers(0, cut - 1))
    a1 = draw(st.integers(a0, cut - 1))
    b0 = draw(st.integers(cut + 1, n))
    b1 = draw(st.integers(b0, n))
    new_a = [b"ours %d\n" % i for i in range(draw(st.integers(0, 4)))]
    new_b = [b"theirs %d\n" % i for i in range(draw(st.integers(0, 4)))]
    if draw(st.booleans()):  # a last line without its newline
        base[-1] = base[-1].rstrip(b"\n")
        if b1 == n and new_b:
            new_b[-1] = new_b[-1].rstrip(b"\n")
    return base, (a0, a1, new_a), (b0, b1, new_b)


@settings(max_examples=200, deadline=None)
@given(two_disjoint_edits())
def test_edits_apart_merge_to_both_edits_applied_as_a_naive_merge_says(case) -> None:
    base, (a0, a1, new_a), (b0, b1, new_b) = case
    ours = base[:a0] + new_a + base[a1:]
    theirs = base[:b0] + new_b + base[b1:]
    expected = base[:a0] + new_a + base[a1:b0] + new_b + base[b1:]
    merged = merge(b"".join(base), b"".join(ours), b"".join(theirs))
    assert merged.clean, [c.to_json() for c in merged.conflicts]
    assert merged.content == b"".join(expected)
    swapped = merge(b"".join(base), b"".join(theirs), b"".join(ours))
    assert swapped.clean and swapped.content == merged.content


def test_a_large_file_full_of_repeated_lines_merges_edits_far_apart():
    """Past 200 lines difflib stops anchoring on frequent lines (blank lines, ``return y``):
    edits of different functions of a 20,000-line file still merge, to both edits."""
    text = b"".join(b"def f%d(x):\n    y = x + %d\n    return y\n\n" % (i, i)
                    for i in range(5000))
    ours = text.replace(b"    y = x + 4999\n", b"    y = x - 4999\n")
    theirs = text.replace(b"    y = x + 1\n", b"    y = x * 1\n").replace(
        b"    y = x + 2500\n", b"    y = x * 2500\n")
    merged = merge(text, ours, theirs)
    assert merged.clean
    assert merged.content == ours.replace(b"    y = x + 1\n", b"    y = x * 1\n").replace(
        b"    y = x + 2500\n", b"    y = x * 2500\n")
    both = merge(text, ours, text.replace(b"    y = x + 4999\n", b"    y = x / 4999\n"))
    assert [c.ours.start for c in both.conflicts] == [4999 * 4 + 2]
