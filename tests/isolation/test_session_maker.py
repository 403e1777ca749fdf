"""The session maker (isolation/_session.py): the program it starts is in the foreground of
its pseudo-terminal from its first instruction, however late the maker itself gets there.

An interactive shell that starts in the background stops itself with SIGTTIN until it is given
the terminal; seen in CI as `exec -- bash -i` reported "Stopped" in the caller's shell. The race
is made certain here: strace delays every ioctl on the terminal by DELAY_US, the maker's
hand-over included, and the program (dash, which makes no ioctl with -c) reads its process
group and its terminal's foreground group from /proc at once."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from agent_2pc.isolation._terminal import session_argv

pytestmark = pytest.mark.skipif(not shutil.which("strace") or not shutil.which("dash"),
                                reason="needs strace and dash")

DELAY_US = 400_000
# Fields 5 and 8 of /proc/self/stat: the process group and the terminal's foreground group.
PROBE = 'read -r _ _ _ _ pgrp _ _ tpgid _ < /proc/self/stat; echo "groups $pgrp $tpgid"'


def test_the_program_is_in_the_foreground_before_the_maker_hands_the_terminal_over():
    master, slave = os.openpty()
    try:
        argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-P", os.ttyname(slave),
                "-e", "trace=ioctl", "-e", f"inject=ioctl:delay_enter={DELAY_US}",
                *session_argv(["dash", "-c", PROBE])]
        proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                close_fds=True)
        os.close(slave)
        slave = -1
        out = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every holder of the slave is gone
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=60) == 0, out
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    words = out.decode().split()
    assert "groups" in words, out
    pgrp, tpgid = words[words.index("groups") + 1:words.index("groups") + 3]
    assert pgrp == tpgid, f"the program started in the background: {out!r}"
