"""git-commit runs git's hooks as `git commit` does, in the staged view; -F, --no-verify, --sign.

Real repositories and real hook scripts (tests/test_git_commit.py has the atomicity and crash
tests of git-commit; tests/test_git_hooks.py the pre-commit gate itself).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from crashkit import cli
from test_git_commit import assert_fsck_clean, assert_user_index_kept, git, head, make_repo

from agent_2pc import Agent2PC
from agent_2pc.errors import CheckFailed

pytestmark = pytest.mark.timeout(120)


def hook(repo: Path, name: str, body: str, directory: str = ".git/hooks") -> Path:
    path = repo / directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def staged(repo: Path, text: str = "A changed\n") -> str:
    tx = Agent2PC(repo).begin(label="hooks")
    tx.stage_write("a.txt", text)
    return tx.tid


def git_commit(repo: Path, tid: str, *args: str, input: str | None = None
               ) -> tuple[int, dict]:
    proc = subprocess.run(
        [*cli_argv(repo), "git-commit", "--tid", tid, *args, "--json"], input=input,
        capture_output=True, text=True, timeout=60)
    return proc.returncode, json.loads(proc.stdout)


def cli_argv(repo: Path) -> list[str]:
    import sys

    return [sys.executable, "-m", "agent_2pc", "--root", str(repo)]


def test_pre_commit_sees_the_staged_tree_and_its_index_and_writes_nothing_to_the_tree(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    hook(repo, "pre-commit",
         'echo "$(cat a.txt)|$(git diff --cached --name-only | tr "\\n" " ")" > "$SEEN"\n'
         'echo formatted > a.txt; echo litter > hook-litter.txt\n')
    seen = tmp_path / "seen"
    os.environ["SEEN"] = str(seen)
    try:
        tid = staged(repo)
        code, out = git_commit(repo, tid, "-m", "with hooks")
    finally:
        del os.environ["SEEN"]
    assert code == 0, out
    # the repository as it will be after the commit, and the commit's own index
    assert seen.read_text() == "A changed|a.txt \n"
    assert out["hooks"] == [{"hook": "pre-commit", "exit_code": 0}]
    assert git(repo, "show", f"{out['commit']}:a.txt") == "A changed\n"
    assert (repo / "a.txt").read_text() == "A changed\n"  # the hook's writes stayed in the view
    assert not (repo / "hook-litter.txt").exists()
    assert_user_index_kept(repo)
    assert_fsck_clean(repo)


def test_a_failing_pre_commit_commits_nothing_shows_its_output_and_keeps_the_transaction(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    hook(repo, "pre-commit", 'grep -q BAD a.txt && { echo "lint: a.txt is BAD" >&2; exit 3; }\n'
                             'exit 0\n')
    old = head(repo)
    tid = staged(repo, "BAD\n")
    code, out = git_commit(repo, tid, "-m", "refused")
    assert code == 1 and out["error"]["code"] == "verification_failed", out
    message = out["error"]["message"]
    assert "pre-commit hook failed (exit 3)" in message and "lint: a.txt is BAD" in message
    assert head(repo) == old and (repo / "a.txt").read_text() == "a\n"
    tx = Agent2PC(repo).get(tid)
    assert tx.state() == "active"
    tx.stage_write("a.txt", "good\n")  # fixed: the same transaction commits
    out2 = tx.git_commit("fixed")
    assert out2["state"] == "committed" and git(repo, "rev-parse", "main^").strip() == old
    assert_user_index_kept(repo)
    assert_fsck_clean(repo)


def test_commit_msg_rewrites_the_message_and_post_commit_runs_after_the_commit(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    hook(repo, "prepare-commit-msg", 'test "$2" = message && echo "[prepared]" >> "$1"\n')
    hook(repo, "commit-msg", 'printf "\\nSigned-off-by: Hook <h@example.com>\\n" >> "$1"\n')
    marker = tmp_path / "post"
    hook(repo, "post-commit", f'git rev-parse HEAD > {marker}; cat a.txt >> {marker}\n')
    tid = staged(repo)
    code, out = git_commit(repo, tid, "-m", "subject")
    assert code == 0, out
    assert [h["hook"] for h in out["hooks"]] == ["prepare-commit-msg", "commit-msg",
                                                 "post-commit"]
    body = git(repo, "log", "-1", "--format=%B", out["commit"])
    assert body.startswith("subject") and "[prepared]" in body
    assert "Signed-off-by: Hook <h@example.com>" in body
    # post-commit ran once the branch and the files were both committed
    assert marker.read_text() == out["commit"] + "\nA changed\n"


def test_a_failing_post_commit_changes_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    hook(repo, "post-commit", "exit 9\n")
    code, out = git_commit(repo, staged(repo), "-m", "post fails")
    assert code == 0 and out["state"] == "committed", out
    assert out["hooks"] == [{"hook": "post-commit", "exit_code": 9}]
    assert head(repo) == out["commit"]


def test_no_verify_skips_pre_commit_and_commit_msg_but_runs_prepare_commit_msg(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    hook(repo, "pre-commit", "exit 1\n")
    hook(repo, "commit-msg", "exit 1\n")
    hook(repo, "prepare-commit-msg", 'echo "[prepared]" >> "$1"\n')
    code, out = git_commit(repo, staged(repo), "-m", "unverified", "--no-verify")
    assert code == 0, out
    assert out["hooks"] == [{"hook": "prepare-commit-msg", "exit_code": 0}]
    assert "[prepared]" in git(repo, "log", "-1", "--format=%B")


def test_a_message_emptied_by_a_hook_commits_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    hook(repo, "commit-msg", ': > "$1"\n')
    old = head(repo)
    code, out = git_commit(repo, staged(repo), "-m", "soon empty")
    assert code == 1 and out["error"]["code"] == "verification_failed", out
    assert "empty" in out["error"]["message"] and head(repo) == old


def test_core_hooks_path_is_where_the_hooks_are_found(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    hook(repo, "pre-commit", "exit 1\n")  # not the hooks git runs any more
    hook(repo, "commit-msg", 'echo "Hooks-Path: yes" >> "$1"\n', directory="my-hooks")
    git(repo, "config", "core.hooksPath", "my-hooks")
    code, out = git_commit(repo, staged(repo), "-m", "elsewhere")
    assert code == 0, out
    assert "Hooks-Path: yes" in git(repo, "log", "-1", "--format=%B")


def test_the_installed_gate_lets_git_commit_through_and_its_chained_hook_runs(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    hook(repo, "pre-commit", 'echo chained-ran >> "$MARK"\n')
    assert json.loads(cli(repo, "hook", "install").stdout)["chained"] is True
    other = Agent2PC(repo).begin(label="another agent, in flight")
    other.stage_write("z.txt", "z\n")
    mark = tmp_path / "mark"
    os.environ["MARK"] = str(mark)
    try:
        code, out = git_commit(repo, staged(repo), "-m", "through the gate")
    finally:
        del os.environ["MARK"]
    assert code == 0, out
    assert mark.read_text() == "chained-ran\n"
    # the gate still refuses a person's `git commit` while the other one is in flight
    refused = subprocess.run(["git", "commit", "-q", "-m", "by hand"], cwd=repo,
                             capture_output=True, text=True)
    assert refused.returncode != 0


def test_the_message_from_a_file_or_stdin(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    msg = tmp_path / "MSG"
    msg.write_text("from a file\n\nwith a body\n")
    code, out = git_commit(repo, staged(repo), "-F", str(msg))
    assert code == 0, out
    assert git(repo, "log", "-1", "--format=%B").startswith("from a file\n\nwith a body")
    code, out = git_commit(repo, staged(repo, "again\n"), "-F", "-", input="from stdin\n")
    assert code == 0, out
    assert git(repo, "log", "-1", "--format=%s") == "from stdin\n"


@pytest.mark.parametrize("case", ["both", "neither", "missing", "not-utf8"])
def test_a_bad_message_file_is_a_usage_error_and_changes_nothing(tmp_path: Path,
                                                                 case: str) -> None:
    repo = make_repo(tmp_path)
    old = head(repo)
    tid = staged(repo)
    msg = tmp_path / "MSG"
    msg.write_bytes(b"\xff\xfe not text" if case == "not-utf8" else b"fine\n")
    args = {"both": ["-m", "x", "-F", str(msg)], "neither": [],
            "missing": ["-F", str(tmp_path / "nope")], "not-utf8": ["-F", str(msg)]}[case]
    code, out = git_commit(repo, tid, *args)
    assert code == 2 and out["error"]["code"] == "usage", out
    assert head(repo) == old and Agent2PC(repo).get(tid).state() == "active"


FAKE_GPG = """#!/bin/sh
# stands in for gpg: what git asks of it (--status-fd=2 -bsau KEY, the payload on stdin)
cat > /dev/null
echo "$@" >> "$GPG_LOG"
printf '[GNUPG:] BEGIN_SIGNING\\n[GNUPG:] SIG_CREATED D 1 8 00 1 X\\n' >&2
printf -- '-----BEGIN PGP SIGNATURE-----\\n\\nZmFrZQ==\\n-----END PGP SIGNATURE-----\\n'
"""


@pytest.mark.parametrize("how", ["--sign", "commit.gpgSign"])
def test_the_commit_is_signed_with_sign_or_commit_gpgsign(tmp_path: Path, how: str) -> None:
    repo = make_repo(tmp_path)
    gpg = tmp_path / "fake-gpg"
    gpg.write_text(FAKE_GPG)
    gpg.chmod(0o755)
    git(repo, "config", "gpg.program", str(gpg))
    args = ["--sign"] if how == "--sign" else []
    if how == "commit.gpgSign":
        git(repo, "config", "commit.gpgSign", "true")
    os.environ["GPG_LOG"] = str(tmp_path / "gpg.log")
    try:
        code, out = git_commit(repo, staged(repo), "-m", "signed", *args)
    finally:
        del os.environ["GPG_LOG"]
    assert code == 0, out
    raw = git(repo, "cat-file", "commit", out["commit"])
    assert "gpgsig -----BEGIN PGP SIGNATURE-----" in raw
    assert "-bsau" in (tmp_path / "gpg.log").read_text()
    assert_fsck_clean(repo)


def test_a_signature_that_cannot_be_made_commits_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    git(repo, "config", "gpg.program", str(tmp_path / "no-such-gpg"))
    old = head(repo)
    tid = staged(repo)
    code, out = git_commit(repo, tid, "-m", "unsignable", "--sign")
    assert code == 1 and out["state"] == "aborted", out
    assert "git commit could not be made" in out["error"]["message"]
    assert head(repo) == old and (repo / "a.txt").read_text() == "a\n"


def test_the_library_raises_check_failed_for_a_failing_hook(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    hook(repo, "pre-commit", "echo nope >&2; exit 1\n")
    tx = Agent2PC(repo).begin()
    tx.stage_write("a.txt", "x\n")
    with pytest.raises(CheckFailed, match="nope"):
        tx.git_commit("m")
    assert tx.git_commit("m", verify=False)["state"] == "committed"
