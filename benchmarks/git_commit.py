#!/usr/bin/env python3
"""``agent-2pc git-commit`` of one file against ``git add F && git commit -m M``, by repository
size (issue 13).

For each size N (files in a repository of 100 files a directory, committed once), in one fresh
repository that is also an agent-2pc workspace, repeated: stage one changed file in a
transaction (not timed) and time ``agent-2pc git-commit --tid T -m M`` in a child process; then
change another file and time ``sh -c 'git add F && git commit -q -m M'`` in a child process.
Both commit one file on top of the same branch. ``ratio`` is git-commit's median over git's;
the growth from the smallest to the largest N shows the cost per file of the repository
(git-commit reads the branch's tree into a temporary index: O(tree) in git's C code, the rest
O(changed files)).

Target (issue 13): git-commit within 1.5x of git's own at 20k files.

    python benchmarks/git_commit.py                  # N = 1000, 20000
    python benchmarks/git_commit.py --smoke          # CI
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

from _common import BenchDir, bytecode_env, emit, log, machine, ratio, time_run, venv_python
from _common import wall_summary as summary

GIT_ENV = {"GIT_AUTHOR_NAME": "Bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
           "GIT_COMMITTER_NAME": "Bench", "GIT_COMMITTER_EMAIL": "bench@example.com",
           "GIT_CONFIG_NOSYSTEM": "1"}


def make_repo(path: str, n: int, env: dict) -> None:
    os.makedirs(path)
    for i in range(n):
        d = os.path.join(path, f"d{i // 100:04d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:06d}.txt"), "w") as f:
            f.write(f"file {i}\n")
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "."],
                 ["git", "commit", "-q", "-m", "init"]):
        subprocess.run(argv, cwd=path, env=env, check=True)


def one_size(n: int, reps: int, python: str, env: dict) -> dict:
    with BenchDir(f"git-{n}") as d:
        repo = os.path.join(d.path, "repo")
        make_repo(repo, n, env)
        cli = [python, "-m", "agent_2pc", "--root", repo]
        subprocess.run([*cli, "init"], env=env, check=True, stdout=subprocess.DEVNULL)
        ours, theirs = [], []
        for r in range(reps):
            out = subprocess.run([*cli, "begin", "--json"], env=env, check=True,
                                 capture_output=True, text=True).stdout
            tid = json.loads(out)["tid"]
            subprocess.run([*cli, "stage-write", "--tid", tid, "--path", "d0000/f000000.txt",
                            "--content", f"agent {r}\n"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            ours.append(time_run([*cli, "git-commit", "--tid", tid, "-m", f"agent {r}"], env))
            rel = "d0000/f000001.txt"
            with open(os.path.join(repo, rel), "w") as f:
                f.write(f"user {r}\n")
            theirs.append(time_run(["sh", "-c", f"cd '{repo}' && git add {rel} && "
                                    f"git commit -q -m 'user {r}'"], env))
        lib = library_times(python, repo, reps, env)
        a, b, c = summary(ours), summary(theirs), summary(lib)
        log(f"N={n}: git-commit {a['median_ms']} ms (in-process {c['median_ms']} ms), "
            f"git add+commit {b['median_ms']} ms")
        return {"files": n, "git_commit": a, "git_add_commit": b, "library_git_commit": c,
                "ratio": ratio(a["median_ms"], b["median_ms"]),
                "library_ratio": ratio(c["median_ms"], b["median_ms"])}


# The library's git_commit in one long-lived process (what the MCP server, a harness using the
# library, or a daemon pays): no interpreter start per step.
_LIBRARY = """
import json, sys, time
from agent_2pc import Agent2PC
client = Agent2PC(sys.argv[1])
times = []
for r in range(int(sys.argv[2])):
    tx = client.begin()
    tx.stage_write("d0000/f000002.txt", f"library {r}\\n")
    t0 = time.perf_counter()
    tx.git_commit(f"library {r}")
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""


def library_times(python: str, repo: str, reps: int, env: dict) -> list[float]:
    out = subprocess.run([python, "-c", _LIBRARY, repo, str(reps)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return [float(t) for t in json.loads(out)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,20000")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    sizes = [100, 300] if args.smoke else [int(s) for s in args.sizes.split(",")]
    reps = 2 if args.smoke else args.reps
    python = venv_python()
    env = {**bytecode_env(python), **GIT_ENV}
    rows = [one_size(n, reps, python, env) for n in sizes]
    first, last = rows[0], rows[-1]
    growth = {"files": [first["files"], last["files"]],
              "git_commit_ms": [first["git_commit"]["median_ms"],
                                last["git_commit"]["median_ms"]],
              "git_add_commit_ms": [first["git_add_commit"]["median_ms"],
                                    last["git_add_commit"]["median_ms"]],
              "library_git_commit_ms": [first["library_git_commit"]["median_ms"],
                                        last["library_git_commit"]["median_ms"]]}
    emit({"benchmark": "git_commit", "sizes": rows, "growth": growth,
          "target": "git-commit <= 1.5x git add && git commit at 20k files",
          "machine": machine()}, smoke=args.smoke)


if __name__ == "__main__":
    main()
