"""Explore crash states: ``python -m crashsim`` (from tests/, or with PYTHONPATH=tests).

    python -m crashsim                       # every workload, both models, the CI budget
    python -m crashsim --full                # every state the models generate (by hand)
    python -m crashsim -w small -m posix --budget 50 --seed 7 --keep-failures /tmp/cs-fail

It re-runs itself in a private mount namespace (``unshare -m``): the states are checked on a
tmpfs, and with another boot id bind-mounted over /proc/sys/kernel/random/boot_id, because a
machine crash is a reboot (agent-2pc aborts transactions begun before one). Prints a JSON
report (``--json FILE`` writes it) and a table; exits 1 when any state violates an invariant.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

CI_BUDGET = 40  # states checked per workload and model in CI
NS_FLAG = "CRASHSIM_IN_NAMESPACE"


def main(argv: list[str] | None = None) -> int:
    from .models import MODELS
    from .workloads import all_workloads

    p = argparse.ArgumentParser(prog="crashsim")
    p.add_argument("-w", "--workload", action="append", choices=sorted(all_workloads()))
    p.add_argument("-m", "--model", action="append", choices=sorted(MODELS))
    p.add_argument("--budget", type=int, default=CI_BUDGET,
                   help="states checked per workload and model (sampled with --seed)")
    p.add_argument("--per-point", type=int, default=64,
                   help="states generated per crash point before sampling")
    p.add_argument("--full", action="store_true", help="check every state generated")
    p.add_argument("--rank-max", type=int, default=None,
                   help="only states of this rank or lower (0: only what was synced survives; "
                        "1: also one file's or directory's unsynced tail lost; models.RANKS)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the report here")
    p.add_argument("--keep-failures", help="copy violating states (before recover) here")
    p.add_argument("--self-test", action="store_true",
                   help="check that planted violations are reported (selftest.py)")
    args = p.parse_args(argv)
    if os.environ.get(NS_FLAG) != "1":
        env = {**os.environ, NS_FLAG: "1"}
        cmd = ["unshare", "-m", "--propagation", "private", sys.executable, "-m", "crashsim",
               *(argv if argv is not None else sys.argv[1:])]
        return subprocess.run(cmd, env=env, check=False).returncode
    if args.self_test:
        from . import selftest

        _reboot()
        os.environ["AGENT2PC_SAFE_DIRECTORY"] = "*"  # as in _run
        problems = selftest.run()
        print("\n".join(problems) or "self-test: every planted violation was reported")
        return 1 if problems else 0
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from . import check, explore
    from .models import MODELS
    from .workloads import all_workloads

    workloads = [all_workloads()[n] for n in (args.workload or sorted(all_workloads()))]
    names = args.model or sorted(MODELS)
    budget = 10**9 if args.full else args.budget
    per_point = 4096 if args.full else args.per_point
    work = tempfile.mkdtemp(prefix="crashsim-", dir="/var/tmp")
    report = {"seed": args.seed, "budget": None if args.full else budget,
              "per_point": per_point, "results": []}
    failed = False
    t0 = time.monotonic()
    recordings = {}
    for w in workloads:
        t1 = time.monotonic()
        recordings[w.name] = explore.record(w, os.path.join(work, w.name))
        print(f"recorded {w.name}: {recordings[w.name].calls} calls, "
              f"{len(recordings[w.name].ops)} operations, {time.monotonic() - t1:.1f} s",
              file=sys.stderr, flush=True)
    _reboot()
    # A state is materialized in another directory than the one its workspace was made in
    # (another inode of .agent-tx/): a machine crash keeps the inode, so this is no move.
    os.environ["AGENT2PC_SAFE_DIRECTORY"] = "*"
    scratch = os.path.join(work, "scratch")
    os.makedirs(scratch)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4g", "crashsim", scratch], check=True)
    check.warm_up()
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, tests_dir)
    for w in workloads:
        for name in names:
            res = explore.explore(recordings[w.name], MODELS[name], budget=budget,
                                  seed=args.seed, scratch=scratch, per_point_max=per_point,
                                  keep_failures=args.keep_failures, rank_max=args.rank_max)
            report["results"].append(res.to_json())  # type: ignore[union-attr]
            failed |= bool(res.violations)
            print(f"{w.name:9} {name:6} ops {res.ops:4}  points {res.crash_points:3}  "
                  f"generated {res.generated:6}  unique {res.unique:5}  checked "
                  f"{res.checked:5}  violations {len(res.violations):3}  "
                  f"{f'refused {res.refusals}  ' if res.refusals else ''}"
                  f"{res.seconds:6.1f} s", file=sys.stderr, flush=True)
            for v in res.violations[:3]:
                print("   ", json.dumps(v.to_json())[:1500], file=sys.stderr)
    report["seconds"] = round(time.monotonic() - t0, 1)
    text = json.dumps(report, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)
    subprocess.run(["umount", "-l", scratch], check=False)
    subprocess.Popen(["rm", "-rf", work])
    return 1 if failed else 0


def _reboot() -> None:
    """From here on this namespace sees another boot of the machine."""
    fake = tempfile.NamedTemporaryFile("w", delete=False, prefix="boot_id-")
    fake.write(str(uuid.uuid4()) + "\n")
    fake.close()
    subprocess.run(["mount", "--bind", fake.name, "/proc/sys/kernel/random/boot_id"],
                   check=True)


if __name__ == "__main__":
    sys.exit(main())
