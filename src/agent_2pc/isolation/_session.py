"""The session of a program on a pseudo-terminal of its own (run as ``python -S -I -c``).

The last step before the program, in its innermost PID namespace: it makes a new session whose
controlling terminal is its stdin (the pty's slave), starts the program in a process group of
its own, gives that group the terminal, and waits for it, as a login shell would. The program's
group is then not orphaned (its parent is in the same session), so a ^Z stops a program that is
not a shell (vim, less, a REPL) instead of being discarded by the kernel; the caller's relay sees
the foreground job stopped and suspends itself in turn (_terminal.py).

Signals sent to us (the caller passes TERM, HUP, USR1, USR2 to the session's leader) go on to
the program's group. Exits with the program's status as a shell gives it (128+N for signal N);
127 when the program cannot be started.

Standalone on purpose (stdlib only, no package import): it is passed as ``-c`` text, so that
it also runs where our source tree is not visible (a sandbox hides /tmp).

    python -S -I -c SOURCE CMD ARGS...
"""

import fcntl
import os
import signal
import sys
import termios

FORWARD = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def main(cmd: list[str]) -> int:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    try:
        pid = os.fork()
    except OSError as exc:
        print(f"{cmd[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        return 126
    if pid == 0:
        try:
            # The group and the terminal are taken here as well as by the parent (as shells
            # do): whichever runs first, the program starts in the foreground. An interactive
            # shell that started in the background would stop itself (SIGTTIN) for good.
            os.setpgid(0, 0)
            signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            try:
                os.tcsetpgrp(0, os.getpid())
            except OSError:
                pass
            for sig in (signal.SIGTTOU, signal.SIGTTIN, signal.SIGTSTP, signal.SIGINT,
                        signal.SIGQUIT, signal.SIGPIPE, *FORWARD):
                signal.signal(sig, signal.SIG_DFL)
            os.execvp(cmd[0], cmd)
        except OSError as exc:
            os.write(2, f"{cmd[0]}: {exc.strerror}\n".encode())
            os._exit(127)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child did it first, or has already exited
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(0, pid)
    except OSError:
        pass

    def forward(signum: int, frame: object) -> None:
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    for sig in FORWARD:
        signal.signal(sig, forward)
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP):
        signal.signal(sig, signal.SIG_IGN)  # the terminal's keys are for the program
    while True:
        try:
            _, status = os.waitpid(pid, 0)  # not WUNTRACED: a stopped program is waited on
        except ChildProcessError:
            return 0
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status)
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
