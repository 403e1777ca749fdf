"""The store itself goes away (its server stopped) and comes back: steps answer
``store_unavailable`` meanwhile, nodes keep running, reconnect, and finish what was decided
before the outage."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Iterator

import pytest
from pg_cluster import Cluster, unavailable

from .conftest import World, wait_until

pytestmark = pytest.mark.postgres


class Restartable(Cluster):
    def down(self) -> None:
        pg_ctl = os.path.join(self.bindir, "pg_ctl")
        proc = subprocess.run(self.prefix + [pg_ctl, "-D", self.data, "-m", "immediate", "-w",
                                             "stop"], capture_output=True, timeout=60)
        assert proc.returncode == 0, proc

    def up(self) -> None:
        pg_ctl = os.path.join(self.bindir, "pg_ctl")
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off "
                f"-c max_connections={self.max_connections} "
                f"-c max_prepared_transactions={self.mpt}")
        self._run(pg_ctl, "-D", self.data, "-o", opts, "-w", "-t", "60", "-l",
                  os.path.join(self.dir, "log"), "start", timeout=90)


@pytest.fixture
def own_store(tmp_path: object) -> Iterator[tuple[Restartable, str]]:
    try:
        cluster = Restartable()
        dsn = cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        unavailable(f"a throwaway cluster did not start: {exc}")
    try:
        yield cluster, dsn
    finally:
        cluster.stop()


def test_the_store_down_and_back_nodes_finish_what_was_decided(
        tmp_path: object, own_store: tuple[Restartable, str]) -> None:
    cluster, dsn = own_store
    world = World(str(tmp_path), dsn, "agent2pc")
    try:
        for name in ("a", "b"):  # resolution rounds 3 s apart: the next one meets the outage
            world.workspace(name, {"f.txt": f"{name} old\n"}, start=False).start(
                AGENT2PC_NODE_RESOLVE_MS="3000")
        tid = world.begin()
        for name in ("a", "b"):
            assert world.cli("stage-write", "--tid", tid, "--workspace", name, "--path",
                             "f.txt", "--content", f"{name} new\n")[0] == 0
        # the coordinator dies right after the decision; then the store goes down
        proc = subprocess.run([sys.executable, "-m", "agent_2pc", "commit", "--tid", tid,
                               "--json"], capture_output=True, timeout=120,
                              env=world.env({"AGENT2PC_CRASH_AT": "global.after_decision"}))
        assert proc.returncode == 137, proc
        cluster.down()  # no decide request was sent; the nodes learn it from the store
        try:
            status, out = world.cli("status", "--tid", tid)
            assert status == 2 and out["error"]["code"] == "store_unavailable", out
            status, out = world.cli("begin", "--global")
            assert status == 2 and out["error"]["code"] == "store_unavailable", out
            time.sleep(2)
            for node in world.nodes.values():  # still running, waiting for the store
                assert node.proc is not None and node.proc.poll() is None
        finally:
            cluster.up()
        g = wait_until(lambda: world.all_done(tid), 60, "the nodes to finish")
        assert g["state"] == "committed"
        for name in ("a", "b"):
            with open(os.path.join(world.nodes[name].root, "f.txt")) as f:
                assert f.read() == f"{name} new\n"
        # and they serve new transactions
        tid2 = world.begin()
        assert world.cli("stage-write", "--tid", tid2, "--workspace", "a", "--path", "g.txt",
                         "--content", "g")[0] == 0
        status, out = world.cli("commit", "--tid", tid2)
        assert status == 0 and out["state"] == "committed", out
    finally:
        world.close()
