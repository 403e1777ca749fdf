"""The workloads whose crash states are explored: real CLI commands on a real workspace.

A workload prepares a tree (``setup``: files, ``init``, and maybe steps that are not traced,
whose results count as already on disk), then runs its traced ``steps``, each a real
``agent-2pc`` process under strace. ``{t0}``, ``{t1}``... in a step's arguments stand for the
id that the first, second... ``begin`` returned; ``{url}`` for the API service's address;
``{k0}`` for the idempotency key the first ``stage-api`` answered.

Kinds of step:
  ``commit=tN``  the step commits tN: its answer on stdout is the acknowledgement (a crash
                 after it must find tN committed);
  ``env``        extra environment (a crash point: the step is killed there, exit 137).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

A2PC = [sys.executable, "-m", "agent_2pc"]


@dataclass
class Step:
    args: list[str]
    commit: str | None = None  # "t0": this step commits the first begun transaction
    env: dict[str, str] = field(default_factory=dict)
    stdin: bytes | None = None
    expect: tuple[int, ...] = (0,)
    inject: str | None = None  # strace -e inject=...: a system call that fails for real


@dataclass
class Workload:
    name: str
    about: str
    files: dict[str, bytes | str] = field(default_factory=dict)  # the tree before
    modes: dict[str, int] = field(default_factory=dict)
    before: list[Step] = field(default_factory=list)  # run untraced, after init
    steps: list[Step] = field(default_factory=list)
    service: bool = False  # run tests/api_server.py's payment service
    mounts: tuple[str, ...] = ()  # directories that are another file system (tmpfs)
    env: dict[str, str] = field(default_factory=dict)  # for every step
    extra_files: dict[str, bytes] = field(default_factory=dict)  # outside the root (inputs)


def _w(tid: str, path: str, content: str, *extra: str) -> Step:
    return Step(["stage-write", "--tid", "{" + tid + "}", "--path", path, "--content", content,
                 *extra])


def _commit(tid: str, **kw: object) -> Step:
    return Step(["commit", "--tid", "{" + tid + "}"], commit=tid, **kw)  # type: ignore[arg-type]


BEGIN = Step(["begin"])

BIG = bytes((i * 7 + i // 251) % 256 for i in range(200 * 1024))  # 200 KiB, not inline
HUGE = (BIG * 21)[:(4 << 20) + 4096]  # past blobs.COPY_MIN: copied by the kernel

_MANY_FILES = {f"src/m{i:02d}.py": f"# module {i}\nVALUE = {i}\n" for i in range(20)}
_MANY_FILES.update({f"old/o{i:02d}.txt": f"old {i}\n" for i in range(12)})
_MANY_FILES.update({"replace_me/a.txt": "a\n", "replace_me/sub/b.txt": "b\n",
                    "becomes_dir": "a file that becomes a directory\n",
                    "keep.txt": "untouched\n"})

# One exec: 20 modified files, 10 created (3 of them large), 12 deleted (their directory goes),
# a directory replaced by a file, a file replaced by a directory, a symbolic link, an empty
# directory -- 50 changes.
_MANY_SCRIPT = " && ".join([
    "for i in $(seq -w 0 19); do echo \"VALUE = $i + 1\" >> src/m$i.py; done",
    "for i in $(seq -w 0 6); do mkdir -p new/d$i && echo new $i > new/d$i/f.txt; done",
    "for i in 0 1 2; do head -c 70000 /dev/urandom > new/big$i.bin; done",
    "rm -r old",
    "rm -r replace_me && echo 'now a file' > replace_me",
    "rm becomes_dir && mkdir becomes_dir && echo inside > becomes_dir/x.txt",
    "ln -s src/m00.py link_to_m00",
    "mkdir empty_dir",
])


# 12 changes: 6 new files (3 with one content: copied), a big one (a blob synced at prepare,
# moved at apply), a rewrite made executable, two deletes (their directory goes).
_BIG_SCRIPT = " && ".join([
    "mkdir -p lib/x lib/y",
    "for i in 1 2 3; do echo own $i > lib/x/f$i.txt; echo same > lib/y/s$i.txt; done",
    "head -c 30000 /dev/urandom > lib/big.bin",
    "echo 'X = 2' > mod.py && chmod 755 mod.py",
    "rm -r old",
])


def all_workloads() -> dict[str, Workload]:
    ws = [
        Workload("small", "a commit of two small files (they travel in the decision), then "
                 "the next one (its decision's fsync carries the first one's end record)",
                 files={"a.txt": "hello\n"},
                 steps=[BEGIN, _w("t0", "a.txt", "hello, world\n"),
                        _w("t0", "b/new.txt", "created\n", "--mode", "0600"), _commit("t0"),
                        BEGIN, _w("t1", "c.txt", "next\n"), _commit("t1")]),
        Workload("large", "one commit of two 200 KiB files, one into new directories (synced "
                 "as blobs at prepare, moved into the tree at apply)",
                 files={"data.bin": b"old\n"},
                 extra_files={"big.bin": BIG, "big2.bin": BIG[::-1]},
                 steps=[BEGIN, Step(["stage-write", "--tid", "{t0}", "--path", "data.bin",
                                     "--from-file", "{extra}/big.bin", "--mode", "0755"]),
                        Step(["stage-write", "--tid", "{t0}", "--path", "new/deep/big.bin",
                              "--from-file", "{extra}/big2.bin"]),
                        _commit("t0")]),
        Workload("huge", "one commit of a file of 4 MiB and more (copied into the store by "
                 "copy_file_range, hashed beside the copy, its writeback started early)",
                 files={"data.bin": b"old\n"}, extra_files={"huge.bin": HUGE},
                 steps=[BEGIN, Step(["stage-write", "--tid", "{t0}", "--path", "data.bin",
                                     "--from-file", "{extra}/huge.bin"]), _commit("t0")]),
        Workload("many", "one commit of 50 changes made by exec: writes, creates, deletes, a "
                 "directory replaced by a file and a file by a directory, a link",
                 files=dict(_MANY_FILES),
                 steps=[BEGIN, Step(["exec", "--tid", "{t0}", "--json", "--", "sh", "-c",
                                     _MANY_SCRIPT]), _commit("t0")]),
        Workload("bigtree", "one commit of more changes than durable.SYNCFS_MIN (set to 8 "
                 "here) made by exec: files synced by one syncfs before the renames and one "
                 "before the end record instead of an fsync each; copies of a shared blob, "
                 "a blob moved, a mode, deletes",
                 files={"old/a.txt": "a\n", "old/b.txt": "b\n", "mod.py": "X = 1\n"},
                 env={"AGENT2PC_SYNCFS_MIN": "8"},
                 steps=[BEGIN, Step(["exec", "--tid", "{t0}", "--json", "--", "sh", "-c",
                                     _BIG_SCRIPT]), _commit("t0")]),
        Workload("api", "one commit of a file and an HTTP call (with its compensation)",
                 files={"ledger.txt": "balance 0\n"}, service=True,
                 steps=[BEGIN, _w("t0", "ledger.txt", "balance 500\n"),
                        Step(["stage-api", "--tid", "{t0}", "--method", "POST", "--url",
                              "{url}/charges", "--body", '{"amount": 500}',
                              "--compensate-method", "POST", "--compensate-url",
                              "{url}/refunds", "--compensate-body", '{"amount": 500}']),
                        _commit("t0")]),
        Workload("compact", "compaction: two finished transactions move to history.jsonl while "
                 "a third stays live, then commits",
                 files={"a.txt": "0\n"},
                 before=[BEGIN, _w("t0", "a.txt", "1\n"), _commit("t0"),
                         BEGIN, _w("t1", "a.txt", "2\n"), _commit("t1"),
                         BEGIN, _w("t2", "b.txt", "live\n")],
                 steps=[Step(["compact"]), _commit("t2")]),
        Workload("gc", "garbage collection: pre-images and unnamed blobs go to trash/ and are "
                 "deleted by the background sweeper, while a live transaction keeps its blob",
                 files={"a.txt": "0\n", "big.txt": "x" * 20000},
                 env={"AGENT2PC_PREIMAGE_RETENTION_S": "0", "AGENT2PC_BLOB_GRACE_S": "0"},
                 before=[BEGIN, _w("t0", "a.txt", "1\n"), _w("t0", "big.txt", "y" * 20000),
                         _commit("t0"), BEGIN, _w("t1", "c.txt", "z" * 30000)],
                 steps=[Step(["compact"]), _commit("t1")]),
        Workload("crossdev", "a commit into a directory that is another file system (tmpfs): "
                 "prepare places the content next to the target",
                 files={"mnt/keep.txt": "on tmpfs\n", "a.txt": "root\n"}, mounts=("mnt",),
                 steps=[BEGIN, _w("t0", "mnt/keep.txt", "changed on tmpfs\n"),
                        _w("t0", "mnt/new/deep.txt", "x" * 10000),
                        _w("t0", "a.txt", "root 2\n"), _commit("t0")]),
        Workload("fsyncgate", "the commit decision's fsync fails (EIO, injected by strace into "
                 "the real system call): the commit answers io_error, and what the failed fsync "
                 "was to sync may be lost at any later crash, even after later fsyncs succeed; "
                 "then recover and the next commit",
                 files={"a.txt": "a\n"},
                 steps=[BEGIN, _w("t0", "a.txt", "A\n"),
                        Step(["commit", "--tid", "{t0}"], expect=(2,),
                             inject="fsync:error=EIO:when=1"),
                        Step(["recover"]), BEGIN, _w("t1", "b.txt", "b\n"), _commit("t1")]),
        Workload("recovery", "a commit killed after its first file operation (a process crash: "
                 "the page cache keeps everything), then recover, then the next commit -- "
                 "crash states of recovery itself and of what it left unsynced",
                 files={"a.txt": "a\n", "b.txt": "b\n", "c/d.txt": "d\n"},
                 steps=[BEGIN, _w("t0", "a.txt", "A\n"), _w("t0", "b.txt", "B\n"),
                        _w("t0", "c/d.txt", "D" * 12000), Step(
                            ["commit", "--tid", "{t0}"], env={
                                "AGENT2PC_CRASH_AT": "commit.mid_apply:2"}, expect=(137,)),
                        Step(["recover"]), BEGIN, _w("t1", "e.txt", "e\n"), _commit("t1")]),
    ]
    return {w.name: w for w in ws}


def make_tree(w: Workload, root: str) -> None:
    for rel, data in w.files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(path, w.modes.get(rel, 0o644))


def mount_tmpfs(path: str) -> None:
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "crashsim", path], check=True,
                   timeout=30)
