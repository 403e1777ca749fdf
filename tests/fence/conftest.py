"""Fixtures for the effect fence tests: the same tests run against every store.

Postgres: the DSN comes from $AGENT2PC_TEST_POSTGRES_DSN; else the server on
postgresql://postgres@127.0.0.1:5432/test is tried; else, when initdb/pg_ctl exist under
/usr/lib/postgresql/*/bin, a throwaway cluster is started in a temporary directory for the
session; else the Postgres tests are skipped -- unless $AGENT2PC_REQUIRE_POSTGRES=1 (CI), which
turns the skip into a failure. Each test gets its own schema (``fence_schema=`` in the URL) under
a per-session prefix, dropped afterwards, so parallel runs never collide.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from typing import Any, Callable, Iterator

import pytest
from pg_cluster import Cluster, can_connect, unavailable

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
SESSION_PREFIX = f"a2pc_fence_t{os.getpid()}_{uuid.uuid4().hex[:6]}"
STORES = ("memory", "sqlite", "postgres")
WORKER = os.path.join(os.path.dirname(__file__), "fence_worker.py")


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A DSN of a reachable Postgres server (skips or fails as the module docstring says)."""
    explicit = os.environ.get("AGENT2PC_TEST_POSTGRES_DSN")
    if explicit:
        why = can_connect(explicit)
        if why:
            unavailable(f"AGENT2PC_TEST_POSTGRES_DSN does not connect: {why}")
        yield explicit
        _drop_session_schemas(explicit)
        return
    why = can_connect(DEFAULT_DSN)
    if why is None:
        yield DEFAULT_DSN
        _drop_session_schemas(DEFAULT_DSN)
        return
    cluster = None
    try:
        cluster = Cluster(max_connections=200)  # the fence's storms open many
        dsn = cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        if cluster is not None:
            cluster.stop()
        unavailable(f"{why}; and a throwaway cluster did not start: {exc}")
    try:
        yield dsn
    finally:
        cluster.stop()


def _drop_session_schemas(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s",
                            (SESSION_PREFIX + "%",)).fetchall()
        for (name,) in rows:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _pg_url(dsn: str, schema: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}fence_schema={schema}"


@pytest.fixture
def pg_url(pg_dsn: str) -> Iterator[str]:
    """A Postgres store URL with a schema of its own, dropped after the test."""
    schema = f"{SESSION_PREFIX}_{uuid.uuid4().hex[:8]}"
    yield _pg_url(pg_dsn, schema)
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _url_for(kind: str, request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if kind == "memory":
        return f"memory://test-{uuid.uuid4().hex}"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/fence.db"
    assert kind == "postgres"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """The URL of a fresh, empty store of each kind (a memory store named for sharing)."""
    url = _url_for(request.param, request, tmp_path)
    yield url
    if url.startswith("memory://"):
        from agent_2pc import fence as fence_pkg

        fence_pkg._named_memory.pop(url[len("memory://"):], None)


@pytest.fixture(params=("sqlite", "postgres"))
def shared_store_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """A store that several processes can share."""
    return _url_for(request.param, request, tmp_path)


@pytest.fixture
def open_store(store_url: str) -> Iterator[Callable[..., Any]]:
    """``open_store(lease_ttl=..., result_ttl=...)`` opens a Fence on this test's store; every
    Fence opened is closed after the test."""
    from agent_2pc.fence import open_fence

    opened: list[Any] = []

    def make(**kw: Any) -> Any:
        f = open_fence(store_url, **kw)
        opened.append(f)
        return f

    yield make
    for f in opened:
        f.close()


@pytest.fixture
def fence(open_store: Callable[..., Any]) -> Any:
    return open_store(lease_ttl=5.0)


class Effect:
    """A real side effect: one line appended to a file per execution."""

    def __init__(self, path: str) -> None:
        self.path = path

    def run(self, tag: str = "x") -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (tag + "\n").encode())
        finally:
            os.close(fd)

    @property
    def count(self) -> int:
        try:
            with open(self.path, encoding="utf-8") as f:
                return sum(1 for line in f if line.strip())
        except FileNotFoundError:
            return 0


@pytest.fixture
def effect(tmp_path: Any) -> Effect:
    return Effect(str(tmp_path / "effects.log"))


def run_worker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run tests/fence/fence_worker.py with ``args`` and wait for it."""
    return subprocess.run([sys.executable, WORKER, *args], capture_output=True, text=True,
                          timeout=timeout)


def wait_until(pred: Callable[[], bool], timeout_s: float, step_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step_s)
    return pred()
