"""Staging semantics: the staged view, composition, savepoints, directories, modes, diff, and
optimistic concurrency (no lost update)."""

from __future__ import annotations

import os
import stat

import pytest
from conftest import read, write

# A CLI call that hangs (a lock never released) must fail the test, not stall the run.
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def tree(root):
    write(root, "a.txt", "line 1\nline 2\nline 3\n")
    write(root, "b.txt", "bee\n")
    write(root, "keep/one.txt", "1\n")
    write(root, "keep/two.txt", "2\n")
    write(root, "lonely/deep/only.txt", "alone\n")
    return root


def begin(cli, *args):
    status, out = cli("begin", *args)
    assert status == 0, out
    return out["tid"]


def ok(result):
    status, out = result
    assert status == 0 and out["ok"] is True, out
    return out


def mode_of(root, rel):
    return stat.S_IMODE(os.stat(os.path.join(root, rel)).st_mode)


# -- the staged view -------------------------------------------------------------------------


def test_staging_does_not_touch_the_tree_before_commit(tree, cli, snapshot):
    tid = begin(cli)
    before = snapshot()["tree"]
    ok(cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "x\n"))
    ok(cli("stage-delete", "--tid", tid, "--path", "b.txt"))
    ok(cli("stage-write", "--tid", tid, "--path", "new/dir/f.txt", "--content", "f\n"))
    assert snapshot()["tree"] == before


def test_successive_patches_compose_on_the_staged_view(tree, cli):
    tid = begin(cli)
    first = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n line 1\n-line 2\n+line two\n line 3\n"
    second = ("--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,4 @@\n line 1\n line two\n+line 2.5\n"
              " line 3\n")
    ok(cli("stage-patch", "--tid", tid, "--stdin", input=first))
    # The second patch is written against the first one's result, not the tree.
    ok(cli("stage-patch", "--tid", tid, "--stdin", input=second))
    ok(cli("commit", "--tid", tid))
    assert read(tree, "a.txt") == b"line 1\nline two\nline 2.5\nline 3\n"


def test_a_patch_against_the_tree_is_rejected_once_the_staged_view_differs(tree, cli):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "b.txt", "--content", "wasp\n"))
    patch = "--- a/b.txt\n+++ b/b.txt\n@@ -1 +1 @@\n-bee\n+hornet\n"
    status, out = cli("stage-patch", "--tid", tid, "--stdin", input=patch)
    assert (status, out["error"]["code"]) == (2, "patch_rejected"), out


def test_a_patch_can_create_and_then_another_patch_modify_the_new_file(tree, cli):
    tid = begin(cli)
    create = ("diff --git a/n/new.txt b/n/new.txt\nnew file mode 100644\n--- /dev/null\n"
              "+++ b/n/new.txt\n@@ -0,0 +1,2 @@\n+alpha\n+beta\n")
    modify = "--- a/n/new.txt\n+++ b/n/new.txt\n@@ -1,2 +1,2 @@\n alpha\n-beta\n+gamma\n"
    ok(cli("stage-patch", "--tid", tid, "--stdin", input=create))
    ok(cli("stage-patch", "--tid", tid, "--stdin", input=modify))
    ok(cli("commit", "--tid", tid))
    assert read(tree, "n/new.txt") == b"alpha\ngamma\n"


def test_a_multi_file_git_patch_creates_modifies_and_deletes(tree, cli):
    tid = begin(cli)
    patch = (
        "diff --git a/a.txt b/a.txt\nindex 1111111..2222222 100644\n--- a/a.txt\n+++ b/a.txt\n"
        "@@ -1,3 +1,3 @@\n-line 1\n+LINE 1\n line 2\n line 3\n"
        "diff --git a/b.txt b/b.txt\ndeleted file mode 100644\nindex 3333333..0000000\n"
        "--- a/b.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bee\n"
        "diff --git a/c.txt b/c.txt\nnew file mode 100644\nindex 0000000..4444444\n"
        "--- /dev/null\n+++ b/c.txt\n@@ -0,0 +1 @@\n+sea\n")
    out = ok(cli("stage-patch", "--tid", tid, "--stdin", input=patch))
    assert sorted(out["files"]) == ["a.txt", "b.txt", "c.txt"]
    ok(cli("commit", "--tid", tid))
    assert read(tree, "a.txt") == b"LINE 1\nline 2\nline 3\n"
    assert not os.path.exists(os.path.join(tree, "b.txt"))
    assert read(tree, "c.txt") == b"sea\n"


def test_a_plain_diff_without_git_headers_applies(tree, cli):
    tid = begin(cli)
    patch = ("--- a.txt.orig\t2024-01-01 00:00:00.000000000 +0000\n"
             "+++ a.txt\t2024-01-01 00:00:01.000000000 +0000\n"
             "@@ -2 +2 @@\n-line 2\n+second\n")
    ok(cli("stage-patch", "--tid", tid, "--stdin", input=patch))
    ok(cli("commit", "--tid", tid))
    assert read(tree, "a.txt") == b"line 1\nsecond\nline 3\n"


def test_replace_after_write_sees_the_staged_content(tree, cli):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "staged text\n"))
    out = ok(cli("stage-replace", "--tid", tid, "--path", "a.txt", "--old", "staged",
                 "--new", "replaced"))
    assert out["replacements"] == 1
    status, out = cli("stage-replace", "--tid", tid, "--path", "a.txt", "--old", "line 1",
                      "--new", "x")
    assert (status, out["error"]["code"]) == (2, "no_match"), out   # the tree's text is gone
    ok(cli("commit", "--tid", tid))
    assert read(tree, "a.txt") == b"replaced text\n"


def test_replace_on_a_new_staged_file_works_before_it_exists_in_the_tree(tree, cli):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "fresh.txt", "--content", "a b a\n"))
    out = ok(cli("stage-replace", "--tid", tid, "--path", "fresh.txt", "--old", "a",
                 "--new", "z", "--all"))
    assert out["replacements"] == 2
    ok(cli("commit", "--tid", tid))
    assert read(tree, "fresh.txt") == b"z b z\n"


def test_delete_then_write_of_the_same_path_leaves_the_new_content(tree, cli):
    tid = begin(cli)
    ok(cli("stage-delete", "--tid", tid, "--path", "b.txt"))
    ok(cli("stage-write", "--tid", tid, "--path", "b.txt", "--content", "reborn\n"))
    status, diff = cli("diff", "--tid", tid)
    assert [(f["path"], f["status"]) for f in diff["files"]] == [("b.txt", "modified")], diff
    ok(cli("commit", "--tid", tid))
    assert read(tree, "b.txt") == b"reborn\n"


def test_write_then_delete_of_a_new_file_leaves_nothing(tree, cli, snapshot):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "tmp/new.txt", "--content", "x\n"))
    ok(cli("stage-delete", "--tid", tid, "--path", "tmp/new.txt"))
    status, diff = cli("diff", "--tid", tid)
    assert diff["files"] == [], diff
    before = snapshot()["tree"]
    ok(cli("commit", "--tid", tid))
    assert snapshot()["tree"] == before


def test_write_into_new_nested_directories_creates_them(tree, cli):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "x/y/z/deep.txt", "--content", "deep\n"))
    ok(cli("stage-write", "--tid", tid, "--path", "x/y/side.txt", "--content", "side\n"))
    ok(cli("commit", "--tid", tid))
    assert read(tree, "x/y/z/deep.txt") == b"deep\n"
    assert read(tree, "x/y/side.txt") == b"side\n"


def test_deletes_remove_emptied_directories_and_keep_others(tree, cli):
    tid = begin(cli)
    ok(cli("stage-delete", "--tid", tid, "--path", "lonely/deep/only.txt"))
    ok(cli("stage-delete", "--tid", tid, "--path", "keep/one.txt"))
    ok(cli("commit", "--tid", tid))
    assert not os.path.exists(os.path.join(tree, "lonely"))
    assert sorted(os.listdir(os.path.join(tree, "keep"))) == ["two.txt"]


def test_a_new_file_gets_0644_and_mode_0755_is_applied(tree, cli):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "plain.txt", "--content", "p\n"))
    ok(cli("stage-write", "--tid", tid, "--path", "bin/run.sh", "--content", "#!/bin/sh\n",
           "--mode", "0755"))
    ok(cli("commit", "--tid", tid))
    assert mode_of(tree, "plain.txt") == 0o644
    assert mode_of(tree, "bin/run.sh") == 0o755


def test_an_existing_file_keeps_its_mode_unless_mode_is_given(tree, cli):
    write(tree, "tool.sh", "#!/bin/sh\n", mode=0o750)
    write(tree, "private.txt", "p\n", mode=0o600)
    write(tree, "exec.sh", "#!/bin/sh\n", mode=0o755)
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "tool.sh", "--content", "#!/bin/sh\necho\n"))
    ok(cli("stage-replace", "--tid", tid, "--path", "private.txt", "--old", "p", "--new", "q"))
    ok(cli("stage-write", "--tid", tid, "--path", "exec.sh", "--content", "x\n",
           "--mode", "0644"))
    ok(cli("commit", "--tid", tid))
    assert mode_of(tree, "tool.sh") == 0o750
    assert mode_of(tree, "private.txt") == 0o600
    assert mode_of(tree, "exec.sh") == 0o644
    assert read(tree, "tool.sh") == b"#!/bin/sh\necho\n"


def test_a_patch_keeps_the_mode_of_the_file_it_modifies(tree, cli):
    write(tree, "run.sh", "#!/bin/sh\necho 1\n", mode=0o755)
    tid = begin(cli)
    patch = "--- a/run.sh\n+++ b/run.sh\n@@ -1,2 +1,2 @@\n #!/bin/sh\n-echo 1\n+echo 2\n"
    ok(cli("stage-patch", "--tid", tid, "--stdin", input=patch))
    ok(cli("commit", "--tid", tid))
    assert mode_of(tree, "run.sh") == 0o755
    assert read(tree, "run.sh") == b"#!/bin/sh\necho 2\n"


def test_diff_reflects_the_staged_view(tree, cli):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "a.txt", "--content",
           "line 1\nline 2\nline 3\nline 4\n"))
    ok(cli("stage-replace", "--tid", tid, "--path", "a.txt", "--old", "line 4",
           "--new", "line four"))
    ok(cli("stage-delete", "--tid", tid, "--path", "b.txt"))
    ok(cli("stage-write", "--tid", tid, "--path", "c.txt", "--content", "c\n"))
    status, out = cli("diff", "--tid", tid)
    assert status == 0
    files = {f["path"]: (f["status"], f["additions"], f["deletions"]) for f in out["files"]}
    assert files == {"a.txt": ("modified", 1, 0), "b.txt": ("deleted", 0, 1),
                     "c.txt": ("added", 1, 0)}
    assert "+line four" in out["diff"] and "line 4" not in out["diff"].replace("line four", "")
    assert "-bee" in out["diff"] and "+c" in out["diff"]


def test_a_write_of_identical_content_is_not_a_change_in_the_diff(tree, cli):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "b.txt", "--content", "bee\n"))
    status, out = cli("diff", "--tid", tid)
    assert status == 0 and out["files"] == [], out


# -- savepoints ------------------------------------------------------------------------------


def test_rollback_to_a_savepoint_drops_what_was_staged_after_it(tree, cli):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "kept\n"))
    ok(cli("savepoint", "--tid", tid, "--name", "s1"))
    ok(cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "dropped\n"))
    ok(cli("stage-delete", "--tid", tid, "--path", "b.txt"))
    ok(cli("stage-write", "--tid", tid, "--path", "dropped.txt", "--content", "x\n"))
    ok(cli("rollback-to", "--tid", tid, "--name", "s1"))
    status, diff = cli("diff", "--tid", tid)
    assert [f["path"] for f in diff["files"]] == ["a.txt"], diff
    ok(cli("commit", "--tid", tid))
    assert read(tree, "a.txt") == b"kept\n"
    assert read(tree, "b.txt") == b"bee\n"
    assert not os.path.exists(os.path.join(tree, "dropped.txt"))


def test_rollback_to_an_outer_savepoint_drops_the_inner_ones(tree, cli):
    tid = begin(cli)
    ok(cli("savepoint", "--tid", tid, "--name", "outer"))
    ok(cli("stage-write", "--tid", tid, "--path", "one.txt", "--content", "1\n"))
    ok(cli("savepoint", "--tid", tid, "--name", "inner"))
    ok(cli("stage-write", "--tid", tid, "--path", "two.txt", "--content", "2\n"))
    ok(cli("rollback-to", "--tid", tid, "--name", "outer"))
    status, out = cli("rollback-to", "--tid", tid, "--name", "inner")
    assert (status, out["error"]["code"]) == (2, "unknown_savepoint"), out
    status, diff = cli("diff", "--tid", tid)
    assert diff["files"] == [], diff


def test_rollback_to_an_inner_savepoint_keeps_the_outer_changes(tree, cli):
    tid = begin(cli)
    ok(cli("savepoint", "--tid", tid, "--name", "outer"))
    ok(cli("stage-write", "--tid", tid, "--path", "one.txt", "--content", "1\n"))
    ok(cli("savepoint", "--tid", tid, "--name", "inner"))
    ok(cli("stage-write", "--tid", tid, "--path", "two.txt", "--content", "2\n"))
    ok(cli("rollback-to", "--tid", tid, "--name", "inner"))
    # The savepoint survives its rollback: roll back to it again, or further out.
    ok(cli("stage-write", "--tid", tid, "--path", "three.txt", "--content", "3\n"))
    ok(cli("rollback-to", "--tid", tid, "--name", "inner"))
    ok(cli("commit", "--tid", tid))
    assert read(tree, "one.txt") == b"1\n"
    assert not os.path.exists(os.path.join(tree, "two.txt"))
    assert not os.path.exists(os.path.join(tree, "three.txt"))


def test_rollback_restores_the_staged_view_for_later_replaces(tree, cli):
    tid = begin(cli)
    ok(cli("savepoint", "--tid", tid, "--name", "s"))
    ok(cli("stage-replace", "--tid", tid, "--path", "a.txt", "--old", "line 2", "--new", "L2"))
    ok(cli("rollback-to", "--tid", tid, "--name", "s"))
    out = ok(cli("stage-replace", "--tid", tid, "--path", "a.txt", "--old", "line 2",
                 "--new", "second"))
    assert out["replacements"] == 1
    ok(cli("commit", "--tid", tid))
    assert read(tree, "a.txt") == b"line 1\nsecond\nline 3\n"


def test_unknown_savepoint_is_refused_and_changes_nothing(tree, cli, snapshot):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "x\n"))
    before = snapshot()
    status, out = cli("rollback-to", "--tid", tid, "--name", "never")
    assert (status, out["ok"], out["error"]["code"]) == (2, False, "unknown_savepoint"), out
    assert snapshot() == before
    status, diff = cli("diff", "--tid", tid)
    assert [f["path"] for f in diff["files"]] == ["a.txt"]


def test_a_savepoint_name_reused_marks_the_latest_point(tree, cli):
    tid = begin(cli)
    ok(cli("savepoint", "--tid", tid, "--name", "s"))
    ok(cli("stage-write", "--tid", tid, "--path", "one.txt", "--content", "1\n"))
    ok(cli("savepoint", "--tid", tid, "--name", "s"))
    ok(cli("stage-write", "--tid", tid, "--path", "two.txt", "--content", "2\n"))
    ok(cli("rollback-to", "--tid", tid, "--name", "s"))
    status, diff = cli("diff", "--tid", tid)
    assert [f["path"] for f in diff["files"]] == ["one.txt"], diff


def test_savepoints_work_through_the_library(tree, client):
    tx = client.begin()
    tx.stage_write("a.txt", "kept\n")
    tx.savepoint("s1")
    tx.stage_write("b.txt", "dropped\n")
    tx.savepoint("s2")
    tx.stage_delete("keep/two.txt")
    tx.rollback_to("s1")
    assert [f["path"] for f in tx.diff()["files"]] == ["a.txt"]
    tx.commit()
    assert read(tree, "a.txt") == b"kept\n" and read(tree, "b.txt") == b"bee\n"
    assert read(tree, "keep/two.txt") == b"2\n"


# -- no lost update --------------------------------------------------------------------------


def test_an_outside_edit_of_a_staged_file_makes_commit_conflict_and_is_kept(tree, cli):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "mine\n"))
    ok(cli("stage-write", "--tid", tid, "--path", "other.txt", "--content", "other\n"))
    write(tree, "a.txt", "theirs\n")
    status, out = cli("commit", "--tid", tid)
    assert status == 1 and out["ok"] is False and out["state"] == "aborted", out
    assert out["error"]["code"] == "conflict"
    assert read(tree, "a.txt") == b"theirs\n"
    assert not os.path.exists(os.path.join(tree, "other.txt"))  # all or nothing


def test_an_outside_edit_of_a_recorded_read_makes_commit_conflict(tree, cli):
    tid = begin(cli)
    ok(cli("record-read", "--tid", tid, "--path", "b.txt"))
    ok(cli("stage-write", "--tid", tid, "--path", "a.txt", "--content", "derived from b\n"))
    write(tree, "b.txt", "bee changed\n")
    status, out = cli("commit", "--tid", tid)
    assert (status, out["error"]["code"]) == (1, "conflict"), out
    assert read(tree, "a.txt") == b"line 1\nline 2\nline 3\n"
    assert read(tree, "b.txt") == b"bee changed\n"


def test_an_outside_delete_of_a_staged_file_makes_commit_conflict(tree, cli):
    tid = begin(cli)
    ok(cli("stage-replace", "--tid", tid, "--path", "a.txt", "--old", "line 2", "--new", "x"))
    os.unlink(os.path.join(tree, "a.txt"))
    status, out = cli("commit", "--tid", tid)
    assert (status, out["error"]["code"]) == (1, "conflict"), out
    assert not os.path.exists(os.path.join(tree, "a.txt"))


def test_an_outside_create_of_a_file_staged_as_new_makes_commit_conflict(tree, cli):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "new.txt", "--content", "mine\n"))
    write(tree, "new.txt", "theirs\n")
    status, out = cli("commit", "--tid", tid)
    assert (status, out["error"]["code"]) == (1, "conflict"), out
    assert read(tree, "new.txt") == b"theirs\n"


def test_an_outside_edit_of_a_file_staged_for_deletion_makes_commit_conflict(tree, cli):
    tid = begin(cli)
    ok(cli("stage-delete", "--tid", tid, "--path", "b.txt"))
    write(tree, "b.txt", "still needed\n")
    status, out = cli("commit", "--tid", tid)
    assert (status, out["error"]["code"]) == (1, "conflict"), out
    assert read(tree, "b.txt") == b"still needed\n"


def test_an_outside_file_where_a_new_directory_goes_makes_commit_conflict(tree, cli):
    tid = begin(cli)
    ok(cli("stage-write", "--tid", tid, "--path", "nd/f.txt", "--content", "mine\n"))
    write(tree, "nd", "a file now\n")
    status, out = cli("commit", "--tid", tid)
    assert (status, out["error"]["code"]) == (1, "conflict"), out
    assert read(tree, "nd") == b"a file now\n"


def test_two_transactions_on_one_file_the_second_commit_conflicts_without_merge(tree, cli):
    """With --no-merge (tests/test_commit_merge.py: by default these two edits merge)."""
    first, second = begin(cli), begin(cli)
    ok(cli("stage-replace", "--tid", first, "--path", "a.txt", "--old", "line 1",
           "--new", "first"))
    ok(cli("stage-replace", "--tid", second, "--path", "a.txt", "--old", "line 3",
           "--new", "second"))
    ok(cli("commit", "--tid", first))
    status, out = cli("commit", "--tid", second, "--no-merge")
    assert (status, out["error"]["code"]) == (1, "conflict"), out
    assert read(tree, "a.txt") == b"first\nline 2\nline 3\n"


def test_disjoint_transactions_both_commit(tree, cli):
    first, second = begin(cli), begin(cli)
    ok(cli("stage-write", "--tid", first, "--path", "a.txt", "--content", "A\n"))
    ok(cli("stage-write", "--tid", second, "--path", "b.txt", "--content", "B\n"))
    ok(cli("commit", "--tid", second))
    ok(cli("commit", "--tid", first))
    assert read(tree, "a.txt") == b"A\n" and read(tree, "b.txt") == b"B\n"


def test_a_commit_applies_every_staged_file(tree, client):
    tx = client.begin()
    for i in range(50):
        tx.stage_write(f"many/f{i:02}.txt", f"{i}\n")
    out = tx.commit()
    assert out["files"] == [f"many/f{i:02}.txt" for i in range(50)]
    assert [read(tree, f"many/f{i:02}.txt") for i in range(50)] == [
        f"{i}\n".encode() for i in range(50)]
