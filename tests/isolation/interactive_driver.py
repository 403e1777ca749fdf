"""Run an interactive shell in a staged view on the terminal it is given, then write the
result and the capture as JSON (for test_interactive.py).

    interactive_driver.py ROOT TID TIER OUT_JSON

Started as a session leader with a pty as stdin/stdout/stderr; it makes that pty its
controlling terminal first, as a login would, so the shell gets job control.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sys
import termios

from agent_2pc import Agent2PC
from agent_2pc.isolation import StagedView


def main(root: str, tid: str, tier: str, out: str) -> int:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    client = Agent2PC(root)
    changes = client.engine.txs[tid].changes()
    shell = [shutil.which("bash") or "/bin/bash", "--norc", "--noprofile", "-i"] \
        if shutil.which("bash") else ["/bin/sh", "-i"]
    with StagedView(root, changes, client.engine.blobs, tier=tier) as view:
        res = view.run(shell, interactive=True, timeout_s=60)
        cap = view.capture()
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"exit_code": res.exit_code, "tier": res.tier, "log": res.log_path,
                       "capture": cap.to_json()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
