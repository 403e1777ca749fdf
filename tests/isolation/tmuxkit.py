"""Drive a terminal as a person would: a tmux server of our own, keys in, the screen out.

    with Tmux(cwd, env, shell=["bash", "--norc", "--noprofile"]) as t:
        t.type("agent-2pc exec --tid T -- sh -i")       # a line, then Enter
        t.keys("C-z")                                   # tmux key names
        t.wait_for(r"Stopped")                          # a regex on the whole screen
        t.resize(90, 20)

Each Tmux has its own server (``-L`` socket) and no configuration file; the window is 100x30
unless asked. ``screen()`` joins wrapped lines and keeps the scrollback, so a wait is not
fooled by what scrolled away.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from typing import Any

TMUX_TIMEOUT_S = 20.0
WAIT_S = 30.0


def have_tmux() -> bool:
    return shutil.which("tmux") is not None


class Tmux:
    def __init__(self, cwd: str, env: dict[str, str], shell: list[str],
                 width: int = 100, height: int = 30) -> None:
        self.socket = f"a2pc-test-{os.getpid()}-{os.urandom(4).hex()}"
        self.env = env
        self._tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height),
                   "-c", cwd, "--", *shell)
        self._tmux("set-option", "-g", "history-limit", "5000")

    def _tmux(self, *args: str) -> str:
        proc = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args],
                              capture_output=True, text=True, env=self.env,
                              timeout=TMUX_TIMEOUT_S)
        assert proc.returncode == 0, f"tmux {args}: {proc.stderr}"
        return proc.stdout

    def type(self, line: str) -> None:
        self._tmux("send-keys", "-t", "t", "-l", line)
        self._tmux("send-keys", "-t", "t", "Enter")

    def keys(self, *names: str) -> None:
        self._tmux("send-keys", "-t", "t", *names)

    def resize(self, width: int, height: int) -> None:
        self._tmux("resize-window", "-t", "t", "-x", str(width), "-y", str(height))

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "t")

    def wait_for(self, pattern: str, timeout_s: float = WAIT_S, after: int = 0) -> re.Match[str]:
        """The first match of ``pattern`` in the screen (past character ``after``)."""
        deadline = time.monotonic() + timeout_s
        rx = re.compile(pattern, re.M)
        while True:
            text = self.screen()
            m = rx.search(text, after)
            if m:
                return m
            assert time.monotonic() < deadline, \
                f"never saw {pattern!r}; the screen:\n{text[-3000:]}"
            time.sleep(0.1)

    def mark(self) -> int:
        """Where the screen ends now: wait_for(..., after=mark) looks only at what follows."""
        return len(self.screen().rstrip("\n"))

    def pane_pid(self) -> int:
        return int(self._tmux("display-message", "-p", "-t", "t", "#{pane_pid}").strip())

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=TMUX_TIMEOUT_S, env=self.env)

    def __enter__(self) -> Tmux:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
