"""core/patch.py: parsing unified diffs and applying them to bytes, all or nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agent_2pc.core import patch as patch_module
from agent_2pc.core.patch import FilePatch, Hunk, apply_patch, parse_patch
from agent_2pc.errors import InvalidPatch, NotFound, PatchRejected

Files = dict[str, bytes]


def applied(text: str | bytes, files: Files) -> Files:
    """The files after applying ``text`` to a copy of ``files``."""
    result = dict(files)
    for path, content, _mode in apply_patch(text, files.get):
        if content is None:
            result.pop(path, None)
        else:
            result[path] = content
    return result


GIT_MODIFY = """\
diff --git a/src/app.py b/src/app.py
index 3b18e51..a5c1f0e 100644
--- a/src/app.py
+++ b/src/app.py
@@ -1,4 +1,4 @@
 import os
 
-def main():
+def main() -> None:
     return os.getcwd()
"""
APP = b"import os\n\ndef main():\n    return os.getcwd()\n"


# -- accepted formats --------------------------------------------------------------------------


def test_git_style_modification_applies():
    assert applied(GIT_MODIFY, {"src/app.py": APP}) == {
        "src/app.py": b"import os\n\ndef main() -> None:\n    return os.getcwd()\n"
    }


def test_apply_returns_path_content_and_mode_without_touching_the_input():
    files = {"src/app.py": APP}
    changes = apply_patch(GIT_MODIFY, files.get)
    assert changes == [("src/app.py", APP.replace(b"main():", b"main() -> None:"), None)]
    assert files == {"src/app.py": APP}


def test_plain_unified_diff_with_timestamps_applies():
    text = (
        "--- app.py\t2024-05-01 10:00:00.000000000 +0200\n"
        "+++ app.py\t2024-05-01 10:05:00.000000000 +0200\n"
        "@@ -3,2 +3,2 @@\n"
        "-def main():\n"
        "+def run():\n"
        "     return os.getcwd()\n"
    )
    assert applied(text, {"app.py": APP})["app.py"] == APP.replace(b"main", b"run")


def test_prose_before_between_and_after_the_diff_is_ignored():
    text = (
        "Sure! Here is the change you asked for.\n\n"
        "It renames the function.\n\n"
        "--- a/app.py\n+++ b/app.py\n@@ -3 +3 @@\n-def main():\n+def run():\n"
        "\nAnd that's all: the tests should pass now.\n"
    )
    assert applied(text, {"app.py": APP})["app.py"] == APP.replace(b"main", b"run")


def test_email_style_patch_with_signature_applies():
    text = (
        "From 1234 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] rename\n\n---\n"
        " app.py | 2 +-\n 1 file changed\n\n" + GIT_MODIFY.replace("src/app.py", "app.py")
        + "-- \n2.39.5\n\n"
    )
    assert b"-> None" in applied(text, {"app.py": APP})["app.py"]


def test_multi_file_patch_changes_every_file():
    text = (
        "diff --git a/one.txt b/one.txt\n--- a/one.txt\n+++ b/one.txt\n"
        "@@ -1 +1 @@\n-1\n+one\n"
        "diff --git a/two.txt b/two.txt\n--- a/two.txt\n+++ b/two.txt\n"
        "@@ -1,2 +1,2 @@\n 2\n-two\n+TWO\n"
    )
    files = {"one.txt": b"1\n", "two.txt": b"2\ntwo\n", "other": b"x"}
    assert applied(text, files) == {"one.txt": b"one\n", "two.txt": b"2\nTWO\n", "other": b"x"}


def test_hunk_headers_without_counts_mean_one_line():
    text = "--- a/f\n+++ b/f\n@@ -2 +2 @@\n-b\n+B\n"
    assert applied(text, {"f": b"a\nb\nc\n"})["f"] == b"a\nB\nc\n"


def test_blank_lines_between_hunks_are_ignored():
    text = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+A\n\n\n@@ -3 +3 @@\n-c\n+C\n"
    assert applied(text, {"f": b"a\nb\nc\n"})["f"] == b"A\nb\nC\n"


def test_empty_context_line_without_its_space_is_accepted():
    text = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n\n-c\n+C\n"
    assert applied(text, {"f": b"a\n\nc\n"})["f"] == b"a\n\nC\n"


def test_quoted_git_paths_are_unquoted():
    text = (
        'diff --git "a/caf\\303\\251 \\"x\\".txt" "b/caf\\303\\251 \\"x\\".txt"\n'
        '--- "a/caf\\303\\251 \\"x\\".txt"\n+++ "b/caf\\303\\251 \\"x\\".txt"\n'
        "@@ -1 +1 @@\n-a\n+b\n"
    )
    assert applied(text, {'café "x".txt': b"a\n"}) == {'café "x".txt': b"b\n"}


def test_path_with_spaces_ends_at_the_tab():
    text = "--- a/my file.txt\t\n+++ b/my file.txt\t\n@@ -1 +1 @@\n-a\n+b\n"
    assert applied(text, {"my file.txt": b"a\n"}) == {"my file.txt": b"b\n"}


def test_crlf_patch_text_is_matched_against_lf_file_and_keeps_lf():
    text = "--- a/f\r\n+++ b/f\r\n@@ -1,2 +1,2 @@\r\n a\r\n-b\r\n+B\r\n"
    assert applied(text, {"f": b"a\nb\n"})["f"] == b"a\nB\n"


# -- creation, deletion, renames, modes --------------------------------------------------------


def test_git_creation_returns_content_and_mode():
    text = (
        "diff --git a/bin/run b/bin/run\nnew file mode 100755\nindex 0000000..e69de29\n"
        "--- /dev/null\n+++ b/bin/run\n@@ -0,0 +1,2 @@\n+#!/bin/sh\n+exit 0\n"
    )
    assert apply_patch(text, {}.get) == [("bin/run", b"#!/bin/sh\nexit 0\n", 0o100755)]


def test_git_creation_of_an_empty_file_has_no_hunks():
    text = "diff --git a/empty b/empty\nnew file mode 100644\nindex 0000000..e69de29\n"
    assert apply_patch(text, {}.get) == [("empty", b"", 0o100644)]


def test_plain_creation_from_dev_null_keeps_unprefixed_path():
    text = "--- /dev/null\n+++ src/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
    assert apply_patch(text, {}.get) == [("src/new.py", b"x = 1\n", None)]


def test_plain_creation_strips_b_prefix():
    text = "--- /dev/null\n+++ b/src/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
    assert apply_patch(text, {}.get) == [("src/new.py", b"x = 1\n", None)]


def test_diff_minus_n_epoch_timestamps_mean_creation_and_deletion():
    text = (
        "diff -ruN orig/new.txt new/new.txt\n"
        "--- orig/new.txt\t1970-01-01 00:00:00.000000000 +0000\n"
        "+++ new/new.txt\t2024-01-01 12:00:00.000000000 +0000\n"
        "@@ -0,0 +1 @@\n+hello\n"
        "diff -ruN orig/old.txt new/old.txt\n"
        "--- orig/old.txt\t2024-01-01 12:00:00.000000000 +0000\n"
        "+++ new/old.txt\t1969-12-31 16:00:00.000000000 -0800\n"
        "@@ -1 +0,0 @@\n-bye\n"
    )
    assert applied(text, {"old.txt": b"bye\n"}) == {"new.txt": b"hello\n"}


def test_creation_onto_an_existing_file_is_rejected():
    text = "--- /dev/null\n+++ b/f\n@@ -0,0 +1 @@\n+x\n"
    with pytest.raises(PatchRejected, match="cannot create f: it already exists") as info:
        apply_patch(text, {"f": b"old\n"}.get)
    assert info.value.details["path"] == "f"


def test_git_deletion_returns_none_content():
    text = (
        "diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644\nindex 1234567..0000000\n"
        "--- a/gone.txt\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n"
    )
    assert apply_patch(text, {"gone.txt": b"a\nb\n"}.get) == [("gone.txt", None, None)]


def test_deletion_of_an_empty_file_needs_no_hunks():
    text = "diff --git a/e b/e\ndeleted file mode 100644\nindex e69de29..0000000\n"
    assert apply_patch(text, {"e": b""}.get) == [("e", None, None)]


def test_deletion_that_does_not_remove_the_whole_content_is_rejected():
    text = "--- a/f\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n"
    with pytest.raises(PatchRejected, match=r"cannot delete f: .*1 line\(s\).*'b'"):
        apply_patch(text, {"f": b"a\nb\n"}.get)


def test_modifying_an_absent_file_is_not_found_naming_the_paths_tried():
    # CONTRACT.md: not_found is "a file to delete, replace or patch is absent".
    with pytest.raises(NotFound, match="does not exist") as info:
        apply_patch("--- a/x/f\n+++ b/x/f\n@@ -1 +1 @@\n-a\n+b\n", {}.get)
    assert info.value.details["tried"] == ["x/f", "a/x/f", "b/x/f"]
    with pytest.raises(NotFound, match="cannot patch f: the file does not exist"):
        apply_patch("diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n", {}.get)


def test_pure_rename_becomes_deletion_plus_creation():
    text = (
        "diff --git a/old.py b/pkg/new.py\nsimilarity index 100%\n"
        "rename from old.py\nrename to pkg/new.py\n"
    )
    assert apply_patch(text, {"old.py": b"x\n"}.get) == [
        ("old.py", None, None), ("pkg/new.py", b"x\n", None),
    ]


def test_rename_with_hunks_and_mode_change_carries_edited_content_and_mode():
    text = (
        "diff --git a/a.sh b/b.sh\nold mode 100644\nnew mode 100755\nsimilarity index 80%\n"
        "rename from a.sh\nrename to b.sh\nindex 1..2\n--- a/a.sh\n+++ b/b.sh\n"
        "@@ -1,2 +1,2 @@\n echo hi\n-exit 1\n+exit 0\n"
    )
    assert apply_patch(text, {"a.sh": b"echo hi\nexit 1\n"}.get) == [
        ("a.sh", None, None), ("b.sh", b"echo hi\nexit 0\n", 0o100755),
    ]


def test_rename_onto_an_existing_file_is_rejected():
    text = "diff --git a/a b/b\nrename from a\nrename to b\n"
    with pytest.raises(PatchRejected, match="cannot rename a to b: b already exists"):
        apply_patch(text, {"a": b"1", "b": b"2"}.get)


def test_mode_only_change_keeps_content_and_returns_new_mode():
    text = "diff --git a/run b/run\nold mode 100644\nnew mode 100755\n"
    assert apply_patch(text, {"run": b"#!/bin/sh\n"}.get) == [("run", b"#!/bin/sh\n", 0o100755)]


def test_symlink_modes_are_invalid():
    text = "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+t\n"
    with pytest.raises(InvalidPatch, match="line 2: symbolic links are not supported"):
        parse_patch(text)


def test_copies_are_invalid():
    text = "diff --git a/a b/b\nsimilarity index 100%\ncopy from a\ncopy to b\n"
    with pytest.raises(InvalidPatch, match="line 3: copies"):
        parse_patch(text)


# -- bytes: newlines, CRLF, encodings ----------------------------------------------------------


def test_no_newline_marker_on_the_old_side_adds_the_final_newline():
    text = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n"
    assert applied(text, {"f": b"a\nb"})["f"] == b"a\nb\n"


def test_no_newline_marker_on_the_new_side_drops_the_final_newline():
    text = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+b\n\\ No newline at end of file\n"
    assert applied(text, {"f": b"a\nb\n"})["f"] == b"a\nb"


def test_no_newline_markers_on_both_sides():
    text = (
        "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n"
        "+c\n\\ No newline at end of file\n"
    )
    assert applied(text, {"f": b"a\nb"})["f"] == b"a\nc"


def test_context_line_without_newline_only_matches_the_end_of_the_file():
    text = "--- a/f\n+++ b/f\n@@ -1,2 +1,3 @@\n+new\n a\n b\n\\ No newline at end of file\n"
    assert applied(text, {"f": b"a\nb"})["f"] == b"new\na\nb"
    with pytest.raises(PatchRejected):
        apply_patch(text, {"f": b"a\nb\n"}.get)


def test_text_glued_after_a_line_without_newline_is_rejected():
    text = "--- a/f\n+++ b/f\n@@ -1,0 +2 @@\n+c\n"  # appends after an unterminated last line
    with pytest.raises(PatchRejected, match="line without a newline") as info:
        apply_patch(text, {"f": b"b"}.get)
    assert info.value.details["hunk"] == 1


def test_crlf_line_endings_are_preserved():
    text = b"--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\r\n-b\r\n+B\r\n c\r\n"
    assert applied(text, {"f": b"a\r\nb\r\nc\r\n"})["f"] == b"a\r\nB\r\nc\r\n"


def test_lf_patch_applies_to_crlf_file_and_added_lines_get_crlf():
    text = "--- a/f\n+++ b/f\n@@ -1,3 +1,4 @@\n a\n-b\n+B\n+B2\n c\n"
    assert applied(text, {"f": b"a\r\nb\r\nc\r\nd\r\n"})["f"] == b"a\r\nB\r\nB2\r\nc\r\nd\r\n"


def test_non_utf8_bytes_are_preserved_exactly():
    old = "caf\xe9\nna\xefve\n".encode("latin-1")
    text = b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n caf\xe9\n-na\xefve\n+na\xeff\n"
    assert applied(text, {"f": old})["f"] == "caf\xe9\nna\xeff\n".encode("latin-1")


def test_str_patch_with_surrogate_escapes_round_trips_to_the_same_bytes():
    text = b"--- a/f\n+++ b/f\n@@ -1 +1 @@\n-\xff\n+\xfe\n".decode("utf-8", "surrogateescape")
    assert applied(text, {"f": b"\xff\n"})["f"] == b"\xfe\n"


# -- composition and atomicity -----------------------------------------------------------------


def test_successive_patches_compose():
    files = {"f": b"1\n2\n3\n"}
    files = applied("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-1\n+one\n 2\n", files)
    files = applied("--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n one\n-2\n+two\n 3\n", files)
    assert files == {"f": b"one\ntwo\n3\n"}


def test_sections_on_the_same_file_compose_in_order_into_one_entry():
    text = (
        "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-1\n+one\n"
        "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-one\n+uno\n"
        "--- /dev/null\n+++ b/g\n@@ -0,0 +1 @@\n+g\n"
        "diff --git a/g b/g\ndeleted file mode 100644\n--- a/g\n+++ /dev/null\n@@ -1 +0,0 @@\n-g\n"
    )
    assert apply_patch(text, {"f": b"1\n"}.get) == [("f", b"uno\n", None), ("g", None, None)]


def test_a_rejected_patch_changes_nothing_and_returns_nothing():
    files = {"a": b"1\n", "b": b"2\n"}
    snapshot = dict(files)
    text = (
        "--- a/a\n+++ b/a\n@@ -1 +1 @@\n-1\n+one\n"
        "--- a/b\n+++ b/b\n@@ -1 +1 @@\n-not two\n+two\n"
    )
    result = None
    with pytest.raises(PatchRejected) as info:
        result = apply_patch(text, files.get)
    assert result is None
    assert files == snapshot
    assert info.value.details["path"] == "b"


def test_file_patch_objects_can_be_applied_directly():
    hunk = Hunk(1, 1, 1, 1, (b"-a\n", b"+b\n"))
    assert apply_patch([FilePatch("f", "f", (hunk,), None, False)], {"f": b"a\n"}.get) == [
        ("f", b"b\n", None),
    ]


# -- hunk placement ----------------------------------------------------------------------------


def test_patch_with_offset_hunks_applies_at_nearest_match():
    old = b"".join(b"%d\n" % i for i in range(1, 21))
    shifted = b"new1\nnew2\n" + old  # the file grew above the hunk since the diff was made
    text = "--- a/f\n+++ b/f\n@@ -9,3 +9,3 @@\n 9\n-10\n+ten\n 11\n"
    assert applied(text, {"f": shifted})["f"] == shifted.replace(b"\n10\n", b"\nten\n")


def test_ambiguous_context_resolves_to_the_match_nearest_the_stated_line():
    old = b"x\nsame\nx\n" + b"pad\n" * 10 + b"x\nsame\nx\n"
    text = "--- a/f\n+++ b/f\n@@ -13,3 +13,3 @@\n x\n-same\n+changed\n x\n"
    assert applied(text, {"f": old})["f"] == old[:-7] + b"changed\nx\n"


def test_later_hunks_follow_the_offset_of_earlier_ones():
    old = b"".join(b"%d\n" % i for i in range(1, 41))
    text = (
        "--- a/f\n+++ b/f\n@@ -2,3 +2,3 @@\n 2\n-3\n+three\n 4\n"
        "@@ -30,3 +30,3 @@\n 30\n-31\n+thirty-one\n 32\n"
    )
    got = applied(text, {"f": b"top\n" + old})["f"]
    assert got == b"top\n" + old.replace(b"\n3\n", b"\nthree\n").replace(b"31", b"thirty-one")


def test_hunks_must_apply_in_increasing_order_without_overlap():
    text = (
        "--- a/f\n+++ b/f\n@@ -3,2 +3,2 @@\n-c\n+C\n d\n"
        "@@ -1,2 +1,2 @@\n-a\n+A\n b\n"
    )
    with pytest.raises(PatchRejected, match="hunk 2 of f .*after line 4") as info:
        apply_patch(text, {"f": b"a\nb\nc\nd\n"}.get)
    assert info.value.details["hunk"] == 2


def test_hunk_that_does_not_match_is_rejected_with_file_hunk_line_and_first_difference():
    old = b"def f():\n    x = 1\n    return x\n"
    text = ("--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n"
            " def f():\n-    x = 1\n+    x = 2\n     return y\n")
    with pytest.raises(PatchRejected) as info:
        apply_patch(text, {"m.py": old}.get)
    err = info.value
    assert err.code == "patch_rejected"
    assert "hunk 1 of m.py (@@ -1,3 +1,3 @@)" in err.message
    assert "at line 3 the hunk expects '    return y' and the file has '    return x'" in str(err)
    assert err.details == {
        "path": "m.py", "hunk": 1, "header": "@@ -1,3 +1,3 @@", "line": 3,
        "expected": "    return y", "found": "    return x",
    }


def test_rejection_reports_a_first_line_found_nowhere_and_whitespace_only_differences():
    with pytest.raises(PatchRejected, match="'zzz' occurs nowhere in the file"):
        apply_patch("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-zzz\n+y\n", {"f": b"a\n"}.get)
    with pytest.raises(PatchRejected, match="differ only in whitespace"):
        apply_patch("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b \n+c\n", {"f": b"a\nb\n"}.get)


def test_rejection_of_a_hunk_running_past_the_end_of_file():
    with pytest.raises(PatchRejected, match="the file ends there") as info:
        apply_patch("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n", {"f": b"a\n"}.get)
    assert info.value.details["found"] is None


# -- malformed input ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n\n", b""])
def test_empty_patch_is_invalid(text: str | bytes):
    with pytest.raises(InvalidPatch, match="patch is empty"):
        parse_patch(text)


def test_text_without_file_sections_is_invalid():
    with pytest.raises(InvalidPatch, match="no file sections found"):
        parse_patch("I changed the function to return early.\n")


def test_hunk_without_file_header_is_invalid_with_its_line():
    with pytest.raises(InvalidPatch, match="line 2: hunk header") as info:
        parse_patch("fix:\n@@ -1 +1 @@\n-a\n+b\n")
    assert info.value.details["line"] == 2


def test_malformed_hunk_header_is_invalid_with_line_number():
    with pytest.raises(InvalidPatch, match="line 3: malformed hunk header '@@ bad @@' in f"):
        parse_patch("--- a/f\n+++ b/f\n@@ bad @@\n-a\n+b\n")


def test_hunk_shorter_than_its_counts_is_invalid_with_line_number():
    text = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\nnot a hunk line\n"
    match = r"line 7: hunk 1 of f .*header @@ -1,3 \+1,3 @@"
    with pytest.raises(InvalidPatch, match=match) as info:
        parse_patch(text)
    assert "after 2 old and 2 new line(s) line 7 is 'not a hunk line'" in info.value.message


def test_hunk_cut_off_by_the_end_of_the_patch_is_invalid():
    with pytest.raises(InvalidPatch, match="line 6: .*the patch ends"):
        parse_patch("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-a\n+b\n")


def test_hunk_longer_than_its_counts_is_invalid_with_line_number():
    text = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+B\n c\n"
    with pytest.raises(InvalidPatch, match="line 7: ' c' follows hunk 1 of f"):
        parse_patch(text)


def test_no_newline_marker_in_the_middle_of_a_side_is_invalid():
    text = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-a\n\\ No newline at end of file\n-b\n+c\n+d\n"
    with pytest.raises(InvalidPatch, match="not the last line of its side"):
        parse_patch(text)


def test_plain_section_without_hunks_is_invalid():
    with pytest.raises(InvalidPatch, match="line 1: the section for f has no hunks"):
        parse_patch("--- a/f\n+++ b/f\nsome prose\n")


@pytest.mark.parametrize("name", ["../etc/passwd", "a/../../x", "/etc/passwd"])
def test_dotdot_and_absolute_paths_are_invalid(name: str):
    text = f"--- {name}\n+++ {name}\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(InvalidPatch, match="line 1: file name"):
        parse_patch(text)


def test_dotdot_in_git_rename_is_invalid():
    with pytest.raises(InvalidPatch, match="contains '..'"):
        parse_patch("diff --git a/x b/y\nrename from x\nrename to ../y\n")


@pytest.mark.parametrize("text", [
    "diff --git a/logo.png b/logo.png\nindex 1..2 100644\nGIT binary patch\nliteral 5\n"
    "McmZ?wbhEHb\n\nliteral 0\nHcmV?d00001\n\n",
    "diff --git a/logo.png b/logo.png\nindex 1..2 100644\n"
    "Binary files a/logo.png and b/logo.png differ\n",
    "Binary files orig/logo.png and new/logo.png differ\n",
])
def test_binary_patches_parse_but_do_not_apply(text: str):
    assert parse_patch(text)[0].binary
    with pytest.raises(InvalidPatch, match=r"binary patches are not supported \((new/)?logo.png\)"):
        apply_patch(text, {"logo.png": b"\x89PNG"}.get)


def test_limits_are_enforced_with_clear_errors(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(patch_module, "MAX_PATCH_BYTES", 100)
    with pytest.raises(InvalidPatch, match="the limit is 100 bytes"):
        parse_patch("x" * 101)
    monkeypatch.setattr(patch_module, "MAX_PATCH_BYTES", 1 << 20)
    monkeypatch.setattr(patch_module, "MAX_LINE_BYTES", 13)
    with pytest.raises(InvalidPatch, match="line 4 of the patch is 14 bytes long"):
        parse_patch("--- a/f\n+++ b/f\n@@ -1 +1 @@\n-aaaaaaaaaaaa\n+b\n")
    monkeypatch.setattr(patch_module, "MAX_LINE_BYTES", 1 << 20)
    monkeypatch.setattr(patch_module, "MAX_FILES_PER_PATCH", 2)
    section = "--- /dev/null\n+++ b/f{}\n@@ -0,0 +1 @@\n+x\n"
    with pytest.raises(InvalidPatch, match="more than 2 files"):
        parse_patch("".join(section.format(k) for k in range(3)))


# -- strip levels ------------------------------------------------------------------------------


def test_plain_diff_strip_level_is_chosen_by_which_old_path_exists():
    text = "--- src/f\n+++ src/f\n@@ -1 +1 @@\n-a\n+b\n"
    assert applied(text, {"src/f": b"a\n"}) == {"src/f": b"b\n"}
    assert applied(text, {"f": b"a\n"}) == {"f": b"b\n"}


def test_plain_diff_between_two_trees_patches_in_place():
    text = "--- orig/pkg/f.py\n+++ new/pkg/f.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert applied(text, {"pkg/f.py": b"a\n"}) == {"pkg/f.py": b"b\n"}


def test_plain_a_b_prefixes_prefer_strip_level_one_but_fall_back_to_zero():
    text = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"
    assert applied(text, {"f": b"a\n", "a/f": b"a\n"}) == {"f": b"b\n", "a/f": b"a\n"}
    assert applied(text, {"a/f": b"a\n"}) == {"a/f": b"b\n"}


def test_git_diff_without_prefixes_applies():
    text = "diff --git f.txt f.txt\nindex 1..2 100644\n--- f.txt\n+++ f.txt\n@@ -1 +1 @@\n-a\n+b\n"
    assert applied(text, {"f.txt": b"a\n"}) == {"f.txt": b"b\n"}


# -- agreement with git apply and GNU patch ----------------------------------------------------

FIXTURES: list[tuple[str, Files, str]] = [
    ("modify", {"src/app.py": APP}, GIT_MODIFY),
    ("offset", {"f": b"new\n" * 5 + b"".join(b"%d\n" % i for i in range(30))},
     "--- a/f\n+++ b/f\n@@ -10,7 +10,8 @@\n 9\n 10\n 11\n-12\n+twelve\n+12.5\n 13\n 14\n 15\n"),
    ("create", {}, "--- /dev/null\n+++ b/dir/new.txt\n@@ -0,0 +1,2 @@\n+a\n+b\n"),
    ("delete", {"old.txt": b"x\ny\n"},
     "diff --git a/old.txt b/old.txt\ndeleted file mode 100644\n--- a/old.txt\n+++ /dev/null\n"
     "@@ -1,2 +0,0 @@\n-x\n-y\n"),
    ("no-newline", {"f": b"a\nb"},
     "--- a/f\n+++ b/f\n@@ -1,2 +1,3 @@\n a\n-b\n\\ No newline at end of file\n+b\n+c\n"
     "\\ No newline at end of file\n"),
    ("crlf", {"f": b"a\r\nb\r\nc\r\n"},
     "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\r\n-b\r\n+B\r\n c\r\n"),
    ("multi", {"x": b"1\n2\n", "y": b"3\n"},
     "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-1\n+one\n 2\n--- a/y\n+++ b/y\n@@ -1 +1,2 @@\n 3\n+4\n"),
]


def _write_tree(root: Path, files: Files) -> None:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)


def _read_tree(root: Path) -> Files:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(root).parts and p.name != "patch.diff"
    }


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("name,files,text", FIXTURES, ids=[f[0] for f in FIXTURES])
def test_result_matches_git_apply(tmp_path: Path, name: str, files: Files, text: str):
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True, env=_env(tmp_path))
    _write_tree(root, files)
    (root / "patch.diff").write_bytes(text.encode())
    subprocess.run(["git", "apply", "--whitespace=nowarn", "patch.diff"], cwd=root, check=True,
                   env=_env(tmp_path), capture_output=True)
    assert _read_tree(root) == applied(text, files)


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs GNU patch")
@pytest.mark.parametrize("name,files,text", FIXTURES, ids=[f[0] for f in FIXTURES])
def test_result_matches_gnu_patch(tmp_path: Path, name: str, files: Files, text: str):
    _write_tree(tmp_path, files)
    (tmp_path / "patch.diff").write_bytes(text.encode())
    command = ["patch", "-p1", "-F0", "-s", "--no-backup-if-mismatch", "-i", "patch.diff"]
    subprocess.run(command, cwd=tmp_path, check=True, env=_env(tmp_path), capture_output=True)
    assert _read_tree(tmp_path) == applied(text, files)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_real_git_diff_output_applies(tmp_path: Path):
    """What `git diff` prints for edits, renames, mode changes, CRLF and missing newlines."""
    root = tmp_path / "repo"
    root.mkdir()
    env = _env(tmp_path)

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=root, check=True, env=env, capture_output=True).stdout

    before = {
        "edit.py": b"".join(b"line %d\n" % i for i in range(50)),
        "crlf.txt": b"one\r\ntwo\r\nthree\r\n",
        "tail.txt": b"no newline",
        "move/me.txt": b"".join(b"keep %d\n" % i for i in range(20)),
        "run.sh": b"#!/bin/sh\n",
        "gone.txt": b"bye\n",
        "space name.txt": b"s\n",
        "latin1.txt": b"caf\xe9\n",
    }
    _write_tree(root, before)
    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "before")
    after = dict(before)
    after["edit.py"] = before["edit.py"].replace(b"line 3\n", b"LINE 3\n").replace(
        b"line 40\n", b"line 40\nextra\n")
    after["crlf.txt"] = b"one\r\nTWO\r\nthree\r\n"
    after["tail.txt"] = b"no newline\n"
    after["moved/you.txt"] = before["move/me.txt"].replace(b"keep 5\n", b"kept 5\n")
    del after["move/me.txt"]
    del after["gone.txt"]
    after["new.txt"] = b"fresh"
    after["space name.txt"] = b"t\n"
    shutil.rmtree(root / "move")
    (root / "gone.txt").unlink()
    _write_tree(root, {k: v for k, v in after.items() if v != before.get(k)})
    os.chmod(root / "run.sh", 0o755)
    git("add", "-A")
    text = git("diff", "--cached", "-M", "--text")
    changes = apply_patch(text, before.get)
    assert applied(text, before) == after
    assert ("run.sh", b"#!/bin/sh\n", 0o100755) in changes
