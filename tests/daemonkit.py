"""Helpers for the daemon tests: a daemon in a child process (crash points armed through its
environment), stopped or killed at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any


class DaemonProc:
    """``agent-2pc daemon start --foreground --json`` in a child process."""

    def __init__(self, root: str, env: dict[str, str] | None = None, *args: str) -> None:
        full = {k: v for k, v in os.environ.items()
                if k not in ("AGENT2PC_CRASH_AT", "AGENT2PC_STALL_AT", "AGENT2PC_NO_DAEMON")}
        full.update(env or {})
        self.root = root
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent_2pc", "--root", root, "daemon", "start",
             "--foreground", "--json", *args], env=full, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read().decode() if self.proc.stderr else "no output"
        self.ready: dict[str, Any] = json.loads(line)
        assert self.ready["ok"], self.ready
        self.pid = self.ready["pid"]

    def wait_dead(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> DaemonProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for(pred: Any, timeout: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
