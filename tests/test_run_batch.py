"""run-batch: a JSON manifest run as one transaction. A malformed manifest begins nothing; a step
that fails aborts the whole transaction."""

from __future__ import annotations

import base64
import json

import pytest
from conftest import read, write

from agent_2pc import Agent2PCError

# A CLI call that hangs (a lock never released) must fail the test, not stall the run.
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def tree(root):
    write(root, "a.txt", "alpha\nbeta\n")
    write(root, "old.txt", "old\n")
    return root


def step(intent):
    return {"participant_id": "fs", "intent": intent}


def run(cli, tmp_path, manifest, name="m.json"):
    path = tmp_path / name
    if isinstance(manifest, (bytes, str)):
        path.write_bytes(manifest.encode() if isinstance(manifest, str) else manifest)
    else:
        path.write_text(json.dumps(manifest))
    return cli("run-batch", "--file", str(path))


def tids(cli):
    status, out = cli("list")
    assert status == 0
    return {row["tid"] for row in out["transactions"]}


def test_a_manifest_of_every_file_step_commits_as_one_transaction(tree, cli, tmp_path):
    manifest = {"label": "batch", "timeout_ms": 60000, "steps": [
        step({"type": "fs_write", "path": "dir/new.txt", "content": "new\n"}),
        step({"type": "fs_replace", "path": "a.txt", "old": "beta", "new": "BETA"}),
        step({"type": "fs_patch", "patch": "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n"
                                           "-alpha\n+ALPHA\n BETA\n"}),
        step({"type": "fs_delete", "path": "old.txt"}),
    ]}
    status, out = run(cli, tmp_path, manifest)
    assert status == 0, out
    assert out["ok"] is True and out["state"] == "committed"
    assert [s["ok"] for s in out["steps"]] == [True] * 4
    assert read(tree, "dir/new.txt") == b"new\n"
    assert read(tree, "a.txt") == b"ALPHA\nBETA\n"      # the patch saw the replace
    assert not (tmp_path / "repo" / "old.txt").exists()
    status, listed = cli("list")
    row = [r for r in listed["transactions"] if r["tid"] == out["tid"]][0]
    assert row["state"] == "committed" and row["label"] == "batch"


def test_a_manifest_read_from_stdin_runs(tree, cli):
    manifest = json.dumps({"steps": [{"type": "fs_write", "path": "s.txt", "content": "s\n"}]})
    status, out = cli("run-batch", "--file", "-", input=manifest)
    assert status == 0 and out["state"] == "committed", out
    assert read(tree, "s.txt") == b"s\n"


def test_binary_content_in_a_manifest_round_trips(tree, cli, tmp_path):
    data = bytes(range(256)) + b"\xff\xfe"
    manifest = {"steps": [step({"type": "fs_write", "path": "b.bin",
                                "content_base64": base64.b64encode(data).decode(),
                                "mode": "0755"})]}
    status, out = run(cli, tmp_path, manifest)
    assert status == 0, out
    assert read(tree, "b.bin") == data
    assert (tmp_path / "repo" / "b.bin").stat().st_mode & 0o777 == 0o755


def test_a_failing_step_aborts_the_whole_batch_and_names_the_step(tree, cli, tmp_path,
                                                                  snapshot):
    before = snapshot()["tree"]
    manifest = {"steps": [
        step({"type": "fs_write", "path": "n.txt", "content": "n\n"}),
        step({"type": "fs_replace", "path": "a.txt", "old": "nowhere", "new": "x"}),
        step({"type": "fs_delete", "path": "old.txt"}),
    ]}
    status, out = run(cli, tmp_path, manifest)
    assert status in (1, 2) and out["ok"] is False, out
    assert out["error"]["code"] == "no_match", out
    assert "step 1" in out["error"]["message"], out
    assert out.get("state") == "aborted"
    assert [s["ok"] for s in out["steps"]] == [True, False], out   # step 2 never ran
    assert snapshot()["tree"] == before
    status, listed = cli("list", "--state", "aborted")
    assert out["tid"] in {r["tid"] for r in listed["transactions"]}


@pytest.mark.parametrize("manifest", [
    "{not json",
    "",
    "[]",
    '"steps"',
    "{}",
    '{"steps": []}',
    '{"steps": "fs_write"}',
    '{"steps": [42]}',
    '{"steps": [{"participant_id": "fs", "intent": "fs_write"}]}',
    '{"steps": [{"participant_id": "fs", "intent": {"type": "fs_teleport", "path": "a"}}]}',
    '{"steps": [{"participant_id": "fs", "intent": {"path": "a.txt", "content": "x"}}]}',
    '{"steps": [{"participant_id": "fs", "intent": {"type": "fs_write", "content": "x"}}]}',
    '{"steps": [{"participant_id": "fs", "intent": {"type": "fs_write", "path": "a.txt"}}]}',
    '{"steps": [{"participant_id": "fs", "intent": {"type": "fs_replace", "path": "a.txt",'
    ' "old": "a"}}]}',
    '{"steps": [{"participant_id": "fs", "intent": {"type": "fs_delete"}}]}',
    '{"steps": [{"participant_id": "fs", "intent": {"type": "fs_patch"}}]}',
    '{"steps": [{"participant_id": "fs", "intent": {"type": "fs_write", "path": 7,'
    ' "content": "x"}}]}',
    '{"steps": [{"participant_id": "fs", "intent": {"type": "fs_write", "path": "a.txt",'
    ' "content": "x", "colour": "red"}}]}',
    '{"timeout_ms": "soon", "steps": [{"type": "fs_delete", "path": "old.txt"}]}',
    '{"timeout_ms": -1, "steps": [{"type": "fs_delete", "path": "old.txt"}]}',
    # a good step first, then a bad one: the whole manifest is checked before anything begins
    '{"steps": [{"type": "fs_write", "path": "n.txt", "content": "n"}, {"type": "nope"}]}',
], ids=["malformed-json", "empty", "array", "string", "no-steps", "empty-steps",
        "steps-not-list", "step-not-object", "intent-not-object", "unknown-type", "no-type",
        "write-no-path", "write-no-content", "replace-no-new", "delete-no-path",
        "patch-no-patch", "path-not-string", "unknown-field", "timeout-not-number",
        "timeout-negative", "bad-second-step"])
def test_a_malformed_manifest_is_invalid_manifest_and_begins_nothing(tree, cli, tmp_path,
                                                                     snapshot, manifest):
    known = tids(cli)
    before = snapshot()
    status, out = run(cli, tmp_path, manifest)
    assert (status, out["ok"], out["error"]["code"]) == (2, False, "invalid_manifest"), out
    assert snapshot() == before
    assert tids(cli) == known


def test_a_malformed_manifest_on_stdin_is_invalid_manifest(tree, cli, snapshot):
    before = snapshot()
    status, out = cli("run-batch", "--file", "-", input="{oops")
    assert (status, out["error"]["code"]) == (2, "invalid_manifest"), out
    assert snapshot() == before


def test_a_non_utf8_manifest_is_invalid_manifest(tree, cli, tmp_path, snapshot):
    before = snapshot()
    status, out = run(cli, tmp_path, b'{"steps": [{"type": "fs_write", "path": "\xff",'
                                     b' "content": "x"}]}')
    assert (status, out["error"]["code"]) == (2, "invalid_manifest"), out
    assert snapshot() == before


def test_a_missing_manifest_file_is_refused_with_exit_2(tree, cli, tmp_path, snapshot):
    before = snapshot()
    status, out = cli("run-batch", "--file", str(tmp_path / "absent.json"))
    assert status == 2 and out["ok"] is False, out
    assert snapshot() == before


def test_a_step_aimed_outside_the_root_aborts_the_batch_and_changes_nothing(tree, cli, tmp_path,
                                                                           snapshot):
    before = snapshot()["tree"]
    manifest = {"steps": [step({"type": "fs_write", "path": "ok.txt", "content": "x"}),
                          step({"type": "fs_write", "path": "../escape.txt", "content": "x"})]}
    status, out = run(cli, tmp_path, manifest)
    assert out["ok"] is False and out["error"]["code"] == "path_outside_root", out
    assert status in (1, 2)
    assert snapshot()["tree"] == before
    assert not (tmp_path / "escape.txt").exists()


def test_run_batch_through_the_library_takes_a_dict(tree, client):
    out = client.run_batch({"steps": [{"type": "fs_write", "path": "lib.txt", "content": "l\n"}]})
    assert out["state"] == "committed"
    assert read(tree, "lib.txt") == b"l\n"
    with pytest.raises(Agent2PCError) as info:
        client.run_batch({"steps": []})
    assert info.value.code == "invalid_manifest"
