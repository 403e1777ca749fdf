#!/usr/bin/env python3
"""Bundles (and, later, commit-time merges): export and import of a transaction of N files
against ``tar czf`` of the same files, measured in the same run (issue 14).

Section ``bundles``: in workspace A (N source-like files of ~4 KiB, 100 a directory), one
transaction rewrites every file (staged through the library, not timed). Timed, each a child
process as a user runs it: ``agent-2pc export --tid T -o F.a2pc`` (reads the blobs, writes the
gzip'd tar, fsyncs, renames) and ``agent-2pc import F.a2pc`` in workspace B, a copy of A's
tree (verifies every hash, stores the blobs, appends the records; the imported transaction is
aborted between repetitions, untimed, so each import is a new one). Baseline: ``tar czf`` of
the same N new contents (a directory written once, untimed), and its size; ``tar cf`` size for
the uncompressed reference.

The JSON is ``{"benchmark", "sections": {"bundles": {...}}, "machine"}``: other sections (the
merge at commit) are added next to ``bundles``.

    python benchmarks/merge_and_bundles.py               # N = 1000
    python benchmarks/merge_and_bundles.py --smoke       # CI
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess

from _common import BenchDir, bytecode_env, emit, log, machine, ratio, time_run, venv_python
from _common import wall_summary as summary

WORDS = ("self", "value", "result", "items", "config", "return", "index", "count", "name",
         "path", "data", "None", "True", "False", "len", "range", "append", "update")


def source(rng: random.Random, n_bytes: int) -> str:
    """Python-like text: what a coding agent's transaction holds (compresses like code)."""
    lines: list[str] = []
    size = 0
    while size < n_bytes:
        if rng.random() < 0.1:
            line = f"def {rng.choice(WORDS)}_{rng.randrange(1000)}(self, {rng.choice(WORDS)}):"
        else:
            line = ("    " * rng.randint(1, 3) + f"{rng.choice(WORDS)} = "
                    f"{rng.choice(WORDS)}.{rng.choice(WORDS)}({rng.randrange(100)})")
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


def make_tree(root: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    rels = []
    for i in range(n):
        rel = f"pkg{i // 100:03d}/mod{i:05d}.py"
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(source(rng, 4096))
        rels.append(rel)
    return rels


def bundles(n: int, reps: int, python: str, env: dict) -> dict:
    from agent_2pc import Agent2PC

    with BenchDir(f"bundles-{n}") as d:
        a, b, new = (os.path.join(d.path, x) for x in ("a", "b", "new"))
        rels = make_tree(a, n, seed=1)
        shutil.copytree(a, b)
        make_tree(new, n, seed=2)  # the transaction's contents, also tar's input
        cli = [python, "-m", "agent_2pc"]
        for root in (a, b):
            subprocess.run([*cli, "--root", root, "init"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        client = Agent2PC(a)
        try:
            tx = client.begin(label="bench")
            for rel in rels:
                with open(os.path.join(new, rel), "rb") as f:
                    tx.stage_write(rel, f.read())
        finally:
            client.close()
        bundle = os.path.join(d.path, "t.a2pc")
        exports, imports, tars = [], [], []
        for _ in range(reps):
            exports.append(time_run([*cli, "--root", a, "export", "--tid", tx.tid, "-o",
                                     bundle], env))
            imports.append(time_run([*cli, "--root", b, "import", bundle], env))
            out = subprocess.run([*cli, "--root", b, "list", "--state", "active", "--json"],
                                 env=env, check=True, capture_output=True, text=True).stdout
            for row in json.loads(out)["transactions"]:
                subprocess.run([*cli, "--root", b, "abort", "--tid", row["tid"]], env=env,
                               check=True, stdout=subprocess.DEVNULL)
            tars.append(time_run(["tar", "czf", os.path.join(d.path, "t.tgz"), "-C", new,
                                  "."], env))
        subprocess.run(["tar", "cf", os.path.join(d.path, "t.tar"), "-C", new, "."], env=env,
                       check=True)
        sizes = {"bundle_bytes": os.path.getsize(bundle),
                 "tar_czf_bytes": os.path.getsize(os.path.join(d.path, "t.tgz")),
                 "tar_cf_bytes": os.path.getsize(os.path.join(d.path, "t.tar")),
                 "content_bytes": sum(os.path.getsize(os.path.join(new, r)) for r in rels)}
        e, i, t = summary(exports), summary(imports), summary(tars)
        log(f"N={n}: export {e['median_ms']} ms, import {i['median_ms']} ms, tar czf "
            f"{t['median_ms']} ms; bundle {sizes['bundle_bytes']} B, tgz "
            f"{sizes['tar_czf_bytes']} B")
        return {"files": n, "export": e, "import": i, "tar_czf": t, **sizes,
                "export_over_tar_czf": ratio(e["median_ms"], t["median_ms"]),
                "import_over_tar_czf": ratio(i["median_ms"], t["median_ms"]),
                "bundle_over_tgz_bytes": ratio(sizes["bundle_bytes"],
                                               sizes["tar_czf_bytes"]),
                "disk": d.describe(probe=False)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    n = 50 if args.smoke else args.files
    reps = 1 if args.smoke else args.reps
    python = venv_python()
    env = bytecode_env(python)
    sections = {"bundles": bundles(n, reps, python, env)}
    emit({"benchmark": "merge_and_bundles", "sections": sections,
          "note_bundles": "export and import are CLI processes (start-up included); tar czf "
                          "is one process over the same files",
          "machine": machine()}, smoke=args.smoke)


if __name__ == "__main__":
    main()
