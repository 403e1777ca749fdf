"""git-commit: a transaction's files and a git commit of exactly its changes land as one unit.

Real git repositories; crashes are real processes killed at the named points
(AGENT2PC_CRASH_AT, as tests/test_crash_points.py does), then `agent-2pc recover`: after the
decision the files and the branch are both committed, before it neither, and `git fsck` is
clean after each. These scenarios cover the crash points git.after_objects, git.after_lock and
git.after_ref
(tests/test_crash_points.py lists them as covered here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from crashkit import cli, wal_is_clean

from agent_2pc import Agent2PC, TransactionAborted
from agent_2pc.errors import UsageError

pytestmark = pytest.mark.timeout(120)

GIT_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
           "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}


def git(repo: Path, *args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, input=input,
                          capture_output=True, check=True)
    return proc.stdout.decode()


def make_repo(tmp_path: Path) -> Path:
    """A repository with two commits' worth of files, an agent-2pc workspace, and a file the
    user staged (other.txt) plus one they modified without staging (dirty.txt)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Repo Owner")
    git(repo, "config", "user.email", "owner@example.com")
    for name, text in {"a.txt": "a\n", "b.txt": "b\n", "dirty.txt": "d\n",
                       "sub/c.txt": "c\n"}.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "init")
    Agent2PC.init(repo)
    (repo / "other.txt").write_text("the user's own, staged\n")
    git(repo, "add", "other.txt")
    (repo / "dirty.txt").write_text("the user's own, not staged\n")
    return repo


def stage_change(repo: Path) -> str:
    tx = Agent2PC(repo).begin(label="agent edit")
    tx.stage_write("a.txt", "A changed\n")
    tx.stage_delete("b.txt")
    tx.stage_write("new/tool.sh", "#!/bin/sh\necho hi\n", mode=0o755)
    return tx.tid


def head(repo: Path, ref: str = "refs/heads/main") -> str:
    return git(repo, "rev-parse", ref).strip()


def changed_in(repo: Path, commit: str) -> list[str]:
    return git(repo, "show", "--format=", "--name-status", commit).split("\n")[:-1]


def wait_for_dead_coordinators_git(repo: Path) -> None:
    """A coordinator killed while holding the branch leaves its ``git update-ref --stdin``
    (git/reftx.py) running a moment: git aborts the transaction when it reads end of input and
    only then removes its locks, main.lock and HEAD.lock (HEAD's log is updated with main).
    Wait (at most 10 s) for both to go."""
    locks = [repo / ".git" / "refs" / "heads" / "main.lock", repo / ".git" / "HEAD.lock"]
    deadline = time.monotonic() + 10
    while any(lock.exists() for lock in locks):
        assert time.monotonic() < deadline, "a lock outlived the crashed git-commit"
        time.sleep(0.02)


def killed_after_the_decision(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository whose git-commit was killed once its commit decision was durable (nothing
    applied), the dead coordinator's git gone: (repo, the branch's commit before, tid)."""
    repo = make_repo(tmp_path)
    old = head(repo)
    tid = stage_change(repo)
    proc = cli(repo, "git-commit", "--tid", tid, "-m", "later",
               env={"AGENT2PC_CRASH_AT": "commit.after_decision"})
    assert proc.returncode == 137
    wait_for_dead_coordinators_git(repo)  # else its removal of main.lock could take ours
    return repo, old, tid


def assert_fsck_clean(repo: Path) -> None:
    git(repo, "fsck", "--no-dangling", "--strict")


def assert_user_index_kept(repo: Path) -> None:
    status = git(repo, "status", "--porcelain")
    assert "A  other.txt" in status.splitlines(), status
    assert " M dirty.txt" in status.splitlines(), status


def test_git_commit_makes_one_commit_of_exactly_the_transaction_and_keeps_the_users_index(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    old = head(repo)
    tid = stage_change(repo)
    out = Agent2PC(repo).get(tid).git_commit("agent: edit a, drop b")
    assert out["state"] == "committed" and out["branch"] == "main"
    assert out["commit"] == head(repo) != old
    assert git(repo, "rev-parse", out["commit"] + "^").strip() == old
    assert sorted(changed_in(repo, out["commit"])) == [
        "A\tnew/tool.sh", "D\tb.txt", "M\ta.txt"]
    assert git(repo, "log", "-1", "--format=%an <%ae>|%s").strip() == (
        "Repo Owner <owner@example.com>|agent: edit a, drop b")
    assert git(repo, "ls-tree", out["commit"], "new/tool.sh").startswith("100755 blob")
    assert (repo / "a.txt").read_text() == "A changed\n" and not (repo / "b.txt").exists()
    status = git(repo, "status", "--porcelain").splitlines()
    assert sorted(status) == [" M dirty.txt", "A  other.txt"], status  # nothing of ours
    assert "other.txt" not in git(repo, "ls-tree", "-r", "--name-only", out["commit"])
    assert_fsck_clean(repo)


def test_git_commit_from_the_cli_with_author_and_short_message_flag(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    tid = stage_change(repo)
    proc = cli(repo, "git-commit", "--tid", tid, "-m", "by the bot", "--author",
               "Agent Bot <bot@example.com>")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] and out["commit"] == head(repo) and out["branch"] == "main"
    assert out["files"] == ["a.txt", "b.txt", "new/tool.sh"]
    assert git(repo, "log", "-1", "--format=%an <%ae>|%cn").strip() == (
        "Agent Bot <bot@example.com>|Repo Owner")
    assert_user_index_kept(repo)
    again = json.loads(cli(repo, "commit", "--tid", tid).stdout)  # the same answer
    assert again["commit"] == out["commit"] and again["branch"] == "main"


def test_a_branch_moved_between_begin_and_commit_is_the_parent(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    tid = stage_change(repo)
    git(repo, "commit", "-q", "-m", "the user's commit meanwhile")  # commits other.txt
    moved = head(repo)
    out = Agent2PC(repo).get(tid).git_commit("agent change")
    assert git(repo, "rev-parse", out["commit"] + "^").strip() == moved
    assert "other.txt" in git(repo, "ls-tree", "-r", "--name-only", out["commit"])
    assert_fsck_clean(repo)


def test_another_branch_moves_and_the_users_index_is_not_touched(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    git(repo, "branch", "agent")
    index_before = git(repo, "ls-files", "-s")
    tid = stage_change(repo)
    out = Agent2PC(repo).get(tid).git_commit("on agent", branch="agent")
    assert out["branch"] == "agent" and head(repo, "refs/heads/agent") == out["commit"]
    assert git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert git(repo, "ls-files", "-s") == index_before


@pytest.mark.parametrize("case", ["detached", "unborn", "missing_branch", "bad_author",
                                  "empty_message", "index_locked"])
def test_bad_input_is_a_usage_error_and_changes_nothing(tmp_path: Path, case: str) -> None:
    repo = make_repo(tmp_path)
    kwargs: dict[str, str] = {"message": "m"}
    if case == "detached":
        git(repo, "checkout", "-q", "--detach")
    elif case == "unborn":
        git(repo, "checkout", "-q", "--orphan", "fresh")
    elif case == "missing_branch":
        kwargs["branch"] = "nope"
    elif case == "bad_author":
        kwargs["author"] = "no email"
    elif case == "empty_message":
        kwargs["message"] = " "
    elif case == "index_locked":
        (repo / ".git" / "index.lock").write_bytes(b"")
    refs, index = git(repo, "show-ref"), (repo / ".git" / "index").read_bytes()
    tid = stage_change(repo)
    tx = Agent2PC(repo).get(tid)
    with pytest.raises(UsageError) as err:
        tx.git_commit(**kwargs)
    assert err.value.code == "usage"
    assert tx.state() == "active" and (repo / "a.txt").read_text() == "a\n"
    assert git(repo, "show-ref") == refs and (repo / ".git" / "index").read_bytes() == index
    proc = cli(repo, "git-commit", "--tid", tid, *[f"--{k}={v}" for k, v in kwargs.items()])
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == "usage"


def test_a_file_conflict_aborts_and_moves_no_ref(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    old = head(repo)
    tid = stage_change(repo)
    (repo / "a.txt").write_text("someone else\n")
    with pytest.raises(TransactionAborted) as err:
        Agent2PC(repo).get(tid).git_commit("m")
    assert err.value.code == "conflict" and head(repo) == old
    assert_fsck_clean(repo)


# -- crashes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("point,expect", [
    ("git.after_objects", "old"),
    ("git.after_lock", "old"),
    ("prepare.before_decision", "old"),
    ("commit.after_decision", "new"),
    ("commit.mid_apply:2", "new"),
    ("commit.before_end", "new"),
    ("git.after_ref", "new"),
])
def test_a_crash_then_recover_lands_files_and_branch_together(tmp_path: Path, point: str,
                                                             expect: str) -> None:
    repo = make_repo(tmp_path)
    old = head(repo)
    tid = stage_change(repo)
    proc = cli(repo, "git-commit", "--tid", tid, "-m", "crashing",
               env={"AGENT2PC_CRASH_AT": point})
    assert proc.returncode == 137, (proc.stdout, proc.stderr)
    out = json.loads(cli(repo, "recover").stdout)
    assert wal_is_clean(repo)
    state = Agent2PC(repo).status(tid)["transactions"][0]["state"]
    if expect == "old":
        assert tid in out["rolled_back"] and state == "aborted"
        assert head(repo) == old and (repo / "a.txt").read_text() == "a\n"
        assert (repo / "b.txt").exists() and not (repo / "new").exists()
    else:
        assert tid in out["rolled_forward"] and state == "committed"
        new = head(repo)
        assert git(repo, "rev-parse", new + "^").strip() == old
        assert sorted(changed_in(repo, new)) == ["A\tnew/tool.sh", "D\tb.txt", "M\ta.txt"]
        assert (repo / "a.txt").read_text() == "A changed\n" and not (repo / "b.txt").exists()
        status = git(repo, "status", "--porcelain").splitlines()
        assert sorted(status) == [" M dirty.txt", "A  other.txt"], status
    assert_user_index_kept(repo)
    assert_fsck_clean(repo)


def test_a_branch_moved_after_the_decision_is_left_and_reported_diverged(tmp_path: Path
                                                                         ) -> None:
    repo = make_repo(tmp_path)
    tid = stage_change(repo)
    proc = cli(repo, "git-commit", "--tid", tid, "-m", "crashing",
               env={"AGENT2PC_CRASH_AT": "commit.after_decision"})
    assert proc.returncode == 137
    wait_for_dead_coordinators_git(repo)
    git(repo, "commit", "-q", "-m", "someone moved main")  # after the decision
    moved = head(repo)
    out = json.loads(cli(repo, "recover").stdout)
    assert tid in out["rolled_forward"]
    assert head(repo) == moved  # never forced
    answer = json.loads(cli(repo, "commit", "--tid", tid).stdout)
    assert answer["diverged"] == ["refs/heads/main"]
    assert (repo / "a.txt").read_text() == "A changed\n"
    assert_fsck_clean(repo)


def _stalled_git_commit(repo: Path, tid: str, point: str) -> subprocess.Popen[str]:
    env = {**os.environ, "AGENT2PC_STALL_AT": point, "AGENT2PC_STALL_S": "4"}
    env.pop("AGENT2PC_CRASH_AT", None)
    return subprocess.Popen([sys.executable, "-m", "agent_2pc", "--root", str(repo),
                             "git-commit", "--tid", tid, "-m", "racing", "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(what: str, done: Any, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 20
    while not done():
        assert proc.poll() is None, (what, proc.communicate())
        assert time.monotonic() < deadline, f"git-commit never got to {what}"
        time.sleep(0.02)


def _our_commit_written(repo: Path) -> bool:
    listing = git(repo, "cat-file", "--batch-all-objects", "--batch-check=%(objecttype) "
                  "%(objectname)").split("\n")
    commits = [line.split()[1] for line in listing if line.startswith("commit ")]
    return any(git(repo, "log", "-1", "--format=%s", sha).strip() == "racing"
               for sha in commits)


def test_a_branch_moved_between_the_commit_and_the_lock_is_a_conflict_and_nothing_lands(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    tid = stage_change(repo)
    proc = _stalled_git_commit(repo, tid, "git.after_objects")
    _wait_for("its commit object", lambda: _our_commit_written(repo), proc)
    git(repo, "commit", "-q", "-m", "the user's commit, meanwhile")
    moved = head(repo)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    answer = json.loads(out)
    assert answer["error"]["code"] == "conflict" and "main" in answer["error"]["message"]
    assert head(repo) == moved and (repo / "a.txt").read_text() == "a\n"
    assert (repo / "b.txt").exists() and not (repo / "new").exists()
    assert Agent2PC(repo).status(tid)["transactions"][0]["state"] == "aborted"
    assert not (repo / ".git" / "refs" / "heads" / "main.lock").exists()
    assert_fsck_clean(repo)


def test_after_the_yes_vote_no_git_process_can_move_the_branch(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    old = head(repo)
    tid = stage_change(repo)
    proc = _stalled_git_commit(repo, tid, "git.after_lock")
    lock = repo / ".git" / "refs" / "heads" / "main.lock"
    _wait_for("the ref's lock", lock.exists, proc)
    refused = subprocess.run(["git", "commit", "-q", "-m", "the user's, meanwhile"], cwd=repo,
                             env=GIT_ENV, capture_output=True, text=True)
    assert refused.returncode != 0 and "lock" in refused.stderr, refused
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    answer = json.loads(out)
    assert answer["state"] == "committed" and head(repo) == answer["commit"]
    assert git(repo, "rev-parse", "main^").strip() == old and not lock.exists()
    assert_user_index_kept(repo)
    assert_fsck_clean(repo)


def test_an_index_lock_held_a_moment_by_another_git_is_waited_for_not_refused(
        tmp_path: Path) -> None:
    """Another agent's git-commit updates the user's index (``git reset``) holding index.lock
    for milliseconds: a git-commit staged meanwhile waits for it (up to 1 s) rather than
    refusing with ``usage`` (seen with agents committing to one repository at once)."""
    import threading

    repo = make_repo(tmp_path)
    tid = stage_change(repo)
    tx = Agent2PC(repo).get(tid)
    lock = repo / ".git" / "index.lock"
    lock.write_bytes(b"")
    started = time.monotonic()
    threading.Timer(0.3, lock.unlink).start()
    out = tx.git_commit("after the lock")
    assert time.monotonic() - started >= 0.3
    assert head(repo) == out["commit"] and not lock.exists()
    assert_fsck_clean(repo)


def test_a_crash_holding_the_ref_lock_leaves_no_lock_behind(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    tid = stage_change(repo)
    proc = cli(repo, "git-commit", "--tid", tid, "-m", "crashing",
               env={"AGENT2PC_CRASH_AT": "git.after_lock"})
    assert proc.returncode == 137
    wait_for_dead_coordinators_git(repo)
    git(repo, "commit", "-q", "-m", "the user can commit again")


def test_a_workspace_below_the_top_of_the_work_tree_commits_its_paths_under_it(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    sub = repo / "sub"
    Agent2PC.init(sub)
    tx = Agent2PC(sub).begin()
    tx.stage_write("c.txt", "C\n")
    tx.stage_write("d/e.txt", "e\n")
    out = tx.git_commit("in sub")
    assert sorted(changed_in(repo, out["commit"])) == ["A\tsub/d/e.txt", "M\tsub/c.txt"]
    status = git(repo, "status", "--porcelain", "--untracked-files=no").splitlines()
    assert sorted(status) == [" M dirty.txt", "A  other.txt"], status
    assert_fsck_clean(repo)


def test_a_workspace_outside_git_is_a_usage_error(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    client = Agent2PC.init(plain)
    tx = client.begin()
    tx.stage_write("x.txt", "x\n")
    with pytest.raises(UsageError, match="not in a git (work tree|repository)"):
        tx.git_commit("m")
    assert tx.state() == "active" and not (plain / "x.txt").exists()


def test_a_locked_ref_at_apply_leaves_it_committing_and_recover_finishes_it_later(
        tmp_path: Path) -> None:
    repo, old, tid = killed_after_the_decision(tmp_path)
    lock = repo / ".git" / "refs" / "heads" / "main.lock"
    os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL))  # a git process updates main
    cli(repo, "recover")
    assert head(repo) == old
    status = cli(repo, "status", "--tid", tid)
    assert status.returncode == 2, status.stdout
    err = json.loads(status.stdout)["error"]
    assert err["code"] == "apply_incomplete" and "main.lock" in err["message"], err
    lock.unlink()
    out = json.loads(cli(repo, "recover").stdout)
    assert tid in out["rolled_forward"]
    assert git(repo, "rev-parse", "main^").strip() == old
    assert (repo / "a.txt").read_text() == "A changed\n"
    assert_fsck_clean(repo)


def test_recover_waits_for_the_ref_locks_a_dead_coordinators_git_is_still_removing(
        tmp_path: Path) -> None:
    repo, old, tid = killed_after_the_decision(tmp_path)
    # What a slow host shows: the killed coordinator's git has not removed its locks yet.
    locks = [repo / ".git" / "refs" / "heads" / "main.lock", repo / ".git" / "HEAD.lock"]
    for lock in locks:
        os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    recover = subprocess.Popen([sys.executable, "-m", "agent_2pc", "--root", str(repo),
                                "recover", "--json"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.6)  # git waits up to 100 ms by default
    assert recover.poll() is None, "recover did not wait for the branch's lock"
    for lock in locks:
        lock.unlink()
    out = json.loads(recover.communicate(timeout=60)[0])
    assert tid in out["rolled_forward"] and recover.returncode == 0, out
    assert git(repo, "rev-parse", "main^").strip() == old
    assert Agent2PC(repo).status(tid)["transactions"][0]["state"] == "committed"
    assert_fsck_clean(repo)


def test_a_stuck_redo_is_retried_by_later_commits_only_after_its_back_off(
        tmp_path: Path) -> None:
    repo, old, tid = killed_after_the_decision(tmp_path)
    lock = repo / ".git" / "refs" / "heads" / "main.lock"
    os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL))  # stale: a git killed hard
    started = time.monotonic()
    client = Agent2PC(repo, daemon=False)  # its start-up redo waits 1 s for the lock, fails
    assert time.monotonic() - started >= 1.0
    for n in range(3):  # each commit finishes dead transactions first: not this one yet
        started = time.monotonic()
        tx = client.begin()
        tx.stage_write(f"other{n}.txt", "x\n")
        tx.commit()
        assert time.monotonic() - started < 0.9, "a commit waited on the stuck redo's lock"
    assert head(repo) == old
    lock.unlink()
    out = client.recover()  # recover retries at once
    assert tid in out["rolled_forward"]
    assert client.status(tid)["transactions"][0]["state"] == "committed"
    client.close()


def test_a_symbolic_link_is_committed_as_a_link_and_an_empty_directory_not_at_all(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "ln -s a.txt to-a && mkdir empty"])
    out = tx.git_commit("a link")
    assert git(repo, "ls-tree", out["commit"], "to-a").startswith("120000 blob")
    assert git(repo, "cat-file", "-p", out["commit"] + ":to-a") == "a.txt"
    assert changed_in(repo, out["commit"]) == ["A\tto-a"]
    assert (repo / "empty").is_dir() and os.readlink(repo / "to-a") == "a.txt"
    assert_fsck_clean(repo)


def test_a_branch_checked_out_in_another_worktree_is_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    git(repo, "worktree", "add", "-q", "-b", "elsewhere", str(tmp_path / "other"))
    refs = git(repo, "show-ref")
    tx = Agent2PC(repo).begin()
    tx.stage_write("a.txt", "x\n")
    with pytest.raises(UsageError, match="checked out in the worktree"):
        tx.git_commit("m", branch="elsewhere")
    assert git(repo, "show-ref") == refs and tx.state() == "active"
    assert tx.git_commit("m", branch="main")["branch"] == "main"  # its own branch is fine


def test_in_a_linked_worktree_the_commit_goes_onto_its_branch(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    other = tmp_path / "other"
    git(repo, "worktree", "add", "-q", "-b", "feature", str(other))
    main_before = head(repo)
    tx = Agent2PC.init(other).begin()
    tx.stage_write("a.txt", "in the worktree\n")
    out = tx.git_commit("from a worktree")
    assert out["branch"] == "feature" and head(repo, "refs/heads/feature") == out["commit"]
    assert head(repo) == main_before
    assert git(other, "status", "--porcelain", "--untracked-files=no") == ""
    assert_fsck_clean(repo)


def test_a_git_decision_or_effect_of_the_wrong_shape_is_a_bad_record() -> None:
    from agent_2pc.core.records import shape_problem

    good = {"type": "decision", "tid": "t", "ts": 1, "outcome": "commit",
            "git": {"ref": "refs/heads/main", "old": "a" * 40, "new": "b" * 40, "prefix": ""}}
    assert shape_problem(good) is None
    assert "'new'" in (shape_problem({**good, "git": {**good["git"], "new": 7}}) or "")
    effect = {"type": "effect", "tid": "t", "ts": 1, "n": 0, "kind": "git", "key": "k",
              "request": {"message": "m", "author": None, "branch": "main", "prefix": ""}}
    assert shape_problem(effect) is None
    assert "'branch'" in (shape_problem({**effect, "request": {"message": "m"}}) or "")


def test_new_files_git_ignores_land_on_disk_but_not_in_the_commit(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    (repo / ".gitignore").write_text("build/\n*.log\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore build/ and logs", "--", ".gitignore")
    (repo / "tracked.log").write_text("tracked before the rule\n")
    git(repo, "add", "-f", "tracked.log")
    git(repo, "commit", "-q", "-m", "a tracked log", "--", "tracked.log")
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "mkdir -p build && echo obj > build/out.o && echo new > run.log && "
                         "echo more >> tracked.log && echo src > src.c"])
    out = tx.git_commit("build")
    assert out["git_ignored"] == ["build/out.o", "run.log"], out
    assert sorted(changed_in(repo, out["commit"])) == ["A\tsrc.c", "M\ttracked.log"]
    assert (repo / "build" / "out.o").read_text() == "obj\n"  # the files all landed
    assert (repo / "run.log").exists()
    assert git(repo, "status", "--porcelain", "src.c", "tracked.log") == ""
    assert_user_index_kept(repo)
    assert_fsck_clean(repo)
