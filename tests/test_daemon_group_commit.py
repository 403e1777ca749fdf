"""Group commit in the daemon: commits that wait together share one fsync of the log, those that
overlap do not, and a daemon killed at any crash point with several commits in one batch leaves
each transaction all-or-nothing, with no client told "committed" for one that recovery rolls
back.

How a batch of several is made for sure: the first commit stalls right after its decision is
durable (AGENT2PC_STALL_AT=commit.after_decision:1, outside the engine's mutex); the next four
commit meanwhile, and queue; when the stall ends, one leader takes the four in one batch.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
from conftest import run_cli
from daemonkit import DaemonProc

from agent_2pc import Agent2PC
from agent_2pc.errors import DaemonUnavailable

STALL = {"AGENT2PC_STALL_AT": "commit.after_decision:1", "AGENT2PC_STALL_S": "2"}
CLIENTS = 5


def _stage(root: str, paths: list[str]) -> list[tuple[Agent2PC, Any]]:
    """A client and a staged transaction each (serially: the log's appends are counted)."""
    out = []
    for i, path in enumerate(paths):
        client = Agent2PC(root)
        assert client.via_daemon
        tx = client.begin(label=f"c{i}")
        tx.stage_write(path, f"content {i}\n")
        out.append((client, tx))
    return out


def _commit_all(staged: list[tuple[Agent2PC, Any]]) -> dict[str, Any]:
    """Commit the first, then (while it stalls) the others; what each client was told."""
    told: dict[str, Any] = {}

    def commit(tx: Any) -> None:
        try:
            told[tx.tid] = tx.commit()["state"]
        except DaemonUnavailable as exc:
            told[tx.tid] = exc.code
        except Exception as exc:  # recorded, checked by the test
            told[tx.tid] = repr(exc)

    threads = [threading.Thread(target=commit, args=(tx,)) for _, tx in staged]
    threads[0].start()
    time.sleep(0.5)
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for client, _ in staged:
        client.close()
    return told


def test_commits_that_wait_together_share_one_fsync(root: str) -> None:
    with DaemonProc(root, STALL, "--reap-interval-ms", "0"):
        staged = _stage(root, [f"f{i}.txt" for i in range(CLIENTS)])
        told = _commit_all(staged)
        st = _status(root)
    assert set(told.values()) == {"committed"}, told
    assert st["commits"] == CLIENTS
    assert st["fsyncs"] == 2 and st["largest_batch"] == CLIENTS - 1
    assert st["fsyncs_saved"] == CLIENTS - 2
    for i in range(CLIENTS):
        with open(os.path.join(root, f"f{i}.txt")) as f:
            assert f.read() == f"content {i}\n"


def test_overlapping_commits_are_not_batched_together(root: str) -> None:
    # c1 and c2 write the same file, c3 writes under a directory c4 deletes in: each pair
    # goes in two batches (first come, first batched), in arrival order.
    os.makedirs(os.path.join(root, "d"))
    with open(os.path.join(root, "d", "gone.txt"), "w") as f:
        f.write("x")
    with DaemonProc(root, STALL, "--reap-interval-ms", "0"):
        staged = _stage(root, ["f0.txt", "same.txt", "same.txt", "d/new.txt"])
        client = Agent2PC(root)
        deleter = client.begin()
        deleter.stage_delete("d/gone.txt")
        staged.append((client, deleter))
        told = _commit_all(staged)
        st = _status(root)
    # batches: [c0], then c1 or c2 (whichever arrived first: the threads race) with c3 or
    # c4, then the other two; the later of c1 and c2 votes no at prepare (its file is no
    # longer absent), as it would have in-process
    said = [told[tx.tid] for _, tx in staged]
    assert said[0] == said[3] == said[4] == "committed", said
    assert said[1:3].count("committed") == 1, said
    lost = next(s for s in said[1:3] if s != "committed")
    assert "changed since it was staged" in lost, said
    winner = 1 if said[1] == "committed" else 2
    with open(os.path.join(root, "same.txt")) as f:
        assert f.read() == f"content {winner}\n"
    assert st["commits"] == 4 and st["fsyncs"] == 3 and st["largest_batch"] == 2, st
    assert not os.path.exists(os.path.join(root, "d", "gone.txt"))
    with open(os.path.join(root, "d", "new.txt")) as f:
        assert f.read() == "content 3\n"


def _status(root: str) -> dict[str, Any]:
    import json

    proc = run_cli(("daemon", "status"), json_out=True, root=root)
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


# (crash spec, what recovery must do with the batch of four: forward | back | either)
# Passes counted in the daemon: batch 1 (c0) passes each point once; the fifth and later
# log appends are batch 2's prepares; wal.torn_append:N tears its decision append (5 begins,
# 5 stages, c0's prepare + decision + end, 4 prepares: the 18th append).
CRASHES = [
    ("prepare.before_decision:3", "back"),
    ("wal.torn_append:18", "either"),
    ("commit.after_decision:2", "forward"),
    ("commit.mid_apply:3", "forward"),
    ("commit.before_end:2", "forward"),
]


@pytest.mark.parametrize("spec,expect", CRASHES, ids=[c[0] for c in CRASHES])
def test_daemon_killed_in_a_batch_leaves_each_commit_all_or_nothing(
        root: str, spec: str, expect: str) -> None:
    env = dict(STALL, AGENT2PC_CRASH_AT=spec)
    paths = [f"f{i}.txt" for i in range(CLIENTS)]
    with DaemonProc(root, env, "--reap-interval-ms", "0") as d:
        staged = _stage(root, paths)
        told = _commit_all(staged)
        assert d.wait_dead() == 137
    first = staged[0][1].tid  # done before the crash; its answer may not have left in time
    assert told[first] in ("committed", "daemon_unavailable"), told
    batch = [tx.tid for _, tx in staged[1:]]
    assert all(told[t] == "daemon_unavailable" for t in batch), told
    direct = Agent2PC(root, daemon=False)
    direct.recover()
    states = {r["tid"]: r["state"] for r in direct.transactions()}
    for i, (_, tx) in enumerate(staged):
        state = states[tx.tid]
        # active: the crash came before its prepare; nothing of it is applied, and its client
        # may commit it again
        assert state in ("committed", "aborted", "active"), (tx.tid, state)
        path = os.path.join(root, paths[i])
        if state == "committed":
            with open(path) as f:
                assert f.read() == f"content {i}\n"
        else:
            assert not os.path.exists(path)
        if told[tx.tid] == "committed":
            assert state == "committed"
    assert states[first] == "committed"
    outcomes = {states[t] for t in batch}
    if expect == "forward":
        assert outcomes == {"committed"}, states
    elif expect == "back":
        assert "aborted" in outcomes and "committed" not in outcomes, states
    for tid in batch:
        if states[tid] == "active":  # never prepared: a retry commits it
            assert direct.get(tid).commit()["state"] == "committed"
    # "either": a torn append keeps the decisions before the tear; each one whole
    assert not [n for n in os.listdir(root) if ".tmp" in n or "a2pc" in n]
    direct.close()
