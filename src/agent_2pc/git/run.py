"""Running git: a subprocess with a clean environment, its messages in English.

Shared by the pre-commit gate (hooks.py) and the git participant (participants/git.py).
"""

from __future__ import annotations

import os

from ..errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

GIT_TIMEOUT_S = 60.0

# How long a redo of a ref update (participants/git.py move_ref) waits for a ref lock another
# process holds; git's own default is 100 ms, and prepare keeps it (it holds the commit lock).
# git holds a ref lock for milliseconds, but a coordinator killed while holding a branch
# (git/reftx.py) leaves its git running a moment longer: that git removes main.lock and
# HEAD.lock only after it reads end of input, later still on a loaded host. A recover started at
# once should wait for that rather than report the branch locked. The price: while a stale
# lock (a git killed hard) stays, each command that retries the redo waits 1 s for it.
# Pass as ``git_env(**REF_LOCK_WAIT)``.
REF_LOCK_WAIT = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.filesRefLockTimeout",
                 "GIT_CONFIG_VALUE_0": "1000"}

# What git itself clears before it works in another repository (``git rev-parse
# --local-env-vars``): a caller's GIT_DIR or GIT_INDEX_FILE must not redirect us. The user's
# global configuration (HOME, GIT_CONFIG_GLOBAL) stays: core.hooksPath may be set there.
LOCAL_ENV_VARS = frozenset((
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_CONFIG", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT",
    "GIT_OBJECT_DIRECTORY", "GIT_DIR", "GIT_WORK_TREE", "GIT_IMPLICIT_WORK_TREE",
    "GIT_GRAFT_FILE", "GIT_INDEX_FILE", "GIT_NO_REPLACE_OBJECTS", "GIT_REPLACE_REF_BASE",
    "GIT_PREFIX", "GIT_INTERNAL_SUPER_PREFIX", "GIT_SHALLOW_FILE", "GIT_COMMON_DIR"))


def git_env(**extra: str) -> dict[str, str]:
    """The caller's environment without LOCAL_ENV_VARS (and the GIT_CONFIG_KEY_/VALUE_ pairs),
    git's messages in English, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in LOCAL_ENV_VARS and not k.startswith("GIT_CONFIG_KEY_")
           and not k.startswith("GIT_CONFIG_VALUE_")}
    env["LC_ALL"] = "C"
    env.update(extra)
    return env


class GitError(Exception):
    """git ran and failed (``returncode``, its ``stderr``)."""

    def __init__(self, args: list[str], returncode: int, stderr: str) -> None:
        lines = stderr.strip().splitlines()
        said = [ln for ln in lines if ln.startswith(("fatal:", "error:"))] or lines[-1:]
        super().__init__(f"git {args[0]} failed"
                         + (f": {said[0]}" if said else f" (exit {returncode})"))
        self.returncode = returncode
        self.stderr = stderr


_program: list[str] = []  # git's absolute path, found once per process


def git_program() -> str:
    """git's path on PATH, looked up once (each run would otherwise try every PATH entry)."""
    if not _program:
        import shutil

        _program.append(shutil.which("git") or "git")
    return _program[0]


def run(args: list[str], cwd: str, *, env: dict[str, str] | None = None,
        input: bytes | None = None, check: bool = True, timeout: float = GIT_TIMEOUT_S
        ) -> subprocess.CompletedProcess[bytes]:
    """``git ARGS`` in ``cwd`` with ``git_env()`` (or ``env``). UsageError when git is not
    installed or does not answer in time; GitError when it fails and ``check``."""
    import subprocess

    try:
        proc = subprocess.run([git_program(), *args], cwd=cwd,
                              env=env if env is not None else git_env(), input=input,
                              stdin=None if input is not None else subprocess.DEVNULL,
                              capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise UsageError("git is not installed (or not on PATH)") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"git {args[0]} did not answer within {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        raise GitError(args, proc.returncode, proc.stderr.decode("utf-8", "replace"))
    return proc
