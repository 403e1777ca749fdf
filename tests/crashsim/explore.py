"""Record a workload, generate its crash states under a model, check each one.

``record`` runs the workload for real (each step under strace), remembering the tree after
each commit, the transactions' ids, when each commit was acknowledged, and the API service's
state after each request. ``explore`` materializes crash states (models.py) one by one in a
scratch directory, runs ``recover`` and then a new transaction there, and checks:

  recover      exits 0 and the log reads clean afterwards (a torn tail is cut, nothing
               else is damaged), and every transaction the durable log named is still known
               (in the log or in history.jsonl): no record lost silently;
  decisions    a transaction is committed after recovery exactly when a commit decision was
               durable; nothing is left in flight; an acknowledged commit (its ``committed``
               answer was printed before the crash) is committed;
  the tree     is exactly the tree of the real run after the same number of commits (files,
               modes, links, directories; no temp file, no wrong content);
  the fence    an intent whose effect the service recorded is never executed again, a
               committed transaction's call happened exactly once, an aborted one's did not
               or was compensated exactly once (or is reported uncompensated), and an intent
               the fence had recorded as done stays done with the same certificate;
  next steps   a new transaction commits.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from . import check, fsmodel, models, trace
from .workloads import A2PC, Step, Workload, make_tree, mount_tmpfs

UMASK = 0o022


@dataclass
class Recording:
    workload: Workload
    root: str
    initial: fsmodel.Fs
    ops: list[fsmodel.Op]
    tids: list[str]
    trees: list[dict[str, tuple[str, ...]]]  # the tree after 0, 1, 2... commits
    commit_order: list[str]
    acks: dict[str, int]  # tid -> index of the mark op of its "committed" answer
    keys: list[str] = field(default_factory=list)
    service_history: list[dict[str, object]] = field(default_factory=list)
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    calls: int = 0


@dataclass
class Violation:
    workload: str
    model: str
    state: int
    what: list[str]
    why: str
    window: tuple[int, int]
    service_k: int | None = None
    kept_last: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"workload": self.workload, "model": self.model, "state": self.state,
                "what": self.what, "why": self.why, "crash_window": list(self.window),
                "service_requests": self.service_k, "around": self.kept_last}


def _subst(args: list[str], ctx: dict[str, str]) -> list[str]:
    out = []
    for a in args:
        for k, v in ctx.items():
            a = a.replace("{" + k + "}", v)
        out.append(a)
    return out


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT2PC_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["AGENT2PC_API_TIMEOUT_S"] = "5"
    env.update(extra)
    return env


def _committed(root: str) -> set[str]:
    """Transactions whose end record says committed (read from the files: a command would
    finish what a killed step left, outside the trace)."""
    view = check.LogView(root)
    return {t for t, s in view.ended.items() if s == "committed"} | {
        t for t, s in view.history.items() if s == "committed"}


def record(w: Workload, workdir: str) -> Recording:
    """Run ``w`` for real in ``workdir``; every traced step under strace."""
    root = os.path.join(workdir, "root")
    extra = os.path.join(workdir, "extra")
    os.makedirs(root)
    os.makedirs(extra)
    for name, data in w.extra_files.items():
        with open(os.path.join(extra, name), "wb") as f:
            f.write(data)
    for m in w.mounts:
        mount_tmpfs(os.path.join(root, m))
    make_tree(w, root)
    old = os.umask(UMASK)
    service = None
    try:
        ctx: dict[str, str] = {"extra": extra}
        if w.service:
            sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            from api_server import Service

            service = Service()
            ctx["url"] = service.url
        env = _env(w.env)
        subprocess.run([*A2PC, "--root", root, "init", "--json"], check=True, env=env,
                       capture_output=True, timeout=60)
        tids: list[str] = []
        keys: list[str] = []
        for step in w.before:
            _run_step(step, root, ctx, env, tids, keys, None)
        os.sync()
        initial = fsmodel.snapshot(root)
        interp = fsmodel.Interpreter(initial, umask=UMASK, http_ports=(
            (int(ctx["url"].rsplit(":", 1)[1]),) if service else ()))
        rec = Recording(w, root, initial, interp.ops, tids, [check.tree_view(root)], [], {},
                        keys, env=dict(w.env))
        committed = _committed(root)
        for step in w.steps:
            with tempfile.NamedTemporaryFile(suffix=".trace", dir=workdir) as tf:
                out = _run_step(step, root, ctx, env, tids, keys, tf.name)
                calls = trace.parse(tf.name)
            rec.calls += len(calls)
            interp.feed(calls)
            answer = interp.mark("step_end", args=step.args, out=out)
            if step.commit is not None and '"state": "committed"' in out:
                tid = ctx[step.commit]
                stdout_marks = [op for op in interp.ops[:answer.index]
                                if op.kind == "mark" and op.label == "stdout"]
                rec.acks[tid] = stdout_marks[-1].index
            now = _committed(root)
            for tid in tids:
                if tid in now and tid not in committed:
                    rec.commit_order.append(tid)
                    rec.trees.append(check.tree_view(root))
            committed = now
        rec.ops = interp.ops
        if service is not None:
            rec.service_history = list(service.history)
            rec.port = int(ctx["url"].rsplit(":", 1)[1])
        return rec
    finally:
        os.umask(old)
        if service is not None:
            service.close()


def _run_step(step: Step, root: str, ctx: dict[str, str], env: dict[str, str],
              tids: list[str], keys: list[str], trace_file: str | None) -> str:
    args = [*A2PC, "--root", root, *_subst(step.args, ctx)]
    if "--json" not in args:
        args.append("--json")
    step_env = {**env, **step.env}
    if trace_file is None:
        proc = subprocess.run(args, env=step_env, capture_output=True, timeout=300,
                              input=step.stdin, cwd=root, check=False)
    else:
        proc = trace.run_traced(args, trace_file, cwd=root, env=step_env, stdin=step.stdin,
                                inject=step.inject)
    out = proc.stdout.decode("utf-8", "replace")
    if proc.returncode not in step.expect:
        raise RuntimeError(f"step {step.args} exited {proc.returncode}: {out}\n"
                           f"{proc.stderr.decode('utf-8', 'replace')[-2000:]}")
    if step.args[0] == "begin":
        tid = json.loads(out)["tid"]
        ctx[f"t{len(tids)}"] = tid
        tids.append(tid)
    elif step.args[0] == "stage-api":
        key = json.loads(out)["idempotency_key"]
        ctx[f"k{len(keys)}"] = key
        keys.append(key)
    return out


# -- exploring ----------------------------------------------------------------------------------


@dataclass
class Result:
    workload: str
    model: str
    ops: int
    crash_points: int
    generated: int
    unique: int
    checked: int
    violations: list[Violation]
    seconds: float
    refusals: int = 0

    def to_json(self) -> dict[str, object]:
        return {"workload": self.workload, "model": self.model, "operations": self.ops,
                "crash_points": self.crash_points, "states_generated": self.generated,
                "states_unique": self.unique, "states_checked": self.checked,
                "violations": len(self.violations), "refused_corrupt_wal": self.refusals,
                "seconds": round(self.seconds, 1),
                "examples": [v.to_json() for v in self.violations[:5]],
                "kinds": _kinds(self.violations)}


def _kinds(violations: list[Violation]) -> dict[str, int]:
    """How many violations of each kind (the first words of each finding, ids and paths out)."""
    import re

    out: dict[str, int] = {}
    for v in violations:
        for what in v.what:
            kind = re.sub(r"tx-\d{8}-\d{6}-[0-9a-f]{6}", "TX", what)
            kind = re.sub(r"(/[^ :]+)+", "PATH", kind)[:90]
            out[kind] = out.get(kind, 0) + 1
    return out


def materialize(rec: Recording, st: models.State) -> dict[str, tuple[str, int, bytes | str,
                                                                      int]]:
    fs = rec.initial.clone()
    get = fsmodel._owner(fs)
    for i in sorted(st.kept):
        op = rec.ops[i]
        data = None
        if st.torn is not None and st.torn[0] == i:
            _, n, zero = st.torn
            data = op.data[:n] + (bytes(len(op.data) - n) if zero else b"")
        fsmodel.apply_op(fs, op, own=get, data=data)
    return fsmodel.tree(fs)


def explore(rec: Recording, model: models.Model, *, budget: int, seed: int, scratch: str,
            per_point_max: int = 64, keep_failures: str | None = None,
            rank_max: int | None = None) -> Result:
    """Check up to ``budget`` distinct crash states of ``rec`` under ``model``.

    States are told apart first by what they keep (cheap), then, as they are drawn for
    checking, by the tree they make (two sets of operations can leave the same files): a
    drawn state whose tree was checked already is skipped without counting.
    """
    t0 = time.monotonic()
    gen = models.Generator(rec.ops, model, seed=seed, per_point_max=per_point_max)
    states = gen.states()
    by_kept: dict[tuple[frozenset[int], object], models.State] = {}
    for st in states:
        key = (st.kept, st.torn)
        prev = by_kept.get(key)
        if prev is None:
            by_kept[key] = st
        else:  # the same state seen from another crash point: keep the widest window
            by_kept[key] = models.State(st.kept, st.torn, min(st.c_min, prev.c_min),
                                        max(st.c_max, prev.c_max), prev.why,
                                        min(st.rank, prev.rank), st.lost_unsure)
    order = list(by_kept.values())
    random.Random(seed).shuffle(order)
    order.sort(key=lambda st: st.rank)  # stable: shuffled within a rank
    if rank_max is not None:
        order = [st for st in order if st.rank <= rank_max]
    seen: set[tuple[str, int | None]] = set()
    violations: list[Violation] = []
    refusals = 0
    checked = 0
    for st in order:
        if checked >= budget:
            break
        t = materialize(rec, st)
        d = fsmodel.digest(t)
        for k in _service_variants(rec, st):
            if (d, k) in seen or checked >= budget:
                continue
            seen.add((d, k))
            what = check_one(rec, st, t, k, os.path.join(scratch, f"s{checked}"),
                             keep_failures)
            if what and st.lost_unsure and all("corrupt_wal" in w for w in what):
                # What a failed fsync was to sync is lost in the middle of the log: recover
                # refuses to guess, with the offset (G5), and commits nothing wrong. Expected.
                refusals += 1
            elif what:
                around = [f"{i}:{_op_text(rec.ops[i])}" for i in sorted(st.kept)[-3:]]
                violations.append(Violation(rec.workload.name, model.name, checked, what,
                                            st.why, (st.c_min, st.c_max), k, around))
            checked += 1
    return Result(rec.workload.name, model.name, len(rec.ops), len(gen.points), len(states),
                  len(by_kept), checked, violations, time.monotonic() - t0, refusals)


def _op_text(op: fsmodel.Op) -> str:
    if op.kind == "write":
        return f"write ino {op.ino} at {op.off} ({len(op.data)} bytes)"
    if op.kind in ("link", "unlink"):
        return f"{op.kind} {op.name} (ino {op.ino}) in dir {op.dir}"
    if op.kind == "rename":
        return f"rename {op.name} -> {op.new_name} in dir {op.dir}"
    return f"{op.kind} {op.ino if op.ino is not None else ''} {op.label}".strip()


def _service_variants(rec: Recording, st: models.State) -> list[int | None]:
    if not rec.service_history:
        return [None]
    answered = sum(1 for op in rec.ops[: st.c_min] if op.label == "http_recv")
    sent = sum(1 for op in rec.ops[: st.c_max] if op.label == "http_send")
    return list(range(answered, max(answered, sent) + 1))


_SERVICE: list[object] = []


def _service(rec: Recording) -> object:
    if not _SERVICE:
        from api_server import Service

        _SERVICE.append(Service(port=rec.port))
    return _SERVICE[0]


def check_one(rec: Recording, st: models.State, t: dict[str, tuple[str, int, bytes | str, int]],
              service_k: int | None, root: str, keep_failures: str | None) -> list[str]:
    w = rec.workload
    os.makedirs(root)
    mounted = []
    try:
        for m in w.mounts:
            mount_tmpfs(os.path.join(root, m))
            mounted.append(os.path.join(root, m))
        _write_state(t, root, w.mounts)
        what = _verify(rec, st, root, service_k)
        if what and keep_failures:
            dest = os.path.join(keep_failures, f"{w.name}-{os.path.basename(root)}")
            shutil.rmtree(dest, ignore_errors=True)
            os.makedirs(dest)
            _write_state(t, os.path.join(dest, "before-recover"), ())
            with open(os.path.join(dest, "violations.txt"), "w") as f:
                f.write("\n".join(what) + f"\n\nwhy: {st.why}\nwindow {st.c_min}..{st.c_max}\n")
        return what
    finally:
        for m in reversed(mounted):
            subprocess.run(["umount", "-l", m], check=False, timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _write_state(t: dict[str, tuple[str, int, bytes | str, int]], root: str,
                 mounts: tuple[str, ...]) -> None:
    """Write the tree; directories that are mount points exist (mounted) already."""
    fsmodel.write_out(t, root, exist_ok=set(mounts))


def _verify(rec: Recording, st: models.State, root: str, service_k: int | None) -> list[str]:
    env = dict(rec.env)
    what: list[str] = []
    pre = check.LogView(root)
    fence_pre = {k: check.fence_entry(root, k) for k in rec.keys}
    service = None
    if service_k is not None:
        service = _service(rec)
        service.restore(rec.service_history[service_k])  # type: ignore[attr-defined]
    code, out, err = check.run_cli(root, ["recover"], env)
    if code != 0:
        return [f"recover exited {code}: {out.strip()[:300]} {err.strip()[-600:]}"]
    post = check.LogView(root)
    if post.damage is not None:
        what.append(f"the log is damaged after recover at {post.damage.offset} "
                    f"({post.damage.reason})")
    lost = pre.known() - post.known()
    if lost:
        what.append(f"transactions lost by recover: {sorted(lost)}")
    code, out, err = check.run_cli(root, ["list"], env)
    if code != 0:
        return what + [f"list exited {code}: {out[:300]} {err[-300:]}"]
    states = {r["tid"]: r["state"] for r in json.loads(out)["transactions"]}
    for tid in rec.tids:
        decided = pre.decided(tid)
        now = states.get(tid)
        if now not in (None, "committed", "aborted"):
            what.append(f"{tid} is {now} after recover")
        if decided == "commit" and now != "committed":
            what.append(f"{tid}: a durable commit decision, yet {now} after recover")
        if decided != "commit" and now == "committed":
            what.append(f"{tid}: committed with no durable commit decision")
        ack = rec.acks.get(tid)
        if ack is not None and ack < st.c_max and now != "committed":
            what.append(f"{tid}: its commit was acknowledged before the crash, yet it is {now}")
        if tid in pre.known() and now is None:
            what.append(f"{tid}: durable before the crash, unknown after recover")
    done = [t for t in rec.commit_order if states.get(t) == "committed"]
    if done != rec.commit_order[: len(done)]:
        what.append(f"commits survived out of order: {done} of {rec.commit_order}")
    else:
        diff = check.tree_diff(check.tree_view(root), rec.trees[len(done)])
        if diff:
            what.append(f"the tree is not the tree after {len(done)} commit(s): " +
                        "; ".join(diff))
    if service is not None:
        what.extend(_verify_effects(rec, states, service, fence_pre, root))
    what.extend(_probe(root, env))
    return what


def _verify_effects(rec: Recording, states: dict[str, str], service: object,
                    fence_pre: dict[str, dict[str, object] | None], root: str) -> list[str]:
    what = []
    executed = service.executed  # type: ignore[attr-defined]
    tid = rec.tids[0]
    for key in rec.keys:
        runs, undone = executed.get(key, 0), executed.get(key + ":compensate", 0)
        if runs > 1 or undone > 1:
            what.append(f"effect {key} ran {runs} time(s), its compensation {undone}")
        if states.get(tid) == "committed" and (runs != 1 or undone != 0):
            what.append(f"{tid} committed, but its call ran {runs} time(s) and its "
                        f"compensation {undone}")
        if states.get(tid) != "committed" and runs != undone:
            code, out, _ = check.run_cli(root, ["status", "--tid", tid], rec.env)
            if "uncompensated" not in out:
                what.append(f"{tid} aborted with its call run {runs} time(s) and compensated "
                            f"{undone} time(s), and nothing reported uncompensated")
        before = fence_pre.get(key)
        after = check.fence_entry(root, key)
        if before is not None and before.get("state") == "done" and (
                after is None or after.get("cert") != before.get("cert")):
            what.append(f"the fence had recorded {key} as done; after recover: {after}")
        others = {k for _, _, k in service.requests  # type: ignore[attr-defined]
                  if k is not None and k.split(":")[0] not in rec.keys}
        if others:
            what.append(f"requests with keys nobody staged: {sorted(others)}")
    return what


def _probe(root: str, env: dict[str, str]) -> list[str]:
    """The next transaction works."""
    code, out, err = check.run_cli(root, ["begin"], env)
    if code != 0:
        return [f"begin after recover exited {code}: {out[:300]} {err[-300:]}"]
    tid = json.loads(out)["tid"]
    code, out, err = check.run_cli(root, ["stage-write", "--tid", tid, "--path",
                                          "crashsim-probe.txt", "--content", "probe\n"], env)
    if code != 0:
        return [f"stage-write after recover exited {code}: {out[:300]} {err[-300:]}"]
    code, out, err = check.run_cli(root, ["commit", "--tid", tid], env)
    if code != 0 or json.loads(out).get("state") != "committed":
        return [f"commit after recover exited {code}: {out[:300]} {err[-300:]}"]
    with open(os.path.join(root, "crashsim-probe.txt"), "rb") as f:
        if f.read() != b"probe\n":
            return ["the probe commit's file has wrong content"]
    if check.LogView(root).damage is not None:
        return ["the log is damaged after the probe commit"]
    return []
