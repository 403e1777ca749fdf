"""A workspace is data, not instructions: what a forged log or a shipped .agent-tx/ can make
agent-2pc do (nothing), and which workspaces agent-2pc uses at all (the ones this user made
here, or said to trust).

The attacks are written as an attacker would: log frames built by hand (tests/hostile.py), a
git repository that commits its own .agent-tx/, a victim who clones it and asks for status.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
from typing import Any

import pytest
from conftest import _env, parse_one_object, run_cli, write
from hostile import PAYLOAD, TID, attack_failed, forged_clone, forged_commit, frame, stage

from agent_2pc import Agent2PC

pytestmark = pytest.mark.timeout(120)


def git(*args: str, cwd: str) -> None:
    subprocess.run(["git", "-c", "user.name=a", "-c", "user.email=a@example.com", *args],
                   cwd=cwd, check=True, capture_output=True, env=_env(), timeout=30)


def cli_json(*args: str, cwd: str | None = None, root: str | None = None,
             env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    proc = run_cli(args, json_out=True, root=root, cwd=cwd, env=env)
    return proc.returncode, parse_one_object(proc)


def record_at(wal: str, offset: int) -> dict[str, Any]:
    """The record whose frame starts at ``offset`` of the log ``wal``."""
    with open(wal, "rb") as f:
        data = f.read()
    magic, _, size, _ = struct.unpack_from("<4sBII", data, offset)
    assert magic == b"A2PC", f"no frame starts at offset {offset}"
    return json.loads(data[offset + 13: offset + 13 + size])


# -- the attack of the issue, end to end -------------------------------------------------------


@pytest.fixture
def cloned(tmp_path: Any) -> str:
    """A victim's clone of a repository that commits a .agent-tx/ whose log holds a decided,
    never applied commit of ``../OUTSIDE.txt`` and ``.git/hooks/post-merge`` (mode 0755)."""
    return forged_clone(str(tmp_path))


def assert_attack_failed(clone: str) -> None:
    assert attack_failed(clone)


def test_status_in_a_clone_that_ships_a_forged_decision_writes_nothing(cloned: str) -> None:
    status, out = cli_json("status", cwd=cloned)  # as the victim runs it: no --root
    assert_attack_failed(cloned)
    assert status == 2 and out["error"]["code"] == "untrusted_workspace", out
    assert "agent-2pc trust" in out["error"]["message"]
    # init does not adopt it either (an agent may run init in every repository it enters).
    status, out = cli_json("init", cwd=cloned)
    assert status == 2 and out["error"]["code"] == "untrusted_workspace", out
    assert_attack_failed(cloned)


def test_a_clone_trusted_by_mistake_still_writes_nothing_its_log_is_corrupt(cloned: str) -> None:
    status, out = cli_json("trust", cwd=cloned)
    assert status == 0 and [t["state"] for t in out["transactions"]] == ["committing"], out
    assert_attack_failed(cloned)  # trust lists, applies nothing
    status, out = cli_json("status", cwd=cloned)
    assert_attack_failed(cloned)
    assert status == 2 and out["error"]["code"] == "corrupt_wal", out
    err = out["error"]
    rec = record_at(err["path"], err["offset"])
    assert rec["type"] == "stage" and rec["path"] == "../OUTSIDE.txt", rec


def test_a_log_that_a_git_pull_puts_in_a_trusted_workspace_is_refused(tmp_path: Any) -> None:
    """git overwrites ignored files on checkout: a pulled commit that adds .agent-tx/wal.bin
    replaces the user's log (and its live transactions) with the attacker's."""
    upstream = str(tmp_path / "upstream")
    os.makedirs(upstream)
    git("init", "-q", cwd=upstream)
    write(upstream, "README.md", "a project\n")
    git("add", "-A", cwd=upstream)
    git("commit", "-qm", "initial", cwd=upstream)
    mine = str(tmp_path / "mine")
    git("clone", "-q", upstream, mine, cwd=str(tmp_path))
    client = Agent2PC.init(mine)
    tx = client.begin(label="my work")
    tx.stage_write("mine.txt", "mine\n")
    client.engine.close()
    forged = b"".join(frame(r) for r in forged_commit([stage("pwned.txt")]))
    write(upstream, ".agent-tx/wal.bin", forged)
    git("add", "-A", cwd=upstream)
    git("commit", "-qm", "innocent", cwd=upstream)
    git("pull", "-q", "--no-rebase", cwd=mine)
    with open(os.path.join(mine, ".agent-tx", "wal.bin"), "rb") as f:
        assert f.read() == forged  # git did overwrite the log
    status, out = cli_json("status", root=mine)
    assert not os.path.exists(os.path.join(mine, "pwned.txt"))
    assert status == 2 and out["error"]["code"] == "untrusted_workspace", out
    assert "replaced" in out["error"]["message"]


# -- forged records in a workspace the user made --------------------------------------------


def _blob_named(root: str, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    path = os.path.join(root, ".agent-tx", "objects", digest[:2], digest)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o444)
    return digest


def _case(name: str, root: str, outside: str) -> tuple[list[dict[str, Any]], str, str]:
    """(forged records, the command that acts on them, the record type that is refused);
    the bait files outside the tree are made here, the damage checked by _intact."""
    if name == "path out of the root":
        return forged_commit([stage("../OUTSIDE.txt")]), "status", "stage"
    if name == "path into .git":
        return forged_commit([stage(".git/hooks/post-merge")]), "status", "stage"
    if name == "path into .agent-tx":  # the globs that exec never captures, say
        return forged_commit([stage(".agent-tx/ignore")]), "status", "stage"
    if name == "path through ..":
        return forged_commit([stage("sub/../../OUTSIDE.txt")]), "status", "stage"
    if name == "absolute path":
        return forged_commit([stage(os.path.join(outside, "OUTSIDE.txt"))]), "status", "stage"
    if name == "delete out of the root":
        rec = stage("../precious.txt")
        rec.update(op="delete", via="delete", blob=None, size=0, mode=None,
                   pre=hashlib.sha256(b"precious\n").hexdigest())
        return forged_commit([rec]), "status", "stage"
    if name == "blob name that is a path":
        # objects/<digest[:2]>/<digest> with digest "../../secret.txt": the user's file is
        # renamed into the tree (where an agent may read it, commit it, push it).
        rec = stage("stolen.txt", mode=0o644)
        rec["blob"] = "../../secret.txt"
        return forged_commit([rec], decision={"inline": {}}), "status", "stage"
    if name == "placed out of the root":
        digest = _blob_named(root, PAYLOAD)
        rec = stage("sub/x.txt")
        assert rec["blob"] == digest
        return (forged_commit([rec], decision={"inline": {}, "placed": {"0": ".."}}),
                "status", "decision")
    if name == "decision names no such change":
        return (forged_commit([stage("ok.txt")], decision={"modes": {"7": 0o755}}),
                "status", "decision")
    if name == "undo of a prepare out of the root":
        recs = forged_commit([stage("../victim.txt")])[:-1]  # preparing: no decision
        return recs, "status", "stage"
    if name == "tid that is a path":
        tid = "../../../bait"  # .agent-tx/tx/<tid>: the scratch recover removes
        recs = [{"type": "begin", "tid": tid, "ts": 1, "label": None, "timeout_ms": 1,
                 "boot": None, "pid": 1}]
        return recs, "recover", "begin"
    raise AssertionError(name)


CASES = ["path out of the root", "path into .git", "path into .agent-tx", "path through ..",
         "absolute path", "delete out of the root", "blob name that is a path",
         "placed out of the root", "decision names no such change",
         "undo of a prepare out of the root", "tid that is a path"]


def _baits(outside: str) -> dict[str, bytes]:
    baits = {"precious.txt": b"precious\n", "secret.txt": b"my private key\n",
             f".agent-2pc-{TID}-0.tmp": b"someone's file\n", "bait/keep.txt": b"keep me\n"}
    for rel, data in baits.items():
        write(outside, rel, data)
    return baits


def _intact(root: str, outside: str, baits: dict[str, bytes], before: dict[str, Any]) -> None:
    for rel, data in baits.items():
        with open(os.path.join(outside, rel), "rb") as f:
            assert f.read() == data, f"{rel} outside the tree was changed"
    assert not os.path.exists(os.path.join(outside, "OUTSIDE.txt"))
    assert not os.path.exists(os.path.join(root, ".git", "hooks", "post-merge"))
    assert not os.path.exists(os.path.join(root, ".agent-tx", "ignore"))
    from conftest import take_snapshot
    assert take_snapshot(root)["tree"] == before["tree"], "the tree was changed"


@pytest.mark.parametrize("name", CASES)
def test_a_forged_record_is_corruption_reported_with_its_offset_and_never_applied(
        root: str, tmp_path: Any, name: str) -> None:
    from conftest import take_snapshot
    outside = str(tmp_path)
    baits = _baits(outside)
    before = take_snapshot(root)
    records, command, refused = _case(name, root, outside)
    wal = os.path.join(root, ".agent-tx", "wal.bin")
    with open(wal, "ab") as f:
        f.write(b"".join(frame(r) for r in records))
    proc = run_cli((command,), json_out=True, root=root)
    _intact(root, outside, baits, before)
    out = parse_one_object(proc)
    assert proc.returncode == 2 and out["error"]["code"] == "corrupt_wal", out
    assert record_at(wal, out["error"]["offset"])["type"] == refused, out
    # Asked again, the same answer, and still nothing happens.
    status, again = cli_json(command, root=root)
    assert status == 2 and again["error"] == out["error"], again
    _intact(root, outside, baits, before)


def test_a_forged_stage_record_in_an_active_transaction_is_refused_at_commit(
        root: str, tmp_path: Any) -> None:
    """The commit path checks the log's paths too (one pass before prepare): a record slipped
    into a live transaction is not committed."""
    client = Agent2PC(root)
    tx = client.begin()
    tx.stage_write("fine.txt", "fine\n")
    _blob_named(root, PAYLOAD)
    wal = os.path.join(root, ".agent-tx", "wal.bin")
    with open(wal, "ab") as f:
        f.write(frame(stage("../OUTSIDE.txt", tid=tx.tid)))
    status, out = cli_json("commit", "--tid", tx.tid, root=root)
    assert status == 2 and out["error"]["code"] == "corrupt_wal", out
    assert record_at(wal, out["error"]["offset"])["path"] == "../OUTSIDE.txt"
    assert not os.path.exists(tmp_path / "OUTSIDE.txt")
    assert not os.path.exists(os.path.join(root, "fine.txt"))


def test_a_staged_view_is_not_built_from_a_forged_record(root: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A view lays the transaction's paths out in a layer of its own, outside the tree, and
    gives the directories on the way their modes: before the fix a forged '../../..' path
    wrote a file into / and changed the modes of /, /dev and /dev/shm. So the view is a stub
    here that fails if it is ever asked for (a regression must not touch the machine)."""
    import agent_2pc.isolation as isolation
    from agent_2pc.errors import CorruptWal

    asked: list[list[str]] = []

    class NoView:
        def __init__(self, root: str, changes: list[Any], *args: Any, **kw: Any) -> None:
            asked.append([op.path for op in changes])
            raise AssertionError("a staged view was built from a forged record")

    monkeypatch.setattr(isolation, "StagedView", NoView)
    client = Agent2PC(root)
    tx = client.begin()
    tx.stage_write("fine.txt", "fine\n")
    _blob_named(root, PAYLOAD)
    wal = os.path.join(root, ".agent-tx", "wal.bin")
    with open(wal, "ab") as f:
        f.write(frame(stage("../../../../OUTSIDE.txt", tid=tx.tid)))
    with pytest.raises(CorruptWal) as refused:
        client.engine.stage_cmd(tx.tid, "true")
    assert asked == []
    assert record_at(wal, refused.value.details["offset"])["path"] == "../../../../OUTSIDE.txt"


# -- which workspaces are used ---------------------------------------------------------------


def test_init_keeps_the_workspace_out_of_git(root: str) -> None:
    client = Agent2PC(root)
    tx = client.begin()
    tx.stage_write("a.txt", "a\n")
    tx.commit()
    with open(os.path.join(root, ".git", "info", "exclude")) as f:
        assert "/.agent-tx/" in f.read().splitlines()
    porcelain = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                               cwd=root, capture_output=True, text=True, check=True).stdout
    assert porcelain.splitlines() == ["?? a.txt"]
    git("add", "-A", cwd=root)
    staged = subprocess.run(["git", "diff", "--cached", "--name-only"], cwd=root,
                            capture_output=True, text=True, check=True).stdout
    assert staged.splitlines() == ["a.txt"]


def test_init_in_a_linked_worktree_excludes_the_workspace_in_the_common_git_dir(
        tmp_path: Any) -> None:
    main = str(tmp_path / "main")
    os.makedirs(main)
    git("init", "-q", cwd=main)
    write(main, "README", "x\n")
    git("add", "-A", cwd=main)
    git("commit", "-qm", "x", cwd=main)
    linked = str(tmp_path / "linked")
    git("worktree", "add", "-q", linked, cwd=main)
    Agent2PC.init(linked)
    porcelain = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                               cwd=linked, capture_output=True, text=True, check=True).stdout
    assert porcelain == ""


def test_a_copied_workspace_is_refused_until_the_user_trusts_it(root: str, tmp_path: Any
                                                                 ) -> None:
    client = Agent2PC(root)
    tx = client.begin(label="kept")
    tx.stage_write("a.txt", "a\n")
    copy = str(tmp_path / "copy")
    shutil.copytree(root, copy, symlinks=True)
    status, out = cli_json("status", root=copy)
    assert status == 2 and out["error"]["code"] == "untrusted_workspace", out
    assert "copied" in out["error"]["message"]
    proc = run_cli(("status",), root=copy)  # as text: the refusal on stderr, nothing on stdout
    assert proc.returncode == 2 and proc.stdout == b"" and b"agent-2pc trust" in proc.stderr
    proc = run_cli(("trust",), root=copy)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().splitlines() == [
        f"trusted {copy}; 1 live transaction(s), which the next command finishes or keeps:",
        f"  {tx.tid} active kept"]
    status, out = cli_json("trust", root=copy)  # again: idempotent
    assert status == 0 and [t["tid"] for t in out["transactions"]] == [tx.tid], out
    status, out = cli_json("commit", "--tid", tx.tid, root=copy)
    assert status == 0 and out["state"] == "committed", out
    with open(os.path.join(copy, "a.txt")) as f:
        assert f.read() == "a\n"
    # The original is untouched and still trusted.
    assert cli_json("status", root=root)[0] == 0


def test_a_workspace_of_another_user_is_refused_and_cannot_be_trusted_by_its_trust_file(
        root: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to hand the workspace to another user")
    ws = os.path.join(root, ".agent-tx")
    os.chown(ws, 65534, 65534)  # nobody
    try:
        status, out = cli_json("status", root=root)
        assert status == 2 and out["error"]["code"] == "untrusted_workspace", out
        assert "another user" in out["error"]["message"]
        status, out = cli_json("trust", root=root)
        assert status == 2 and out["error"]["code"] == "untrusted_workspace", out
        assert "AGENT2PC_SAFE_DIRECTORY" in out["error"]["message"]
        # The user's own say-so, where that other user cannot write it.
        status, out = cli_json("status", root=root, env={"AGENT2PC_SAFE_DIRECTORY": root})
        assert status == 0, out
        status, out = cli_json("status", root=root, env={"AGENT2PC_SAFE_DIRECTORY": "*"})
        assert status == 0, out
        # sudo from the owner counts as the owner (as git does).
        status, out = cli_json("status", root=root, env={"SUDO_UID": "65534"})
        assert status == 0, out
    finally:
        os.chown(ws, 0, 0)


def test_a_workspace_without_its_trust_file_is_refused(root: str) -> None:
    os.unlink(os.path.join(root, ".agent-tx", "TRUST"))
    status, out = cli_json("begin", root=root)
    assert status == 2 and out["error"]["code"] == "untrusted_workspace", out
    assert cli_json("trust", root=root)[0] == 0
    assert cli_json("begin", root=root)[0] == 0


def test_a_symlinked_workspace_directory_is_refused(root: str, tmp_path: Any) -> None:
    elsewhere = str(tmp_path / "elsewhere")
    os.rename(os.path.join(root, ".agent-tx"), elsewhere)
    os.symlink(elsewhere, os.path.join(root, ".agent-tx"))
    status, out = cli_json("status", root=root)
    assert status == 2 and out["error"]["code"] == "untrusted_workspace", out
    status, out = cli_json("trust", root=root)
    assert status == 2 and out["error"]["code"] == "untrusted_workspace", out


# -- a workspace that lost its log -----------------------------------------------------------


@pytest.mark.parametrize("lost", ["wal.bin", "FORMAT"])
def test_a_missing_log_or_format_file_is_reported_not_taken_for_an_empty_workspace(
        root: str, lost: str) -> None:
    client = Agent2PC(root)
    tx = client.begin(label="in flight")
    tx.stage_write("a.txt", "a\n")
    client.engine.close()
    os.unlink(os.path.join(root, ".agent-tx", lost))
    for args in (("status",), ("list",), ("begin",), ("recover",), ("init",)):
        status, out = cli_json(*args, root=root)
        assert status == 2 and out["error"]["code"] == "corrupt_wal", (args, out)
        assert lost in out["error"]["message"]
    assert not os.path.exists(os.path.join(root, ".agent-tx", lost))  # nothing made it anew


def test_a_log_removed_under_a_running_client_is_reported(root: str) -> None:
    from agent_2pc.errors import CorruptWal

    client = Agent2PC(root)
    tx = client.begin()
    os.unlink(os.path.join(root, ".agent-tx", "wal.bin"))
    with pytest.raises(CorruptWal, match="wal.bin is missing"):
        tx.stage_write("a.txt", "a\n")
    assert not os.path.exists(os.path.join(root, ".agent-tx", "wal.bin"))


def test_init_makes_the_log_with_its_header_and_the_trust_file(tmp_path: Any) -> None:
    from agent_2pc.storage.wal_format import decode

    Agent2PC.init(tmp_path)
    ws = tmp_path / ".agent-tx"
    [header] = decode((ws / "wal.bin").read_bytes()).records
    assert header["type"] == "log" and len(header["workspace"]) == 32, header
    trust = f"inode {os.lstat(ws).st_ino}\nlog {header['workspace']}\n"
    assert (ws / "TRUST").read_text() == trust
    Agent2PC.init(tmp_path)  # idempotent
    assert (ws / "TRUST").read_text() == trust
