"""Capture: what a command created, modified, deleted, renamed, chmodded, linked and made, as
changes relative to the repo root; the same answer on every tier."""

from __future__ import annotations

import os

import pytest

from agent_2pc.isolation import Ignore

pytestmark = pytest.mark.timeout(60)


def capture(staged, tier, command, **kw):
    select = kw.pop("select", None)
    with staged.view(tier, **kw) as view:
        res = view.run(command, timeout_s=30)
        assert res.exit_code == 0, res.tail
        cap = view.capture(select=select)
        contents = {}
        for c in cap.changes:
            if c.op == "write":
                with open(c.source, "rb") as f:
                    contents[c.path] = f.read()
                assert os.path.getsize(c.source) == c.size
        return cap, {c.path: c for c in cap.changes}, contents


def test_create_modify_delete(staged, tier):
    cap, by, data = capture(staged, tier, "echo new > new.txt; mkdir -p a/b; echo deep > a/b/c; "
                                          "echo more >> README.md; rm docs/guide.txt")
    assert {p: c.op for p, c in by.items()} == {
        "new.txt": "write", "a/b/c": "write", "README.md": "write", "docs/guide.txt": "delete"}
    assert data == {"new.txt": b"new\n", "a/b/c": b"deep\n", "README.md": b"# demo\nmore\n"}
    assert by["new.txt"].mode == 0o644 and by["README.md"].mode == 0o644
    assert cap.changes[0].op == "delete"  # deletes come first
    assert staged.tree_hash() == staged.before


def test_a_rename_is_a_delete_and_a_create(staged, tier):
    _, by, data = capture(staged, tier, "mv README.md READ.md; mv src lib")
    assert {p: c.op for p, c in by.items()} == {
        "README.md": "delete", "READ.md": "write",
        "src/app.py": "delete", "src/util.py": "delete",
        "lib/app.py": "write", "lib/util.py": "write"}
    assert data["lib/app.py"] == b"def answer():\n    return 42\n"  # the staged content moved
    assert staged.tree_hash() == staged.before


def test_a_mode_change_alone_is_a_write_with_the_new_mode(staged, tier):
    _, by, data = capture(staged, tier, "chmod 755 src/util.py; chmod 644 bin/run.sh")
    assert {p: (c.op, c.mode) for p, c in by.items()} == {
        "src/util.py": ("write", 0o755), "bin/run.sh": ("write", 0o644)}
    assert data["bin/run.sh"] == b"#!/bin/sh\necho staged\n"


def test_symlinks_and_empty_directories(staged, tier):
    _, by, _ = capture(staged, tier, "ln -s src/app.py link; mkdir -p empty/inner; "
                                     "mkdir full && echo x > full/f")
    assert by["link"].op == "symlink" and by["link"].target == "src/app.py"
    assert by["empty/inner"].op == "mkdir" and by["empty/inner"].mode == 0o755
    assert "empty" not in by  # it is not empty: it holds inner/
    assert "full" not in by and by["full/f"].op == "write"


def test_a_removed_directory_is_a_delete_of_every_file_in_it(staged, tier):
    _, by, _ = capture(staged, tier, "rm -rf src new")
    assert {p: c.op for p, c in by.items()} == {
        "src/app.py": "delete", "src/util.py": "delete", "new/deep/made.txt": "delete"}


def test_a_directory_removed_and_made_again_hides_what_it_held(staged, tier):
    _, by, _ = capture(staged, tier, "rm -rf src; mkdir src; echo fresh > src/fresh.py; "
                                     "echo again > src/util.py")
    assert {p: c.op for p, c in by.items()} == {
        "src/app.py": "delete", "src/fresh.py": "write", "src/util.py": "write"}


def test_a_file_replaced_by_a_directory_and_back(staged, tier):
    cap, by, _ = capture(staged, tier, "rm README.md; mkdir README.md; echo in > README.md/x; "
                                       "rm -rf docs; echo flat > docs")
    ops = {p: c.op for p, c in by.items()}
    assert ops == {"README.md": "delete", "README.md/x": "write",
                   "docs/guide.txt": "delete", "docs": "write"}
    # in an order a transaction can stage: the deletes clear the way for the writes
    assert [c.path for c in cap.changes] == ["README.md", "docs/guide.txt", "README.md/x",
                                             "docs"]


def test_deleting_a_file_the_transaction_wrote_is_a_delete(staged, tier):
    _, by, _ = capture(staged, tier, "rm new/deep/made.txt src/app.py")
    assert {p: c.op for p, c in by.items()} == {
        "new/deep/made.txt": "delete", "src/app.py": "delete"}


def test_rewriting_the_same_bytes_is_not_a_change(staged, tier):
    cap, by, _ = capture(staged, tier, "touch README.md; cat src/util.py > t && cat t > "
                                       "src/util.py && rm t; printf '# demo\\n' > README.md")
    assert by == {}
    assert cap.unchanged == 2


def test_other_file_types_are_listed_as_skipped(staged, tier):
    cap, by, _ = capture(staged, tier, "mkfifo pipe; echo ok > ok.txt")
    assert set(by) == {"ok.txt"}
    assert cap.skipped == [{"path": "pipe", "kind": "fifo"}]


def test_ignore_rules_decide_what_is_captured(staged, tier):
    command = ("mkdir -p src/__pycache__ build/out .pytest_cache && "
               "echo c > src/__pycache__/app.pyc && echo o > build/out/x.o && "
               "echo keep > build/keep.txt && echo p > .pytest_cache/v && echo t > trace.log && "
               "mkdir -p .git && echo g > .git/junk && "
               "mkdir -p sub/.git && echo n > sub/.git/nested")
    cap, by, _ = capture(staged, tier, command, ignore=["build/out", "*.log"])
    assert set(by) == {"build/keep.txt", "sub/.git/nested", "src/__pycache__/app.pyc",
                       ".pytest_cache/v"}  # only the given list applies (and .git at the root)
    assert cap.ignored == ["build/out", "trace.log"]
    cap, by, _ = capture(staged, tier, command)  # the default list: tool caches
    assert "src/__pycache__/app.pyc" not in by and ".pytest_cache/v" not in by
    assert {"build/out/x.o", "trace.log"} <= set(by)
    assert ".pytest_cache" in cap.ignored and "src/__pycache__" in cap.ignored


def test_a_deleted_directory_leaves_its_ignored_files_out(staged, tier):
    staged.write("src/__pycache__/app.cpython.pyc", b"cache")
    staged.before = staged.tree_hash()
    _, by, _ = capture(staged, tier, "rm -rf src")
    assert set(by) == {"src/app.py", "src/util.py"}


def test_select_narrows_the_capture(staged, tier):
    _, by, _ = capture(staged, tier, "echo a > keep-me.txt; echo b > drop-me.txt; rm gone.txt "
                                     "2>/dev/null; rm docs/guide.txt",
                       select=lambda p: p.startswith("keep") or p.startswith("docs/"))
    assert {p: c.op for p, c in by.items()} == {"keep-me.txt": "write",
                                                 "docs/guide.txt": "delete"}


def test_binary_and_large_content_arrives_intact(staged, tier):
    _, by, data = capture(staged, tier, "head -c 3000000 /dev/urandom > big.bin; "
                                        "cp big.bin data/blob.bin")
    assert data["big.bin"] == data["data/blob.bin"] and len(data["big.bin"]) == 3_000_000


def test_to_json_has_the_contract_shape(staged, tier):
    cap, _, _ = capture(staged, tier, "echo x > a.txt; rm gone.txt 2>/dev/null; ln -s a.txt l; "
                                      "mkdir d; rm docs/guide.txt")
    assert cap.to_json()["captured"] == [
        {"path": "docs/guide.txt", "op": "delete"},
        {"path": "a.txt", "op": "write", "mode": 0o644, "bytes": 2},
        {"path": "d", "op": "mkdir", "mode": 0o755},
        {"path": "l", "op": "symlink", "target": "a.txt"},
    ]


def test_ignore_patterns():
    ig = Ignore(["*.log", "build/", "/dist", "docs/_build"])
    assert ig(".git") and ig(".git/config") and ig(".agent-tx/wal.bin")
    assert not ig("sub/.git") and not ig("sub/.agent-tx")
    assert ig("a.log") and ig("deep/er/b.log") and ig("build") and ig("x/build/y")
    assert ig("dist/a") and not ig("x/dist/a")
    assert ig("docs/_build/html/index.html") and not ig("other/docs/_build")
    assert not ig("src/app.py")
    for bad in ("", "/", 3):
        with pytest.raises(ValueError):
            Ignore([bad])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        Ignore("*.log")
