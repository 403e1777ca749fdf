"""exec stages symbolic links and empty directories, as the contract's exec ``op`` says
(``symlink``, ``mkdir``), and commit puts them in the tree: a link is the link itself (never
its target), a directory keeps its mode, a removed empty directory goes. Every tier the host
has runs each case; the tree is unchanged until commit."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from crashkit import snapshot

from agent_2pc import Agent2PC, TransactionAborted
from agent_2pc.errors import NotAFile
from agent_2pc.isolation import probe_tiers

pytestmark = pytest.mark.timeout(120)

TIERS = ("overlay", "fuse-overlayfs", "copy")


@pytest.fixture(params=TIERS)
def tier(request, monkeypatch) -> str:
    why = probe_tiers()[request.param]
    if why is not None:
        pytest.skip(f"{request.param} is not available here: {why}")
    monkeypatch.setenv("AGENT2PC_ISOLATION", request.param)
    return request.param


@pytest.fixture
def repo(tmp_path) -> Path:
    # Not a git work tree: the copy tier then copies every directory, empty ones too (in a
    # git work tree it copies what git lists, which has no empty directories).
    root = tmp_path / "repo"
    root.mkdir()
    (root / "real.txt").write_text("precious\n")
    os.symlink("real.txt", root / "link.txt")
    (root / "realdir").mkdir()
    (root / "realdir" / "f.txt").write_text("inner\n")
    os.symlink("realdir", root / "dirlink")
    (root / "emptyd").mkdir()
    (root / "nest" / "e").mkdir(parents=True)
    (root / "plain.txt").write_text("plain\n")
    Agent2PC.init(root)
    return root


def node(path: Path) -> tuple:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return ("symlink", os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return ("dir", stat.S_IMODE(st.st_mode))
    return ("file", path.read_bytes(), stat.S_IMODE(st.st_mode))


def test_exec_stages_new_links_and_commit_makes_the_links_themselves(repo, tier):
    before = snapshot(repo)
    tx = Agent2PC(repo).begin()
    out = tx.exec(["sh", "-c", "ln -s real.txt new.txt && ln -s /nowhere/at/all dangling && "
                               "ln -s ../realdir sub/up 2>/dev/null || "
                               "(mkdir sub && ln -s ../realdir sub/up)"])
    assert out["isolation"] == tier
    captured = {c["path"]: c for c in out["captured"]}
    assert captured["new.txt"] == {"path": "new.txt", "op": "symlink", "target": "real.txt"}
    assert captured["dangling"]["target"] == "/nowhere/at/all"
    assert captured["sub/up"]["op"] == "symlink"
    assert snapshot(repo) == before
    tx.commit()
    assert node(repo / "new.txt") == ("symlink", "real.txt")
    assert node(repo / "dangling") == ("symlink", "/nowhere/at/all")
    assert node(repo / "sub" / "up") == ("symlink", "../realdir")
    assert (repo / "real.txt").read_text() == "precious\n"


def test_exec_stages_empty_directories_with_their_mode(repo, tier):
    tx = Agent2PC(repo).begin()
    out = tx.exec(["sh", "-c", "mkdir -p a/b/c && mkdir -m 0700 private && "
                               "mkdir full && echo x > full/f"])
    ops = {c["path"]: (c["op"], c.get("mode")) for c in out["captured"]}
    assert ops == {"a/b/c": ("mkdir", 0o755), "private": ("mkdir", 0o700),
                   "full/f": ("write", 0o644)}
    assert not (repo / "a").exists()
    tx.commit()
    assert node(repo / "a" / "b" / "c") == ("dir", 0o755)
    assert node(repo / "private") == ("dir", 0o700)
    assert os.listdir(repo / "a" / "b" / "c") == []


def test_removing_a_link_stages_the_links_deletion_never_its_targets(repo, tier):
    tx = Agent2PC(repo).begin()
    out = tx.exec(["sh", "-c", "rm link.txt && rm dirlink"])
    assert sorted((c["path"], c["op"]) for c in out["captured"]) == [
        ("dirlink", "delete"), ("link.txt", "delete")]
    assert out["skipped"] == []
    tx.commit()
    assert not os.path.lexists(repo / "link.txt") and not os.path.lexists(repo / "dirlink")
    assert (repo / "real.txt").read_text() == "precious\n"
    assert (repo / "realdir" / "f.txt").read_text() == "inner\n"


def test_a_link_replaced_by_a_file_or_another_link_commits_as_such(repo, tier):
    (repo / "other.txt").write_text("other\n")
    os.symlink("real.txt", repo / "relink")
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "rm link.txt && echo mine > link.txt && ln -sfn other.txt relink"])
    assert {f["path"]: f["op"] for f in tx.status()["files"]} == {
        "link.txt": "write", "relink": "symlink"}
    tx.commit()
    assert node(repo / "link.txt") == ("file", b"mine\n", 0o644)
    assert node(repo / "relink") == ("symlink", "other.txt")
    assert (repo / "real.txt").read_text() == "precious\n"


def test_removing_empty_directories_is_staged_and_committed(repo, tier):
    tx = Agent2PC(repo).begin()
    out = tx.exec(["sh", "-c", "rmdir emptyd && rm -r nest"])
    assert sorted((c["path"], c["op"]) for c in out["captured"]) == [
        ("emptyd", "delete"), ("nest/e", "delete")]
    assert (repo / "emptyd").is_dir()
    tx.commit()
    assert not (repo / "emptyd").exists() and not (repo / "nest").exists()


def test_a_file_replaced_by_a_directory_commits_as_a_directory(repo, tier):
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "rm plain.txt && mkdir plain.txt && echo in > plain.txt/x && "
                         "rm real.txt && mkdir real.txt"])
    tx.commit()
    assert node(repo / "plain.txt") == ("dir", 0o755)
    assert (repo / "plain.txt" / "x").read_text() == "in\n"
    assert node(repo / "real.txt") == ("dir", 0o755) and os.listdir(repo / "real.txt") == []


def test_later_runs_see_the_staged_links_and_directories(repo, tier):
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "ln -s real.txt seen.txt && mkdir -p made/empty && rmdir emptyd"])
    out = tx.exec(["sh", "-c", "test \"$(readlink seen.txt)\" = real.txt && "
                               "test \"$(cat seen.txt)\" = precious && test -d made/empty && "
                               "test ! -e emptyd && rm seen.txt && rmdir made/empty"])
    assert sorted((c["path"], c["op"]) for c in out["captured"]) == [
        ("made/empty", "delete"), ("seen.txt", "delete")]
    tx.commit()
    assert not os.path.lexists(repo / "seen.txt") and not (repo / "made").exists()
    assert not (repo / "emptyd").exists()


def test_diff_shows_a_link_as_git_does_and_a_directory_as_a_row(repo):
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "ln -s real.txt l2 && mkdir newdir && rm link.txt"])
    d = tx.diff()
    rows = {(f["path"], f["status"]): f for f in d["files"]}
    assert rows[("l2", "added")]["kind"] == "symlink"
    assert rows[("link.txt", "deleted")]["kind"] == "symlink"
    assert rows[("newdir", "added")]["kind"] == "directory"
    assert "diff --git a/l2 b/l2\nnew file mode 120000\n" in d["diff"]
    assert "+real.txt\n\\ No newline at end of file\n" in d["diff"]
    assert "deleted file mode 120000\n" in d["diff"]
    assert "# empty directory added: newdir/\n" in d["diff"]
    stat_lines = [" ".join(ln.split()) for ln in tx.diff(stat=True)["diff"].splitlines()]
    assert "newdir/ | directory added" in stat_lines


def test_git_applies_the_diff_of_staged_links(tmp_path):
    root = tmp_path / "g"
    root.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "a.txt").write_text("a\n")
    os.symlink("a.txt", root / "old")
    Agent2PC.init(root)
    tx = Agent2PC(root).begin()
    tx.exec(["sh", "-c", "ln -s a.txt l && rm old && mkdir e"])
    patch = tx.diff()["diff"]
    assert "# empty directory added: e/" in patch
    check = subprocess.run(["git", "apply", "--check", "-"], cwd=root, input=patch.encode(),
                           capture_output=True)
    assert check.returncode == 0, check.stderr


def test_a_link_planted_after_staging_makes_the_commit_a_conflict(repo):
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "ln -s real.txt mine && mkdir made"])
    os.symlink("plain.txt", repo / "mine")  # another writer got there first
    with pytest.raises(TransactionAborted) as info:
        tx.commit()
    assert info.value.code == "conflict"
    assert node(repo / "mine") == ("symlink", "plain.txt") and not (repo / "made").exists()


def test_a_directory_someone_else_made_satisfies_a_staged_mkdir(repo):
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "mkdir made"])
    (repo / "made").mkdir()
    assert tx.commit()["state"] == "committed"
    assert (repo / "made").is_dir()


def test_a_link_changed_after_staging_its_deletion_is_kept(repo):
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "rm link.txt"])
    os.unlink(repo / "link.txt")
    os.symlink("plain.txt", repo / "link.txt")
    with pytest.raises(TransactionAborted) as info:
        tx.commit()
    assert info.value.code == "conflict" and "symbolic link" in str(info.value)
    assert node(repo / "link.txt") == ("symlink", "plain.txt")


def test_a_staged_link_or_directory_is_not_read_or_written_as_a_file(repo):
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "ln -s real.txt l3 && mkdir d3"])
    with pytest.raises(NotAFile):
        tx.read("l3")
    with pytest.raises(NotAFile):
        tx.stage_write("d3", "no\n")
    with pytest.raises(NotAFile):
        tx.stage_write("l3/below.txt", "no\n")
    tx.stage_write("d3/in.txt", "yes\n")  # a staged directory takes files
    tx.stage_delete("l3")  # and a staged link can be taken back
    tx.commit()
    assert not os.path.lexists(repo / "l3")
    assert (repo / "d3" / "in.txt").read_text() == "yes\n"


def test_writing_through_a_link_stages_the_target_and_replacing_it_stages_a_directory(
        repo, tier):
    tx = Agent2PC(repo).begin()
    out = tx.exec(["sh", "-c", "echo new > dirlink/g.txt"])
    assert [c["path"] for c in out["captured"]] == ["realdir/g.txt"]  # the kernel followed it
    out = tx.exec(["sh", "-c", "rm dirlink && mkdir dirlink && echo z > dirlink/z.txt"])
    assert {c["path"]: c["op"] for c in out["captured"]} == {
        "dirlink": "delete", "dirlink/z.txt": "write"}
    tx.commit()
    assert node(repo / "dirlink") == ("dir", 0o755)
    assert (repo / "dirlink" / "z.txt").read_text() == "z\n"
    assert sorted(os.listdir(repo / "realdir")) == ["f.txt", "g.txt"]


def test_exec_of_links_and_directories_through_the_cli(repo, tier):
    import json

    def cli(*args: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", "agent_2pc", "--json", "--root",
                               str(repo), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        return json.loads(proc.stdout)

    tid = cli("begin")["tid"]
    out = cli("exec", "--tid", tid, "--", "sh", "-c", "ln -s real.txt c && mkdir cd")
    assert {(c["path"], c["op"]) for c in out["captured"]} == {("c", "symlink"),
                                                               ("cd", "mkdir")}
    assert cli("commit", "--tid", tid)["files"] == ["c", "cd"]
    assert node(repo / "c") == ("symlink", "real.txt") and (repo / "cd").is_dir()


def test_the_exec_summary_names_link_targets_and_directories(repo):
    tid = Agent2PC(repo).begin().tid
    proc = subprocess.run([sys.executable, "-m", "agent_2pc", "--root", str(repo), "exec",
                           "--tid", tid, "--", "sh", "-c", "ln -s real.txt s && mkdir sd"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "  symlink s -> real.txt\n" in proc.stderr
    assert "  mkdir   sd/" in proc.stderr


def test_a_directory_replaced_by_a_file_commits_as_a_file(repo, tier):
    (repo / "pkg" / "sub").mkdir(parents=True)
    (repo / "pkg" / "a.py").write_text("a\n")
    (repo / "pkg" / "sub" / "b.py").write_text("b\n")
    (repo / "pkg" / "empty").mkdir()
    before = snapshot(repo)
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "rm -r pkg && echo module > pkg && rm -r realdir && "
                         "ln -s real.txt realdir"])
    out = tx.exec(["sh", "-c", "test -f pkg && test \"$(cat pkg)\" = module && "
                               "test -L realdir"])  # later runs see it too
    assert out["captured"] == []
    assert snapshot(repo) == before
    tx.commit()
    assert node(repo / "pkg") == ("file", b"module\n", 0o644)
    assert node(repo / "realdir") == ("symlink", "real.txt")


def test_a_directory_is_not_replaced_while_it_holds_what_the_transaction_keeps(repo, tier):
    (repo / "pkg").mkdir()
    (repo / "pkg" / "a.py").write_text("a\n")
    (repo / "pkg" / "__pycache__").mkdir()  # ignored: never captured, so never deleted
    (repo / "pkg" / "__pycache__" / "a.pyc").write_text("x")
    before = snapshot(repo)
    tx = Agent2PC(repo).begin()
    with pytest.raises(NotAFile) as info:
        tx.exec(["sh", "-c", "rm -r pkg && echo module > pkg"])
    assert "pkg/__pycache__" in str(info.value)
    assert tx.status()["files"] == [] and snapshot(repo) == before


def test_a_file_put_in_an_emptied_directory_after_staging_makes_the_commit_a_conflict(repo):
    (repo / "pkg").mkdir()
    (repo / "pkg" / "a.py").write_text("a\n")
    tx = Agent2PC(repo).begin()
    tx.exec(["sh", "-c", "rm -r pkg && echo module > pkg"])
    (repo / "pkg" / "late.py").write_text("someone else's\n")
    with pytest.raises(TransactionAborted) as info:
        tx.commit()
    assert info.value.code == "conflict" and "pkg/late.py" in str(info.value)
    assert (repo / "pkg" / "a.py").read_text() == "a\n"


def test_stage_write_replaces_a_directory_the_transaction_emptied(repo):
    (repo / "pkg").mkdir()
    (repo / "pkg" / "a.py").write_text("a\n")
    tx = Agent2PC(repo).begin()
    with pytest.raises(NotAFile):
        tx.stage_write("pkg", "module\n")  # it still holds pkg/a.py
    tx.stage_delete("pkg/a.py")
    tx.stage_write("pkg", "module\n")
    assert tx.commit()["files"] == ["pkg", "pkg/a.py"]
    assert node(repo / "pkg") == ("file", b"module\n", 0o644)
