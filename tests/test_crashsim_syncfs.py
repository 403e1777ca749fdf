"""The crash-state explorer understands syncfs (tests/crashsim): a syncfs makes every file and
directory of its file system durable, and only of its own; a failed one is no barrier and
what it was to sync is unsure. Without this the explorer would take the batched commit of a
big transaction (durable.batching) for one that syncs nothing, or for one that syncs all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from crashsim import fsmodel, models


def _fs() -> fsmodel.Fs:
    fs = fsmodel.Fs("/r", 1, {1: fsmodel.Node(fsmodel.DIR, 0o755, 0, entries={}),
                              2: fsmodel.Node(fsmodel.DIR, 0o755, 9, entries={})})
    fs.nodes[1].entries = {"mnt": 2}  # type: ignore[index]
    fs.births[-1] = fsmodel.Node(fsmodel.FILE, 0o644, 0, data=bytearray())
    fs.births[-2] = fsmodel.Node(fsmodel.FILE, 0o644, 9, data=bytearray())
    return fs


def _ops(sync: fsmodel.Op) -> list[fsmodel.Op]:
    """tmp written on the root's file system, m on another (dev 9), then ``sync``, then f
    (renamed from tmp): what a batched apply does."""
    ops = [fsmodel.Op("link", dir=1, name="tmp", ino=-1),
           fsmodel.Op("write", ino=-1, off=0, data=b"new", info={"extends": True}),
           fsmodel.Op("link", dir=2, name="m", ino=-2),
           fsmodel.Op("write", ino=-2, off=0, data=b"mm", info={"extends": True}),
           sync,
           fsmodel.Op("rename", dir=1, name="tmp", new_name="f", ino=-1)]
    for i, op in enumerate(ops):
        op.index = i
    return ops


def _trees(ops: list[fsmodel.Op], model: models.Model) -> set[tuple[object, object]]:
    """(f's content, m's content) in every crash state after the rename."""
    found = set()
    for st in models.Generator(ops, model, per_point_max=1000).states():
        if 5 not in st.kept:
            continue
        f2 = _fs().clone()
        get = fsmodel._owner(f2)
        for i in sorted(st.kept):
            fsmodel.apply_op(f2, ops[i], own=get)
        t = fsmodel.tree(f2)
        found.add((t.get("f", (None, 0, None))[2], t.get("mnt/m", (None, 0, None))[2]))
    return found


ROOT_FS = {"inos": frozenset({1, -1}), "root_dev": True}


@pytest.mark.parametrize("model", sorted(models.MODELS))
def test_a_syncfs_makes_what_came_before_on_its_file_system_durable(model):
    found = _trees(_ops(fsmodel.Op("sync", ino=1, info=ROOT_FS)), models.MODELS[model])
    assert found and all(f == b"new" for f, _ in found), found
    if model == "posix":  # the other file system's file was not synced by it
        assert any(m != b"mm" for _, m in found), found


@pytest.mark.parametrize("model", sorted(models.MODELS))
def test_a_failed_syncfs_is_no_barrier(model):
    found = _trees(_ops(fsmodel.Op("sync", ino=1, info=ROOT_FS, failed=True, label="EIO")),
                   models.MODELS[model])
    assert any(f != b"new" for f, _ in found), found


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("strace"),
                    reason="traces a real commit with strace")
def test_the_batched_commit_is_traced_as_syncfs_of_the_root(tmp_path):
    """A real big commit under strace: the interpreter turns its syncfs calls into barriers
    of the root's file system (the explorer's bigtree workload relies on it)."""
    from crashsim import trace

    root = tmp_path / "repo"
    root.mkdir()
    env = dict(os.environ, AGENT2PC_SYNCFS_MIN="4")
    a2pc = [sys.executable, "-m", "agent_2pc", "--root", str(root)]
    subprocess.run([*a2pc, "init"], check=True, capture_output=True, env=env)
    tid = subprocess.run([*a2pc, "begin"], check=True, capture_output=True, text=True,
                         env=env).stdout.strip()
    for i in range(6):
        subprocess.run([*a2pc, "stage-write", "--tid", tid, "--path", f"d/f{i}.txt",
                        "--content", f"{i}\n"], check=True, capture_output=True, env=env)
    fs = fsmodel.snapshot(str(root))
    out = str(tmp_path / "commit.trace")
    proc = trace.run_traced([*a2pc, "commit", "--tid", tid], out, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    interp = fsmodel.Interpreter(fs)
    interp.feed(trace.parse(out))
    syncs = [op for op in interp.ops if op.kind == "sync"]
    assert len(syncs) == 2, [op.kind for op in interp.ops]  # before the renames; the end
    assert all(op.info["root_dev"] and not op.failed for op in syncs)
    renamed = [i for i, op in enumerate(interp.ops) if op.kind in ("rename", "link")
               and op.name and op.name.startswith("f")]
    assert renamed and syncs[0].index < min(renamed) and max(renamed) < syncs[1].index
