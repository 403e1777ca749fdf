"""Opening a file a caller names as input (content to stage, a patch, a manifest, JSON).

One place for the CLI's options (cli/inputs.py), run-batch's ``content_file`` and the
library's ``stage_write_file(path, "a/path")``: a missing file, a directory or a name too long
is a usage error that names the file, never an OSError escaping.
"""

from __future__ import annotations

import os

from .errors import UsageError


def open_source(path: str, what: str = "") -> int:
    """A read-only descriptor on ``path`` (the caller closes it); ``what`` names it in the
    error ("the manifest from m.json")."""
    import stat

    name = f"{what} from {path}" if what else path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror}", path=path) from None
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"cannot read {name}: it is a directory", path=path)
    return fd
