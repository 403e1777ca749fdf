"""Helpers for the web tests: ``agent-2pc web`` started as a user starts it, its URL read from
the first line of its stdout."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from urllib.parse import parse_qs, urlsplit


class Web:
    def __init__(self, root: str, *args: str, env: dict[str, str] | None = None) -> None:
        full = {k: v for k, v in os.environ.items() if k not in ("AGENT2PC_ROOT",
                                                                 "AGENT2PC_CRASH_AT")}
        full.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent_2pc", "--root", root, "web", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full)
        self.url = self._first_line(15.0)
        parts = urlsplit(self.url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.port = parts.port
        self.token = parse_qs(parts.query)["token"][0]

    def _first_line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        buf = b""
        while b"\n" not in buf:
            if not sel.select(max(deadline - time.monotonic(), 0)):
                self.stop()
                raise AssertionError("'agent-2pc web' printed no URL in time")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise AssertionError(f"'agent-2pc web' exited: {err}")
            buf += chunk
        sel.close()
        return buf.split(b"\n", 1)[0].decode()

    def api(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}{path}{sep}token={self.token}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()

    def __enter__(self) -> "Web":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
