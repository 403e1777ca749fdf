"""begin --git-branch (the GitAdapter): a transaction bound to a branch at begin.

prepare refuses (conflict) when the branch moved under a path the transaction touches, goes on
when it moved elsewhere; git-commit commits onto it; abort leaves no ref and no index change;
run-batch takes git_branch and git_commit. Real repositories, real CLI processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from crashkit import cli
from test_git_commit import (
    assert_fsck_clean,
    assert_user_index_kept,
    changed_in,
    git,
    head,
    make_repo,
)

from agent_2pc import Agent2PC, TransactionAborted
from agent_2pc.errors import UsageError

pytestmark = pytest.mark.timeout(120)


def begin_on(repo: Path, branch: str = "main") -> str:
    out = json.loads(cli(repo, "begin", "--git-branch", branch, "--label", "bound").stdout)
    assert out["git_branch"] == branch, out
    return str(out["tid"])


def someone_commits(repo: Path, path: str, text: str) -> str:
    """Another writer commits ``path`` on main (through a second worktree-free route: plumbing
    on a temporary index, so that the work tree and the user's index are not touched)."""
    import os
    import subprocess

    from test_git_commit import GIT_ENV

    env = {**GIT_ENV, "GIT_INDEX_FILE": str(repo / ".git" / "someone-index")}
    run = lambda *a, input=None: subprocess.run(  # noqa: E731
        ["git", *a], cwd=repo, env=env, input=input, capture_output=True, check=True
    ).stdout.decode().strip()
    run("read-tree", "main")
    blob = run("hash-object", "-w", "--stdin", input=text.encode())
    run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
    tree = run("write-tree")
    new = run("commit-tree", tree, "-p", "main", "-m", f"someone changed {path}")
    run("update-ref", "refs/heads/main", new)
    os.unlink(env["GIT_INDEX_FILE"])
    return new


def test_a_bound_branch_that_did_not_move_is_where_git_commit_commits(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    git(repo, "branch", "feature")
    old = head(repo, "refs/heads/feature")
    tid = begin_on(repo, "feature")
    tx = Agent2PC(repo).get(tid)
    tx.stage_write("a.txt", "A changed\n")
    assert tx.status()["git_branch"]["base"] == old
    out = tx.git_commit("onto the bound branch")  # no branch given: the bound one
    assert out["branch"] == "feature" and head(repo, "refs/heads/feature") == out["commit"]
    assert git(repo, "rev-parse", "feature^").strip() == old
    assert changed_in(repo, out["commit"]) == ["M\ta.txt"]
    assert_fsck_clean(repo)


@pytest.mark.parametrize("how", ["commit", "git-commit"])
def test_a_branch_moved_under_a_touched_file_is_a_conflict_and_nothing_lands(
        tmp_path: Path, how: str) -> None:
    repo = make_repo(tmp_path)
    tid = begin_on(repo)
    tx = Agent2PC(repo).get(tid)
    tx.stage_write("a.txt", "A changed\n")
    moved = someone_commits(repo, "a.txt", "someone's a\n")
    args = ["commit", "--tid", tid] if how == "commit" else \
        ["git-commit", "--tid", tid, "-m", "late"]
    proc = cli(repo, *args)
    assert proc.returncode == 1, proc.stdout
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == "conflict" and "moved since the transaction began" in err["message"]
    assert "a.txt" in err["message"]
    assert head(repo) == moved and (repo / "a.txt").read_text() == "a\n"
    assert_user_index_kept(repo)
    assert_fsck_clean(repo)


def test_a_branch_moved_under_a_recorded_read_is_a_conflict(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    tx = Agent2PC(repo).get(begin_on(repo))
    tx.record_read("sub/c.txt")
    tx.stage_write("a.txt", "relies on sub/c.txt\n")
    someone_commits(repo, "sub/c.txt", "changed under the reader\n")
    with pytest.raises(TransactionAborted, match="sub/c.txt"):
        tx.commit()
    assert (repo / "a.txt").read_text() == "a\n"


def test_a_branch_moved_elsewhere_goes_on_and_the_commit_is_a_fast_forward(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    tx = Agent2PC(repo).get(begin_on(repo))
    tx.stage_write("a.txt", "A changed\n")
    moved = someone_commits(repo, "unrelated.txt", "elsewhere\n")
    out = tx.git_commit("after someone else's")
    assert out["state"] == "committed"
    assert git(repo, "rev-parse", "main^").strip() == moved  # on top: a fast-forward of main
    assert changed_in(repo, out["commit"]) == ["M\ta.txt"]
    assert_fsck_clean(repo)


def test_abort_of_a_bound_transaction_leaves_no_ref_and_no_index_change(tmp_path: Path
                                                                       ) -> None:
    repo = make_repo(tmp_path)
    refs = git(repo, "for-each-ref")
    index = (repo / ".git" / "index").read_bytes()
    tx = Agent2PC(repo).get(begin_on(repo))
    tx.stage_write("a.txt", "A changed\n")
    tx.abort()
    assert git(repo, "for-each-ref") == refs
    assert (repo / ".git" / "index").read_bytes() == index
    assert_fsck_clean(repo)


@pytest.mark.parametrize("branch", ["nope", "-x", "bad..name"])
def test_a_bad_branch_at_begin_is_a_usage_error_and_begins_nothing(tmp_path: Path,
                                                                   branch: str) -> None:
    repo = make_repo(tmp_path)
    proc = cli(repo, "begin", f"--git-branch={branch}")
    assert proc.returncode == 2, proc.stdout
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == "usage" and branch in err["message"], err
    assert Agent2PC(repo).transactions() == []


def test_git_commit_onto_another_branch_than_the_bound_one_is_a_usage_error(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    git(repo, "branch", "other")
    tx = Agent2PC(repo).get(begin_on(repo))
    tx.stage_write("a.txt", "x\n")
    with pytest.raises(UsageError, match="begun on the branch main"):
        tx.git_commit("m", branch="other")
    assert tx.state() == "active"


def test_run_batch_on_a_branch_ends_with_a_git_commit(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    old = head(repo)
    manifest = {"label": "batch", "git_branch": "main",
                "git_commit": {"message": "batch: edit a", "author": "Bot <bot@example.com>"},
                "steps": [{"type": "fs_write", "path": "a.txt", "content": "from a batch\n"},
                          {"type": "command", "command": "grep -q batch a.txt"}]}
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    proc = cli(repo, "run-batch", "--file", str(tmp_path / "m.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["state"] == "committed" and out["branch"] == "main"
    assert out["commit"] == head(repo) and git(repo, "rev-parse", "main^").strip() == old
    assert git(repo, "log", "-1", "--format=%an|%s").strip() == "Bot|batch: edit a"


def test_run_batch_whose_git_hook_fails_aborts_and_commits_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho 'refused by the hook' >&2\nexit 1\n")
    hook.chmod(0o755)
    old = head(repo)
    manifest = {"git_commit": {"message": "m"},
                "steps": [{"type": "fs_write", "path": "a.txt", "content": "x\n"}]}
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    proc = cli(repo, "run-batch", "--file", str(tmp_path / "m.json"))
    assert proc.returncode == 1, proc.stdout
    out = json.loads(proc.stdout)
    assert out["error"]["code"] == "verification_failed" and out["state"] == "aborted"
    assert "refused by the hook" in out["error"]["message"]
    assert head(repo) == old and (repo / "a.txt").read_text() == "a\n"


@pytest.mark.parametrize("bad", [{"git_commit": "m"}, {"git_commit": {"message": ""}},
                                 {"git_commit": {"message": "m", "amend": True}},
                                 {"git_branch": 3}])
def test_a_bad_git_field_in_a_manifest_is_invalid_manifest(tmp_path: Path,
                                                           bad: dict) -> None:
    repo = make_repo(tmp_path)
    manifest = {**bad, "steps": [{"type": "fs_write", "path": "a.txt", "content": "x\n"}]}
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    proc = cli(repo, "run-batch", "--file", str(tmp_path / "m.json"))
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == \
        "invalid_manifest", proc.stdout
    assert Agent2PC(repo).transactions() == []


def test_a_bound_transaction_exports_its_files_without_the_binding(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    tx = Agent2PC(repo).get(begin_on(repo))
    tx.stage_write("a.txt", "A changed\n")
    out = tx.export(str(tmp_path / "t.a2pc"))
    assert out["bytes"] > 0
    imported = Agent2PC(repo).import_bundle(str(tmp_path / "t.a2pc"))
    assert imported["files"] == ["a.txt"]
