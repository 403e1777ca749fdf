"""An interactive session (a shell driven through a pty, as a person or an agent harness
would) runs in the staged view with a real terminal, and what it changed is captured."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(60)

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "interactive_driver.py")


class Pty:
    def __init__(self, argv: list[str]) -> None:
        self.master, slave = os.openpty()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
        env["TERM"] = "dumb"
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                     start_new_session=True, env=env)
        os.close(slave)
        self.seen = b""

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def expect(self, token: bytes, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while token not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {token!r}; saw {self.seen[-2000:]!r}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.1))
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # the other side closed
                    assert token in self.seen, self.seen[-2000:]

    def close(self) -> int:
        try:
            return self.proc.wait(20)
        finally:
            os.close(self.master)

    def __enter__(self) -> "Pty":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # a failed expectation: never leave the session behind
            self.proc.kill()
            self.proc.wait()


def test_an_interactive_shell_session_is_captured(staged, tier, shared_tmp):
    out = os.path.join(shared_tmp, "result.json")
    with Pty([sys.executable, DRIVER, staged.root, staged.tx.tid, tier, out]) as term:
        # $((..)) makes the expected text differ from the echo of what was typed
        term.send(b"test -t 0 && test -t 1 && echo TTY-$((40+2))\n")
        term.expect(b"TTY-42")
        term.send(b"echo hi > inter.txt; rm docs/guide.txt; chmod 755 src/util.py; "
                  b"echo READY-$((1+1)); sleep 30\n")
        term.expect(b"READY-2")
        time.sleep(0.3)
        term.send(b"\x03")  # ^C: for the sleep, not for the view
        term.send(b"echo AFTER-$((2+2)) $(cat src/app.py | tail -1)\n")
        term.expect(b"AFTER-4 return 42")
        term.send(b"exit 3\n")
        assert term.close() == 0
    with open(out, encoding="utf-8") as f:
        result = json.load(f)
    assert result["exit_code"] == 3 and result["tier"] == tier and result["log"] is None
    assert result["capture"]["captured"] == [
        {"path": "docs/guide.txt", "op": "delete"},
        {"path": "inter.txt", "op": "write", "mode": 0o644, "bytes": 3},
        {"path": "src/util.py", "op": "write", "mode": 0o755, "bytes": 6},
    ]
    assert staged.tree_hash() == staged.before


def test_an_interactive_run_can_send_its_stdout_elsewhere(staged, tier, shared_tmp):
    out = os.path.join(shared_tmp, "stdout")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with staged.view(tier) as view:
            res = view.run("echo to-stdout; tail -1 src/app.py", interactive=True,
                           stdout_fd=fd, timeout_s=30)
    finally:
        os.close(fd)
    assert res.exit_code == 0 and res.log_path is None and res.tail is None
    with open(out) as f:
        assert f.read() == "to-stdout\n    return 42\n"


def test_an_interactive_shell_has_job_control(staged, tier, shared_tmp):
    out = os.path.join(shared_tmp, "result.json")
    with Pty([sys.executable, DRIVER, staged.root, staged.tx.tid, tier, out]) as term:
        term.send(b"echo UP-$((1+1)); sleep 30\n")
        term.expect(b"UP-2")
        time.sleep(0.3)
        term.send(b"\x1a")  # ^Z stops the sleep and gives the shell back
        term.expect(b"Stopped")
        term.send(b"jobs; echo JOBS-$((2+3))\n")
        term.expect(b"JOBS-5")
        term.send(b"fg\n")  # the sleep again in the foreground: ^C is for it
        time.sleep(0.3)
        term.send(b"\x03")
        term.send(b"echo BACK-$((3+4)); exit 0\n")
        term.expect(b"BACK-7")
        assert term.close() == 0
    with open(out, encoding="utf-8") as f:
        assert json.load(f)["exit_code"] == 0
