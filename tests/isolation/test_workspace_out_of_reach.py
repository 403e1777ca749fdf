"""A check or an exec'd command cannot touch the workspace's own state (.agent-tx/: the log, the
fence's ledger, the scratch of its own view), whatever it tries, in every tier: the view hides
.agent-tx/ (and in the copy tier the real repository is read-only at its own path, by a mount
namespace or by Landlock). Nested agent-2pc calls are refused with a clear error.

The attacks below run as the user runs checks (``agent-2pc stage-cmd``), as root here (the
tests of the bounding set, for what needs capabilities, are in test_root_in_the_view.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent_2pc.errors import IsolationUnavailable
from agent_2pc.fence import EffectRequest, Fresh, Replay, open_fence
from agent_2pc.isolation import _confine

pytestmark = pytest.mark.timeout(120)

A2PC = [sys.executable, "-m", "agent_2pc"]
# printf escapes: the marker never appears in the command's own text (which the log records)
MARK = "\\106\\117\\122\\107\\105\\104"  # FORGED
EFFECT = EffectRequest(intent="pay-invoice-7", domain="bank", tool="pay", args={"eur": 7},
                       agent="test")


def attack(root: str) -> str:
    """Every way we know to reach .agent-tx/ from a command in the view (no capability
    needed): the repo-relative and the absolute path, renames, a link, descriptors of other
    processes, their cwd and root."""
    ws = f"{root}/.agent-tx"
    return f"""
for w in .agent-tx/wal.bin "{ws}/wal.bin"; do printf '{MARK}' >> "$w"; done
rm -f .agent-tx/fence.db "{ws}/fence.db" "{ws}/fence.db-wal" "{ws}/fence.db-shm"
mv .agent-tx moved-1; mv "{ws}" "{root}/moved-2"
ln -s "{ws}/wal.bin" link-to-wal; printf '{MARK}' >> link-to-wal
for p in /proc/[0-9]*; do
    printf '{MARK}' >> "$p/cwd/.agent-tx/wal.bin"
    printf '{MARK}' >> "$p/root{ws}/wal.bin"
    for fd in "$p"/fd/*; do
        case "$(readlink "$fd")" in
        *"/.agent-tx"*log) ;;
        *"/.agent-tx"*) printf '{MARK}' >> "$fd";;
        esac
    done
done
"""


def _env(tier: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    env["AGENT2PC_ISOLATION"] = tier
    return env


def _fence(root: str):
    return open_fence("sqlite:///" + os.path.join(root, ".agent-tx", "fence.db").lstrip("/"))


def _done_effect(root: str) -> None:
    fence = _fence(root)
    adm = fence.prepare(EFFECT)
    assert isinstance(adm, Fresh)
    fence.commit(adm.ticket, {"paid": 7})


def _wal(root: str) -> bytes:
    with open(os.path.join(root, ".agent-tx", "wal.bin"), "rb") as f:
        return f.read()


@pytest.mark.parametrize("how", ["stage-cmd", "exec"])
def test_a_command_cannot_forge_the_log_or_erase_the_fence(staged, tier, how):
    _done_effect(staged.root)
    before = _wal(staged.root)
    script = attack(staged.root) + "exit 0\n"
    args = (["stage-cmd", "--tid", staged.tx.tid, "--command", script] if how == "stage-cmd"
            else ["exec", "--tid", staged.tx.tid, "--", "sh", "-c", script])
    out = subprocess.run([*A2PC, "--json", "--root", staged.root, *args], env=_env(tier),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    wal = _wal(staged.root)
    assert wal.startswith(before) and b"FORGED" not in wal  # only our own record was added
    assert os.path.isdir(os.path.join(staged.root, ".agent-tx"))
    assert not os.path.exists(os.path.join(staged.root, "moved-2"))
    assert isinstance(_fence(staged.root).prepare(EFFECT), Replay)  # the effect stays done
    assert staged.tree_hash() == staged.before
    if how == "exec":  # what it did in the view is staged; nothing of the workspace is
        captured = json.loads(out.stdout)["captured"]
        assert all(".agent-tx" not in c["path"] for c in captured)


def test_the_copy_tier_keeps_out_of_the_repository_with_landlock(staged, monkeypatch):
    # Where no mount namespace can be had (a container without CAP_SYS_ADMIN, no user
    # namespaces), the copy tier's supervisor restricts itself with Landlock.
    if "landlock" not in _confine._probe_landlock():
        pytest.skip("no Landlock here")
    monkeypatch.setattr(_confine, "_confinement", "landlock")
    _done_effect(staged.root)
    before = _wal(staged.root)
    with staged.view("copy") as view:
        res = view.run(attack(staged.root) + f"echo x > {staged.root}/README.md; "
                       "echo mine > in-the-copy.txt", timeout_s=60)
        assert res.exit_code == 0, res.tail
        assert "Permission denied" in res.tail
        assert "in-the-copy.txt" in [c.path for c in view.capture().changes]
    wal = _wal(staged.root)
    assert wal == before
    assert isinstance(_fence(staged.root).prepare(EFFECT), Replay)
    assert staged.tree_hash() == staged.before


def test_the_copy_tier_refuses_to_run_where_it_cannot_keep_out_of_the_repository(
        staged, monkeypatch):
    monkeypatch.setattr(_confine, "_confinement", "no private mount namespace and no Landlock")
    with staged.view("copy") as view:
        with pytest.raises(IsolationUnavailable) as info:
            view.run("touch ran")
    assert "cannot keep the command out of the repository" in str(info.value)
    assert staged.tree_hash() == staged.before
