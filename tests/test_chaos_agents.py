"""Many agents at once on one workspace, every kind of step, some killed, the daemon killed.

Real processes: half the agents work through the workspace's daemon and half in their own
process (the library with ``daemon=False``), each a seeded mix of steps on files of its own, on
files they share, and on one git branch: stage + commit, stage + abort, write then delete,
``exec`` of a shell command, a check (``stage_cmd``), a savepoint rolled back to,
``git_commit``, ``undo`` of its last commit, CLI processes (begin, stage-write, commit),
and ``status``, ``recover`` and ``compact`` in between. Partway, the daemon is killed with
SIGKILL, then a third of the agents. Each agent notes a step only after its answer.

Then, after ``recover``: every file of an agent holds what its last noted step left there (or,
for a killed agent, what a step it did not live to note left); no aborted content is visible
unless a commit put the same bytes; no error but the expected ones (``conflict`` from another
writer, ``daemon_unavailable`` from the killed daemon); nothing left to roll forward or back;
git's objects and refs intact (``git fsck``) with no lock left.

It found two races (see git log): a daemon's lock object dropped from the cache between a
request's look-up and its step (``busy`` after 120 s), and a ``recover`` that swept the view of
an exec begun after it had last read the log.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

AGENT = r'''
import json, os, random, subprocess, sys
from agent_2pc import Agent2PC
from agent_2pc.errors import Agent2PCError

root, me, rounds, direct = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
rnd = random.Random(me)
client = Agent2PC(root, daemon=not direct)
notes = open(os.path.join(root, ".notes", str(me)), "a", buffering=1)
done = []

def note(*entry):
    done.append(list(entry))
    notes.write(json.dumps(list(entry)) + "\n")

KINDS = ["commit", "commit", "abort", "shared", "delete", "exec", "check", "savepoint", "git",
         "undo", "cli", "status", "recover", "compact"]
for r in range(rounds):
    kind = rnd.choice(KINDS)
    path, body = f"own/a{me}/f{r % 5}.txt", f"{me}:{r}\n"
    try:
        if kind in ("commit", "abort", "shared", "delete", "check", "savepoint", "git"):
            tx = client.begin(label=f"a{me}-{r}")
            if kind == "shared":
                path = f"shared/s{rnd.randrange(3)}.txt"
            tx.stage_write(path, body)
            if kind == "abort":
                tx.abort("chaos")
                note("abort", tx.tid, path, body)
                continue
            if kind == "check":
                tx.stage_cmd(["sh", "-c", f"grep -q '{me}:{r}' {path}"])
            if kind == "savepoint":
                tx.savepoint("s")
                tx.stage_write(path, "rolled back\n")
                tx.rollback_to("s")
            if kind == "git":
                tx.git_commit(f"agent {me} round {r}")
            else:
                tx.commit()
            note("commit", tx.tid, path, body)
            if kind == "delete":
                tx = client.begin()
                tx.stage_delete(path)
                tx.commit()
                note("commit", tx.tid, path, None)
        elif kind == "exec":
            tx = client.begin(label=f"a{me}-{r}")
            tx.exec(["sh", "-c", f"mkdir -p own/a{me}/t{r} && printf '{me}:{r}\\n' > {path}"
                                 f" && echo t > own/a{me}/t{r}/x"])
            tx.commit()
            note("commit", tx.tid, path, body)
        elif kind == "undo":
            mine = [e for e in done if e[0] == "commit" and e[2].startswith("own/")]
            if mine:
                client.undo(mine[-1][1])
                note("undo", mine[-1][1], mine[-1][2])
        elif kind == "cli":
            cli = [sys.executable, "-m", "agent_2pc", "--root", root]

            def step(*args):
                c = subprocess.run(cli + list(args) + ["--json"], capture_output=True,
                                   text=True)
                answer = json.loads(c.stdout)
                if c.returncode != 0:
                    raise RuntimeError(answer["error"]["code"])
                return answer

            try:
                tid = step("begin")["tid"]
                step("stage-write", "--tid", tid, "--path", path, "--content", body)
                step("commit", "--tid", tid)
            except RuntimeError as exc:
                note("error", kind, str(exc), "")
                continue
            note("commit", tid, path, body)
        elif kind == "status":
            client.status()
        elif kind == "recover":
            client.recover()
        else:
            client.compact()
    except Agent2PCError as exc:
        note("error", kind, exc.code, str(exc)[:300])
'''

EXPECTED_ERRORS = {"conflict", "daemon_unavailable"}


def _git(root: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(["git", *args], cwd=root, env=env, capture_output=True, text=True,
                          check=True).stdout


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent_2pc", "--root", str(root), *args,
                           "--json"], capture_output=True, text=True, timeout=120)


def _last_noted(notes: list[list[object]]) -> dict[str, tuple[str | None, bool]]:
    """Each own path -> (what the last noted step left there, whether it was an undo)."""
    out: dict[str, tuple[str | None, bool]] = {}
    for e in notes:
        if e[0] == "commit" and str(e[2]).startswith("own/"):
            out[str(e[2])] = (e[3], False)  # type: ignore[assignment]
        elif e[0] == "undo":
            out[str(e[2])] = (None, True)
    return out


def test_many_agents_killed_among_every_kind_of_step_leave_every_answer_true(
        tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.name", "Chaos")
    _git(root, "config", "user.email", "chaos@example.com")
    _git(root, "commit", "-q", "--allow-empty", "-m", "root")
    (root / ".git" / "info" / "exclude").write_text(".notes/\n.agent-tx/\n")
    (root / ".notes").mkdir()
    assert _cli(root, "init").returncode == 0
    assert _cli(root, "daemon", "start").returncode == 0
    n, rounds = 14, 24
    procs = [subprocess.Popen([sys.executable, "-c", AGENT, str(root), str(i), str(rounds),
                               "1" if i % 2 else "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(n)]
    chance = random.Random(19)
    time.sleep(2.0)
    daemon = json.loads(_cli(root, "daemon", "status").stdout)
    os.kill(int(daemon["pid"]), signal.SIGKILL)
    killed = set(chance.sample(range(n), n // 3))
    for i in sorted(killed):
        time.sleep(chance.uniform(0.05, 0.3))
        procs[i].send_signal(signal.SIGKILL)
    for i, proc in enumerate(procs):
        _, err = proc.communicate(timeout=240)
        if i not in killed or proc.returncode != -signal.SIGKILL:
            assert proc.returncode == 0, f"agent {i}: {err[-3000:]}"

    out = json.loads(_cli(root, "recover").stdout)
    assert out["ok"], out
    again = json.loads(_cli(root, "recover").stdout)
    assert again["rolled_forward"] == [] and again["rolled_back"] == [], again

    notes = {}
    for i in range(n):
        path = root / ".notes" / str(i)
        lines = path.read_text().splitlines() if path.exists() else []
        notes[i] = [json.loads(line) for line in lines]
    errors = [e for entries in notes.values() for e in entries if e[0] == "error"]
    assert {e[2] for e in errors} <= EXPECTED_ERRORS, errors
    commits = sum(e[0] == "commit" for entries in notes.values() for e in entries)
    assert commits >= n * 3, f"only {commits} commits: the run did too little to prove much"

    for i, entries in notes.items():
        for path, (body, undone) in _last_noted(entries).items():
            if undone:
                continue  # what an undo leaves is the commit before: checked by its own tests
            now = (root / path).read_text() if (root / path).exists() else None
            if now == body:
                continue
            # A killed agent may have done one more step than it noted: a later round's own
            # content (or, a write-then-delete, none).
            later = now is None or (body is not None and now.split(":")[0] == str(i)
                                    and int(now.split(":")[1]) > int(body.split(":")[1]))
            assert i in killed and later, (i, path, now, body)
    aborted = {(e[2], e[3]) for entries in notes.values() for e in entries if e[0] == "abort"}
    for path, body in aborted:
        p = root / path
        if p.exists() and p.read_text() == body:
            owner = int(body.split(":")[0])  # the same bytes only its own commit can put
            assert owner in killed or not str(path).startswith("own/"), (path, body)
    for shared in (root / "shared").glob("*.txt"):
        assert shared.read_text().count("\n") == 1, shared.read_text()  # whole, one writer's

    _git(root, "fsck", "--no-dangling", "--strict")
    assert not list((root / ".git").glob("**/*.lock"))
    assert _git(root, "rev-list", "--count", "main").strip() != "0"
