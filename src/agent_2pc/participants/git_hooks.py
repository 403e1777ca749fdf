"""The hooks ``git commit`` runs, run for git-commit as git would (docs/git.md, "Hooks").

Before the commit (``before_commit``, called by git-commit before anything is staged for git):
pre-commit, prepare-commit-msg and commit-msg, in git's order, with the commit's tree on a
temporary index (``GIT_INDEX_FILE``: the branch's commit plus the transaction's changes, as
prepare will build it) and its message in a file. They run in the staged view: a hook that
reads, lints or formats files sees the repository as it will be after the commit, and nothing
it writes reaches the user's tree before the decision (git's own hooks run in the work tree,
which here does not hold the transaction's files yet). A hook that fails stops git-commit with
its output (``CheckFailed``, verification_failed); nothing is committed and the transaction
stays active. prepare-commit-msg and commit-msg may rewrite the message, and the commit gets the
rewritten one, as with git. ``verify=False`` (``--no-verify``) skips pre-commit and commit-msg;
prepare-commit-msg still runs, as git does. The pre-commit gate of ``hook install`` passes here
(hooks.py: GIT_COMMIT_ENV): this commit holds exactly its transaction's changes.

After the commit (``after_commit``): post-commit, in the work tree, its output on our stderr;
its exit status changes nothing, as with git.
"""

from __future__ import annotations

import os

from ..errors import CheckFailed
from .git import _check_message, _git, repository, resolve_branch, write_index

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..core.states import Tx

HOOK_TIMEOUT_MS = 10 * 60 * 1000
BEFORE = ("pre-commit", "prepare-commit-msg", "commit-msg")
SKIPPED_BY_NO_VERIFY = frozenset({"pre-commit", "commit-msg"})
TAIL_LINES = 20


def hook_path(directory: str, name: str) -> str | None:
    """The executable hook ``name`` in git's hooks ``directory``, if any."""
    path = os.path.join(directory, name)
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def _hook_env(tid: str, **extra: str) -> dict[str, str]:
    """git's environment for a hook: the caller's (their locale too), the gate told who runs."""
    from ..git.hooks import GIT_COMMIT_ENV
    from ..git.run import git_env

    env = git_env(**extra)
    if "LC_ALL" in os.environ:
        env["LC_ALL"] = os.environ["LC_ALL"]
    else:
        env.pop("LC_ALL", None)
    env[GIT_COMMIT_ENV] = tid
    env.setdefault("GIT_EDITOR", ":")  # git's own for a commit that opens no editor
    return env


def before_commit(root: str, tx: Tx, message: str, branch: str | None,
                  blob_path: Callable[[str], str], verify: bool,
                  run_in_view: Callable[[list[str], dict[str, str], int], dict[str, Any]]
                  ) -> tuple[str, list[dict[str, Any]], str]:
    """Run the hooks due before the commit; return the message (as the hooks left it),
    ``[{hook, exit_code}]`` for those that ran, and git's hooks directory. CheckFailed when
    one fails."""
    from ..git.hooks import hooks_dir

    directory = hooks_dir(root)
    names = [n for n in BEFORE if verify or n not in SKIPPED_BY_NO_VERIFY]
    hooks = {n: path for n in names if (path := hook_path(directory, n)) is not None}
    if not hooks:
        return message, [], directory
    import shutil
    import tempfile

    message = _check_message(message)
    repo = repository(root)
    ref = "refs/heads/" + resolve_branch(root, branch, repo=repo)
    base = _git(["rev-parse", "--verify", ref + "^{commit}"], root)
    # Outside the workspace: the staged view shows its root, not .agent-tx/ (nor scratch).
    tmp = tempfile.mkdtemp(prefix="agent-2pc-hooks-")
    ran: list[dict[str, Any]] = []
    try:
        index = os.path.join(tmp, "index")
        write_index(root, index, tx, repo["prefix"], base, blob_path)
        env = _hook_env(tx.tid, GIT_INDEX_FILE=index, GIT_DIR=repo["git_dir"])
        if repo["prefix"]:  # the workspace is below the top: git's work tree is the top
            env["GIT_WORK_TREE"] = repo["top"]
        msg_file = os.path.join(tmp, "COMMIT_EDITMSG")
        with open(msg_file, "w", encoding="utf-8") as f:
            f.write(message)
        for name, path in hooks.items():
            args = {"pre-commit": [], "prepare-commit-msg": [msg_file, "message"],
                    "commit-msg": [msg_file]}[name]
            res = run_in_view([path, *args], env, HOOK_TIMEOUT_MS)
            ran.append({"hook": name, "exit_code": res["exit_code"]})
            if not res["passed"]:
                tail = "\n".join(str(res.get("tail") or "").rstrip().splitlines()[-TAIL_LINES:])
                how = ("timed out" if res.get("timed_out") else
                       f"exit {res['exit_code']}")
                raise CheckFailed(
                    f"the {name} hook failed ({how}); nothing was committed and the "
                    "transaction stays active: fix and run git-commit again, or skip the "
                    "pre-commit and commit-msg hooks with `no_verify`"
                    + (f"\n{tail}" if tail else ""), params=("no_verify",),
                    tid=tx.tid, result={**res, "hook": name, "hooks": ran})
        with open(msg_file, encoding="utf-8", errors="surrogateescape") as f:
            edited = f.read()
        if edited != message:
            if not edited.strip():
                raise CheckFailed("the commit message is empty after the hooks (git aborts "
                                  "such a commit too)", tid=tx.tid, result={"hooks": ran})
            message = _check_message(edited)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return message, ran, directory


def after_commit(root: str, tid: str, directory: str) -> dict[str, Any] | None:
    """Run post-commit from git's hooks ``directory`` in the work tree (its output to our
    stderr); ``{hook, exit_code}``, or None when there is none."""
    import subprocess

    path = hook_path(directory, "post-commit")
    if path is None:
        return None
    top = _git(["rev-parse", "--show-toplevel"], root)
    try:
        proc = subprocess.run([path], cwd=top, env=_hook_env(tid), stdin=subprocess.DEVNULL,
                              stdout=2, stderr=2, timeout=HOOK_TIMEOUT_MS / 1000, check=False)
        code = proc.returncode
    except (OSError, subprocess.TimeoutExpired):
        code = -1  # git ignores what post-commit does; so do we, but say it
    return {"hook": "post-commit", "exit_code": code}
