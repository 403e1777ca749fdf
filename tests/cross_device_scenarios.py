"""Scenarios of test_cross_device.py, run inside a private mount namespace in which ``ROOT/mnt``
is a tmpfs: another file system than ``ROOT/.agent-tx``. Prints one JSON object.

    cross_device_scenarios.py ROOT SCENARIO
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from agent_2pc import Agent2PC, TransactionAborted


def tree(root: str) -> dict[str, object]:
    """Every path (file content and mode, link target, directory) but .git and .agent-tx."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in (".git", ".agent-tx")]
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if os.path.islink(path):
                out[rel] = "link:" + os.readlink(path)
            elif os.path.isdir(path):
                out[rel + "/"] = "dir"
            else:
                with open(path, "rb") as f:
                    out[rel] = [f.read().decode(), oct(os.stat(path).st_mode & 0o7777)]
    return out


def placed(root: str) -> list[str]:
    return sorted(rel for rel in tree(root) if os.path.basename(rel).startswith(".agent-2pc-"))


def cli(root: str, *args: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("AGENT2PC_CRASH_AT", None)
    if crash:
        env["AGENT2PC_CRASH_AT"] = crash
    return subprocess.run([sys.executable, "-m", "agent_2pc", "--root", root, "--json", *args],
                          env=env, capture_output=True, text=True, timeout=60)


def stage(root: str) -> str:
    """Writes to the other file system (a new file in a new directory, a changed file with a
    new mode, a link) and to the repo's own, in one transaction."""
    tx = Agent2PC(root).begin()
    tx.stage_write("mnt/new/deep.txt", "deep\n")
    tx.stage_write("mnt/data.txt", "changed\n", mode=0o600)
    tx.stage_write("local.txt", "local changed\n")
    tx.exec(["sh", "-c", "ln -s data.txt mnt/link && mkdir mnt/empty"])
    return tx.tid


def main(root: str, scenario: str) -> dict[str, object]:
    same = os.stat(os.path.join(root, "mnt")).st_dev == os.stat(
        os.path.join(root, ".agent-tx")).st_dev
    out: dict[str, object] = {"other_fs": not same, "before": tree(root)}
    if scenario == "commit":
        tid = stage(root)
        res = Agent2PC(root).get(tid).commit()
        out["files"] = res["files"]
    elif scenario == "api_says_no":  # the files are prepared (placed), then a call is refused
        from api_server import Service

        service = Service()
        try:
            tid = stage(root)
            Agent2PC(root).get(tid).stage_api("POST", f"{service.url}/nowhere", {"x": 1})
            try:
                Agent2PC(root).get(tid).commit()
                out["aborted"] = False
            except TransactionAborted as exc:
                out["aborted"] = True
                out["code"] = exc.code
        finally:
            service.close()
    elif scenario.startswith("crash:"):
        point = scenario.split(":", 1)[1]
        tid = stage(root)
        proc = cli(root, "commit", "--tid", tid, crash=point)
        out["exit"] = proc.returncode
        out["placed_after_crash"] = placed(root)
        if point == "commit.after_decision":  # somebody removes what prepare placed
            for rel in out["placed_after_crash"]:  # type: ignore[union-attr]
                os.unlink(os.path.join(root, rel))
        proc = cli(root, "recover")
        out["recover"] = json.loads(proc.stdout)
    elif scenario.startswith("vote:"):  # voted in one process, decided in another
        outcome = scenario.split(":", 1)[1]
        tid = stage(root)
        coordinator = json.dumps({"gtid": "g-x", "store": "postgresql://h/db"})
        proc = cli(root, "vote", "--tid", tid, "--coordinator", coordinator)
        out["vote"] = json.loads(proc.stdout)
        out["placed_while_in_doubt"] = placed(root)
        out["in_doubt_tree_unchanged"] = {k: v for k, v in tree(root).items()
                                          if k not in out["placed_while_in_doubt"]
                                          } == out["before"]
        out["decide"] = json.loads(cli(root, "decide", "--tid", tid, outcome).stdout)
    elif scenario == "both_names":  # a file system that kept both names of a rename
        from agent_2pc.coordinator.engine import Engine

        tid = stage(root)
        out["exit"] = cli(root, "commit", "--tid", tid, crash="commit.before_end").returncode
        engine = Engine(root, recover_dead=False)
        tx = engine.txs[tid]
        for k, home in tx.decision_fields["placed"].items():
            os.link(os.path.join(root, tx.changes()[int(k)].path),
                    os.path.join(root, home, f".agent-2pc-{tid}-{k}.tmp"), follow_symlinks=False)
        engine.close()
        out["placed_after_crash"] = placed(root)
        out["recover"] = json.loads(cli(root, "recover").stdout)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    out["after"] = tree(root)
    out["placed"] = placed(root)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
