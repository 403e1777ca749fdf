"""Bad input gets its contract error code and exit status, and changes nothing.

CONTRACT.md: exit 2 for bad input or usage (unknown tid, path outside the root, wrong state,
malformed patch/manifest/JSON, missing workspace); error codes path_outside_root,
path_forbidden, unknown_tid, bad_state, invalid_patch, patch_rejected, no_match,
ambiguous_match, not_found, not_initialized, usage. "Changes nothing" is checked by comparing a
snapshot of the tree and of .agent-tx/wal.bin (and history.jsonl) before and after.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
import types

import pytest
from conftest import parse_one_object, read, write

from agent_2pc import Agent2PC, Agent2PCError

# A CLI call that hangs (a lock never released) must fail the test, not stall the run.
pytestmark = pytest.mark.timeout(60)

SECRET = b"secret outside the root\n"


@pytest.fixture
def world(root, tmp_path, client):
    """A small tree, a directory outside the root, links leading out, and an active tid."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    write(root, "a.txt", "alpha\n")
    write(root, "src/b.py", "print('b')\n")
    write(root, "dup.txt", "x = 1\nx = 1\n")
    write(root, "sub/.git/config", "[core]\n")
    os.symlink(str(outside / "secret.txt"), os.path.join(root, "link_out"))
    os.symlink(str(outside), os.path.join(root, "dir_out"))
    os.symlink(".git/config", os.path.join(root, "link_git"))
    tid = client.begin().tid

    return types.SimpleNamespace(
        root=root, tid=tid, outside=str(outside),
        outside_snapshot=lambda: sorted((p, (outside / p).read_bytes())
                                        for p in os.listdir(outside)))


def path_cmd(kind: str, tid: str, path: str) -> list[str]:
    """A command of ``kind`` that takes --path, aimed at ``path``."""
    extra = {
        "stage-write": ["--content", "pwned\n"],
        "stage-delete": [],
        "stage-replace": ["--old", "secret", "--new", "pwned"],
        "record-read": [],
    }[kind]
    return [kind, "--tid", tid, "--path", path, *extra]


PATH_KINDS = ["stage-write", "stage-delete", "stage-replace", "record-read"]


def assert_refused(result, code, status=2):
    exit_status, out = result
    assert out["ok"] is False, out
    assert out["error"]["code"] == code, out
    assert exit_status == status, (exit_status, out)
    return out


# -- paths -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PATH_KINDS)
@pytest.mark.parametrize("path", ["../outside/secret.txt", "src/../../outside/secret.txt",
                                  "../../../../../../../../etc/passwd", ".."])
def test_path_escaping_root_with_dotdot_is_refused_and_changes_nothing(
        world, cli, snapshot, kind, path):
    before, outside_before = snapshot(), world.outside_snapshot()
    assert_refused(cli(*path_cmd(kind, world.tid, path)), "path_outside_root")
    assert snapshot() == before
    assert world.outside_snapshot() == outside_before


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_absolute_path_elsewhere_is_refused_and_changes_nothing(world, cli, snapshot, kind):
    before = snapshot()
    for path in (os.path.join(world.outside, "secret.txt"), "/etc/passwd", "/"):
        assert_refused(cli(*path_cmd(kind, world.tid, path)), "path_outside_root")
    assert snapshot() == before
    assert read(world.outside, "secret.txt") == SECRET


def test_absolute_path_inside_root_is_accepted_and_made_relative(world, cli):
    status, out = cli("stage-write", "--tid", world.tid, "--path",
                      os.path.join(world.root, "src", "b.py"), "--content", "new\n")
    assert (status, out["ok"], out["path"]) == (0, True, "src/b.py")


def test_a_path_with_dotdot_that_stays_inside_the_root_is_normalized(world, cli):
    status, out = cli("stage-write", "--tid", world.tid, "--path", "src/../src/./b.py",
                      "--content", "new\n")
    assert (status, out["path"]) == (0, "src/b.py"), out


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_symlink_leading_out_of_root_is_refused_and_changes_nothing(world, cli, snapshot, kind):
    before = snapshot()
    assert_refused(cli(*path_cmd(kind, world.tid, "link_out")), "path_outside_root")
    assert snapshot() == before
    assert read(world.outside, "secret.txt") == SECRET


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_symlinked_parent_directory_leading_out_is_refused_and_changes_nothing(
        world, cli, snapshot, kind):
    before, outside_before = snapshot(), world.outside_snapshot()
    for path in ("dir_out/secret.txt", "dir_out/new.txt"):
        assert_refused(cli(*path_cmd(kind, world.tid, path)), "path_outside_root")
    assert snapshot() == before
    assert world.outside_snapshot() == outside_before


def test_commit_never_writes_through_a_symlink_leading_out(world, cli, snapshot):
    """Even a file staged through a path that is fine at staging time cannot be redirected out
    of the root by a symlink planted before commit: the commit aborts, outside is untouched."""
    assert cli("stage-write", "--tid", world.tid, "--path", "newdir/f.txt",
               "--content", "inside\n")[0] == 0
    os.symlink(world.outside, os.path.join(world.root, "newdir"))
    status, out = cli("commit", "--tid", world.tid)
    assert status == 1 and out["ok"] is False and out["state"] == "aborted", out
    assert out["error"]["code"] == "conflict", out
    assert sorted(os.listdir(world.outside)) == ["secret.txt"]


@pytest.mark.parametrize("kind", PATH_KINDS)
@pytest.mark.parametrize("path", [".agent-tx/wal.bin", ".agent-tx/FORMAT", ".agent-tx/new",
                                  "./.agent-tx/../.agent-tx/wal.bin", ".git/config",
                                  ".git/hooks/pre-commit", "src/../.git/HEAD",
                                  "sub/.git/config", "sub/.git/new", "link_git"])
def test_paths_in_agent_tx_or_git_are_forbidden_and_change_nothing(
        world, cli, snapshot, kind, path):
    git_config = read(world.root, ".git/config")
    before = snapshot()
    assert_refused(cli(*path_cmd(kind, world.tid, path)), "path_forbidden")
    assert snapshot() == before
    assert read(world.root, ".git/config") == git_config


PATCH_MODIFY_GIT_CONFIG = (
    "--- a/.git/config\n+++ b/.git/config\n@@ -1 +1,2 @@\n [core]\n+\thooksPath = /tmp/evil\n")


def test_patch_creating_a_file_in_git_dir_is_forbidden(world, cli, snapshot):
    before = snapshot()
    patch = "--- /dev/null\n+++ b/.git/hooks/post-commit\n@@ -0,0 +1 @@\n+echo pwned\n"
    assert_refused(cli("stage-patch", "--tid", world.tid, "--stdin", input=patch),
                   "path_forbidden")
    assert snapshot() == before
    assert not os.path.exists(os.path.join(world.root, ".git/hooks/post-commit"))


def test_patch_modifying_an_existing_file_in_git_dir_is_forbidden(world, cli, snapshot):
    """.git/config exists: a patch to it must be refused as forbidden, not as 'absent'."""
    git_config = read(world.root, ".git/config")
    before = snapshot()
    assert git_config.startswith(b"[core]\n")  # what git init writes
    assert_refused(cli("stage-patch", "--tid", world.tid, "--stdin",
                       input=PATCH_MODIFY_GIT_CONFIG), "path_forbidden")
    assert snapshot() == before
    assert read(world.root, ".git/config") == git_config


def test_patch_naming_a_path_outside_root_is_refused_and_changes_nothing(world, cli, snapshot):
    before, outside_before = snapshot(), world.outside_snapshot()
    patch = "--- /dev/null\n+++ b/../outside/evil.txt\n@@ -0,0 +1 @@\n+evil\n"
    status, out = cli("stage-patch", "--tid", world.tid, "--stdin", input=patch)
    assert status == 2 and out["ok"] is False
    # A file name with '..' is a malformed patch or a path outside the root: refused either way.
    assert out["error"]["code"] in ("path_outside_root", "invalid_patch"), out
    assert snapshot() == before
    assert world.outside_snapshot() == outside_before


def test_patch_through_a_symlink_leading_out_is_refused_as_outside_root(world, cli, snapshot):
    before = snapshot()
    patch = ("--- a/link_out\n+++ b/link_out\n@@ -1 +1 @@\n-secret outside the root\n"
             "+pwned\n")
    assert_refused(cli("stage-patch", "--tid", world.tid, "--stdin", input=patch),
                   "path_outside_root")
    create = "--- /dev/null\n+++ b/dir_out/evil.txt\n@@ -0,0 +1 @@\n+evil\n"
    assert_refused(cli("stage-patch", "--tid", world.tid, "--stdin", input=create),
                   "path_outside_root")
    assert snapshot() == before
    assert read(world.outside, "secret.txt") == SECRET
    assert sorted(os.listdir(world.outside)) == ["secret.txt"]


# -- tids ------------------------------------------------------------------------------------

TID_COMMANDS = [
    ["stage-write", "--path", "a.txt", "--content", "x"],
    ["stage-delete", "--path", "a.txt"],
    ["stage-replace", "--path", "a.txt", "--old", "alpha", "--new", "beta"],
    ["record-read", "--path", "a.txt"],
    ["diff"], ["status"], ["savepoint", "--name", "s"], ["rollback-to", "--name", "s"],
    ["commit"], ["abort"],
    ["vote", "--coordinator", '{"gtid": "g-1"}'], ["decide", "commit"], ["decide", "abort"],
]


@pytest.mark.parametrize("tid", ["tx-20200101-000000-abcdef", "nonsense", "",
                                 "../../etc/passwd", "tx-20200101-000000-ABCDEF "])
@pytest.mark.parametrize("cmd", TID_COMMANDS, ids=lambda c: c[0])
def test_unknown_or_malformed_tid_is_refused_and_changes_nothing(world, cli, snapshot, tid, cmd):
    before = snapshot()
    assert_refused(cli(cmd[0], "--tid", tid, *cmd[1:]), "unknown_tid")
    assert snapshot() == before


def test_unknown_tid_through_the_library_raises_unknown_tid(world, client):
    with pytest.raises(Agent2PCError) as info:
        client.get("tx-20200101-000000-abcdef")
    assert info.value.code == "unknown_tid"
    assert info.value.exit_status == 2


STAGING = [
    ["stage-write", "--path", "a.txt", "--content", "late\n"],
    ["stage-delete", "--path", "a.txt"],
    ["stage-replace", "--path", "a.txt", "--old", "alpha", "--new", "late"],
    ["record-read", "--path", "a.txt"],
    ["savepoint", "--name", "late"],
]


@pytest.mark.parametrize("finish", ["commit", "abort"])
def test_staging_on_a_finished_transaction_is_bad_state_and_changes_nothing(
        world, cli, client, snapshot, finish):
    tx = client.get(world.tid)
    tx.stage_write("src/b.py", "b2\n")
    getattr(tx, finish)()
    before = snapshot()
    for cmd in STAGING:
        assert_refused(cli(cmd[0], "--tid", world.tid, *cmd[1:]), "bad_state")
    patch = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-alpha\n+late\n"
    assert_refused(cli("stage-patch", "--tid", world.tid, "--stdin", input=patch), "bad_state")
    assert_refused(cli("rollback-to", "--tid", world.tid, "--name", "late"), "bad_state")
    assert snapshot() == before


# -- patches ---------------------------------------------------------------------------------


@pytest.mark.parametrize("patch", [
    b"", b"\n", b"   \n\n",
    b"this is not a diff\n",
    b"--- a/a.txt\n+++ b/a.txt\n@@ garbage @@\n-alpha\n+beta\n",
    b"--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-alpha\n+beta\n+gamma\n+delta\n",   # bad counts
    b"--- a/a.txt\n@@ -1 +1 @@\n-alpha\n+beta\n",                                # no +++
    b"\x00\x01\x02\xff binary junk",
], ids=["empty", "newline", "blank", "prose", "bad-header", "bad-counts", "no-plus", "junk"])
def test_empty_or_malformed_patch_is_invalid_patch_and_changes_nothing(
        world, cli, snapshot, tmp_path, patch):
    before = snapshot()
    assert_refused(cli("stage-patch", "--tid", world.tid, "--stdin", input=patch),
                   "invalid_patch")
    pf = tmp_path / "p.diff"
    pf.write_bytes(patch)
    assert_refused(cli("stage-patch", "--tid", world.tid, "--patch-file", str(pf)),
                   "invalid_patch")
    assert snapshot() == before


def test_hunk_that_does_not_apply_is_patch_rejected_naming_file_and_hunk(world, cli, snapshot):
    before = snapshot()
    patch = ("--- a/src/b.py\n+++ b/src/b.py\n@@ -1 +1 @@\n-print('b')\n+print('B')\n"
             "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-not the content\n+beta\n")
    out = assert_refused(cli("stage-patch", "--tid", world.tid, "--stdin", input=patch),
                         "patch_rejected")
    message = out["error"]["message"]
    assert "a.txt" in message and "hunk" in message.lower(), out
    assert snapshot() == before
    # All or nothing: the first section, which applied, was not staged either.
    status, diff = cli("diff", "--tid", world.tid)
    assert status == 0 and diff["files"] == [], diff


def test_patch_of_an_absent_file_is_not_found_and_changes_nothing(world, cli, snapshot):
    """CONTRACT.md: not_found is 'a file to delete, replace or patch is absent'."""
    before = snapshot()
    patch = "--- a/missing.txt\n+++ b/missing.txt\n@@ -1 +1 @@\n-x\n+y\n"
    assert_refused(cli("stage-patch", "--tid", world.tid, "--stdin", input=patch), "not_found")
    assert snapshot() == before


def test_patch_creating_a_file_that_exists_is_patch_rejected(world, cli, snapshot):
    before = snapshot()
    patch = "--- /dev/null\n+++ b/a.txt\n@@ -0,0 +1 @@\n+new\n"
    assert_refused(cli("stage-patch", "--tid", world.tid, "--stdin", input=patch),
                   "patch_rejected")
    assert snapshot() == before


def test_patch_file_that_cannot_be_read_is_usage(world, cli, snapshot, tmp_path):
    before = snapshot()
    assert_refused(cli("stage-patch", "--tid", world.tid, "--patch-file",
                       str(tmp_path / "nope.diff")), "usage")
    assert snapshot() == before


# -- replace, delete, absent and non-files ---------------------------------------------------


def test_old_that_matches_nothing_is_no_match_and_changes_nothing(world, cli, snapshot):
    before = snapshot()
    assert_refused(cli("stage-replace", "--tid", world.tid, "--path", "a.txt",
                       "--old", "omega", "--new", "x"), "no_match")
    assert snapshot() == before


def test_old_that_matches_many_is_ambiguous_then_all_replaces_every_one(world, cli, snapshot):
    before = snapshot()
    assert_refused(cli("stage-replace", "--tid", world.tid, "--path", "dup.txt",
                       "--old", "x = 1", "--new", "x = 2"), "ambiguous_match")
    assert snapshot() == before
    status, out = cli("stage-replace", "--tid", world.tid, "--path", "dup.txt",
                      "--old", "x = 1", "--new", "x = 2", "--all")
    assert (status, out["ok"], out["replacements"], out["op"]) == (0, True, 2, "replace")
    assert cli("commit", "--tid", world.tid)[0] == 0
    assert read(world.root, "dup.txt") == b"x = 2\nx = 2\n"


def test_empty_old_is_refused(world, cli, snapshot):
    before = snapshot()
    status, out = cli("stage-replace", "--tid", world.tid, "--path", "a.txt",
                      "--old", "", "--new", "x")
    assert status == 2 and out["ok"] is False, out
    assert snapshot() == before


@pytest.mark.parametrize("cmd", [
    ["stage-delete"],
    ["stage-replace", "--old", "a", "--new", "b"],
], ids=["delete", "replace"])
def test_deleting_or_replacing_an_absent_file_is_not_found(world, cli, snapshot, cmd):
    before = snapshot()
    for path in ("missing.txt", "nodir/missing.txt"):
        assert_refused(cli(cmd[0], "--tid", world.tid, "--path", path, *cmd[1:]), "not_found")
    assert snapshot() == before


def test_file_deleted_in_the_transaction_is_absent_in_its_staged_view(world, cli, snapshot):
    assert cli("stage-delete", "--tid", world.tid, "--path", "a.txt")[0] == 0
    before = snapshot()
    assert_refused(cli("stage-delete", "--tid", world.tid, "--path", "a.txt"), "not_found")
    assert_refused(cli("stage-replace", "--tid", world.tid, "--path", "a.txt",
                       "--old", "alpha", "--new", "x"), "not_found")
    assert snapshot() == before


@pytest.mark.parametrize("cmd", [
    ["stage-write", "--content", "x"],
    ["stage-delete"],
    ["stage-replace", "--old", "a", "--new", "b"],
    ["record-read"],
], ids=["write", "delete", "replace", "record-read"])
def test_a_directory_given_as_a_file_path_is_refused_and_changes_nothing(world, cli, snapshot,
                                                                         cmd):
    before = snapshot()
    status, out = cli(cmd[0], "--tid", world.tid, "--path", "src", *cmd[1:])
    assert status == 2 and out["ok"] is False, out
    assert out["error"]["code"] in ("not_a_file", "not_found"), out
    assert snapshot() == before
    assert os.path.isdir(os.path.join(world.root, "src"))


def test_a_file_path_below_a_file_is_refused(world, cli, snapshot):
    before = snapshot()
    status, out = cli("stage-write", "--tid", world.tid, "--path", "a.txt/child",
                      "--content", "x")
    assert status == 2 and out["ok"] is False, out
    assert snapshot() == before


@pytest.mark.parametrize("args", [
    ["--mode", "rwx"], ["--mode", "99"], ["--mode", "777777"],
], ids=["letters", "not-octal", "too-big"])
def test_bad_mode_is_usage_and_changes_nothing(world, cli, snapshot, args):
    before = snapshot()
    assert_refused(cli("stage-write", "--tid", world.tid, "--path", "n.txt",
                       "--content", "x", *args), "usage")
    assert snapshot() == before


@pytest.mark.parametrize("value", ["-5", "abc", "1.5"])
def test_bad_timeout_is_usage_and_begins_nothing(world, cli, snapshot, value):
    before = snapshot()
    assert_refused(cli("begin", "--timeout-ms", value), "usage")
    assert snapshot() == before


def test_stage_write_from_a_missing_file_is_usage_and_changes_nothing(world, cli, snapshot,
                                                                      tmp_path):
    before = snapshot()
    assert_refused(cli("stage-write", "--tid", world.tid, "--path", "n.txt", "--from-file",
                       str(tmp_path / "does-not-exist")), "usage")
    assert snapshot() == before


# -- binary, non-UTF-8 and large content -----------------------------------------------------

BINARY = bytes(range(256)) * 64 + b"\xff\xfe\x00\x00\r\n\r\x80\xc3\x28 no newline at end"
LATIN1 = "caf\xe9 na\xefve r\xe9sum\xe9\n".encode("latin-1")


def test_binary_content_round_trips_byte_for_byte_from_file(world, cli, tmp_path):
    src = tmp_path / "blob.bin"
    src.write_bytes(BINARY)
    status, out = cli("stage-write", "--tid", world.tid, "--path", "bin/blob.bin",
                      "--from-file", str(src))
    assert (status, out["bytes"]) == (0, len(BINARY)), out
    status, diff = cli("diff", "--tid", world.tid)
    assert status == 0 and [f["path"] for f in diff["files"]] == ["bin/blob.bin"], diff
    assert cli("commit", "--tid", world.tid)[0] == 0
    assert read(world.root, "bin/blob.bin") == BINARY


def test_binary_content_round_trips_byte_for_byte_from_stdin(world, cli):
    status, out = cli("stage-write", "--tid", world.tid, "--path", "blob.bin", "--stdin",
                      input=BINARY)
    assert (status, out["bytes"]) == (0, len(BINARY)), out
    assert cli("commit", "--tid", world.tid)[0] == 0
    assert read(world.root, "blob.bin") == BINARY


def test_non_utf8_content_round_trips_from_the_content_argument(world, cli_raw):
    # argv is bytes on POSIX: a non-UTF-8 --content must reach the file unchanged.
    proc = cli_raw(b"stage-write", b"--tid", world.tid.encode(), b"--path", b"latin.txt",
                   b"--content", LATIN1, json=True)
    assert proc.returncode == 0, proc
    assert parse_one_object(proc)["bytes"] == len(LATIN1)
    proc = cli_raw("commit", "--tid", world.tid, json=True)
    assert proc.returncode == 0, proc
    assert read(world.root, "latin.txt") == LATIN1


def test_binary_content_round_trips_through_the_library(world, client):
    tx = client.get(world.tid)
    tx.stage_write("lib.bin", BINARY)
    tx.stage_write("latin.txt", LATIN1)
    tx.commit()
    assert read(world.root, "lib.bin") == BINARY
    assert read(world.root, "latin.txt") == LATIN1


def test_replace_in_a_non_utf8_file_keeps_every_other_byte(world, cli, client):
    write(world.root, "latin.txt", LATIN1 + b"\xff\x00tail\n")
    assert cli("stage-replace", "--tid", world.tid, "--path", "latin.txt",
               "--old", "tail", "--new", "TAIL")[0] == 0
    assert cli("commit", "--tid", world.tid)[0] == 0
    assert read(world.root, "latin.txt") == LATIN1 + b"\xff\x00TAIL\n"


def test_patch_of_a_crlf_non_utf8_file_keeps_its_bytes(world, cli):
    write(world.root, "crlf.txt", b"one\r\ncaf\xe9\r\nthree\r\n")
    patch = (b"--- a/crlf.txt\n+++ b/crlf.txt\n@@ -1,3 +1,3 @@\n"
             b" one\r\n-caf\xe9\r\n+CAF\xc9\r\n three\r\n")
    status, out = cli("stage-patch", "--tid", world.tid, "--stdin", input=patch)
    assert status == 0, out
    assert cli("commit", "--tid", world.tid)[0] == 0
    assert read(world.root, "crlf.txt") == b"one\r\nCAF\xc9\r\nthree\r\n"


def test_unicode_file_names_round_trip(world, cli):
    name = "d\u00e9j\u00e0 vu/\u65e5\u672c.txt"
    status, out = cli("stage-write", "--tid", world.tid, "--path", name, "--content", "ok\n")
    assert status == 0 and out["path"] == name, out
    assert cli("commit", "--tid", world.tid)[0] == 0
    assert read(world.root, name) == b"ok\n"


# Runs a command and reports its peak RSS. A launcher of its own keeps the figure honest: on
# Linux a child's ru_maxrss starts at the RSS of the process that forked it (exec carries the
# old high-water mark over), and pytest's own RSS would otherwise be the floor.
_MEASURE = """
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True)
print(json.dumps({"status": proc.returncode, "stdout": proc.stdout.decode("utf-8", "replace"),
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def _run_measured(argv):
    """Run ``argv``; return (exit status, stdout, peak RSS of that child in bytes)."""
    proc = subprocess.run([sys.executable, "-c", _MEASURE, *argv], capture_output=True,
                          check=True, timeout=120)
    report = json.loads(proc.stdout)
    return report["status"], report["stdout"], report["maxrss_kb"] * 1024  # Linux: kilobytes


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_200_mb_file_is_streamed_with_bounded_memory_and_committed_intact(world, tmp_path):
    size_mb = 200
    src = tmp_path / "big.bin"
    digest = hashlib.sha256()
    block = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for i in range(size_mb):
            chunk = i.to_bytes(8, "little") + block[8:]
            digest.update(chunk)
            f.write(chunk)
    started = time.monotonic()
    base = [sys.executable, "-m", "agent_2pc", "--root", world.root]
    peaks = {}
    for name, args in (
            ("stage-write", ["stage-write", "--tid", world.tid, "--path", "big/big.bin",
                             "--from-file", str(src)]),
            ("diff", ["diff", "--tid", world.tid, "--stat"]),
            ("commit", ["commit", "--tid", world.tid])):
        status, out, peaks[name] = _run_measured(base + args + ["--json"])
        assert status == 0, (name, out)
    elapsed = time.monotonic() - started
    with open(os.path.join(world.root, "big/big.bin"), "rb") as f:
        got = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 22), b""):
            got.update(chunk)
    assert got.hexdigest() == digest.hexdigest()
    assert os.path.getsize(os.path.join(world.root, "big/big.bin")) == size_mb << 20
    limit = (size_mb << 20) // 4  # streamed: nowhere near the file's size, let alone twice it
    assert all(peak < limit for peak in peaks.values()), {k: v >> 20 for k, v in peaks.items()}
    assert elapsed < 20, elapsed


# -- workspace and usage ---------------------------------------------------------------------


def test_missing_workspace_is_not_initialized_and_creates_nothing(tmp_path, cli_raw):
    bare = tmp_path / "bare"
    bare.mkdir()
    for args in (["begin"], ["status"], ["list"], ["recover"],
                 ["commit", "--tid", "tx-20200101-000000-abcdef"]):
        proc = cli_raw(*args, json=True, root=str(bare))
        out = parse_one_object(proc)
        assert (proc.returncode, out["error"]["code"]) == (2, "not_initialized"), out
    proc = cli_raw("begin", json=True, root=str(tmp_path / "does-not-exist"))
    assert (proc.returncode, parse_one_object(proc)["error"]["code"]) == (2, "not_initialized")
    assert os.listdir(bare) == []
    assert not os.path.exists(tmp_path / "does-not-exist")


def test_missing_workspace_found_by_neither_cwd_nor_environment_is_not_initialized(
        tmp_path, cli_raw):
    bare = tmp_path / "bare2"
    bare.mkdir()
    ancestors = [p for p in bare.resolve().parents if (p / ".agent-tx").is_dir()]
    if ancestors:
        pytest.skip(f"{ancestors[0]} above the test directory is a workspace")
    proc = cli_raw("status", json=True, root=None, cwd=str(bare))
    out = parse_one_object(proc)
    assert (proc.returncode, out["error"]["code"]) == (2, "not_initialized"), out
    proc = cli_raw("status", json=True, root=None, cwd=str(bare),
                   env={"AGENT2PC_ROOT": str(bare)})
    out = parse_one_object(proc)
    assert (proc.returncode, out["error"]["code"]) == (2, "not_initialized"), out
    assert os.listdir(bare) == []


def test_missing_workspace_in_the_library_raises_not_initialized(tmp_path):
    with pytest.raises(Agent2PCError) as info:
        Agent2PC(tmp_path)
    assert info.value.code == "not_initialized" and info.value.exit_status == 2
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("args", [
    ["frobnicate"], [], ["--bogus", "status"], ["status", "--bogus"],
    ["stage-write", "--path", "a.txt", "--content", "x"],                     # no --tid
    ["stage-write", "--tid", "T", "--path", "a.txt"],                          # no content
    ["stage-write", "--tid", "T", "--path", "a.txt", "--content", "x", "--stdin"],
    ["begin", "--timeout-ms"],                                                 # no value
    ["begin", "extra-positional"],
    ["list", "--state", "bogus"],
    ["begin", "--json=yes"],
], ids=["unknown-command", "no-command", "unknown-global-option", "unknown-option",
        "missing-tid", "missing-content", "two-contents", "missing-value", "extra-argument",
        "bad-state-name", "flag-with-value"])
def test_unknown_command_or_option_is_usage_exit_2_and_changes_nothing(world, cli, snapshot,
                                                                       args):
    before = snapshot()
    assert_refused(cli(*args), "usage")
    assert snapshot() == before


def test_usage_error_without_json_goes_to_stderr_with_exit_2(world, cli_raw):
    proc = cli_raw("frobnicate")
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert proc.stderr.strip()


# -- arguments that are not UTF-8, and input files that are not files ------------------------

# On POSIX argv is bytes. Whatever the CLI does with an argument that is not UTF-8 (take it as
# bytes, as --content does, or refuse it as bad input), it must answer as the contract says:
# exit 0 or 2 and exactly one JSON object (valid UTF-8) on stdout, never a traceback.
NON_UTF8 = {
    "path": [b"stage-write", b"--tid", b"{tid}", b"--path", b"caf\xe9.txt", b"--content", b"x"],
    "path-outside": [b"stage-write", b"--tid", b"{tid}", b"--path", b"../caf\xe9.txt",
                     b"--content", b"x"],
    "tid": [b"stage-write", b"--tid", b"tx-\xe9", b"--path", b"a.txt", b"--content", b"x"],
    "old-new": [b"stage-replace", b"--tid", b"{tid}", b"--path", b"latin.txt",
                b"--old", b"caf\xe9", b"--new", b"CAF\xc9"],
    "label": [b"begin", b"--label", b"caf\xe9"],
    "savepoint": [b"savepoint", b"--tid", b"{tid}", b"--name", b"s\xe9"],
    "reason": [b"abort", b"--tid", b"{tid}", b"--reason", b"caf\xe9"],
    "command": [b"frob\xe9"],
}


@pytest.mark.parametrize("case", list(NON_UTF8))
def test_non_utf8_arguments_get_one_json_answer_and_exit_0_or_2(world, cli_raw, snapshot, case):
    write(world.root, "latin.txt", LATIN1)
    before = snapshot()
    args = [a.replace(b"{tid}", world.tid.encode()) for a in NON_UTF8[case]]
    proc = cli_raw(*args, json=True)
    assert proc.returncode in (0, 2), (proc.returncode, proc.stdout, proc.stderr[-400:])
    out = parse_one_object(proc)   # strict: stdout must be UTF-8 JSON
    assert out["ok"] is (proc.returncode == 0), out
    if proc.returncode == 2:
        assert snapshot() == before
    elif case == "old-new":
        proc = cli_raw("commit", "--tid", world.tid, json=True)
        assert proc.returncode == 0
        assert read(world.root, "latin.txt") == LATIN1.replace(b"caf\xe9", b"CAF\xc9")


@pytest.mark.parametrize("args", [
    ["stage-write", "--tid", "{tid}", "--path", "n.txt", "--from-file", "{dir}"],
    ["stage-patch", "--tid", "{tid}", "--patch-file", "{dir}"],
    ["run-batch", "--file", "{dir}"],
], ids=["from-file", "patch-file", "manifest"])
def test_an_input_file_that_is_a_directory_is_bad_input_and_changes_nothing(world, cli_raw,
                                                                           snapshot, args):
    before = snapshot()
    args = [a.replace("{tid}", world.tid).replace("{dir}", world.outside) for a in args]
    proc = cli_raw(*args, json=True)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-400:])
    out = parse_one_object(proc)
    assert out["ok"] is False and out["error"]["code"] in ("usage", "not_a_file"), out
    assert snapshot() == before


# -- modes: permission bits only -------------------------------------------------------------


@pytest.mark.parametrize("mode", ["4755", "2755", "1777", "7777", "04755", "6644"])
def test_setuid_setgid_or_sticky_mode_is_refused_with_usage_and_changes_nothing(
        world, cli, snapshot, mode):
    before = snapshot()
    out = assert_refused(cli("stage-write", "--tid", world.tid, "--path", "s.sh",
                             "--content", "#!/bin/sh\n", "--mode", mode), "usage")
    assert "setuid" in out["error"]["message"], out
    assert snapshot() == before


@pytest.mark.parametrize("mode", [0o4755, 0o2755, 0o1777, True, False, -1, 0o10000, "0755",
                                  7.0])
def test_the_library_takes_permission_bits_only(world, client, snapshot, mode):
    before = snapshot()
    tx = client.get(world.tid)
    with pytest.raises(Agent2PCError) as info:
        tx.stage_write("s.sh", "#!/bin/sh\n", mode=mode)
    assert info.value.code == "usage"
    assert snapshot() == before


def test_exec_stages_permission_bits_only_of_what_the_command_made(world, cli):
    status, out = cli("exec", "--tid", world.tid, "--json", "--", "sh", "-c",
                      "echo x > suid.sh && chmod 4755 suid.sh && mkdir shared && "
                      "chmod 3777 shared && echo y > a.txt && chmod 2640 a.txt")
    assert status == 0, out
    modes = {c["path"]: c.get("mode") for c in out["captured"]}
    assert (modes["suid.sh"], modes["shared"], modes["a.txt"]) == (0o755, 0o777, 0o640), \
        "the capture reports the modes as staged"
    assert cli("commit", "--tid", world.tid)[0] == 0
    assert stat.S_IMODE(os.stat(os.path.join(world.root, "suid.sh")).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(os.path.join(world.root, "a.txt")).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(os.path.join(world.root, "shared")).st_mode) == 0o777


def test_new_content_for_a_setuid_file_keeps_its_permission_bits_only(world, cli):
    """A rewrite that gives no mode keeps the file's mode, but not its setuid, setgid or sticky
    bits: new content never runs with its owner's rights (docs/cli.md, Modes)."""
    path = os.path.join(world.root, "tool")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(path, 0o6755)
    assert cli("stage-write", "--tid", world.tid, "--path", "tool",
               "--content", "#!/bin/sh\necho new\n")[0] == 0
    assert cli("commit", "--tid", world.tid)[0] == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755


# -- paths the file system cannot look up ------------------------------------------------------

LONG_NAME = "n" * 256


@pytest.mark.parametrize("kind", PATH_KINDS)
@pytest.mark.parametrize("path", [LONG_NAME, f"src/{LONG_NAME}/x.txt",
                                  f"dir_out/../src/{LONG_NAME}", "\u00e9" * 128 + ".txt"],
                         ids=["top", "parent", "through-a-link", "multibyte"])
def test_a_name_longer_than_255_bytes_is_usage_and_changes_nothing(world, cli, snapshot, kind,
                                                                   path):
    before = snapshot()
    assert_refused(cli(*path_cmd(kind, world.tid, path)), "usage")
    assert snapshot() == before


@pytest.mark.parametrize("kind", PATH_KINDS)
@pytest.mark.parametrize("path", ["loop_a", "loop_a/x.txt", "self", "self/x", "./loop_b"])
def test_a_path_through_a_loop_of_links_is_not_a_file_and_changes_nothing(world, cli, snapshot,
                                                                          kind, path):
    os.symlink("loop_b", os.path.join(world.root, "loop_a"))
    os.symlink("loop_a", os.path.join(world.root, "loop_b"))
    os.symlink("self", os.path.join(world.root, "self"))
    before = snapshot()
    assert_refused(cli(*path_cmd(kind, world.tid, path)), "not_a_file")
    assert snapshot() == before


def test_a_patch_naming_a_loop_or_a_long_name_is_refused_and_changes_nothing(world, cli,
                                                                            snapshot):
    os.symlink("loop", os.path.join(world.root, "loop"))
    before = snapshot()
    for name, code in (("loop/f.txt", "not_a_file"), (LONG_NAME, "usage")):
        patch = f"--- /dev/null\n+++ b/{name}\n@@ -0,0 +1 @@\n+x\n"
        assert_refused(cli("stage-patch", "--tid", world.tid, "--stdin", input=patch), code)
    assert snapshot() == before


@pytest.mark.parametrize("path", ["caf\udce9.txt", "\ud800", "a\u0000b"])
def test_a_path_that_is_not_text_is_usage_in_the_library(world, client, snapshot, path):
    before = snapshot()
    tx = client.get(world.tid)
    for call in (lambda: tx.stage_write(path, "x"), lambda: tx.stage_delete(path),
                 lambda: tx.record_read(path)):
        with pytest.raises(Agent2PCError) as info:
            call()
        assert info.value.code == "usage"
    assert snapshot() == before


def _nested(depth):
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_text_the_log_cannot_hold_is_usage_in_the_library(world, client, snapshot):
    before = snapshot()
    tx = client.get(world.tid)
    calls = [lambda: tx.stage_write("a.txt", "caf\udce9"),
             lambda: tx.stage_cmd("echo caf\udce9"),
             lambda: tx.stage_cmd("echo a\u0000b"),
             lambda: tx.stage_cmd("true", env={"A": "\udce9"}),
             lambda: tx.stage_cmd("true", promote=["*\udce9"]),
             lambda: tx.stage_api("POST", "http://example.com/", {"k": "\ud800"}),
             lambda: tx.stage_api("POST", "http://example.com/\udce9"),
             lambda: tx.stage_api("POST", "http://example.com/", _nested(100)),
             lambda: tx.stage_api("POST", "http://example.com/", _nested(5000))]
    for call in calls:
        with pytest.raises(Agent2PCError) as info:
            call()
        assert info.value.code == "usage"
    assert snapshot() == before


def test_a_name_that_is_not_utf8_made_by_exec_stages_nothing_with_usage(world, cli_raw,
                                                                        snapshot):
    before = snapshot()
    for script in ('open(b"caf\\xe9.txt", "wb").write(b"x"); open("fine.txt", "w")',
                   'import os; os.symlink(b"caf\\xe9", "lnk"); open("fine.txt", "w")',
                   'import os; os.mkdir(b"d\\xe9"); open("fine.txt", "w")'):
        proc = cli_raw("exec", "--tid", world.tid, "--json", "--", sys.executable, "-c", script)
        assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-600:])
        out = parse_one_object(proc)
        assert out["error"]["code"] == "usage" and "UTF-8" in out["error"]["message"], out
    assert snapshot() == before, "something of the capture was staged"


def test_a_begin_timeout_past_30_days_is_usage(world, cli, snapshot):
    before = snapshot()
    for value in (str(10 ** 20), str(31 * 24 * 3600 * 1000)):
        assert_refused(cli("begin", "--timeout-ms", value), "usage")
    assert snapshot() == before


# -- JSON options and files: bounded ---------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000
FENCE_JSON_OPTIONS = [
    (["fence", "prepare", "--intent", "i", "--args-file", "{f}"], "usage"),
    (["fence", "prepare", "--request-file", "{f}"], "usage"),
    (["fence", "reconcile", "--intent", "i", "--action", "done", "--result-file", "{f}"],
     "usage"),
    (["fence", "verify", "--cert-file", "{f}"], "usage"),
    # A ticket that is not JSON is malformed: stale_lease (CONTRACT.md, the fence), exit 1.
    (["fence", "commit", "--ticket-file", "{f}"], "stale_lease"),
    (["fence", "abort", "--ticket-file", "{f}"], "stale_lease"),
    (["fence", "heartbeat", "--ticket-file", "{f}"], "stale_lease"),
]


@pytest.mark.parametrize("content", [DEEP, "[" * 65 + "]" * 65, b"\xff\xfe[1]", '{"a": NaN}',
                                     "[1e999]", '"\\udce9"'],
                         ids=["nested-100k", "nested-65", "not-utf8", "nan", "infinity",
                              "lone-surrogate"])
@pytest.mark.parametrize("args, code", FENCE_JSON_OPTIONS,
                         ids=[a[1] + "-" + a[-2].lstrip("-") for a, _ in FENCE_JSON_OPTIONS])
def test_json_files_are_loaded_within_bounds_with_one_json_answer(world, cli_raw, tmp_path,
                                                                  args, code, content):
    f = tmp_path / "value.json"
    f.write_bytes(content.encode() if isinstance(content, str) else content)
    store = f"sqlite:///{tmp_path}/fence.db"
    proc = cli_raw(*[a.replace("{f}", str(f)) for a in args], "--store", store, json=True)
    out = parse_one_object(proc)
    assert out["error"]["code"] == code, out
    assert proc.returncode == (1 if code == "stale_lease" else 2), (proc.returncode, out)


@pytest.mark.parametrize("args", [
    ["fence", "prepare", "--intent", "i", "--args", "[" * 5000 + "]" * 5000],
    ["fence", "prepare", "--intent", "i", "--read-set", "[" * 5000 + "]" * 5000],
    ["stage-api", "--tid", "{tid}", "--method", "POST", "--url", "http://example.com/",
     "--body", "[" * 5000 + "]" * 5000],
    ["stage-api", "--tid", "{tid}", "--method", "POST", "--url", "http://example.com/",
     "--body", "[" * 200 + "]" * 200],
    ["stage-api", "--tid", "{tid}", "--method", "POST", "--url", "http://example.com/",
     "--body", '["\\udce9"]'],
], ids=["args", "read-set", "body-5000", "body-200", "body-surrogate"])
def test_json_option_values_are_loaded_within_bounds(world, cli_raw, snapshot, tmp_path, args):
    before = snapshot()
    args = [a.replace("{tid}", world.tid) for a in args]
    proc = cli_raw(*args, "--store", f"sqlite:///{tmp_path}/fence.db", json=True) \
        if args[0] == "fence" else cli_raw(*args, json=True)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-600:])
    assert parse_one_object(proc)["error"]["code"] == "usage"
    assert snapshot() == before



def test_a_log_record_nested_past_the_parser_is_corrupt_wal_not_a_traceback(root, cli_raw):
    """A workspace's files are input too (a cloned repository may carry .agent-tx/): a record
    with a valid CRC whose JSON is nested too deep for the parser is a damaged record."""
    import struct
    import zlib

    def frame(payload: bytes) -> bytes:
        return struct.pack("<4sBII", b"A2PC", 1, len(payload), zlib.crc32(payload)) + payload

    with open(os.path.join(root, ".agent-tx", "history.jsonl"), "ab") as f:
        f.write(b"[" * 5000 + b"\n")  # a line that does not parse is skipped, as a torn one
    proc = cli_raw("list", json=True)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-600:])
    deep = b'{"type":"begin","tid":"tx-x","ts":1,"a":' + b"[" * 5000 + b"]" * 5000 + b"}"
    with open(os.path.join(root, ".agent-tx", "wal.bin"), "ab") as f:
        f.write(frame(deep) + frame(b'{"type":"abort","tid":"tx-y","ts":2}'))
    proc = cli_raw("status", json=True)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-600:])
    assert parse_one_object(proc)["error"]["code"] == "corrupt_wal"
