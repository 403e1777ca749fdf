"""The git participant: a git commit of exactly a transaction's changes, atomic with its files.

``git-commit`` stages one effect of kind ``git`` ({message, author, branch}) and commits the
transaction (coordinator/client.py, ``Transaction.git_commit``). The effect is checked when it is
staged (``check_effect``): the workspace is in a git work tree, the branch exists and has a
commit, the index is not locked, git knows who the committer is. Nothing is logged otherwise.

prepare (after the file participant voted yes, under the commit lock): read the branch's
  commit OLD; build the new tree on a temporary index (``GIT_INDEX_FILE`` in the transaction's
  scratch directory): ``read-tree OLD``, the transaction's changes through ``update-index
  --index-info`` (deletes first; a write is its staged blob, ``hash-object -w``; a symlink is
  mode 120000; a mkdir means nothing to git), ``write-tree``, ``commit-tree -p OLD``: NEW.
  The user's index and work tree are not touched. Then the ref is locked at OLD with git's own
  reference transaction, held prepared until the apply (git/reftx.py): from the yes vote on,
  no other git process can move the branch, and one that moved it since OLD was read makes the
  vote a no (``conflict``). The vote carries ref, OLD and NEW into the commit decision
  (``decision_fields``), so that a redo in another process has them.
apply (after the file participant applied the files): the held transaction commits, moving
  the ref. In a redo (recovery, in another process: the lock died with the process that held
  it) ``update-ref REF NEW OLD``, a compare-and-swap: the ref at NEW already is done; at
  neither, someone moved it after the crash, and it is left as it is and reported as diverged
  (never forced). Then the user's index gets NEW's entries for the committed paths only (when
  HEAD is that branch), best effort: a locked index is left as it is.
undo: the held transaction aborts (the lock goes, the ref unmoved). The objects prepare wrote
  are unreachable after an abort: harmless garbage that ``git gc`` prunes, like what an
  interrupted ``git commit`` leaves.
"""

from __future__ import annotations

import os

from .. import crashpoints
from ..errors import UsageError
from .base import YES, Applied, ApplyFailed, Vote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..core.states import Op, Tx
    from ..git.reftx import RefTransaction
    from ..storage.blobs import BlobStore
    from .base import Context, EffectFields

KIND = "git"
BRANCH_KIND = "git-branch"  # begin --git-branch: the transaction's target branch, at begin
MESSAGE_BYTES_MAX = 1 << 20
ZERO_SHA = "0" * 40


def _git(args: list[str], cwd: str, **kw: Any) -> str:
    from ..git.run import run

    return os.fsdecode(run(args, cwd, **kw).stdout).strip()


class GitParticipant:
    """A git commit of the transaction's changes (participants/base.py: the protocol)."""

    name = "git"
    kinds = frozenset({KIND, BRANCH_KIND})

    def __init__(self, root: str, scratch_of: Callable[[str], str], blobs: BlobStore) -> None:
        self.root = root
        self._scratch_of = scratch_of  # tid -> the transaction's scratch directory
        self._blobs = blobs
        self._decided: dict[str, dict[str, Any]] = {}  # tid -> {ref, old, new, prefix}
        self._held: dict[str, RefTransaction] = {}  # tid -> its ref, locked since prepare

    # -- staging (base.py: EffectStager) -----------------------------------------------------

    def check_effect(self, kind: str, args: dict[str, Any]) -> Any:
        if kind == BRANCH_KIND:
            return self._check_binding(args)
        unknown = set(args) - {"message", "author", "branch", "sign"}
        if unknown:
            raise UsageError(f"a git commit takes message, author, branch and sign, not "
                             f"{', '.join(sorted(unknown))}")
        message = _check_message(args.get("message"))
        author = _check_author(args.get("author"))
        sign = args.get("sign")
        if sign is not None and not isinstance(sign, bool):
            raise UsageError("`sign` is true, false or absent (commit.gpgSign decides)",
                             params=("sign",))
        repo = repository(self.root)
        branch = resolve_branch(self.root, args.get("branch"), repo=repo)
        if sign is None:
            sign = _git(["config", "--type=bool", "--default=false", "commit.gpgSign"],
                        self.root) == "true"
        return {"message": message, "author": author, "branch": branch,
                "prefix": repo["prefix"], "sign": sign}

    def _check_binding(self, args: dict[str, Any]) -> dict[str, str]:
        """begin --git-branch B: B's commit now is the base that prepare compares with."""
        if set(args) != {"branch"}:
            raise UsageError("a git branch binding takes `branch` only")
        repo = repository(self.root, index_free=False)
        branch = resolve_branch(self.root, args["branch"], params=("git_branch",), repo=repo)
        base = _git(["rev-parse", "--verify", f"refs/heads/{branch}^{{commit}}"], self.root)
        return {"branch": branch, "base": base, "prefix": repo["prefix"]}

    def effect_fields(self, tid: str, n: int, checked: Any) -> EffectFields:
        return {"request": checked, "key": f"git-{tid}-{n}", "compensate": None}

    def staged_answer(self, effect: dict[str, Any]) -> dict[str, Any]:
        request = effect["request"]
        if effect.get("kind") == BRANCH_KIND:
            return {"n": effect["n"], "branch": request["branch"], "base": request["base"]}
        return {"n": effect["n"], "branch": request["branch"], "author": request["author"]}

    # -- the participant protocol (base.py) --------------------------------------------------

    def commit_request(self, tx: Tx) -> dict[str, Any] | None:
        """The git commit ``tx`` asks for: its latest effect of kind git, if any."""
        asks = [eff for eff in tx.effects if eff.get("kind") == KIND]
        return asks[-1]["request"] if asks else None

    def prepare(self, tx: Tx, ctx: Context) -> Vote:
        binding, request = bound_branch(tx), self.commit_request(tx)
        if binding is None and request is None:
            return YES
        from ..git.run import GitError

        try:
            if binding is not None:
                vote = self._unmoved_under(tx, binding)
                if not vote.yes:
                    return vote
            return YES if request is None else self._prepare(tx, request)
        except (OSError, ValueError, GitError, UsageError) as exc:  # raising is voting no
            return Vote.no("prepare_failed", f"the git commit could not be made: {exc}")

    def _unmoved_under(self, tx: Tx, binding: dict[str, str]) -> Vote:
        """begin --git-branch: yes when the branch is where it was at begin, or when what moved
        it changed none of the paths the transaction touches (writes, deletes, reads)."""
        branch, base, prefix = binding["branch"], binding["base"], binding["prefix"]
        now = _git(["rev-parse", "-q", "--verify", f"refs/heads/{branch}^{{commit}}"],
                   self.root, check=False)
        if not now:
            return Vote.no("conflict", f"the branch {branch} is gone since the transaction "
                           "began on it")
        if now == base:
            return YES
        from ..git.run import run

        out = run(["diff", "--no-renames", "--name-only", "-z", base, now], self.root).stdout
        moved = [os.fsdecode(p) for p in out.split(b"\0") if p]
        touched = {prefix + op.path for op in tx.changes()} | {prefix + r[0] for r in tx.reads}
        hit = sorted(p for p in moved for t in touched
                     if p == t or p.startswith(t + "/") or t.startswith(p + "/"))
        if hit:
            return Vote.no("conflict", f"the branch {branch} moved since the transaction began "
                           f"on it ({base[:12]} -> {now[:12]}) and changed {hit[0]}, which the "
                           "transaction touches")
        return YES

    def _prepare(self, tx: Tx, request: dict[str, Any]) -> Vote:
        ref = "refs/heads/" + request["branch"]
        old = _git(["rev-parse", "-q", "--verify", ref + "^{commit}"], self.root, check=False)
        if not old:
            return Vote.no("conflict", f"the branch {request['branch']} is gone since "
                           "git-commit named it")
        new, ignored = build_commit(self.root, self._scratch_of(tx.tid), tx, request, old,
                                    self._blobs.path)
        crashpoints.hit("git.after_objects")
        from ..git.reftx import RefTransaction
        from ..git.run import GitError

        try:
            self._held[tx.tid] = RefTransaction(self.root, ref, new, old,
                                                f"agent-2pc git-commit {tx.tid}")
        except GitError as exc:
            return Vote.no("conflict", f"the branch {request['branch']} could not be locked "
                           f"at {old[:12]} ({exc}): it moved, or another git process is "
                           "updating it")
        crashpoints.hit("git.after_lock")
        self._decided[tx.tid] = {"ref": ref, "old": old, "new": new,
                                 "prefix": request["prefix"]}
        if ignored:
            self._decided[tx.tid]["ignored"] = ignored
        return YES

    def decision_fields(self, tid: str) -> dict[str, Any]:
        decided = self._decided.pop(tid, None)
        return {"git": decided} if decided is not None else {}

    def apply(self, tx: Tx, ctx: Context, redo: bool) -> Applied:
        decided = tx.decision_fields.get("git")
        out = Applied()
        if not decided:
            return out
        from ..git.run import GitError

        held = self._held.pop(tx.tid, None)
        try:
            moved = False
            if held is not None:
                try:
                    held.commit()
                    moved = True
                except GitError:
                    pass  # git could not finish its transaction: the compare-and-swap says
            moved = moved or move_ref(self.root, decided, tx.tid)
        except (OSError, GitError, UsageError) as exc:
            raise ApplyFailed(exc, [op.path for op in tx.changes()]) from exc  # files: done
        if not moved:
            out.diverged.append(decided["ref"])
            return out
        crashpoints.hit("git.after_ref")
        left_out = set(decided.get("ignored", ()))
        update_user_index(self.root, decided, [op.path for op in git_changes(tx)
                                               if op.path not in left_out])
        return out

    def undo(self, tx: Tx, ctx: Context) -> dict[str, Any]:
        self.forget(tx.tid)  # the objects prepare wrote are unreachable garbage
        return {}

    def forget(self, tid: str) -> None:
        self._decided.pop(tid, None)
        held = self._held.pop(tid, None)
        if held is not None:
            held.abort()

    def close(self) -> None:
        for tid in list(self._held):
            self.forget(tid)

    def describe(self, tx: Tx) -> dict[str, Any]:
        out: dict[str, Any] = {}
        binding, request = bound_branch(tx), self.commit_request(tx)
        if binding is not None:
            out["git_branch"] = {"branch": binding["branch"], "base": binding["base"]}
        if request is not None:
            out["git"] = {"branch": request["branch"], "author": request["author"],
                          "message": request["message"].split("\n", 1)[0]}
        return out


def bound_branch(tx: Tx) -> dict[str, str] | None:
    """The branch ``tx`` was begun on (begin --git-branch), with its commit then, if any."""
    binds = [eff for eff in tx.effects if eff.get("kind") == BRANCH_KIND]
    return binds[0]["request"] if binds else None


# -- checks ------------------------------------------------------------------------------------


def _check_message(message: Any) -> str:
    if not isinstance(message, str) or not message.strip():
        raise UsageError("a git commit needs a `message`", params=("message",))
    if "\0" in message or len(message.encode("utf-8", "surrogatepass")) > MESSAGE_BYTES_MAX:
        raise UsageError(f"a commit message is text without NUL, at most {MESSAGE_BYTES_MAX} "
                         "bytes", params=("message",))
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError("a commit message must be Unicode text", params=("message",)) from None
    return message


def _check_author(author: Any) -> str | None:
    if author is None:
        return None
    import re

    if not isinstance(author, str) or not re.fullmatch(r"[^<>\n\0]*[^<>\s\0] <[^<>\n\0]+>",
                                                       author):
        raise UsageError(f"`author` is \"Name <email>\", not {author!r}", params=("author",))
    return author


# git holds index.lock for milliseconds (another agent's git-commit updating the user's index,
# update_user_index below, takes it too); a person's `git commit` with its editor open, for as
# long as the editor is. Staging waits this long for it to go before it refuses.
INDEX_LOCK_WAIT_S = 1.0


def _still_there(path: str, wait_s: float) -> bool:
    """Does ``path`` exist, and still after up to ``wait_s`` seconds?"""
    import time

    deadline = time.monotonic() + wait_s
    while os.path.exists(path):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.01)
    return False


def repository(root: str, index_free: bool = True) -> dict[str, str]:
    """{git_dir, common_dir, prefix, top} of the work tree at ``root`` (one git process);
    UsageError when there is none, when it is bare, or (``index_free``) when its index is
    locked (still, after INDEX_LOCK_WAIT_S)."""
    from ..git.run import GitError

    try:
        lines = _git(["rev-parse", "--absolute-git-dir", "--git-common-dir", "--show-prefix",
                      "--show-toplevel"], root).splitlines()
    except GitError as exc:
        bare = _git(["rev-parse", "--is-bare-repository"], root, check=False) == "true"
        raise UsageError(f"{root} is a bare repository: git-commit needs a work tree" if bare
                         else f"{root} is not in a git work tree ({exc})", root=root) from None
    if len(lines) == 3:  # at the top, --show-prefix prints an empty line
        lines.insert(2, "")
    git_dir, common, prefix, top = lines
    index_lock = os.path.join(git_dir, "index.lock")
    if index_free and _still_there(index_lock, INDEX_LOCK_WAIT_S):
        raise UsageError(f"{index_lock} exists: another git process is working in this "
                         "repository (or one crashed: remove the file if none is running)",
                         root=root)
    return {"git_dir": git_dir, "common_dir": os.path.join(root, common), "prefix": prefix,
            "top": top}


def resolve_branch(root: str, branch: Any, params: tuple[str, ...] = ("branch",),
                   repo: dict[str, str] | None = None) -> str:
    """The short name of the branch to commit onto: ``branch``, else the one HEAD is on. It
    must exist and have a commit, and not be checked out in another worktree; git must know
    who commits (user.name, user.email). ``repo``: ``repository(root)``, if known."""
    if branch is None:
        head = _git(["symbolic-ref", "-q", "HEAD"], root, check=False)
        if not head.startswith("refs/heads/"):
            raise UsageError("HEAD is detached: name the branch to commit onto (`branch`)",
                             params=params)
        branch = head[len("refs/heads/"):]
    elif not isinstance(branch, str) or not branch or branch.startswith("-") or \
            _ref_format_bad(root, branch):
        raise UsageError(f"{branch!r} is not a branch name", params=params)
    ref = "refs/heads/" + branch
    if not _git(["rev-parse", "-q", "--verify", ref + "^{commit}"], root, check=False):
        exists = _git(["show-ref", "--verify", "-q", ref], root, check=False)
        unborn = _git(["symbolic-ref", "-q", "HEAD"], root, check=False) == ref
        raise UsageError(
            f"the branch {branch} has no commit yet (an unborn branch): make a first commit "
            "with git itself" if unborn and not exists else
            f"there is no branch {branch}", params=params)
    elsewhere = _checked_out_elsewhere(root, ref, repo or repository(root, index_free=False))
    if elsewhere:
        raise UsageError(f"the branch {branch} is checked out in the worktree {elsewhere}: "
                         "commit there, or onto another branch", params=params)
    from ..git.run import GitError

    try:
        _git(["var", "GIT_COMMITTER_IDENT"], root)
    except GitError as exc:
        raise UsageError(f"git does not know who commits: set user.name and user.email "
                         f"({exc})") from None
    return str(branch)


def _checked_out_elsewhere(root: str, ref: str, repo: dict[str, str]) -> str | None:
    """The other worktree that has ``ref`` checked out (git will not move a branch under
    another worktree's HEAD either), or None."""
    if not os.path.isdir(os.path.join(repo["common_dir"], "worktrees")):
        return None  # no linked worktree: nobody else has a HEAD
    here = os.path.realpath(repo["top"])
    tree = None
    for line in _git(["worktree", "list", "--porcelain"], root).splitlines():
        if line.startswith("worktree "):
            tree = line[len("worktree "):]
        elif line == "branch " + ref and tree is not None and os.path.realpath(tree) != here:
            return tree
    return None


def _ref_format_bad(root: str, branch: str) -> bool:
    from ..git.run import run

    return run(["check-ref-format", "refs/heads/" + branch], root, check=False).returncode != 0


# -- prepare: the commit, on a temporary index -------------------------------------------------


def git_changes(tx: Tx) -> list[Op]:
    """The changes git records: deletes first (a file may replace a directory), then writes and
    symlinks; a mkdir means nothing to git."""
    changes = [op for op in tx.changes() if op.op != "mkdir"]
    return sorted(changes, key=lambda op: op.op != "delete")


def _ignored(root: str, changes: list[Op], env: dict[str, str]) -> set[str]:
    """The paths of ``changes`` that git ignores and that the index (``env``'s, holding the
    base tree) does not track: what ``git add -A`` would leave out."""
    from ..git.run import run

    adds = [op.path for op in changes if op.op != "delete"]
    if not adds:
        return set()
    out = run(["check-ignore", "-z", "--stdin"], root, env=env, check=False,
              input=b"".join(os.fsencode(p) + b"\0" for p in adds)).stdout
    return {os.fsdecode(p) for p in out.split(b"\0") if p}


def _index_lines(root: str, tx: Tx, prefix: str, blob_path: Callable[[str], str],
                 env: dict[str, str]
                 ) -> tuple[bytes, list[str]]:
    """``update-index -z --index-info`` input for ``tx``'s changes (writes the blobs), and the
    new paths left out because git ignores them."""
    changes = git_changes(tx)
    ignored = _ignored(root, changes, env)
    changes = [op for op in changes if op.path not in ignored]
    writes = [op for op in changes if op.op == "write"]
    shas: dict[str, str] = {}
    if writes:
        from ..git.run import run

        names = "".join(blob_path(op.blob or "") + "\n" for op in writes)
        out = run(["hash-object", "-w", "--no-filters", "--stdin-paths"], root, env=env,
                  input=os.fsencode(names)).stdout.decode("ascii").split()
        shas = {op.path: sha for op, sha in zip(writes, out, strict=True)}
    lines = []
    for op in changes:
        path = os.fsencode(prefix + op.path)
        if op.op == "delete":
            lines.append(b"0 " + ZERO_SHA.encode() + b"\t" + path + b"\0")
        elif op.op == "symlink":
            assert op.target is not None
            sha = _git(["hash-object", "-w", "--stdin"], root, env=env,
                       input=os.fsencode(op.target))
            lines.append(b"120000 " + sha.encode() + b"\t" + path + b"\0")
        else:
            mode = b"100755" if _mode(root, op) & 0o100 else b"100644"
            lines.append(mode + b" " + shas[op.path].encode() + b"\t" + path + b"\0")
    return b"".join(lines), sorted(ignored)


def _mode(root: str, op: Op) -> int:
    """The permission bits the file participant gives a write: its own, else the file's."""
    if op.mode is not None:
        return op.mode
    try:
        return os.lstat(os.path.join(root, op.path)).st_mode & 0o777
    except OSError:
        return 0o644


def write_index(root: str, index: str, tx: Tx, prefix: str, base: str,
                blob_path: Callable[[str], str]) -> tuple[dict[str, str], list[str]]:
    """Make ``index`` (a new file) hold ``base``'s tree with ``tx``'s changes; write their
    blobs. Returns git's environment for that index, and the new paths left out because git
    ignores them (as ``git add -A`` leaves them out; a tracked path is never ignored)."""
    from ..git.run import git_env, run

    env = git_env(GIT_INDEX_FILE=index)
    run(["read-tree", base], root, env=env)
    lines, ignored = _index_lines(root, tx, prefix, blob_path, env)
    run(["update-index", "-z", "--index-info"], root, env=env, input=lines)
    return env, ignored


def build_commit(root: str, scratch: str, tx: Tx, request: dict[str, Any], old: str,
                 blob_path: Callable[[str], str]) -> tuple[str, list[str]]:
    """Write the commit of ``tx``'s changes on top of ``old``; return its id (NEW) and the
    new paths git ignores (left out). Signed when the request says so (``sign``: --sign or
    commit.gpgSign, read at staging)."""
    os.makedirs(scratch, exist_ok=True)
    index = os.path.join(scratch, "git-index")
    env, ignored = write_index(root, index, tx, request["prefix"], old, blob_path)
    tree = _git(["write-tree"], root, env=env)
    author = request.get("author")
    if author is not None:
        name, _, email = author.rpartition(" <")
        env.update(GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email[:-1])
    sign = ["-S"] if request.get("sign") else []
    new = _git(["commit-tree", *sign, tree, "-p", old, "-F", "-"], root, env=env,
               input=request["message"].encode("utf-8"))
    os.unlink(index)
    return new, ignored


# -- apply: the ref, then the user's index -----------------------------------------------------


def move_ref(root: str, decided: dict[str, Any], tid: str) -> bool:
    """Compare-and-swap the ref from OLD to NEW; True when it is at NEW now, False when someone
    moved it elsewhere (left as it is)."""
    from ..git.run import REF_LOCK_WAIT, GitError, git_env, run

    ref, old, new = decided["ref"], decided["old"], decided["new"]
    try:
        run(["update-ref", "-m", f"agent-2pc git-commit {tid}", ref, new, old], root,
            env=git_env(**REF_LOCK_WAIT))
        return True
    except GitError:
        now = _git(["rev-parse", "-q", "--verify", ref], root, check=False)
        if now == new:
            return True  # a redo: done before the crash
        if now == old:
            raise  # the ref is still OLD: it could not be moved (a lock); recover retries
        return False


def update_user_index(root: str, decided: dict[str, Any], paths: list[str]) -> None:
    """Give the user's index NEW's entries for ``paths`` (relative to ``root``; absent in NEW:
    removed), when HEAD is the committed branch: ``git reset -q NEW -- paths``, which changes
    nothing else in the index and nothing in the work tree. Best effort and idempotent."""
    from ..git.run import GitError, git_env, run

    if not paths or _git(["symbolic-ref", "-q", "HEAD"], root, check=False) != decided["ref"]:
        return
    try:
        run(["reset", "-q", decided["new"], "--pathspec-from-file=-", "--pathspec-file-nul"],
            root, env=git_env(GIT_LITERAL_PATHSPECS="1"),
            input=b"".join(os.fsencode(p) + b"\0" for p in paths))
    except (GitError, OSError):
        pass  # a locked index (git running meanwhile): the commit is made; the index stays
