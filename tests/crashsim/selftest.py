"""The explorer can fail: planted violations that it must report (``python -m crashsim
--self-test``), so that a clean run means something.

  - the posix model generates the state that loses a renamed file's new name when its
    directory was not fsynced (the classic "rename without fsync" bug);
  - a state that drops the commit decision after its acknowledgement is reported;
  - a committed state whose tree file got other content is reported;
  - a log damaged in its middle (not a torn tail) is reported: recover refuses it.
"""

from __future__ import annotations

import os
import tempfile

from . import check, explore, fsmodel, models
from .workloads import all_workloads


def synthetic_rename_without_dir_fsync() -> list[str]:
    """write tmp, fsync tmp, rename tmp -> f, no fsync of the directory: posix must have a
    state without f; ext4 must not have one with f empty."""
    fs = fsmodel.Fs("/r", 1, {1: fsmodel.Node(fsmodel.DIR, 0o755, 0, entries={})})
    fs.births[-1] = fsmodel.Node(fsmodel.FILE, 0o644, 0, data=bytearray())
    ops = [fsmodel.Op("link", dir=1, name="tmp", ino=-1),
           fsmodel.Op("write", ino=-1, off=0, data=b"new", info={"extends": True}),
           fsmodel.Op("fsync", ino=-1),
           fsmodel.Op("rename", dir=1, name="tmp", new_name="f", ino=-1)]
    for i, op in enumerate(ops):
        op.index = i
    problems = []
    trees = []
    for name, model in models.MODELS.items():
        found = set()
        for st in models.Generator(ops, model, per_point_max=1000).states():
            f2 = fs.clone()
            get = fsmodel._owner(f2)
            for i in sorted(st.kept):
                fsmodel.apply_op(f2, ops[i], own=get)
            t = fsmodel.tree(f2)
            found.add((t.get("f", (None, 0, None))[2], "tmp" in t))
        trees.append((name, found))
        if name == "posix" and (None, True) not in found:
            problems.append("posix: no state keeps tmp and loses f")
        if (b"", False) in found:
            problems.append(f"{name}: a state with f empty, yet its data was fsynced")
        for st in models.Generator(ops, model, per_point_max=1000).states():
            if st.torn is not None and st.torn[0] == 1 and st.c_max > 2:
                problems.append(f"{name}: a torn write counted as possible after its fsync")
    return problems


def planted(workdir: str, scratch: str) -> list[str]:
    """Record the small workload; check states with planted damage."""
    rec = explore.record(all_workloads()["small"], os.path.join(workdir, "small"))
    problems = []
    every = frozenset(range(len(rec.ops)))
    ack = rec.acks[rec.tids[0]]
    decision = next(op.index for op in rec.ops if op.kind == "write" and b'"decision"'
                    in op.data)
    wal = rec.ops[decision].ino
    cut = {op.index for op in rec.ops if op.ino == wal and op.index >= decision}
    after_ack = models.State(every - cut, None, len(rec.ops), len(rec.ops), "planted")
    cases = [("an acknowledged commit lost", after_ack, None, "acknowledged"),
             ("wrong content in the tree", models.State(every, None, ack + 1, len(rec.ops),
                                                        "planted"), "a.txt", "the tree"),
             ("a log damaged in its middle", models.State(every, None, ack + 1, len(rec.ops),
                                                          "planted"), "wal", "recover")]
    for n, (what, st, damage, expect) in enumerate(cases):
        t = explore.materialize(rec, st)
        if damage == "a.txt":
            kind, mode, _, ino = t["a.txt"]
            t["a.txt"] = (kind, mode, b"not what was committed\n", ino)
        elif damage == "wal":
            kind, mode, data, ino = t[".agent-tx/wal.bin"]
            assert isinstance(data, bytes)
            t[".agent-tx/wal.bin"] = (kind, mode, data[:20] + b"\xff" + data[21:], ino)
        found = explore.check_one(rec, st, t, None, os.path.join(scratch, f"p{n}"), None)
        if not any(expect in f for f in found):
            problems.append(f"{what}: not reported (reported: {found})")
    return problems


def run() -> list[str]:
    check.warm_up()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        scratch = os.path.join(d, "scratch")
        os.makedirs(scratch)
        return synthetic_rename_without_dir_fsync() + planted(d, scratch)
