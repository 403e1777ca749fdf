"""Is a process alive? (For sweeping what dead processes left behind.)"""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True when ``pid`` names a live process (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
