"""Fixtures for global transactions: a store schema per test, workspaces (git repositories)
each served by its own ``agent-2pc node`` subprocess (a simulated host), the coordinator as
the CLI (a process the tests can kill) or the library.

    def test_x(world):
        a, b = world.workspace("a"), world.workspace("b")      # nodes started
        tid = world.begin()
        world.cli("stage-write", "--tid", tid, "--workspace", "a", "--path", "x", "--content", "1")
        status, out = world.cli("commit", "--tid", tid)

Times are short (poll 50 ms, resolve 200 ms, lease 1.5 s) so that the suite stays fast. The
store is the shared server (postgresql://postgres@127.0.0.1:5432/test, or
$AGENT2PC_TEST_POSTGRES_DSN); each test has its own schema, dropped afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any, Callable, Iterator

import pytest
from conftest import parse_one_object, run_cli
from pg_cluster import can_connect, unavailable

from agent_2pc import Agent2PC

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
FAST = {"AGENT2PC_NODE_POLL_MS": "50", "AGENT2PC_NODE_RESOLVE_MS": "200",
        "AGENT2PC_GLOBAL_LEASE_MS": "1500", "AGENT2PC_GLOBAL_DECIDE_WAIT_MS": "5000"}


def wait_until(cond: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        time.sleep(0.05)


class NodeProc:
    """An ``agent-2pc node`` subprocess serving one workspace."""

    def __init__(self, world: World, name: str, root: str) -> None:
        self.world, self.name, self.root = world, name, root
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, **env: str) -> NodeProc:
        self.close()  # the previous process (stopped or killed): its pipes
        argv = [sys.executable, "-m", "agent_2pc", "--root", self.root, "node", "--name",
                self.name, "--json"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=self.world.env(env))
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the ready line (or nothing when it failed)
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else b""
            raise AssertionError(f"node {self.name} did not start: {err!r}")
        info = json.loads(line)
        assert info["ok"] and info["node"] == self.name, info
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"node {self.name} did not stop on SIGTERM") from None

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(10)
            for f in (self.proc.stdout, self.proc.stderr):
                if f is not None:
                    f.close()
            self.proc = None


class World:
    def __init__(self, tmp: str, dsn: str, schema: str) -> None:
        self.tmp, self.dsn, self.schema = tmp, dsn, schema
        self.nodes: dict[str, NodeProc] = {}

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("AGENT2PC_ROOT", "AGENT2PC_CRASH_AT", "AGENT2PC_STALL_AT")}
        env.update(FAST)
        env.update({"AGENT2PC_STORE": self.dsn, "AGENT2PC_STORE_SCHEMA": self.schema,
                    "PYTHONDONTWRITEBYTECODE": "1"})
        env.update(extra or {})
        return env

    def workspace(self, name: str, files: dict[str, str] | None = None, start: bool = True
                  ) -> NodeProc:
        """A git repository with ``files`` committed, made a workspace, served by a node."""
        root = os.path.realpath(os.path.join(self.tmp, name))
        os.makedirs(root)
        for rel, text in (files or {"README": "hello\n"}).items():
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "-C", root]
        subprocess.run(["git", "init", "-q", root], check=True)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-qm", "init"], check=True)
        Agent2PC.init(root).close()
        node = NodeProc(self, name, root)
        self.nodes[name] = node
        return node.start() if start else node

    def cli(self, *args: str, env: dict[str, str] | None = None, input: str | None = None
            ) -> tuple[int, dict[str, Any]]:
        proc = run_cli(args, json_out=True, env=self.env(env), input=input)
        return proc.returncode, parse_one_object(proc)

    def begin(self, label: str = "t") -> str:
        status, out = self.cli("begin", "--global", "--label", label)
        assert status == 0, out
        return str(out["tid"])

    def gtx(self, tid: str) -> dict[str, Any]:
        status, out = self.cli("status", "--tid", tid)
        assert status == 0, out
        return out["transactions"][0]  # type: ignore[no-any-return]

    def sql(self, stmt: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(stmt, params)
            return cur.fetchall() if cur.description else []

    def cut_connections(self) -> int:
        """pg_terminate_backend of every connection of this test's processes to the store."""
        rows = self.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                        "application_name LIKE %s", (f"agent-2pc global {self.schema} %",))
        return len(rows)

    def local(self, name: str, tid: str) -> dict[str, Any]:
        """The local transaction of workspace ``name`` in global ``tid``: its status row."""
        part = next(p for p in self.gtx(tid)["workspaces"] if p["workspace"] == name)
        c = Agent2PC(self.nodes[name].root, daemon=False)
        try:
            return c.status(part["local_tid"])["transactions"][0]  # type: ignore
        finally:
            c.close()

    def all_done(self, tid: str) -> dict[str, Any] | None:
        g = self.gtx(tid)
        return g if g["state"] in ("committed", "aborted") and \
            all(p["done"] for p in g["workspaces"]) else None

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()


@pytest.fixture(scope="session")
def store_dsn() -> str:
    dsn = os.environ.get("AGENT2PC_TEST_POSTGRES_DSN", DEFAULT_DSN)
    why = can_connect(dsn)
    if why:
        unavailable(why)
    return dsn


@pytest.fixture
def world(tmp_path: Any, store_dsn: str) -> Iterator[World]:
    schema = f"a2pc_g_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    w = World(str(tmp_path), store_dsn, schema)
    try:
        yield w
    finally:
        w.close()
        w.sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
