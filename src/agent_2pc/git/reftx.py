"""A ref update held prepared: git's own reference transaction, locked from prepare to apply.

``git update-ref --stdin`` runs a transaction of ref updates: ``start``, ``update REF NEW OLD``,
``prepare`` (git takes ``REF.lock`` and checks that REF is at OLD), then ``commit`` or ``abort``.
Between prepare and commit no other git process can move REF (``git commit`` there fails with
"cannot lock ref"), which is what a participant's yes vote needs: the compare-and-swap of the
apply cannot fail on a ref that someone moved after the vote. git aborts the transaction itself
when its input ends, so a coordinator that dies holding one leaves no lock behind: its git
process reads end-of-file, removes ``REF.lock`` and exits.
"""

from __future__ import annotations

import os

from .run import GIT_TIMEOUT_S, GitError, git_env, git_program

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess


class RefTransaction:
    """``git update-ref --stdin`` with one update, prepared (REF locked at OLD) on creation.

    GitError when git refuses the prepare: REF is not at OLD any more, or another process
    holds its lock (the message says which)."""

    def __init__(self, root: str, ref: str, new: str, old: str, message: str) -> None:
        import subprocess

        self.ref = ref
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [git_program(), "update-ref", "-m", message, "--stdin", "-z"], cwd=root, env=git_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            self._say(b"start\0", b"start: ok")
            self._say(b"update " + os.fsencode(ref) + b"\0" + new.encode() + b"\0"
                      + old.encode() + b"\0", None)
            self._say(b"prepare\0", b"prepare: ok")
        except BaseException:
            self.abort()
            raise

    def _say(self, command: bytes, answer: bytes | None) -> None:
        """Send one command; with ``answer``, wait (at most GIT_TIMEOUT_S) for that line."""
        import select

        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(command)
            proc.stdin.flush()
        except BrokenPipeError:
            raise self._failed() from None
        if answer is None:
            return
        ready, _, _ = select.select([proc.stdout], [], [], GIT_TIMEOUT_S)
        line = proc.stdout.readline().rstrip(b"\n") if ready else b""
        if line != answer:
            raise self._failed()

    def _failed(self) -> GitError:
        """git said no (or did not answer): end it and say what it wrote."""
        proc = self._proc
        assert proc is not None
        self._proc = None
        proc.kill() if proc.poll() is None else None
        _, err = proc.communicate()
        return GitError(["update-ref"], proc.returncode, err.decode("utf-8", "replace"))

    def commit(self) -> None:
        """Move the ref (GitError if git could not)."""
        self._say(b"commit\0", b"commit: ok")
        self._end()

    def abort(self) -> None:
        """Release the lock, the ref unmoved. Idempotent; also what git does by itself when
        this process dies."""
        self._end()

    def _end(self) -> None:
        """End of input (git aborts a transaction not committed), then git's exit."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        import subprocess

        try:
            proc.communicate(timeout=GIT_TIMEOUT_S)  # closes stdin, then reads to the end
        except (subprocess.TimeoutExpired, OSError):
            proc.kill()
            proc.communicate()
