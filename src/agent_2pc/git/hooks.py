"""The pre-commit gate: ``hook install``, ``hook uninstall`` and ``hook check``.

``check`` answers whether transactions are live in a workspace (active, preparing, committing,
aborting: anything not yet committed or aborted). It reads the workspace through the monitor
(coordinator/monitor.py), which never writes and never waits on a transaction's lock: a hook
must neither change the workspace nor hang behind an agent's long ``exec``.

``install`` writes a small sh script as the repository's pre-commit hook, in the directory git
itself names (``git rev-parse --git-path hooks``: core.hooksPath, worktrees and submodules whose
``.git`` is a file). The user's own hook is never lost: it is renamed to
``pre-commit.agent-2pc-chained`` (a symlink stays the same symlink) and the script runs it after
the gate; either one refusing refuses the commit. ``uninstall`` renames it back, so its content
and mode are exactly as they were. Every file is replaced by a rename, never rewritten in place.
"""

from __future__ import annotations

import os
import stat
import sys

from ..errors import CorruptWal, InFlight, IoFailed, NotInitialized, UsageError
from ..storage.durable import fsync_dir, fsync_fd, rename, write_all
from .run import LOCAL_ENV_VARS as LOCAL_ENV_VARS
from .run import git_env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HOOK_NAME = "pre-commit"
CHAINED_NAME = "pre-commit.agent-2pc-chained"
SAVED_NAME = "pre-commit.agent-2pc-saved"   # what --force moves aside
MARKER = "# agent-2pc pre-commit gate"
MARKER_READ_BYTES = 4096
GIT_TIMEOUT_S = 10.0
FILES_SHOWN_MAX = 5    # per transaction, in the text of a refusal
GIT_COMMIT_ENV = "AGENT2PC_GIT_COMMIT"  # set (to its tid) where git-commit runs git's hooks

_SCRIPT = """\
#!/bin/sh
{marker} (hook format 1)
# Installed by 'agent-2pc hook install'; 'agent-2pc hook uninstall' removes it and puts back the
# hook it chains ({chained}), exactly as it was. See docs/git.md of agent-2pc.
# It refuses the commit while agent-2pc transactions are in flight in this workspace, then runs
# the chained hook, if any: the commit goes ahead only if both pass.
agent2pc_python={python}
if [ ! -x "$agent2pc_python" ]; then
  echo "agent-2pc pre-commit hook: $agent2pc_python (the Python that ran 'agent-2pc hook install')\
 is gone. Run 'agent-2pc hook install' again with the agent-2pc you use now, or\
 'agent-2pc hook uninstall' (git commit --no-verify skips hooks once)." >&2
  exit 1
fi
(unset AGENT2PC_ROOT; exec "$agent2pc_python" -P -m agent_2pc hook check --missing-ok >/dev/null) \\
  || exit $?
agent2pc_chained="$(dirname -- "$0")/{chained}"
if [ -x "$agent2pc_chained" ]; then
  exec "$agent2pc_chained" "$@"
fi
exit 0
"""


# -- git ---------------------------------------------------------------------------------------


def hooks_dir(start: str) -> str:
    """The directory git runs the hooks of the repository at ``start`` from (absolute)."""
    import subprocess

    if not os.path.isdir(start):
        raise UsageError(f"{start} is not a directory", root=start)
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--is-bare-repository", "--git-path", "hooks"], cwd=start,
            env=git_env(), stdin=subprocess.DEVNULL, capture_output=True,
            timeout=GIT_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise UsageError("git is not installed (or not on PATH)") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"git rev-parse did not answer within {GIT_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        why = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise UsageError(f"{start} is not in a git repository"
                         + (f" ({why[-1]})" if why else ""), root=start)
    lines = os.fsdecode(proc.stdout).splitlines()
    if len(lines) != 2:
        raise UsageError(f"git rev-parse answered what agent-2pc does not understand: {lines!r}")
    if lines[0] == "true":
        raise UsageError(f"{start} is a bare repository: nobody commits there through a work "
                         "tree, so there is nothing to gate; install the hook in a clone or a "
                         "worktree", root=start)
    return os.path.normpath(os.path.join(start, lines[1]))


# -- the hook files ----------------------------------------------------------------------------


def is_ours(path: str) -> bool:
    """Is ``path`` a regular file (not a symlink) holding our marker line?"""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    with open(path, "rb") as f:
        head = f.read(MARKER_READ_BYTES)
    return MARKER.encode() in head


def _exists(path: str) -> bool:
    return os.path.lexists(path)


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def script(python: str) -> str:
    """The hook's text, running ``python -m agent_2pc`` (an absolute path, fixed at install)."""
    return _SCRIPT.format(marker=MARKER, chained=CHAINED_NAME, python=_shell_quote(python))


def _write_script(directory: str, text: str) -> str:
    """Write ``text`` to a new temporary executable file in ``directory``; return its path."""
    tmp = os.path.join(directory, f".{HOOK_NAME}.agent-2pc-{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o755)
    try:
        write_all(fd, text.encode("utf-8"))
        os.fchmod(fd, 0o755)  # whatever the umask
        fsync_fd(fd)
    finally:
        os.close(fd)
    return tmp


def _free_name(directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    n = 1
    while _exists(path):
        n += 1
        path = os.path.join(directory, f"{name}.{n}")
    return path


def _unwritable(directory: str, exc: OSError) -> IoFailed:
    import errno

    return IoFailed(f"the hooks directory {directory} cannot be written: "
                    f"{exc.strerror or exc}; the hooks there are as they were",
                    hooks_dir=directory, errno=errno.errorcode.get(exc.errno or 0, ""))


def install(start: str, force: bool = False, python: str | None = None) -> dict[str, Any]:
    """Install the gate as the pre-commit hook of the repository at ``start``; idempotent.

    An existing hook (file or symlink) is chained. When the chained name is taken already and
    the pre-commit hook is not ours (a tool replaced the gate after it was installed), nothing
    is changed unless ``force``: then that hook is moved aside to pre-commit.agent-2pc-saved
    (reported as ``saved``) and the gate goes back in front of the chained one. The hook runs
    ``python`` (default: this interpreter) by its absolute path."""
    directory = hooks_dir(start)
    text = script(os.path.abspath(python or sys.executable))
    try:
        os.makedirs(directory, exist_ok=True)
        return _place(directory, text, force)
    except OSError as exc:  # EACCES, EROFS, ENOTDIR (a file on the way), ENOSPC, ...
        raise _unwritable(directory, exc) from None


def _place(directory: str, text: str, force: bool) -> dict[str, Any]:
    hook = os.path.join(directory, HOOK_NAME)
    chained = os.path.join(directory, CHAINED_NAME)
    out: dict[str, Any] = {"hook": hook, "chained": _exists(chained)}
    if is_ours(hook):
        with open(hook, encoding="utf-8", errors="replace") as f:
            if f.read() == text:
                return out  # installed already, as it would be now
    elif _exists(hook):
        if stat.S_ISDIR(os.lstat(hook).st_mode):
            raise UsageError(f"{hook} is a directory, not a hook; move it away first",
                             hook=hook)
        if not out["chained"]:
            tmp = _write_script(directory, text)
            try:
                rename(hook, chained)   # a symlink is renamed, not followed
            except BaseException:
                os.unlink(tmp)
                raise
            rename(tmp, hook)
            fsync_dir(directory)
            out["chained"] = True
            return out
        if not force:
            raise UsageError(
                f"{hook} is not agent-2pc's gate, and {chained} (the hook the gate chains) is "
                "there too: agent-2pc will not choose between them. With `force`, install "
                f"moves the first aside to {SAVED_NAME} and chains the second; or arrange "
                "them yourself", params=("force",), hook=hook)
        out["saved"] = _free_name(directory, SAVED_NAME)
        rename(hook, out["saved"])
    tmp = _write_script(directory, text)
    rename(tmp, hook)
    fsync_dir(directory)
    return out


def uninstall(start: str) -> dict[str, Any]:
    """Remove the gate; put the chained hook back as it was. ``removed: false`` when the gate
    is not installed (a pre-commit hook that is not ours is left alone)."""
    directory = hooks_dir(start)
    hook = os.path.join(directory, HOOK_NAME)
    chained = os.path.join(directory, CHAINED_NAME)
    if not is_ours(hook):
        return {"hook": hook, "chained": False, "removed": False}
    try:
        if _exists(chained):
            rename(chained, hook)  # one step: the user's hook replaces the gate
            fsync_dir(directory)
            return {"hook": hook, "chained": True, "removed": True}
        os.unlink(hook)
        fsync_dir(directory)
    except OSError as exc:
        raise _unwritable(directory, exc) from None
    return {"hook": hook, "chained": False, "removed": True}


# -- the check ---------------------------------------------------------------------------------


def in_flight(root: str) -> list[dict[str, Any]]:
    """The live transactions of the workspace at ``root``: ``[{tid, label, state, age_s,
    files}]``, oldest first (``files``: the first 50 paths). A log damaged before its tail
    (not a torn tail, which is an append cut short) is CorruptWal: what follows is unknown."""
    from ..coordinator.monitor import Monitor

    with Monitor(root) as mon:
        snap = mon.snapshot(recent=0)
    damage = snap["wal"]["damage"]
    if damage and not damage.get("torn"):  # what comes after it cannot be read: refuse
        raise CorruptWal(f"the log of {root} is damaged at offset {damage['offset']} "
                         f"({damage.get('reason')}): the transactions after it cannot be "
                         "told; 'agent-2pc recover' says more", offset=damage["offset"])
    rows = snap["in_flight"]
    return [{k: r[k] for k in ("tid", "label", "state", "age_s", "files")} for r in rows]


def _age(seconds: float) -> str:
    s = int(max(seconds, 0))
    return (f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else
            f"{s // 3600}h{s % 3600 // 60:02d}m" if s < 86400 else f"{s // 86400}d")


def _describe(rows: list[dict[str, Any]], root: str) -> str:
    n = len(rows)
    lines = [f"{n} transaction{'s are' if n != 1 else ' is'} in flight in {root}: "
             "commit or abort first ('agent-2pc status'; git commit --no-verify skips the "
             "check)"]
    for r in rows:
        files = r["files"][:FILES_SHOWN_MAX]
        more = len(r["files"]) - len(files)
        lines.append(f"  {r['tid']}  {r['state']:<10} {_age(r['age_s']):>7}  "
                     f"{r['label'] or '(no label)'}: "
                     + (", ".join(files) + (f" and {more} more" if more else "")
                        if files else "no files staged"))
    if any(r["state"] == "prepared" for r in rows):  # coordinator/outside.py
        lines.append("  (a prepared one waits for its coordinator's decision: 'agent-2pc "
                     "in-doubt' names it)")
    return "\n".join(lines)


def check(root_arg: str | None, missing_ok: bool = False) -> dict[str, Any]:
    """``{in_flight: []}`` when nothing is live; InFlight (exit 1) listing them otherwise.

    The workspace is ``root_arg``, else $AGENT2PC_ROOT, else the nearest at or above the working
    directory. None there: not_initialized, or with ``missing_ok`` a pass with
    ``workspace: null`` (what the installed hook asks: a clone or a worktree without
    .agent-tx/ has nothing in flight), except inside a staged view, which hides it.
    Run by the hooks of agent-2pc's own git-commit (GIT_COMMIT_ENV set): a pass, since that
    commit holds exactly its transaction's changes, whatever else is in flight."""
    from ..storage.workspace import find_root

    committing = os.environ.get(GIT_COMMIT_ENV)
    if committing:  # git-commit runs the hooks: what it commits is exactly its transaction's
        return {"in_flight": [], "workspace": None, "git_commit": committing}
    try:
        root = find_root(root_arg or os.environ.get("AGENT2PC_ROOT") or None)
    except NotInitialized as exc:
        view = os.environ.get("AGENT2PC_VIEW")
        if view:  # a staged view hides .agent-tx/: its absence there proves nothing
            raise NotInitialized(f"{exc.message}: inside a staged view ({view}) the workspace "
                                 "is hidden, so whether transactions are in flight cannot be "
                                 "told; commit from outside the view",
                                 root=exc.details.get("root")) from None
        if not missing_ok:
            raise NotInitialized(f"{exc.message}: 'hook check' has no transactions to look at "
                                 "(with `missing_ok` it passes instead)",
                                 params=("missing_ok",), root=exc.details.get("root")) from None
        return {"in_flight": [], "workspace": None}
    rows = in_flight(root)
    if rows:
        raise InFlight(_describe(rows, root), result={"in_flight": rows, "workspace": root})
    return {"in_flight": [], "workspace": root}
