"""The scenario of test_fsync_failures.py, run inside a private mount namespace in which
``ROOT/mnt`` is a tmpfs. Prints one JSON object.

    fsync_scenarios.py ROOT record                  which step passes which fault site
    fsync_scenarios.py ROOT clean                   the scenario without a fault
    fsync_scenarios.py ROOT fault STEP SPEC         AGENT2PC_FAULT_AT=SPEC in step STEP, then
                                                    recover and a new transaction

Steps run the CLI as a user runs it (agent_2pc.cli.main.main) in a child forked from this
process (a fork is a millisecond; the fault is armed in the child as the environment would arm
it); the step that makes a torn tail is a real process killed at wal.torn_append.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from crashkit import snapshot  # noqa: E402

from agent_2pc import faults  # noqa: E402
from agent_2pc.storage import wal_format  # noqa: E402

BIG = bytes(range(256)) * 400  # 100 KiB: a blob synced at prepare, moved at apply
BIG2 = bytes(reversed(range(256))) * 400
HUGE = bytes(range(256)) * (4 << 12) + b"tail"  # 4 MiB and more: copied by the kernel while
#                                                 a thread hashes it (blobs.COPY_MIN)


def steps(extra: str) -> list[tuple[str, list[str], dict[str, str]]]:
    """(label, arguments, environment of a real process or {}) of every step."""
    return [
        ("init", ["init"], {}),
        ("begin t0", ["begin"], {}),
        ("stage small", ["stage-write", "--tid", "{t0}", "--path", "small.txt", "--content",
                         "new small\n", "--mode", "0600"], {}),
        ("stage dup1", ["stage-write", "--tid", "{t0}", "--path", "dup1.txt", "--content",
                        "same\n"], {}),
        ("stage dup2", ["stage-write", "--tid", "{t0}", "--path", "dup2.txt", "--content",
                        "same\n"], {}),
        ("stage big", ["stage-write", "--tid", "{t0}", "--path", "big.bin", "--from-file",
                       f"{extra}/big.bin"], {}),
        ("stage big2", ["stage-write", "--tid", "{t0}", "--path", "new/dir/big2.bin",
                        "--from-file", f"{extra}/big2.bin"], {}),
        ("stage huge", ["stage-write", "--tid", "{t0}", "--path", "huge.bin", "--from-file",
                        f"{extra}/huge.bin"], {}),
        ("edit huge", ["stage-replace", "--tid", "{t0}", "--path", "huge.bin", "--old",
                       "tail", "--new", "TAIL"], {}),
        ("stage mnt", ["stage-write", "--tid", "{t0}", "--path", "mnt/m.txt", "--content",
                       "on tmpfs, changed\n"], {}),
        ("commit t0", ["commit", "--tid", "{t0}"], {}),
        ("begin t1", ["begin"], {}),
        ("stage t1", ["stage-write", "--tid", "{t1}", "--path", "t1.txt", "--content",
                      "t1\n"], {}),
        ("export t1", ["export", "--tid", "{t1}", "-o", f"{extra}/t1.a2pc"], {}),
        ("torn tail", ["begin"], {"AGENT2PC_CRASH_AT": "wal.torn_append"}),
        ("commit t1", ["commit", "--tid", "{t1}"], {}),
        ("compact", ["compact"], {}),
        # A big transaction (past durable.SYNCFS_MIN changes): its commit syncs each file
        # system once instead of each file (the syncfs sites).
        ("begin t2", ["begin"], {}),
        ("exec t2", ["exec", "--tid", "{t2}", "--json", "--", "sh", "-c", MANY], {}),
        ("commit t2", ["commit", "--tid", "{t2}"], {}),
    ]


# 70 files of their own, 3 of the same content (copied at apply), one past the inline limit.
MANY = ("mkdir -p many/a many/b && for i in $(seq 1 70); do printf '%0900d\\n' $i > "
        "many/a/f$i.txt; done && for i in 1 2 3; do echo same > many/b/s$i.txt; done && "
        "printf '%020000d' 7 > many/b/big.txt")


def fork_cli(root: str, args: list[str], fault: str = "") -> tuple[int, str, str]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                faults.arm(fault)
                from agent_2pc.cli.main import main

                code = main(["--root", root, *args, "--json"])
                sys.stdout.flush()
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return (os.waitstatus_to_exitcode(status), out.read().decode(),
                err.read().decode())


def real_cli(root: str, args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    full.update(env)
    proc = subprocess.run([sys.executable, "-m", "agent_2pc", "--root", root, *args, "--json"],
                          env=full, capture_output=True, text=True, timeout=60, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def log_view(root: str) -> dict[str, object]:
    path = os.path.join(root, ".agent-tx", "wal.bin")
    try:
        with open(path, "rb") as f:
            dec = wal_format.decode(f.read())
    except FileNotFoundError:  # init failed before it made the log
        return {"damage": "missing", "ino": None, "unsynced_mark": False}
    return {"damage": None if dec.damage is None else dec.damage.reason,
            "ino": os.stat(path).st_ino,
            "unsynced_mark": os.path.exists(path + ".unsynced")}


def main(root: str, mode: str, fault_step: int = -1, spec: str = "") -> dict[str, object]:
    extra = tempfile.mkdtemp()
    for name, data in (("big.bin", BIG), ("big2.bin", BIG2), ("huge.bin", HUGE)):
        with open(os.path.join(extra, name), "wb") as f:
            f.write(data)
    import agent_2pc.cli.commands  # noqa: F401  (warm: children fork from here)
    import agent_2pc.coordinator.client  # noqa: F401

    ctx: dict[str, str] = {}
    out: dict[str, object] = {"other_fs": os.stat(os.path.join(root, "mnt")).st_dev
                              != os.stat(root).st_dev, "steps": [], "trees": {}}
    out["initial"] = _tree(root)
    record = os.path.join(extra, "sites")
    sites: dict[str, int] = {}
    for i, (label, args, env) in enumerate(steps(extra)):
        args = [a.format(**ctx) for a in args]
        if env:
            code, stdout, stderr = real_cli(root, args, env)
        elif mode == "record":
            open(record, "w").close()
            code, stdout, stderr = fork_cli(root, args, f"record:{record}")
            with open(record) as f:
                for site in f.read().split():
                    sites.setdefault(site, i)
        else:
            code, stdout, stderr = fork_cli(root, args, spec if i == fault_step else "")
        step = {"label": label, "exit": code, "stdout": stdout, "stderr": stderr[-3000:]}
        out["steps"].append(step)  # type: ignore[union-attr]
        if label.startswith("begin") and code == 0:
            ctx[label.split()[1]] = json.loads(stdout)["tid"]
        if label.startswith("commit") and code == 0:
            out["trees"][label] = _tree(root)  # type: ignore[index]
        if i == fault_step:
            out["log_after_fault"] = log_view(root)
            out["blobs_after_fault"] = _blobs(root)
            break
    out["tids"] = ctx
    out["sites"] = sites
    if fault_step == 0:  # init failed: what does the next command say?
        code, stdout, stderr = fork_cli(root, ["status"])
        out["next"] = {"exit": code, "stdout": stdout, "stderr": stderr[-3000:]}
        return out
    out["before_recover"] = _tree(root)
    code, stdout, stderr = fork_cli(root, ["recover"])
    out["recover"] = {"exit": code, "stdout": stdout, "stderr": stderr[-3000:]}
    out["log_after_recover"] = log_view(root)
    code, stdout, _ = fork_cli(root, ["list"])
    out["states"] = {r["tid"]: r["state"] for r in json.loads(stdout)["transactions"]}
    out["after"] = _tree(root)
    out["objects"] = sorted(os.listdir(os.path.join(root, ".agent-tx", "objects", "tmp")))
    code, stdout, _ = fork_cli(root, ["begin"])
    tid = json.loads(stdout)["tid"]
    fork_cli(root, ["stage-write", "--tid", tid, "--path", "probe.txt", "--content", "p\n"])
    code, stdout, stderr = fork_cli(root, ["commit", "--tid", tid])
    out["probe"] = {"exit": code, "stdout": stdout, "stderr": stderr[-2000:]}
    out["log_after_probe"] = log_view(root)
    return out


def _blobs(root: str) -> list[str]:
    objects = os.path.join(root, ".agent-tx", "objects")
    return sorted(name for fan in os.listdir(objects) if len(fan) == 2
                  for name in os.listdir(os.path.join(objects, fan)))


def _tree(root: str) -> dict[str, object]:
    return {k: [_text(v[0]), v[1]] if isinstance(v, tuple) else v
            for k, v in snapshot(root).items()}


def _text(data: bytes) -> str:
    """A file's content as JSON can carry it: a big one by its hash."""
    if len(data) > 1 << 20:
        import hashlib

        return "sha256:" + hashlib.sha256(data).hexdigest()
    return data.decode("latin-1")


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(args[0], args[1], int(args[2]) if len(args) > 2 else -1,
                          args[3] if len(args) > 3 else "")))
