"""The pre-commit gate (docs/git.md): real git repositories, real ``git commit`` runs.

Every git command, and the CLI, runs with HOME set to a directory of the test's own, so that the
machine's global git configuration (a core.hooksPath, say) changes nothing here.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import parse_one_object, run_cli

from agent_2pc import Agent2PC
from agent_2pc.git import hooks

pytestmark = pytest.mark.timeout(120)

USER_HOOK_PASS = "#!/bin/sh\necho user-hook-ran >&2\nexit 0\n"
USER_HOOK_REFUSE = "#!/bin/sh\necho user-hook-refuses >&2\nexit 3\n"


@pytest.fixture
def home(tmp_path: Path) -> str:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = T\n\temail = t@example.com\n"
                                     "[init]\n\tdefaultBranch = main\n")
    return str(home)


def git(cwd: str, home: str, *args: str, check: bool = True
        ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GIT_") and not k.startswith("AGENT2PC_")}
    env["HOME"] = home
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def cli(cwd: str, home: str, *args: str) -> tuple[int, dict[str, Any]]:
    proc = run_cli(args, json_out=True, cwd=cwd, env={"HOME": home})
    return proc.returncode, parse_one_object(proc)


def make_repo(path: Path, home: str, workspace: bool = True) -> str:
    path.mkdir()
    git(str(path), home, "init", "-q")
    (path / ".gitignore").write_text(".agent-tx/\n")
    git(str(path), home, "add", ".gitignore")
    git(str(path), home, "commit", "-q", "-m", "first")
    if workspace:
        Agent2PC.init(path).close()
    return os.path.realpath(path)


@pytest.fixture
def repo(tmp_path: Path, home: str) -> str:
    return make_repo(tmp_path / "repo", home)


def try_commit(repo: str, home: str, name: str = "f.txt") -> subprocess.CompletedProcess[str]:
    Path(repo, name).write_text(name + "\n")
    git(repo, home, "add", name)
    return git(repo, home, "commit", "-q", "-m", f"add {name}", check=False)


def live_transaction(root: str, label: str = "refactor") -> str:
    client = Agent2PC(root)
    try:
        tx = client.begin(label=label)
        tx.stage_write("src/app.py", "print(1)\n")
        return tx.tid
    finally:
        client.close()


def hook_file(repo: str, name: str = "pre-commit") -> Path:
    return Path(repo, ".git", "hooks", name)


# -- the gate ---------------------------------------------------------------------------------


def test_commit_is_refused_while_a_transaction_is_live_and_allowed_once_it_commits(
        repo: str, home: str) -> None:
    assert cli(repo, home, "hook", "install")[0] == 0
    tid = live_transaction(repo)
    refused = try_commit(repo, home)
    assert refused.returncode != 0
    assert tid in refused.stderr and "refactor" in refused.stderr
    assert "src/app.py" in refused.stderr
    assert git(repo, home, "rev-list", "--count", "HEAD").stdout.strip() == "1"
    Agent2PC(repo).get(tid).commit()
    assert try_commit(repo, home).returncode == 0
    assert git(repo, home, "rev-list", "--count", "HEAD").stdout.strip() == "2"


def test_commit_is_allowed_once_the_live_transaction_aborts(repo: str, home: str) -> None:
    cli(repo, home, "hook", "install")
    tid = live_transaction(repo)
    assert try_commit(repo, home).returncode != 0
    Agent2PC(repo).get(tid).abort("gave up")
    assert try_commit(repo, home).returncode == 0


def test_hook_check_json_is_ok_with_an_empty_list_then_in_flight_with_each_transaction(
        repo: str, home: str) -> None:
    status, out = cli(repo, home, "hook", "check")
    assert (status, out["ok"], out["in_flight"]) == (0, True, [])
    tid = live_transaction(repo, label="one")
    status, out = cli(repo, home, "hook", "check")
    assert status == 1 and out["ok"] is False and out["error"]["code"] == "in_flight"
    [row] = out["in_flight"]
    assert set(row) == {"tid", "label", "state", "age_s", "files"}
    assert (row["tid"], row["label"], row["state"], row["files"]) == (
        tid, "one", "active", ["src/app.py"])
    assert isinstance(row["age_s"], (int, float)) and row["age_s"] >= 0


def test_hook_check_text_lists_the_transactions_on_stderr_and_exits_1(
        repo: str, home: str) -> None:
    tid = live_transaction(repo, label="lbl")
    proc = run_cli(("hook", "check"), cwd=repo, env={"HOME": home})
    assert proc.returncode == 1 and proc.stdout == b""
    err = proc.stderr.decode()
    assert tid in err and "lbl" in err and "src/app.py" in err and "[in_flight]" in err


def test_hook_check_refuses_to_guess_on_a_log_damaged_before_its_tail(
        repo: str, home: str) -> None:
    tid = live_transaction(repo, label="first")
    live_transaction(repo, label="second")
    wal = Path(repo, ".agent-tx", "wal.bin")
    data = bytearray(wal.read_bytes())
    at = data.index(tid.encode()) + len(tid) - 1
    data[at] ^= 0x01  # the first transaction's begin record fails its CRC; good ones follow
    wal.write_bytes(bytes(data))
    status, out = cli(repo, home, "hook", "check")
    assert status == 2 and out["error"]["code"] == "corrupt_wal", out


# -- chaining ---------------------------------------------------------------------------------


def test_an_existing_hook_is_chained_and_its_refusal_still_refuses(repo: str, home: str) -> None:
    user = hook_file(repo)
    user.write_text(USER_HOOK_REFUSE)
    user.chmod(0o750)
    status, out = cli(repo, home, "hook", "install")
    assert status == 0 and out == {"ok": True, "hook": str(user), "chained": True}
    chained = hook_file(repo, hooks.CHAINED_NAME)
    assert chained.read_text() == USER_HOOK_REFUSE
    refused = try_commit(repo, home)
    assert refused.returncode != 0 and "user-hook-refuses" in refused.stderr


def test_a_passing_chained_hook_lets_the_gate_decide(repo: str, home: str) -> None:
    hook_file(repo).write_text(USER_HOOK_PASS)
    hook_file(repo).chmod(0o755)
    cli(repo, home, "hook", "install")
    tid = live_transaction(repo)
    refused = try_commit(repo, home)
    assert refused.returncode != 0 and tid in refused.stderr
    Agent2PC(repo).get(tid).commit()
    passed = try_commit(repo, home)
    assert passed.returncode == 0 and "user-hook-ran" in passed.stderr


def test_uninstall_restores_the_users_hook_exactly_content_and_mode(
        repo: str, home: str) -> None:
    user = hook_file(repo)
    user.write_bytes(USER_HOOK_PASS.encode() + b"# \xff not utf-8\n")
    user.chmod(0o741)
    before = (user.read_bytes(), stat.S_IMODE(user.stat().st_mode), user.stat().st_ino)
    cli(repo, home, "hook", "install")
    status, out = cli(repo, home, "hook", "uninstall")
    assert status == 0 and out == {"ok": True, "hook": str(user), "chained": True,
                                   "removed": True}
    assert (user.read_bytes(), stat.S_IMODE(user.stat().st_mode), user.stat().st_ino) == before
    assert not hook_file(repo, hooks.CHAINED_NAME).exists()


def test_a_symlinked_hook_is_chained_as_the_same_symlink_and_put_back(
        repo: str, home: str, tmp_path: Path) -> None:
    target = tmp_path / "shared-hook"
    target.write_text(USER_HOOK_REFUSE)
    target.chmod(0o755)
    hook_file(repo).symlink_to(target)
    cli(repo, home, "hook", "install")
    chained = hook_file(repo, hooks.CHAINED_NAME)
    assert chained.is_symlink() and os.readlink(chained) == str(target)
    assert target.read_text() == USER_HOOK_REFUSE  # never followed, never written
    assert "user-hook-refuses" in try_commit(repo, home).stderr
    cli(repo, home, "hook", "uninstall")
    assert hook_file(repo).is_symlink() and os.readlink(hook_file(repo)) == str(target)


def test_installing_twice_changes_nothing_the_second_time(repo: str, home: str) -> None:
    hook_file(repo).write_text(USER_HOOK_PASS)
    first = cli(repo, home, "hook", "install")
    gate = hook_file(repo).read_bytes()
    chained = hook_file(repo, hooks.CHAINED_NAME)
    inode = chained.stat().st_ino
    second = cli(repo, home, "hook", "install")
    assert first == second == (0, {"ok": True, "hook": str(hook_file(repo)), "chained": True})
    assert hook_file(repo).read_bytes() == gate and chained.stat().st_ino == inode
    assert chained.read_text() == USER_HOOK_PASS


def test_a_foreign_hook_over_a_chained_one_is_refused_without_force_and_kept_with_it(
        repo: str, home: str) -> None:
    hook_file(repo).write_text(USER_HOOK_PASS)
    cli(repo, home, "hook", "install")
    hook_file(repo).write_text("#!/bin/sh\n# another tool's hook\nexit 0\n")
    status, out = cli(repo, home, "hook", "install")
    assert status == 2 and out["error"]["code"] == "usage" and "--force" in out[
        "error"]["message"]
    assert "another tool" in hook_file(repo).read_text()
    status, out = cli(repo, home, "hook", "install", "--force")
    assert status == 0 and out["chained"] is True
    assert "another tool" in Path(out["saved"]).read_text()
    assert hooks.is_ours(str(hook_file(repo)))
    assert hook_file(repo, hooks.CHAINED_NAME).read_text() == USER_HOOK_PASS


def test_uninstall_leaves_a_hook_that_is_not_ours_alone(repo: str, home: str) -> None:
    hook_file(repo).write_text(USER_HOOK_PASS)
    status, out = cli(repo, home, "hook", "uninstall")
    assert status == 0 and out["removed"] is False and out["chained"] is False
    assert hook_file(repo).read_text() == USER_HOOK_PASS


# -- where the hooks are ----------------------------------------------------------------------


def test_core_hooks_path_is_respected(repo: str, home: str) -> None:
    git(repo, home, "config", "core.hooksPath", "githooks")
    status, out = cli(repo, home, "hook", "install")
    assert status == 0 and out["hook"] == os.path.join(repo, "githooks", "pre-commit")
    assert not hook_file(repo).exists()
    live_transaction(repo)
    assert try_commit(repo, home).returncode != 0


def test_a_linked_worktree_shares_the_gate_and_checks_its_own_workspace(
        repo: str, home: str, tmp_path: Path) -> None:
    wt = str(tmp_path / "wt")
    git(repo, home, "worktree", "add", "-q", wt, "-b", "side")
    assert Path(wt, ".git").is_file()
    status, out = cli(wt, home, "hook", "install")
    assert status == 0 and out["hook"] == str(hook_file(repo))
    # No workspace in the new worktree: nothing in flight there, the commit passes.
    assert try_commit(wt, home, "a.txt").returncode == 0
    Agent2PC.init(wt).close()
    Path(wt, ".gitignore").write_text(".agent-tx/\n")
    tid = live_transaction(wt)
    refused = try_commit(wt, home, "b.txt")
    assert refused.returncode != 0 and tid in refused.stderr
    assert try_commit(repo, home, "c.txt").returncode == 0  # the main tree has none live


def test_a_submodule_gets_the_gate_in_its_own_git_directory(
        repo: str, home: str, tmp_path: Path) -> None:
    upstream = make_repo(tmp_path / "upstream", home, workspace=False)
    git(repo, home, "-c", "protocol.file.allow=always", "submodule", "add", "-q", upstream, "sub")
    sub = os.path.join(repo, "sub")
    assert Path(sub, ".git").is_file()
    status, out = cli(sub, home, "hook", "install")
    assert status == 0
    assert out["hook"] == os.path.join(repo, ".git", "modules", "sub", "hooks", "pre-commit")
    tid = live_transaction(repo)  # the superproject's workspace holds the submodule's files
    refused = try_commit(sub, home, "s.txt")
    assert refused.returncode != 0 and tid in refused.stderr


def test_hook_check_outside_a_workspace_says_so_and_missing_ok_passes(
        tmp_path: Path, home: str) -> None:
    bare_repo = make_repo(tmp_path / "plain", home, workspace=False)
    status, out = cli(bare_repo, home, "hook", "check")
    assert status == 2 and out["error"]["code"] == "not_initialized"
    assert "--missing-ok" in out["error"]["message"]
    status, out = cli(bare_repo, home, "hook", "check", "--missing-ok")
    assert (status, out) == (0, {"ok": True, "in_flight": [], "workspace": None})


def test_missing_ok_does_not_pass_inside_a_staged_view_which_hides_the_workspace(
        tmp_path: Path, home: str) -> None:
    plain = make_repo(tmp_path / "plain", home, workspace=False)
    proc = run_cli(("hook", "check", "--missing-ok"), json_out=True, cwd=plain,
                   env={"HOME": home, "AGENT2PC_VIEW": "/tmp/view-x"})
    out = parse_one_object(proc)
    assert proc.returncode == 2 and out["error"]["code"] == "not_initialized"
    assert "staged view" in out["error"]["message"]


def test_not_a_git_repository_and_a_bare_one_are_usage_errors(tmp_path: Path, home: str
                                                               ) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    status, out = cli(str(plain), home, "hook", "install")
    assert status == 2 and out["error"]["code"] == "usage"
    assert "not in a git repository" in out["error"]["message"]
    git(str(tmp_path), home, "init", "-q", "--bare", "b.git")
    status, out = cli(str(tmp_path / "b.git"), home, "hook", "install")
    assert status == 2 and out["error"]["code"] == "usage" and "bare" in out["error"]["message"]
    assert not (tmp_path / "b.git" / "hooks" / "pre-commit").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to any directory")
def test_an_unwritable_hooks_dir_is_an_io_error_and_changes_nothing(
        repo: str, home: str) -> None:
    hooks_dir = Path(repo, ".git", "hooks")
    before = sorted(os.listdir(hooks_dir))
    hooks_dir.chmod(0o555)
    try:
        status, out = cli(repo, home, "hook", "install")
    finally:
        hooks_dir.chmod(0o755)
    assert status == 2 and out["error"]["code"] == "io_error"
    assert sorted(os.listdir(hooks_dir)) == before


def test_a_hooks_path_that_cannot_be_made_is_an_io_error_and_changes_nothing(
        repo: str, home: str) -> None:
    Path(repo, "afile").write_text("not a directory\n")
    git(repo, home, "config", "core.hooksPath", "afile/hooks")
    status, out = cli(repo, home, "hook", "install")
    assert status == 2 and out["error"]["code"] == "io_error"
    assert out["error"]["hooks_dir"] == os.path.join(repo, "afile", "hooks")
    assert Path(repo, "afile").read_text() == "not a directory\n"


def test_the_hook_says_clearly_when_its_python_is_gone(repo: str, home: str) -> None:
    hooks.install(repo, python="/nonexistent/python3")
    refused = try_commit(repo, home)
    assert refused.returncode != 0
    assert "/nonexistent/python3" in refused.stderr and "hook install" in refused.stderr


def test_the_hook_ignores_a_foreign_agent2pc_root(repo: str, home: str, tmp_path: Path
                                                  ) -> None:
    cli(repo, home, "hook", "install")
    other = tmp_path / "other"
    other.mkdir()
    Agent2PC.init(other).close()
    live_transaction(str(other))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(HOME=home, AGENT2PC_ROOT=str(other))
    Path(repo, "g.txt").write_text("g\n")
    git(repo, home, "add", "g.txt")
    proc = subprocess.run(["git", "commit", "-q", "-m", "g"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_pre_commit_framework_entry_runs_hook_check() -> None:
    text = (Path(__file__).resolve().parent.parent / ".pre-commit-hooks.yaml").read_text()
    assert "- id: agent-2pc-check" in text
    for line in ("entry: agent-2pc hook check", "pass_filenames: false", "always_run: true"):
        assert line in text, line
