"""export / import: a transaction staged by one agent is handed over as a .a2pc bundle, and
another agent, in another copy of the repository and another process, imports it, diffs it,
checks it and commits it. The bundle carries the bases (the fingerprint of every path when it
was staged, and every recorded read), so a commit onto a tree that moved is a conflict that
applies nothing; a refused import writes nothing; export never leaves a half-written bundle
under its name.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import _env, read, run_cli, take_snapshot, write

from agent_2pc import Agent2PC
from agent_2pc.errors import BadState, InvalidBundle, UsageError

pytestmark = pytest.mark.timeout(120)


def cli(root: Path | str, *args: Any) -> tuple[int, dict[str, Any]]:
    proc = run_cli(args, json_out=True, root=str(root))
    out = json.loads(proc.stdout)
    assert "Traceback" not in proc.stderr.decode(), proc.stderr.decode()
    return proc.returncode, out


def repo_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two copies of one repository (a git clone each, as two agents have), each a workspace."""
    origin = tmp_path / "origin"
    origin.mkdir()
    write(str(origin), "src/app.py", "def f():\n    return 1\n")
    write(str(origin), "README.md", "# app\n")
    write(str(origin), "config.toml", "level = 1\n")
    write(str(origin), "old.txt", "to delete\n")
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=origin, env=env, check=True, capture_output=True)
    copies = []
    for name in ("a", "b"):
        dst = tmp_path / name
        subprocess.run(["git", "clone", "-q", str(origin), str(dst)], env=env, check=True,
                       capture_output=True)
        assert cli(dst, "init")[0] == 0
        copies.append(dst.resolve())
    return copies[0], copies[1]


def stage_in_a(a: Path, bundle: Path, cli_export: bool = False) -> dict[str, Any]:
    """Agent A: changes, a read, a savepoint, a check; exported (by the CLI: ``cli_export``)."""
    client = Agent2PC(a)
    try:
        tx = client.begin(label="fix f")
        tx.stage_replace("src/app.py", "return 1", "return 2")
        tx.savepoint("core")
        tx.stage_write("docs/new.md", "new doc\n")
        tx.stage_delete("old.txt")
        tx.record_read("config.toml")
        tx.stage_cmd("grep -q 'return 2' src/app.py")
        if not cli_export:
            return tx.export(bundle)
    finally:
        client.close()
    status, out = cli(a, "export", "--tid", tx.tid, "-o", str(bundle))
    assert status == 0 and out["ok"] is True, out
    return out


def test_a_bundle_made_by_one_agent_is_reviewed_and_committed_by_another(tmp_path):
    a, b = repo_pair(tmp_path)
    bundle = tmp_path / "fix.a2pc"
    exported = stage_in_a(a, bundle, cli_export=True)
    data = bundle.read_bytes()
    assert exported["bytes"] == len(data)
    assert exported["sha256"] == hashlib.sha256(data).hexdigest()
    assert exported["path"] == str(bundle)

    status, imported = cli(b, "import", str(bundle))
    assert status == 0 and imported["ok"] is True, imported
    tid = imported["tid"]
    assert tid != exported["tid"] and imported["again"] is False
    assert imported["files"] == ["docs/new.md", "old.txt", "src/app.py"]
    assert imported["origin"]["tid"] == exported["tid"]
    assert imported["origin"]["bundle"] == exported["sha256"]
    assert imported["checks"] == [{"command": "grep -q 'return 2' src/app.py", "passed": True,
                                   "exit_code": 0, "current": True}]
    status, rows = cli(b, "status", "--tid", tid)
    assert rows["transactions"][0]["label"] == "fix f"
    assert rows["transactions"][0]["savepoints"] == ["core"]

    status, diff = cli(b, "diff", "--tid", tid)
    assert "-    return 1\n+    return 2" in diff["diff"] and "+new doc" in diff["diff"]
    assert read(str(b), "src/app.py") == b"def f():\n    return 1\n"  # nothing applied yet
    assert cli(b, "stage-cmd", "--tid", tid, "--command", "grep -q 'return 2' src/app.py"
               )[0] == 0
    status, committed = cli(b, "commit", "--tid", tid)
    assert status == 0 and committed["state"] == "committed", committed
    assert read(str(b), "src/app.py") == b"def f():\n    return 2\n"
    assert read(str(b), "docs/new.md") == b"new doc\n"
    assert not (b / "old.txt").exists()
    # A's tree never changed; its transaction is still active there.
    assert read(str(a), "src/app.py") == b"def f():\n    return 1\n"


def test_a_commit_onto_a_tree_that_moved_is_a_conflict_that_applies_nothing(tmp_path):
    a, b = repo_pair(tmp_path)
    bundle = tmp_path / "fix.a2pc"
    stage_in_a(a, bundle)
    tid = cli(b, "import", str(bundle))[1]["tid"]
    write(str(b), "src/app.py", "def f():\n    return 10\n")  # another writer, meanwhile
    before = take_snapshot(str(b))["tree"]
    status, out = cli(b, "commit", "--tid", tid)
    assert status == 1 and out["error"]["code"] == "conflict", out
    assert "src/app.py" in out["error"]["message"]
    assert take_snapshot(str(b))["tree"] == before


def test_a_file_the_exporter_only_read_carries_its_base_too(tmp_path):
    a, b = repo_pair(tmp_path)
    bundle = tmp_path / "fix.a2pc"
    stage_in_a(a, bundle)
    tid = cli(b, "import", str(bundle))[1]["tid"]
    write(str(b), "config.toml", "level = 2\n")
    status, out = cli(b, "commit", "--tid", tid)
    assert status == 1 and out["error"]["code"] == "conflict", out
    assert read(str(b), "src/app.py") == b"def f():\n    return 1\n"


def test_a_bundle_from_another_repository_imports_and_then_conflicts_at_commit(tmp_path):
    a, _ = repo_pair(tmp_path)
    bundle = tmp_path / "fix.a2pc"
    stage_in_a(a, bundle)
    other = tmp_path / "other"
    write(str(other), "src/app.py", "something else\n")
    write(str(other), "config.toml", "level = 1\n")
    write(str(other), "old.txt", "to delete\n")
    assert cli(other, "init")[0] == 0
    status, imported = cli(other, "import", str(bundle))
    assert status == 0, imported
    status, out = cli(other, "commit", "--tid", imported["tid"])
    assert status == 1 and out["error"]["code"] == "conflict"
    assert read(str(other), "src/app.py") == b"something else\n"
    assert not (other / "docs").exists()


def test_importing_twice_answers_the_live_transaction_and_after_commit_conflicts(tmp_path):
    a, b = repo_pair(tmp_path)
    bundle = tmp_path / "fix.a2pc"
    stage_in_a(a, bundle)
    first = cli(b, "import", str(bundle))[1]
    wal = (b / ".agent-tx" / "wal.bin").read_bytes()
    again = cli(b, "import", str(bundle), "--label", "other")[1]
    assert again["tid"] == first["tid"] and again["again"] is True
    assert (b / ".agent-tx" / "wal.bin").read_bytes() == wal  # nothing written
    assert cli(b, "commit", "--tid", first["tid"])[0] == 0
    # Its transaction finished: a new import is a new transaction, whose bases are gone.
    third = cli(b, "import", str(bundle))[1]
    assert third["tid"] != first["tid"] and third["again"] is False
    status, out = cli(b, "commit", "--tid", third["tid"])
    assert status == 1 and out["error"]["code"] == "conflict"


def test_savepoints_travel_and_rollback_to_works_on_the_imported_transaction(tmp_path):
    a, b = repo_pair(tmp_path)
    bundle = tmp_path / "fix.a2pc"
    stage_in_a(a, bundle)
    tid = cli(b, "import", str(bundle), "--label", "review")[1]["tid"]
    assert cli(b, "rollback-to", "--tid", tid, "--name", "core")[0] == 0
    status, diff = cli(b, "diff", "--tid", tid, "--stat")
    assert [f["path"] for f in diff["files"]] == ["src/app.py"]
    assert cli(b, "status", "--tid", tid)[1]["transactions"][0]["label"] == "review"


def test_the_exporters_checks_are_reported_and_never_run_by_the_importer(tmp_path):
    a, b = repo_pair(tmp_path)
    marker = tmp_path / "ran.log"
    bundle = tmp_path / "x.a2pc"
    client = Agent2PC(a)
    try:
        tx = client.begin()
        tx.stage_write("x.txt", "x\n")
        tx.stage_cmd(f"echo ran >> {marker}")
        # A later change makes the check stale: the report says it saw earlier content.
        tx.stage_write("y.txt", "y\n")
        tx.export(bundle)
    finally:
        client.close()
    imported = cli(b, "import", str(bundle))[1]
    assert imported["checks"][0]["current"] is False
    assert cli(b, "commit", "--tid", imported["tid"])[0] == 0
    assert marker.read_text() == "ran\n"  # A's one run; B's commit ran nothing of the bundle


def test_the_same_transaction_exports_to_the_same_bytes(tmp_path):
    (tmp_path / "w").mkdir()
    client = Agent2PC.init(tmp_path / "w")
    try:
        tx = client.begin(label="same")
        tx.stage_write("a.txt", b"\x00binary\xff")
        tx.stage_write("b/c.txt", "text\n", mode=0o755)
        tx.record_read("missing.txt")
        tx.savepoint("s")
        first = tx.export(tmp_path / "1.a2pc")
        second = tx.export(tmp_path / "2.a2pc")
        assert first["sha256"] == second["sha256"]
        assert (tmp_path / "1.a2pc").read_bytes() == (tmp_path / "2.a2pc").read_bytes()
        # A standard container: gzip and tar read it.
        assert gzip.decompress((tmp_path / "1.a2pc").read_bytes())[:13] == b"manifest.json"
        listing = subprocess.run(["tar", "tzf", str(tmp_path / "1.a2pc")], check=True,
                                 capture_output=True, text=True).stdout.split()
        assert listing[0] == "manifest.json" and listing[-1] == "seal"
        assert len([n for n in listing if n.startswith("blobs/")]) == 2
    finally:
        client.close()


def test_a_refused_import_writes_nothing(tmp_path):
    a, b = repo_pair(tmp_path)
    bundle = tmp_path / "fix.a2pc"
    stage_in_a(a, bundle)
    data = bytearray(bundle.read_bytes())
    before = take_snapshot(str(b))
    objects = sorted(p.name for p in (b / ".agent-tx" / "objects").rglob("*") if p.is_file())
    cases = {"truncated": bytes(data[: len(data) // 2]), "flipped": None, "empty": b""}
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x40
    cases["flipped"] = bytes(flipped)
    for name, content in cases.items():
        bad = tmp_path / f"{name}.a2pc"
        bad.write_bytes(content or b"")
        status, out = cli(b, "import", str(bad))
        assert out["ok"] is False and out["error"]["code"] in ("invalid_bundle", "tampered")
        assert status == (1 if out["error"]["code"] == "tampered" else 2), (name, out)
        assert take_snapshot(str(b)) == before, name
        assert sorted(p.name for p in (b / ".agent-tx" / "objects").rglob("*")
                      if p.is_file()) == objects, name
    status, out = cli(b, "import", str(tmp_path / "absent.a2pc"))
    assert status == 2 and out["error"]["code"] == "usage"


def test_a_path_reached_through_a_link_in_the_importers_tree_is_refused(tmp_path):
    a, b = repo_pair(tmp_path)
    bundle = tmp_path / "fix.a2pc"
    stage_in_a(a, bundle)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, b / "docs")  # docs/new.md would land outside the root
    before = take_snapshot(str(b))
    status, out = cli(b, "import", str(bundle))
    assert status == 2 and out["error"]["code"] in ("path_outside_root", "invalid_bundle"), out
    assert take_snapshot(str(b)) == before and not list(outside.iterdir())


def test_export_refuses_what_a_bundle_cannot_carry(tmp_path):
    (tmp_path / "w").mkdir()
    client = Agent2PC.init(tmp_path / "w")
    try:
        tx = client.begin()
        tx.stage_write("a.txt", "a\n")
        with pytest.raises(UsageError, match="directory"):
            tx.export(tmp_path)
        with pytest.raises(UsageError, match="no directory"):
            tx.export(tmp_path / "missing" / "x.a2pc")
        tx.stage_api("POST", "http://127.0.0.1:9/x")
        with pytest.raises(UsageError, match="effects"):
            tx.export(tmp_path / "x.a2pc")
        tx.abort()
        with pytest.raises(BadState):
            tx.export(tmp_path / "x.a2pc")
        link_tx = client.begin()
        os.symlink("/etc/passwd", tmp_path / "w" / "tmp-link")
        link_tx.exec(["sh", "-c", "ln -s /etc/hostname out-link"])
        with pytest.raises(InvalidBundle, match="cannot be exported"):
            link_tx.export(tmp_path / "l.a2pc")
        assert not (tmp_path / "x.a2pc").exists() and not (tmp_path / "l.a2pc").exists()
    finally:
        client.close()
    status, out = cli(tmp_path / "w", "export", "--tid", "tx-20260101-000000-abcdef", "-o",
                      str(tmp_path / "u.a2pc"))
    assert status == 2 and out["error"]["code"] == "unknown_tid"


@pytest.mark.parametrize("site", ["bundles._write_file:write", "bundles._write_file:fsync",
                                  "bundles._write_file:rename"])
def test_export_onto_a_full_disk_leaves_no_half_written_bundle(tmp_path, site):
    (tmp_path / "w").mkdir()
    client = Agent2PC.init(tmp_path / "w")
    try:
        tx = client.begin()
        tx.stage_write("big.bin", os.urandom(3 << 20))
    finally:
        client.close()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "prev.a2pc").write_bytes(b"an earlier bundle")
    proc = run_cli(("export", "--tid", tx.tid, "-o", str(out_dir / "prev.a2pc")),
                   json_out=True, root=str(tmp_path / "w"),
                   env={"AGENT2PC_FAULT_AT": f"{site}=ENOSPC"})
    out = json.loads(proc.stdout)
    assert proc.returncode == 2 and out["error"]["code"] == "io_error", out
    assert f"injected at {site}" in out["error"]["message"]
    assert sorted(os.listdir(out_dir)) == ["prev.a2pc"]  # no temp file left
    assert (out_dir / "prev.a2pc").read_bytes() == b"an earlier bundle"


def test_the_library_round_trip(tmp_path):
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    for root in (a_root, b_root):
        write(str(root), "f.txt", "base\n")
    a, b = Agent2PC.init(a_root), Agent2PC.init(b_root)
    try:
        tx = a.begin(label="lib")
        tx.stage_write("f.txt", "changed\n")
        tx.export(tmp_path / "t.a2pc")
        got = b.import_bundle(tmp_path / "t.a2pc")
        assert got["files"] == ["f.txt"]
        assert b.get(got["tid"]).commit()["state"] == "committed"
        assert read(str(b_root), "f.txt") == b"changed\n"
    finally:
        a.close()
        b.close()
    shutil.rmtree(a_root)


def test_an_export_killed_before_its_rename_leaves_no_bundle_under_the_name(tmp_path):
    a, _ = repo_pair(tmp_path)
    client = Agent2PC(a)
    try:
        tx = client.begin()
        tx.stage_write("f.txt", "f\n")
    finally:
        client.close()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = run_cli(("export", "--tid", tx.tid, "-o", str(out_dir / "t.a2pc")), json_out=True,
                   root=str(a), env={"AGENT2PC_CRASH_AT": "export.before_rename"})
    assert proc.returncode == 137
    assert not (out_dir / "t.a2pc").exists()
    # What is left is a hidden temp file beside it, never the final name.
    assert all(n.startswith(".t.a2pc.tmp-") for n in os.listdir(out_dir))
    status, out = cli(a, "export", "--tid", tx.tid, "-o", str(out_dir / "t.a2pc"))
    assert status == 0 and (out_dir / "t.a2pc").stat().st_size == out["bytes"]


def test_an_import_killed_after_its_blobs_registers_nothing_and_can_be_done_again(tmp_path):
    from crashkit import wal_is_clean

    a, b = repo_pair(tmp_path)
    bundle = tmp_path / "fix.a2pc"
    stage_in_a(a, bundle)
    before = take_snapshot(str(b))
    proc = run_cli(("import", str(bundle)), json_out=True, root=str(b),
                   env={"AGENT2PC_CRASH_AT": "import.after_blobs"})
    assert proc.returncode == 137
    assert cli(b, "recover")[0] == 0
    assert cli(b, "list")[1]["transactions"] == []
    assert take_snapshot(str(b)) == before  # the tree and the log as they were
    assert wal_is_clean(b)
    status, imported = cli(b, "import", str(bundle))
    assert status == 0 and imported["again"] is False
    assert cli(b, "commit", "--tid", imported["tid"])[0] == 0
    assert read(str(b), "src/app.py") == b"def f():\n    return 2\n"


def test_links_empty_directories_modes_and_binary_content_travel(tmp_path):
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    for root in (a_root, b_root):
        write(str(root), "run.sh", "echo hi\n")
        write(str(root), "data/old.bin", b"\x00old")
    a, b = Agent2PC.init(a_root), Agent2PC.init(b_root)
    try:
        tx = a.begin()
        tx.exec(["sh", "-c", "ln -s ../run.sh data/link && mkdir empty && chmod 755 run.sh"
                 " && rm data/old.bin"])
        tx.stage_write("data/new.bin", bytes(range(256)) * 10)
        tx.export(tmp_path / "t.a2pc")
        got = b.import_bundle(tmp_path / "t.a2pc")
        assert got["files"] == ["data/link", "data/new.bin", "data/old.bin", "empty",
                                "run.sh"]
        assert b.get(got["tid"]).commit()["state"] == "committed"
    finally:
        a.close()
        b.close()
    assert os.readlink(b_root / "data" / "link") == "../run.sh"
    assert (b_root / "empty").is_dir() and not list((b_root / "empty").iterdir())
    assert os.stat(b_root / "run.sh").st_mode & 0o777 == 0o755
    assert not (b_root / "data" / "old.bin").exists()
    assert read(str(b_root), "data/new.bin") == bytes(range(256)) * 10


def test_an_import_whose_append_was_torn_is_aborted_and_imported_anew(tmp_path):
    a, b = repo_pair(tmp_path)
    bundle = tmp_path / "fix.a2pc"
    stage_in_a(a, bundle)
    proc = run_cli(("import", str(bundle)), json_out=True, root=str(b),
                   env={"AGENT2PC_CRASH_AT": "wal.torn_append"})
    assert proc.returncode == 137
    assert cli(b, "recover")[0] == 0
    partial = [t["tid"] for t in cli(b, "list", "--state", "active")[1]["transactions"]]
    assert len(partial) == 1  # half of the append: begin and some of the stage records
    assert cli(b, "status", "--tid", partial[0])[1]["transactions"][0]["ops"] < 3
    status, imported = cli(b, "import", str(bundle))
    assert status == 0 and imported["again"] is False, imported
    assert imported["files"] == ["docs/new.md", "old.txt", "src/app.py"]
    for tid in partial:  # a prefix of the records survived the cut: aborted, not answered
        assert cli(b, "status", "--tid", tid)[1]["transactions"][0]["state"] == "aborted"
    assert cli(b, "commit", "--tid", imported["tid"])[0] == 0
    assert read(str(b), "docs/new.md") == b"new doc\n"


def test_two_processes_importing_one_bundle_at_once_make_one_transaction(tmp_path):
    a, b = repo_pair(tmp_path)
    bundle = tmp_path / "fix.a2pc"
    stage_in_a(a, bundle)
    # Both verify and store the blobs, then wait at the same point: then both append.
    env = _env({"AGENT2PC_STALL_AT": "import.after_blobs", "AGENT2PC_STALL_S": "2"})
    argv = [sys.executable, "-m", "agent_2pc", "--root", str(b), "import", str(bundle),
            "--json"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for _ in range(2)]
    answers = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs), answers
    assert answers[0]["tid"] == answers[1]["tid"], answers
    assert sorted(x["again"] for x in answers) == [False, True]
    assert len(cli(b, "list", "--state", "active")[1]["transactions"]) == 1
