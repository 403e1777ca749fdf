"""``merge``: a three-way merge of three files into a fourth, as ``git merge-file`` does, but
into its own output (core/merge3way.py does the merge).

No workspace is needed: the paths are ordinary files, relative to the working directory. The
three inputs are read whole first (so the output may be one of them), then the output is
replaced atomically (temp file, fsync, rename, directory fsync): a reader sees the old file or
the merged one, never a part. It keeps the permission bits of the file it replaces, else
takes those of ``ours``.
"""

from __future__ import annotations

import os
import stat

from ..core.merge3way import MERGE_BYTES_MAX, NotText, merge
from ..errors import BinaryContent, MergeConflict, UsageError
from ..storage.durable import write_atomic

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _read(path: str, param: str) -> tuple[bytes, int]:
    """(content, permission bits) of the input file ``path``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read `{param}` {path}: {exc.strerror}", path=path,
                         params=(param,)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"`{param}` {path} is not a regular file", path=path,
                             params=(param,))
        if st.st_size > MERGE_BYTES_MAX:
            raise UsageError(f"`{param}` {path} is {st.st_size} bytes; merge takes files of "
                             f"at most {MERGE_BYTES_MAX}", path=path, params=(param,))
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MERGE_BYTES_MAX + 1)
    finally:
        os.close(fd)
    if len(data) > MERGE_BYTES_MAX:
        raise UsageError(f"`{param}` {path} grew past {MERGE_BYTES_MAX} bytes while read",
                         path=path, params=(param,))
    return data, stat.S_IMODE(st.st_mode)


def merge_files(base: str, ours: str, theirs: str, output: str) -> dict[str, Any]:
    """Merge the change base -> theirs into ours, write the result to ``output``.
    ``{conflicts: 0, output}``; MergeConflict (the output holds markers, its result the
    ranges) when edits overlap; BinaryContent for a binary input, UsageError for an input
    that cannot be read; nothing is written then."""
    texts = {}
    mode = 0o644
    for param, path in (("base", base), ("ours", ours), ("theirs", theirs)):
        texts[param], bits = _read(path, param)
        if param == "ours":
            mode = bits
    try:
        merged = merge(texts["base"], texts["ours"], texts["theirs"], label_ours=ours,
                       label_theirs=theirs)
    except NotText as exc:
        path = {"base": base, "ours": ours, "theirs": theirs}[exc.which]
        raise BinaryContent(f"`{exc.which}` {path} is binary (it holds a NUL byte); merge "
                            "takes text files only, and wrote nothing", path=path,
                            params=(exc.which,)) from None
    try:
        mode = stat.S_IMODE(os.stat(output).st_mode)
    except OSError:
        pass
    if os.path.isdir(output):
        raise UsageError(f"`output` {output} is a directory", path=output, params=("output",))
    try:
        write_atomic(output, merged.content, mode)
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        raise UsageError(f"cannot write `output` {output}: {exc.strerror}", path=output,
                         params=("output",)) from None
    if merged.conflicts:
        n = len(merged.conflicts)
        raise MergeConflict(
            f"{n} conflict{'s' if n != 1 else ''}: both sides changed the same lines; "
            f"{output} holds the merge with conflict markers", result={
                "conflicts": n, "output": output,
                "ranges": [c.to_json() for c in merged.conflicts]})
    return {"conflicts": 0, "output": output}
