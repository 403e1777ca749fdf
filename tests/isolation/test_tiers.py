"""Tiers: the best one the host allows is used and always reported; a tier that was asked for
and cannot be had is an error (isolation_unavailable), never a silent run elsewhere; a refused
mount falls back to the next tier before the command starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent_2pc.errors import IsolationUnavailable, UsageError
from agent_2pc.isolation import TIERS, probe_tiers
from agent_2pc.isolation import _view as view_module

from .conftest import NOBODY, SRC, hand_to_nobody, nobody_can_run

pytestmark = pytest.mark.timeout(60)


def test_probe_names_every_tier_and_copy_is_always_there():
    probe = probe_tiers()
    assert set(probe) == set(TIERS)
    assert probe["copy"] is None


def test_auto_takes_the_best_tier_the_host_has(staged):
    best = next(t for t in TIERS if probe_tiers()[t] is None)
    with staged.view(None) as view:
        res = view.run("true", timeout_s=30)
        assert res.tier == best == view.tier
        assert res.to_json()["isolation"] == best


def test_an_unavailable_tier_that_was_asked_for_is_refused(staged, monkeypatch, shared_tmp):
    monkeypatch.setattr(view_module, "_probe_cache",
                        {"overlay": "simulated: no overlay here", "fuse-overlayfs": None,
                         "copy": None})
    with pytest.raises(IsolationUnavailable) as err:
        staged.view("overlay")
    assert err.value.code == "isolation_unavailable" and err.value.exit_status == 2
    assert "simulated: no overlay here" in err.value.message
    with staged.view(None) as view:  # auto: the next tier, and the reason is kept
        assert view.refused == {"overlay": "simulated: no overlay here"}
        assert view.run("true", timeout_s=30).tier in ("fuse-overlayfs", "copy")


def _refuse_kernel_overlay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the kernel refuse the overlay mount itself (an option it does not know)."""
    monkeypatch.setattr(view_module, "ROOT_OPTS", view_module.ROOT_OPTS + ",a2pc_no_such_option")
    monkeypatch.setattr(view_module, "USERNS_OPTS",
                        view_module.USERNS_OPTS + ",a2pc_no_such_option")


def test_a_refused_mount_is_an_error_when_the_tier_was_asked_for(staged, monkeypatch,
                                                                 shared_tmp):
    if probe_tiers()["overlay"] is not None:
        pytest.skip(f"overlay: {probe_tiers()['overlay']}")
    _refuse_kernel_overlay(monkeypatch)
    ran = os.path.join(shared_tmp, "ran")
    with staged.view("overlay") as view:
        with pytest.raises(IsolationUnavailable) as err:
            view.run(f"touch {ran}", timeout_s=30)
        assert "mount -t overlay was refused" in err.value.message
        assert "overlay" in err.value.details["refused"]
    assert not os.path.exists(ran)  # nothing ran, not even against the real tree
    assert staged.tree_hash() == staged.before


def test_a_refused_mount_falls_back_to_the_next_tier_before_the_command_starts(
        staged, monkeypatch, shared_tmp):
    if probe_tiers()["overlay"] is not None:
        pytest.skip(f"overlay: {probe_tiers()['overlay']}")
    _refuse_kernel_overlay(monkeypatch)
    count = os.path.join(shared_tmp, "count")
    with staged.view(None) as view:
        res = view.run(f"echo run >> {count}; cat src/app.py; echo x > made.txt", timeout_s=30)
        assert res.exit_code == 0 and "return 42" in res.tail
        assert res.tier in ("fuse-overlayfs", "copy") and view.tier == res.tier
        assert "mount -t overlay was refused" in res.refused["overlay"]
        assert [c.path for c in view.capture().changes] == ["made.txt"]
    with open(count) as f:
        assert f.read() == "run\n"  # once: the refused tier never started it
    assert staged.tree_hash() == staged.before


def test_the_environment_can_choose_the_tier(staged, monkeypatch):
    monkeypatch.setenv("AGENT2PC_ISOLATION", "copy")
    with staged.view(None) as view:
        assert view.run("true", timeout_s=30).tier == "copy"
    monkeypatch.setenv("AGENT2PC_ISOLATION", "bogus")
    with pytest.raises(UsageError):
        staged.view(None)


NOBODY_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from agent_2pc.core.states import Op
from agent_2pc.isolation import StagedView
from agent_2pc.storage.blobs import BlobStore
root, agent_tx, scratch, ops = sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
changes = [Op(o["path"], o["op"], "write", o["blob"], o["size"], o["mode"], None) for o in ops]
blobs = BlobStore(os.path.join(agent_tx, "objects"), os.path.join(agent_tx, "preimages"))
with StagedView(root, changes, blobs, tier="overlay", scratch_dir=scratch) as view:
    res = view.run("id -u; tail -1 src/app.py; test -e gone.txt || echo no-gone; "
                   "echo mine > by-user.txt; rm -r docs; mkdir docs; echo n > docs/new.txt",
                   timeout_s=30)
    out = {"tier": res.tier, "namespace": res.namespace, "exit_code": res.exit_code,
           "tail": res.tail, "captured": view.capture().to_json()["captured"]}
print(json.dumps(out))
"""


def test_overlay_in_a_user_namespace_when_not_root(staged, shared_tmp):
    nobody_can_run()
    nobody = NOBODY
    scratch = hand_to_nobody(staged.root, shared_tmp)
    ops = [{"path": op.path, "op": op.op, "blob": op.blob, "size": op.size, "mode": op.mode}
           for op in staged.changes]
    before = staged.tree_hash()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"}
    proc = subprocess.run(["setpriv", f"--reuid={nobody}", f"--regid={nobody}",
                           "--clear-groups", sys.executable, "-c", NOBODY_SCRIPT, SRC,
                           staged.root, os.path.join(staged.root, ".agent-tx"), scratch,
                           json.dumps(ops)], capture_output=True, text=True, env=env,
                          timeout=60)
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr and \
            view_module._userns_refusal() is None:
        pytest.fail(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["tier"] == "overlay" and out["namespace"] == "user+mount+pid"
    assert out["exit_code"] == 0, out["tail"]
    assert out["tail"].split() == [str(nobody), "return", "42", "no-gone"]  # not root
    assert out["captured"] == [
        {"path": "docs/guide.txt", "op": "delete"},
        {"path": "by-user.txt", "op": "write", "mode": 0o644, "bytes": 5},
        {"path": "docs/new.txt", "op": "write", "mode": 0o644, "bytes": 2},
    ]
    assert staged.tree_hash() == before
    assert os.listdir(scratch) == []


def test_a_kernel_that_refuses_the_fast_mount_gets_the_long_way(staged, monkeypatch):
    # The overlay and /proc/sys are mounted by one mount -a with uuid=off,volatile; a kernel
    # that refuses an option makes the helper say @compat, and the run is made again the old
    # way (options tried one by one), before the command ever started.
    if probe_tiers()["overlay"] is not None:
        pytest.skip("no kernel overlay here")
    from agent_2pc.isolation import _view

    monkeypatch.setattr(_view, "FAST_MOUNT_OPTS", ",uuid=off,volatile,no_such_option")
    monkeypatch.setattr(_view, "_COMPAT_MOUNT", set())
    with staged.view("overlay") as view:
        res = view.run("echo ran >> runs.txt; cat src/app.py; v=$(cat "
                       "/proc/sys/kernel/core_pattern); { echo \"$v\" > "
                       "/proc/sys/kernel/core_pattern; } 2>/dev/null && echo SYSCTL-WRITABLE; "
                       "true", timeout_s=60)
        assert res.exit_code == 0 and "return 42" in res.tail
        assert "SYSCTL-WRITABLE" not in res.tail  # /proc/sys read-only the long way too
        assert [c.path for c in view.capture().changes] == ["runs.txt"]
        assert view.capture().changes[0].size == 4  # the command ran once
    assert _view._COMPAT_MOUNT == {"overlay"}
    assert staged.tree_hash() == staged.before
