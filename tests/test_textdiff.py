"""core/textdiff.py: git-style diffs that round-trip through apply_patch and git apply."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_2pc.core.patch import apply_patch
from agent_2pc.core.textdiff import FileDiff, diff_file


def round_trip(path: str, old: bytes | None, new: bytes | None) -> bytes | None:
    """What apply_patch makes of ``old`` given diff_file's text."""
    changes = apply_patch(diff_file(path, old, new).text, {path: old}.get if old is not None
                          else {}.get)
    assert [change[0] for change in changes] == [path]
    return changes[0][1]


# -- format ------------------------------------------------------------------------------------


def test_modification_is_rendered_git_style_with_three_lines_of_context():
    old = b"".join(b"%d\n" % i for i in range(1, 11))
    new = old.replace(b"5\n", b"five\n")
    assert diff_file("src/n.txt", old, new) == FileDiff(
        path="src/n.txt", status="modified", additions=1, deletions=1, binary=False,
        text="diff --git a/src/n.txt b/src/n.txt\n--- a/src/n.txt\n+++ b/src/n.txt\n"
             "@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n",
    )


def test_distant_changes_make_separate_hunks_and_close_ones_merge():
    old = b"".join(b"%d\n" % i for i in range(1, 31))
    far = diff_file("f", old, old.replace(b"\n2\n", b"\nB\n").replace(b"\n25\n", b"\nY\n"))
    assert [line for line in far.text.splitlines() if line.startswith("@@")] == [
        "@@ -1,5 +1,5 @@", "@@ -22,7 +22,7 @@",
    ]
    near = diff_file("f", old, old.replace(b"\n10\n", b"\nX\n").replace(b"\n16\n", b"\nZ\n"))
    assert [line for line in near.text.splitlines() if line.startswith("@@")] == [
        "@@ -7,13 +7,13 @@",
    ]


def test_creation_uses_dev_null_and_new_file_mode():
    d = diff_file("bin/tool", None, b"#!/bin/sh\n", new_mode=0o755)
    assert (d.status, d.additions, d.deletions) == ("added", 1, 0)
    assert d.text == (
        "diff --git a/bin/tool b/bin/tool\nnew file mode 100755\n--- /dev/null\n"
        "+++ b/bin/tool\n@@ -0,0 +1 @@\n+#!/bin/sh\n"
    )


def test_empty_file_creation_has_only_the_header():
    assert diff_file("e", None, b"").text == "diff --git a/e b/e\nnew file mode 100644\n"


def test_deletion_uses_dev_null_and_deleted_file_mode():
    d = diff_file("f", b"a\nb\n", None, old_mode=0o100644)
    assert (d.status, d.additions, d.deletions) == ("deleted", 0, 2)
    assert d.text == (
        "diff --git a/f b/f\ndeleted file mode 100644\n--- a/f\n+++ /dev/null\n"
        "@@ -1,2 +0,0 @@\n-a\n-b\n"
    )


def test_mode_change_is_shown_with_old_and_new_mode():
    d = diff_file("run", b"x\n", b"x\n", old_mode=0o100644, new_mode=0o100755)
    assert d.text == "diff --git a/run b/run\nold mode 100644\nnew mode 100755\n"
    assert apply_patch(d.text, {"run": b"x\n"}.get) == [("run", b"x\n", 0o100755)]


def test_unchanged_file_gives_empty_text():
    assert diff_file("f", b"same\n", b"same\n") == FileDiff("f", "modified", 0, 0, "", False)
    assert diff_file("f", b"x", b"x", old_mode=0o644, new_mode=0o100644).text == ""


def test_missing_final_newline_gets_the_marker():
    d = diff_file("f", b"a\nb", b"a\nc")
    assert d.text.endswith("-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n")
    assert round_trip("f", b"a\nb", b"a\nc") == b"a\nc"


def test_text_always_ends_with_a_newline():
    for old, new in [(b"a", b"b"), (None, b"x"), (b"x", None), (b"\x00", b"\x01"), (b"a", b"a\n")]:
        assert diff_file("f", old, new).text.endswith("\n")


@pytest.mark.parametrize("old,new", [
    (b"\x00\x01\x02", b"\x00\x01\x03"),
    (b"caf\xe9\n", b"cafe\n"),  # Latin-1: not valid UTF-8
    (None, b"\x89PNG\r\n\x1a\n\x00"),
])
def test_binary_content_is_summarised_without_counts(old: bytes | None, new: bytes):
    d = diff_file("img.bin", old, new)
    assert d.binary and (d.additions, d.deletions) == (0, 0)
    a_name = "/dev/null" if old is None else "a/img.bin"
    assert d.text.endswith(f"Binary files {a_name} and b/img.bin differ\n")


def test_paths_needing_quotes_are_c_quoted_and_round_trip():
    name = 'we"ird\tname\x01.txt'
    d = diff_file(name, b"a\n", b"b\n")
    quoted = '"a/we\\"ird\\tname\\001.txt" "b/we\\"ird\\tname\\001.txt"'
    assert d.text.startswith(f"diff --git {quoted}\n")
    assert round_trip(name, b"a\n", b"b\n") == b"b\n"


def test_paths_with_spaces_and_non_ascii_round_trip():
    for name in ["dir with space/f.txt", "café.txt"]:
        assert round_trip(name, b"a\n", b"b\n") == b"b\n"


def test_importing_textdiff_does_not_load_difflib():
    code = "import sys, agent_2pc.core.textdiff; print('difflib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"


# -- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("old,new", [
    (b"a\r\nb\r\nc\r\n", b"a\r\nB\r\nc\r\n"),
    (b"a\r\nb", b"a\r\nb\r\n"),
    (b"mixed\r\nends\nhere\r\n", b"mixed\nends\r\nhere\r\n"),
    (b"", b"x"),
    (b"x", b""),
    (b"\n\n\n", b"\n\n"),
    (b"lone\rcarriage\n", b"lone\rreturn\n"),
])
def test_crlf_empty_and_odd_line_endings_round_trip(old: bytes, new: bytes):
    assert round_trip("f", old, new) == new


def test_large_inputs_use_a_coarse_diff_that_is_fast_and_round_trips():
    old = b"".join(b"line %d\n" % (i % 997) for i in range(60_000))
    new = b"head\n" + old.replace(b"line 5\n", b"line five\n") + b"tail\n"
    start = time.monotonic()
    d = diff_file("big", old, new)
    assert time.monotonic() - start < 5
    assert d.deletions == 60_000 and d.additions == 60_002  # coarse: all out, all in
    assert round_trip("big", old, new) == new


def test_repetitive_inputs_below_the_cap_stay_fast_and_round_trip():
    old = b"".join(b"}\n" if i % 3 else b"\n" for i in range(15_000))
    new = b"".join(b"\n" if i % 4 else b"}\n" for i in range(15_000))
    start = time.monotonic()
    assert round_trip("rep", old, new) == new
    assert time.monotonic() - start < 5


def test_common_prefix_and_suffix_are_trimmed_before_matching():
    old = b"".join(b"line %d\n" % i for i in range(100_000))
    new = old.replace(b"line 50000\n", b"changed\n")
    d = diff_file("big", old, new)
    assert (d.additions, d.deletions) == (1, 1)
    assert "@@ -49998,7 +49998,7 @@" in d.text


line_body = st.sampled_from([b"a", b"b", b"c", b"", b"x y", b"  indented", b"\xc3\xa9"])
ending = st.sampled_from([b"\n", b"\r\n"])
def _drop_final_newline(data: bytes, drop: bool) -> bytes:
    return data[:-1] if drop and data.endswith(b"\n") else data


side = st.one_of(
    st.none(),
    st.builds(_drop_final_newline,
              st.lists(st.tuples(line_body, ending), max_size=25).map(
                  lambda lines: b"".join(body + eol for body, eol in lines)),
              st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(old=side, new=side)
def test_apply_patch_of_diff_file_reproduces_new(old: bytes | None, new: bytes | None):
    if old is None and new is None:
        return
    d = diff_file("dir/p.txt", old, new)
    if not d.text:
        assert old == new
        return
    changes = apply_patch(d.text, {"dir/p.txt": old}.get if old is not None else {}.get)
    assert changes[0][:2] == ("dir/p.txt", new)
    hunk_lines = [line for line in d.text.splitlines() if line[:1] in "+-"
                  and not line.startswith(("+++ ", "--- "))]
    assert d.additions == sum(line.startswith("+") for line in hunk_lines)
    assert d.deletions == sum(line.startswith("-") for line in hunk_lines)


# -- git apply accepts what diff_file renders --------------------------------------------------

GIT_CASES: list[tuple[str, bytes | None, bytes | None]] = [
    ("edit.txt", b"".join(b"%d\n" % i for i in range(40)),
     b"".join(b"%d\n" % i for i in range(40) if i not in (3, 20)) + b"end\n"),
    ("nonl.txt", b"a\nb", b"a\nb\nc"),
    ("addnl.txt", b"a\nb", b"a\nb\n"),
    ("dropnl.txt", b"a\nb\n", b"a\nc"),
    ("crlf.txt", b"one\r\ntwo\r\nthree\r\n", b"one\r\n2\r\nthree\r\nfour\r\n"),
    ("created.txt", None, b"new\nfile\n"),
    ("created-empty.txt", None, b""),
    ("created-nonl.txt", None, b"x"),
    ("deleted.txt", b"bye\nnow\n", None),
    ("deleted-empty.txt", b"", None),
    ("dir with space/f.txt", b"a\n", b"b\n"),
    ("café \"quoted\"\t.txt", b"a\n", b"b\n"),
    ("emptied.txt", b"a\nb\n", b""),
]


def _git_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_apply_accepts_diff_file_output(tmp_path: Path):
    root = tmp_path / "repo"
    root.mkdir()
    env = _git_env(tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True, env=env)
    for name, old, _ in GIT_CASES:
        if old is not None:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(old)
    text = "".join(diff_file(name, old, new).text for name, old, new in GIT_CASES)
    (tmp_path / "all.diff").write_bytes(text.encode())
    subprocess.run(["git", "apply", "--whitespace=nowarn", str(tmp_path / "all.diff")],
                   cwd=root, check=True, env=env, capture_output=True)
    for name, _, new in GIT_CASES:
        path = root / name
        assert (path.read_bytes() if path.exists() else None) == new, name


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_apply_accepts_a_mode_change(tmp_path: Path):
    root = tmp_path / "repo"
    root.mkdir()
    env = _git_env(tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True, env=env)
    (root / "run.sh").write_bytes(b"#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o644)
    d = diff_file("run.sh", b"#!/bin/sh\n", b"#!/bin/sh\nexit 0\n", old_mode=0o100644,
                  new_mode=0o100755)
    (tmp_path / "m.diff").write_text(d.text)
    subprocess.run(["git", "apply", str(tmp_path / "m.diff")], cwd=root, check=True, env=env,
                   capture_output=True)
    assert (root / "run.sh").read_bytes() == b"#!/bin/sh\nexit 0\n"
    assert os.stat(root / "run.sh").st_mode & 0o111

