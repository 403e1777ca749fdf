"""A throwaway Postgres cluster for the SQL participant's tests (tests/test_postgres_sql.py).

Two-phase commit needs ``max_prepared_transactions`` above 0, which the shared server on this
machine does not have: the cluster is made with initdb/pg_ctl (found under
/usr/lib/postgresql/*/bin) in a temporary directory, as the postgres user when root.
$AGENT2PC_TEST_POSTGRES_2PC_DSN names a server to use instead. When neither works the tests
are skipped -- unless $AGENT2PC_REQUIRE_POSTGRES=1 (CI), which turns the skip into a failure.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

import pytest


def unavailable(reason: str) -> None:
    if os.environ.get("AGENT2PC_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"Postgres is required (AGENT2PC_REQUIRE_POSTGRES=1) but {reason}",
                    pytrace=False)
    pytest.skip(f"no Postgres: {reason}")


def can_connect(dsn: str) -> str | None:
    """None when a connection works, else why not."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed ({exc})"
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return None
    except psycopg.Error as exc:
        return f"{dsn}: {str(exc).strip() or type(exc).__name__}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """initdb + pg_ctl start in a temporary directory; ``stop`` removes it."""

    def __init__(self, max_prepared_transactions: int = 0, max_connections: int = 50) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            raise RuntimeError("no initdb under /usr/lib/postgresql/*/bin")
        self.bindir = os.path.dirname(bins[-1])
        self.mpt = max_prepared_transactions
        self.max_connections = max_connections
        self.dir = tempfile.mkdtemp(prefix="a2pc-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = _free_port()
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root and there is no postgres user") from None
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            runuser = shutil.which("runuser")
            if runuser is None:
                raise RuntimeError("running as root and runuser is missing")
            self.prefix = [runuser, "-u", "postgres", "--"]

    def _run(self, *argv: str, timeout: float = 60) -> None:
        subprocess.run(self.prefix + list(argv), check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> str:
        self._run(os.path.join(self.bindir, "initdb"), "-D", self.data, "-U", "postgres",
                  "--auth=trust", "-E", "UTF8", "--no-sync")
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off "
                f"-c max_connections={self.max_connections} "
                f"-c max_prepared_transactions={self.mpt}")
        self._run(os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-o", opts, "-w",
                  "-t", "60", "-l", os.path.join(self.dir, "log"), "start", timeout=90)
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        try:
            self._run(os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "immediate",
                      "-w", "stop")
        except (subprocess.SubprocessError, OSError):
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


_server: dict[str, str] = {}


def server_2pc() -> str:
    """The DSN of a server with max_prepared_transactions > 0: $AGENT2PC_TEST_POSTGRES_2PC_DSN,
    else one throwaway cluster per test process (started on first use, stopped at exit).
    Skips (fails under AGENT2PC_REQUIRE_POSTGRES=1) when neither is possible."""
    if "dsn" in _server:
        return _server["dsn"]
    explicit = os.environ.get("AGENT2PC_TEST_POSTGRES_2PC_DSN")
    if explicit:
        why = can_connect(explicit)
        if why:
            unavailable(f"AGENT2PC_TEST_POSTGRES_2PC_DSN does not connect: {why}")
        _server["dsn"] = explicit
        return explicit
    if "failed" in _server:
        unavailable(_server["failed"])
    try:
        cluster = Cluster(max_prepared_transactions=20)
        dsn = cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        _server["failed"] = f"a throwaway cluster did not start: {exc}"
        unavailable(_server["failed"])
    atexit.register(cluster.stop)
    _server["dsn"] = dsn
    return dsn
