"""The staged view shows the repo as it would be after commit, and never touches the repo.

Every test runs on every tier the host has (overlay, fuse-overlayfs, copy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from agent_2pc.errors import NotFound, PathOutsideRoot, UsageError

from .conftest import SRC, tree_hash

pytestmark = pytest.mark.timeout(60)


def run_ok(view, command, **kw):
    res = view.run(command, timeout_s=30, **kw)
    assert res.exit_code == 0, (res, res.tail)
    return res


def test_staged_writes_are_visible_and_staged_deletes_are_not(staged, tier):
    with staged.view(tier) as view:
        res = run_ok(view, "cat src/app.py new/deep/made.txt bin/run.sh; "
                           "stat -c '%a %n' bin/run.sh src/util.py; "
                           "for p in gone.txt old/only.txt old; do "
                           "  if [ -e $p ]; then echo present $p; else echo absent $p; fi; done")
    assert res.tier == tier
    out = res.tail.splitlines()
    assert out[:5] == ["def answer():", "    return 42", "created by the transaction",
                       "#!/bin/sh", "echo staged"]
    assert "700 bin/run.sh" in out and "644 src/util.py" in out
    # old/ held only the deleted file: the commit removes it, so the view has no old/ either
    assert out[-3:] == ["absent gone.txt", "absent old/only.txt", "absent old"]


def test_the_repo_is_byte_for_byte_unchanged_while_a_command_runs_and_after(staged, tier,
                                                                            shared_tmp):
    ready = os.path.join(shared_tmp, "ready")
    go = os.path.join(shared_tmp, "go")
    command = ("echo new > created.txt; echo more >> README.md; rm src/util.py; "
               "mv docs moved-docs; chmod 600 bin/run.sh; mkdir -p emptydir; ln -s x link; "
               "echo ignored > .git/info/junk; rm -rf data; "
               f"touch {ready}; while [ ! -e {go} ]; do sleep 0.01; done")
    seen = {}

    def watch():
        deadline = time.monotonic() + 20
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        seen["during"] = staged.tree_hash()
        open(go, "w").close()

    with staged.view(tier) as view:
        t = threading.Thread(target=watch)
        t.start()
        res = run_ok(view, command)
        t.join()
        assert view.capture().changes  # it did change things, in the view
    assert seen["during"] == staged.before
    assert staged.tree_hash() == staged.before
    assert res.exit_code == 0


def test_absolute_paths_of_the_repo_reach_the_view(staged, overlay_tier):
    root = staged.root
    with staged.view(overlay_tier) as view:
        res = run_ok(view, [sys.executable, "-c", (
            "import os, sys; r = sys.argv[1]; "
            "print(open(os.path.join(r, 'src/app.py')).read().split()[-1]); "
            "print(os.path.exists(os.path.join(r, 'gone.txt'))); "
            "open(os.path.join(r, 'abs.txt'), 'w').write('by absolute path'); "
            "print(os.getcwd() == r)"), root])
        assert res.tail.split() == ["42", "False", "True"]
        captured = {c.path: c for c in view.capture().changes}
        assert set(captured) == {"abs.txt"}
        with open(captured["abs.txt"].source, "rb") as f:
            assert f.read() == b"by absolute path"
    assert not os.path.exists(os.path.join(root, "abs.txt"))
    assert staged.tree_hash() == staged.before


def test_the_copy_tier_runs_elsewhere_and_says_where(staged):
    with staged.view("copy") as view:
        res = run_ok(view, "pwd; echo $AGENT2PC_VIEW ${AGENT2PC_ROOT-unset}")
        assert view.view_root != staged.root
        assert res.tail.split() == [view.view_root, "copy", "unset"]
        assert os.path.basename(view.view_root) == os.path.basename(staged.root)


def test_cwd_is_mapped_into_the_view(staged, tier):
    with staged.view(tier) as view:
        res = run_ok(view, "pwd; ls", cwd="new/deep")
        assert res.tail.split() == [os.path.join(view.view_root, "new/deep"), "made.txt"]
        res = run_ok(view, "ls", cwd=os.path.join(staged.root, "src"))
        assert res.tail.split() == ["app.py", "util.py"]
        with pytest.raises(NotFound):
            view.run("true", cwd="old")  # the transaction removes it
        with pytest.raises(PathOutsideRoot):
            view.run("true", cwd="/etc")
        with pytest.raises(NotFound):
            view.run("true", cwd="README.md")


def test_env_is_passed_and_names_the_tier(staged, tier):
    with staged.view(tier) as view:
        res = run_ok(view, "echo $A2PC_TEST_VAR $AGENT2PC_VIEW; echo ${HOME-nohome}",
                     env={"PATH": os.environ["PATH"], "A2PC_TEST_VAR": "hello"})
        assert res.tail.split() == ["hello", tier, "nohome"]


def test_argv_and_shell_string_both_run(staged, tier):
    with staged.view(tier) as view:
        res = run_ok(view, ["printf", "%s|", "a b", "$HOME", "*"])
        assert res.tail == "a b|$HOME|*|"
        res = run_ok(view, "printf '%s|' 'a b' x*")
        assert res.tail == "a b|x*|"


def test_a_failing_command_reports_its_status_and_output(staged, tier):
    with staged.view(tier) as view:
        res = view.run("echo to-stdout; echo to-stderr >&2; exit 7", timeout_s=30)
        assert (res.exit_code, res.passed, res.timed_out) == (7, False, False)
        assert res.tail.splitlines() == ["to-stdout", "to-stderr"]
        with open(res.log_path, encoding="utf-8") as f:
            assert f.read() == res.tail
        missing = view.run(["no-such-program-a2pc"], timeout_s=30)
        assert missing.exit_code == 127 and not missing.passed
        killed = view.run("kill -TERM $$", timeout_s=30)
        assert killed.exit_code == 128 + 15
    assert staged.tree_hash() == staged.before


def test_the_log_goes_where_the_caller_says_and_the_tail_is_bounded(staged, tier, shared_tmp):
    log = os.path.join(shared_tmp, "cmd.log")
    with staged.view(tier) as view:
        res = view.run("seq 1 20000", log_path=log, tail_bytes=100, timeout_s=30)
        assert res.log_path == log and len(res.tail.encode()) == 100
        assert res.tail.endswith("19999\n20000\n")
        assert res.to_json()["log"] == log and res.to_json()["isolation"] == tier
    assert os.path.getsize(log) > 100_000  # the log outlives the view: the caller owns it


def test_what_one_run_writes_the_next_run_sees(staged, tier):
    with staged.view(tier) as view:
        run_ok(view, "echo first > step.txt")
        res = run_ok(view, "cat step.txt")
        assert res.tail == "first\n"
        assert [c.path for c in view.capture().changes] == ["step.txt"]


def test_nested_agent_2pc_calls_are_refused_and_say_why(staged, tier):
    # Inside a view the workspace is out of reach (hidden; read-only at the repo's own path in
    # the copy tier): a nested call changes nothing and says why, with one JSON object.
    env = dict(os.environ, PYTHONPATH=SRC)
    env.pop("AGENT2PC_ROOT", None)
    wal = os.path.join(staged.root, ".agent-tx", "wal.bin")
    with open(wal, "rb") as f:
        before = f.read()
    stage = ["stage-write", "--tid", staged.tx.tid, "--path", "nested.txt", "--content", "x"]
    with staged.view(tier) as view:
        for args in (["--json", *stage], ["--json", "--root", staged.root, *stage],
                     ["--json", "status"]):
            res = view.run([sys.executable, "-m", "agent_2pc", *args], env=env, timeout_s=60)
            out = json.loads(res.tail.strip().splitlines()[-1])
            assert res.exit_code == 2 and out["ok"] is False, res.tail
            assert out["error"]["code"] in ("not_initialized", "workspace_read_only")
            assert "inside a staged view" in out["error"]["message"]
        assert view.capture().changes == []
    with open(wal, "rb") as f:
        assert f.read() == before
    assert "nested.txt" not in [op.path for op in staged.changes]


def test_the_mount_lives_only_in_the_commands_namespace(staged, overlay_tier):
    with staged.view(overlay_tier) as view:
        res = run_ok(view, "cat /proc/self/mountinfo; echo PID=$$")
        mine = [line for line in res.tail.splitlines() if f" {staged.root} " in line]
        assert mine, res.tail  # the view is mounted over the repo's own path...
        assert not any(".agent-tx" in line for line in res.tail.splitlines())
        assert "PID=" in res.tail
    with open("/proc/self/mountinfo") as f:
        assert f" {staged.root} " not in f.read()  # ...but not for anyone else


def test_git_in_the_view_sees_the_staged_content_and_cannot_change_the_real_git(staged,
                                                                               overlay_tier):
    head = subprocess.run(["git", "-C", staged.root, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout
    with staged.view(overlay_tier) as view:
        res = run_ok(view, "git status --porcelain; git -c user.email=a@b -c user.name=a "
                           "commit -qam 'inside the view' && git rev-parse HEAD")
        lines = res.tail.splitlines()
        assert " M src/app.py" in lines and " D gone.txt" in lines
        assert lines[-1].strip() != head.strip()
        assert view.capture().changes == []  # .git is never captured
    assert subprocess.run(["git", "-C", staged.root, "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout == head
    assert staged.tree_hash() == staged.before


def test_bad_arguments_are_refused_before_anything_runs(staged, shared_tmp):
    with pytest.raises(UsageError):
        staged.view("no-such-tier")
    with pytest.raises(UsageError):
        staged.view("copy", scratch_dir=os.path.join(staged.root, "src"))
    with staged.view("copy") as view:
        for bad in ("", "   ", [], [""], [1]):
            with pytest.raises(UsageError):
                view.run(bad)
        with pytest.raises(UsageError):
            view.run("true", timeout_s=0)
        with pytest.raises(UsageError):  # the log would be a write into the real tree
            view.run("true", log_path=os.path.join(staged.root, "out.log"))
    with pytest.raises(UsageError):
        view.run("true")  # closed
    assert tree_hash(staged.root) == staged.before


def test_a_directory_the_deletes_empty_stays_when_it_holds_untracked_files(staged, tier):
    staged.write("old/untracked.log", b"not the transaction's\n")
    with staged.view(tier) as view:
        res = run_ok(view, "ls old; test -e old/only.txt || echo no-only")
        assert res.tail.split() == ["untracked.log", "no-only"]  # as the commit would leave it


def test_writing_into_staged_files_never_writes_into_their_blobs(staged, tier):
    blobs = {op.path: staged.client.engine.blobs.path(op.blob) for op in staged.changes
             if op.op == "write"}
    before = {}
    for rel, path in blobs.items():
        with open(path, "rb") as f:
            before[rel] = (f.read(), os.stat(path).st_mode)
    with staged.view(tier) as view:
        run_ok(view, [sys.executable, "-c", (
            "import os\n"
            "for p in ('src/app.py', 'new/deep/made.txt', 'bin/run.sh'):\n"
            "    fd = os.open(p, os.O_RDWR); os.pwrite(fd, b'XX', 0); os.close(fd)\n"
            "    os.chmod(p, 0o600)\n"
            "    with open(p, 'ab') as f: f.write(b'appended')\n")])
        assert {c.path for c in view.capture().changes} == set(blobs)
    for rel, path in blobs.items():
        with open(path, "rb") as f:
            assert (f.read(), os.stat(path).st_mode) == before[rel], rel


def test_a_damaged_blob_is_refused_before_anything_runs(staged, tier, shared_tmp):
    from agent_2pc.storage.blobs import BlobCorrupt

    op = next(op for op in staged.changes if op.path == "src/app.py")
    path = staged.client.engine.blobs.path(op.blob)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.write(b"#")
    ran = os.path.join(shared_tmp, "ran")
    with staged.view(tier) as view:
        with pytest.raises(BlobCorrupt):
            view.run(f"touch {ran}")
    assert not os.path.exists(ran)


def test_a_file_written_and_deleted_again_leaves_no_trace(staged, tier):
    staged.tx.stage_write("brand/new/file.txt", b"here and gone\n")
    staged.tx.stage_delete("brand/new/file.txt")
    with staged.view(tier) as view:
        res = run_ok(view, "test -e brand && echo brand-exists || echo no-brand")
        assert res.tail == "no-brand\n"
        assert view.capture().changes == []
