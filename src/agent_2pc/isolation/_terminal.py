"""A pseudo-terminal of its own for an interactive run, as container runtimes give one for -t.

A program in the view runs in other PID namespaces than the caller: the process groups of the
caller's terminal do not exist there, so a shell cannot do job control on that terminal (dash
exits 2 at ``exit``: "Cannot set tty process group (No such process)"). Instead the program
gets a new pseudo-terminal: the last step before it, in its innermost PID namespace, makes a
new session whose controlling terminal is the pty's slave and runs the program in a process
group of its own in the foreground (_session.py), and the caller relays between its own
terminal and the pty's master:

- input and output, byte for byte; the caller's terminal is in raw mode meanwhile, so ^C, ^Z
  and ^\\ reach the pty, whose line discipline signals the program's foreground job;
- the window size, at the start and at every SIGWINCH;
- signals sent to the caller: INT and QUIT to the pty's foreground job (as the keys would),
  TERM, USR1 and USR2 to the program, HUP to the program and the foreground job (as a hangup);
  TSTP stops the caller itself (its terminal restored first; raw again on CONT);
- job control of the program itself: a program that is not a shell (vim, less, a Python REPL)
  stops at ^Z, and nobody in the view would continue it. The relay sees the pty's foreground
  job stopped with nobody taking the terminal back (on two looks ``STOP_POLL_S`` apart: a shell
  takes it back within milliseconds) and suspends the caller in turn, as the program would
  have been suspended on the caller's terminal: the caller's shell says "Stopped", and ``fg``
  continues the caller, which continues the program. When the caller's process group is
  orphaned (no shell with job control above it), the kernel discards that stop, as it would
  for the program: the program is continued at once.

The caller's terminal mode is restored when the run ends, however it ends: normally, on an
exception (``finally``), and when the caller is killed outright (SIGKILL) by a guard process
that holds the saved mode and restores it once the caller's end of a pipe closes without the
word ``done``. The slave starts with the caller's terminal settings and window size.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
import time

from ._procs import wait_ready

CHUNK_BYTES = 65536
TIOCGSID = getattr(termios, "TIOCGSID", 0x5429)  # Linux's number; Python lacks the name
STOP_POLL_S = 0.1
PENDING_BYTES_MAX = 1 << 20  # input not yet taken by the program; stdin waits beyond this
DRAIN_ROUNDS_MAX = 4096
# The guard: stdin is the caller's terminal, $2 the descriptor of the pipe whose other end the
# caller holds. It is in a session of its own (no terminal's job control applies to it) and
# ignores the signals a dying session sends.
GUARD = ('trap "" INT QUIT TSTP TTIN TTOU HUP TERM; IFS= read -r said <&$2; '
         '[ "$said" = done ] || stty "$1" 2>/dev/null')
FORWARD_TO_JOB = (signal.SIGINT, signal.SIGQUIT)
FORWARD_TO_PROGRAM = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


_session_source: str | None = None


def session_argv(argv: list[str]) -> list[str]:
    """``argv`` run by the session maker (_session.py), as ``python -S -I -c``: the real
    interpreter (a virtualenv's may live where a sandbox does not show it)."""
    global _session_source
    if _session_source is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_session.py")
        with open(path, encoding="utf-8") as f:
            _session_source = f.read()
    return [os.path.realpath(sys.executable), "-S", "-I", "-c", _session_source, *argv]


def wanted(in_fd: int, out_fd: int) -> bool:
    """Does an interactive run on these descriptors get a pty (both are terminals)?"""
    return os.isatty(in_fd) and os.isatty(out_fd)


def stty_string(attrs: list) -> str:  # type: ignore[type-arg]
    """``attrs`` (termios.tcgetattr) in the form ``stty -g`` prints and ``stty`` takes back."""
    iflag, oflag, cflag, lflag, _ispeed, _ospeed, cc = attrs
    chars = [c if isinstance(c, int) else (c[0] if c else 0) for c in cc]
    return ":".join(f"{v:x}" for v in (iflag, oflag, cflag, lflag, *chars))


def raw(attrs: list) -> list:  # type: ignore[type-arg]
    """cfmakeraw(3) of ``attrs``."""
    iflag, oflag, cflag, lflag, ispeed, ospeed, cc = attrs
    iflag &= ~(termios.IGNBRK | termios.BRKINT | termios.PARMRK | termios.ISTRIP
               | termios.INLCR | termios.IGNCR | termios.ICRNL | termios.IXON)
    oflag &= ~termios.OPOST
    lflag &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG | termios.IEXTEN)
    cflag = (cflag & ~(termios.CSIZE | termios.PARENB)) | termios.CS8
    cc = list(cc)
    cc[termios.VMIN] = 1
    cc[termios.VTIME] = 0
    return [iflag, oflag, cflag, lflag, ispeed, ospeed, cc]


class Terminal:
    """The pty of one run: ``open()`` gives the slave for the program's stdio, ``start()``
    after the program is spawned, ``pump()`` from the wait loop, ``close()`` at the end."""

    def __init__(self, in_fd: int = 0, out_fd: int = 1) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.master: int | None = None
        self._saved: list | None = None  # type: ignore[type-arg]
        self._guard: subprocess.Popen[bytes] | None = None
        self._guard_w: int | None = None
        self._handlers: list[tuple[int, object]] = []
        self._pending = b""  # typed, not yet written to the master
        self._input_open = True
        self._output_open = True
        self._raw = False
        self._stop_checked = 0.0
        self._stopped_seen: int | None = None  # a stopped foreground job seen at the last look

    # -- setting up --------------------------------------------------------------------------

    def open(self) -> int:
        """Make the pty; return its slave (the caller closes it once the program has it)."""
        master, slave = os.openpty()
        self.master = master
        try:
            self._saved = termios.tcgetattr(self.in_fd)
            termios.tcsetattr(slave, termios.TCSANOW, self._saved)
        except termios.error:
            self._saved = None
        self._copy_size()
        os.set_blocking(master, False)
        return slave

    def start(self) -> None:
        """Raw mode on our terminal, the guard that restores it if we die, signal handlers."""
        if self._saved is not None:
            self._start_guard()
            self._enter_raw()
        self._install_handlers()

    def _start_guard(self) -> None:
        assert self._saved is not None
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            self._guard = subprocess.Popen(
                ["/bin/sh", "-c", GUARD, "agent-2pc-tty-guard", stty_string(self._saved),
                 str(r)],
                stdin=self.in_fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(r,), start_new_session=True)
        except OSError:
            os.close(w)
            self._guard = None
            return
        finally:
            os.close(r)
        self._guard_w = w

    def _enter_raw(self) -> None:
        if self._saved is None:
            return
        try:
            termios.tcsetattr(self.in_fd, termios.TCSADRAIN, raw(self._saved))
            self._raw = True
        except termios.error:
            pass

    def _leave_raw(self) -> None:
        if self._saved is not None and self._raw:
            try:
                termios.tcsetattr(self.in_fd, termios.TCSADRAIN, self._saved)
            except termios.error:
                pass
            self._raw = False

    def _install_handlers(self) -> None:
        table = {signal.SIGWINCH: self._on_winch, signal.SIGTSTP: self._on_tstp,
                 signal.SIGCONT: self._on_cont, signal.SIGHUP: self._on_hup}
        for sig in FORWARD_TO_JOB + FORWARD_TO_PROGRAM:
            table[sig] = self._on_forward
        for sig, handler in table.items():
            try:
                self._handlers.append((sig, signal.signal(sig, handler)))
            except ValueError:  # not the main thread: no handlers, the pty still works
                self._handlers.clear()
                return

    # -- signals -----------------------------------------------------------------------------

    def _copy_size(self) -> None:
        if self.master is None:
            return
        for fd in (self.in_fd, self.out_fd):
            try:
                size = fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
            except OSError:
                continue
            try:  # sets the slave's size; the kernel sends SIGWINCH to its foreground job
                fcntl.ioctl(self.master, termios.TIOCSWINSZ, size)
            except OSError:
                pass
            return

    def _on_winch(self, signum: int, frame: object) -> None:
        self._copy_size()

    def _on_tstp(self, signum: int, frame: object) -> None:
        self._suspend()

    def _suspend(self) -> None:
        """Stop the caller as a terminal's ^Z would (our terminal restored meanwhile)."""
        self._leave_raw()
        try:
            old = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        except ValueError:  # not the main thread: the disposition cannot change
            old = None
        else:  # stops here unless our process group is orphaned; returns once continued
            os.kill(os.getpid(), signal.SIGTSTP)
            signal.signal(signal.SIGTSTP, old)
        self._enter_raw()
        self._copy_size()

    def watch_stop(self) -> None:
        """If the program itself stopped (^Z in vim, a REPL, ...), suspend the caller, then
        continue the program."""
        now = time.monotonic()
        if now - self._stop_checked < STOP_POLL_S:
            return
        self._stop_checked = now
        pgrp = self._foreground()
        if pgrp is None or pgrp == self._session() or _state(pgrp) != "T":
            self._stopped_seen = None
            return
        if self._stopped_seen != pgrp:  # look again: a shell may be taking the terminal back
            self._stopped_seen = pgrp
            return
        self._stopped_seen = None
        self._suspend()
        try:
            os.killpg(pgrp, signal.SIGCONT)
        except OSError:
            pass

    def _on_cont(self, signum: int, frame: object) -> None:
        if self._saved is not None and not self._raw:
            self._enter_raw()
        self._copy_size()

    def _on_hup(self, signum: int, frame: object) -> None:
        self._input_open = False  # our terminal is gone
        self._signal_program(signal.SIGHUP)
        self._signal_job(signal.SIGHUP)

    def _on_forward(self, signum: int, frame: object) -> None:
        if signum in FORWARD_TO_JOB:
            self._signal_job(signum)
        else:
            self._signal_program(signum)

    def _foreground(self) -> int | None:
        """The pty's foreground process group, in our PID numbering."""
        if self.master is None:
            return None
        try:
            pgrp = os.tcgetpgrp(self.master)
        except OSError:
            return None
        return pgrp if pgrp > 0 else None

    def _session(self) -> int | None:
        """The program: the leader of the pty's session, in our PID numbering."""
        if self.master is None:
            return None
        try:
            sid = struct.unpack("i", fcntl.ioctl(self.master, TIOCGSID, b"\0" * 4))[0]
        except OSError:  # the program has not made its session yet
            return None
        return sid if sid > 0 else None

    def _signal_job(self, sig: int) -> None:
        pgrp = self._foreground()
        if pgrp is not None:
            try:
                os.killpg(pgrp, sig)
            except OSError:
                pass

    def _signal_program(self, sig: int) -> None:
        sid = self._session()
        if sid is not None:
            try:
                os.kill(sid, sig)
            except OSError:
                pass

    # -- relaying ----------------------------------------------------------------------------

    def fds(self) -> tuple[list[int], list[int]]:
        """(read, write) descriptors the wait loop should select on."""
        assert self.master is not None
        rd = [self.master]
        if self._input_open and len(self._pending) < PENDING_BYTES_MAX:
            rd.append(self.in_fd)
        return rd, [self.master] if self._pending else []

    def pump(self, readable: list[int], writable: list[int]) -> None:
        assert self.master is not None
        if self.in_fd in readable:
            try:
                data = os.read(self.in_fd, CHUNK_BYTES)
            except OSError:
                data = b""
            if data:
                self._pending += data
            else:  # our terminal hung up
                self._input_open = False
        if self._pending:  # the master is non-blocking: a full pty just takes nothing now
            try:
                n = os.write(self.master, self._pending)
                self._pending = self._pending[n:]
            except BlockingIOError:
                pass
            except OSError:
                self._pending = b""
        if self.master in readable:
            self._read_master()

    def _read_master(self) -> bool:
        """Relay what the program wrote; False when there is nothing more to read now."""
        assert self.master is not None
        try:
            data = os.read(self.master, CHUNK_BYTES)
        except BlockingIOError:
            return False
        except OSError as exc:  # EIO: no slave is open any more
            if exc.errno != errno.EIO:
                raise
            return False
        if not data:
            return False
        if self._output_open:
            try:
                _write_all(self.out_fd, data)
            except OSError:  # our terminal is gone: keep draining, so the program never blocks
                self._output_open = False
        return True

    def drain(self) -> None:
        """After the program ended: relay what is still in the pty."""
        if self.master is None:
            return
        for _ in range(DRAIN_ROUNDS_MAX):
            if not self._read_master():
                return

    # -- the end -----------------------------------------------------------------------------

    def close(self) -> None:
        """Restore our terminal and signal handlers, dismiss the guard, close the master.
        Idempotent."""
        for sig, old in reversed(self._handlers):
            try:
                signal.signal(sig, old)  # type: ignore[arg-type]
            except (ValueError, TypeError):
                pass
        self._handlers.clear()
        self._leave_raw()
        if self._guard_w is not None:
            try:
                os.write(self._guard_w, b"done\n")
            except OSError:
                pass
            os.close(self._guard_w)
            self._guard_w = None
        if self._guard is not None:
            try:
                self._guard.wait(1.0)
            except subprocess.TimeoutExpired:
                pass
            self._guard = None
        if self.master is not None:
            os.close(self.master)
            self.master = None


def _state(pid: int) -> str | None:
    """The state letter of ``pid`` in /proc (R, S, T, Z, ...)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    i = data.rfind(b")")
    return data[i + 2:i + 3].decode("ascii", "replace") if i >= 0 else None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            wait_ready([], [fd], 1.0)
            continue
        view = view[n:]
