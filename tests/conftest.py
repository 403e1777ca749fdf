"""Shared fixtures: a fresh workspace, the CLI as a user runs it, and a snapshot of the tree.

    def test_something(root, cli, client, snapshot):
        before = snapshot()
        status, out = cli("begin")   # python -m agent_2pc --root ROOT begin --json
        assert status == 0 and out["ok"] is True
        tx = client.begin()                         # the library, same workspace
        ...
        assert snapshot() == before                 # tree + .agent-tx/wal.bin unchanged

Fixtures
  root        str: a fresh git repository (``git init``) made a workspace by ``Agent2PC.init``;
              the real path (symlinks resolved), empty apart from .git/ and .agent-tx/.
  client      Agent2PC opened on ``root``.
  cli         ``cli(*args, input=None)`` -> (exit_status, parsed_json). Runs the real CLI in a
              subprocess with ``--json``; fails the test unless stdout is exactly one JSON object.
  cli_raw     ``cli_raw(*args, input=None, json=False, root=ROOT, cwd=None, env=None)`` ->
              CompletedProcess (bytes). For text mode, other roots, cwd or environment.
              ``root=None`` leaves ``--root`` out.
  snapshot    ``snapshot()`` -> a comparable picture of the tree (path -> kind, mode, sha256 or
              link target; .git/ and .agent-tx/ left out) plus the bytes of .agent-tx/wal.bin and
              .agent-tx/history.jsonl. Equal snapshots: the request changed nothing.

Helpers (plain functions, importable as ``from conftest import ...``)
  write(root, rel, data, mode=None)  create a file (parents too); ``data`` str or bytes.
  read(root, rel)                    a file's bytes.
  read_text(root, rel)               a file's text, or None when it is missing.
  take_snapshot(root)                what the ``snapshot`` fixture returns, for any root.
  parse_one_object(proc)             the single JSON object on a CompletedProcess's stdout,
                                     checked for the contract's ok/error shape.
  run_cli(args, ...)                 what ``cli_raw`` calls (see its signature).
  CLI_TIMEOUT                        seconds a single CLI call may take before the test fails.

Every CLI call runs ``sys.executable -m agent_2pc`` with AGENT2PC_ROOT, AGENT2PC_CRASH_AT and
AGENT2PC_SAFE_DIRECTORY removed from the environment, so a developer's shell cannot change what
a test sees.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from typing import Any, Callable

import pytest

from agent_2pc import Agent2PC

CLI_TIMEOUT = 60
# Variables of ours that must not leak from the developer's shell into the tests.
_SCRUB = ("AGENT2PC_ROOT", "AGENT2PC_CRASH_AT", "AGENT2PC_SAFE_DIRECTORY")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if extra:
        env.update(extra)
    return env


def write(root: str, rel: str, data: str | bytes, mode: int | None = None) -> str:
    """Create ``root/rel`` (and its parents) with ``data``; return its absolute path."""
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(path, mode)
    return path


def read(root: str, rel: str) -> bytes:
    with open(os.path.join(root, rel), "rb") as f:
        return f.read()


def read_text(root: str, rel: str) -> str | None:
    """``root/rel``'s text, or None when there is no such file."""
    try:
        with open(os.path.join(root, rel)) as f:
            return f.read()
    except FileNotFoundError:
        return None


def run_cli(args: tuple[Any, ...], *, input: str | bytes | None = None, json_out: bool = False,
            root: str | None = None, cwd: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m agent_2pc [--root ROOT] ARGS [--json]``; arguments may be str or bytes."""
    argv: list[Any] = [sys.executable, "-m", "agent_2pc"]
    if root is not None:
        argv += ["--root", root]
    argv += [os.fspath(a) if isinstance(a, os.PathLike) else a for a in args]
    if json_out:
        argv.append("--json")
    data = input.encode() if isinstance(input, str) else input
    return subprocess.run(argv, input=data, capture_output=True, cwd=cwd, env=_env(env),
                          timeout=CLI_TIMEOUT, check=False)


def parse_one_object(proc: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    """The one JSON object that ``--json`` promises on stdout (fails the test otherwise)."""
    text = proc.stdout.decode("utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, (f"--json must print exactly one JSON object on stdout; got "
                             f"{text!r} (stderr: {proc.stderr!r})")
    obj = json.loads(lines[0])
    assert isinstance(obj, dict), f"--json printed {obj!r}, not an object"
    assert isinstance(obj.get("ok"), bool), f"'ok' missing or not a boolean in {obj!r}"
    if obj["ok"]:
        assert "error" not in obj, obj
    else:
        err = obj.get("error")
        assert isinstance(err, dict), f"a failure must carry an 'error' object: {obj!r}"
        assert isinstance(err.get("code"), str) and err["code"], obj
        assert isinstance(err.get("message"), str) and err["message"], obj
    return obj


@pytest.fixture
def root(tmp_path: Any) -> str:
    """A fresh git repository made a workspace; its real path."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True, capture_output=True,
                   env=_env())
    Agent2PC.init(repo)
    return os.path.realpath(repo)


@pytest.fixture
def client(root: str) -> Agent2PC:
    return Agent2PC(root)


@pytest.fixture
def cli(root: str) -> Callable[..., tuple[int, dict[str, Any]]]:
    """``cli(*args, input=None)`` -> (exit_status, the JSON object printed on stdout)."""

    def call(*args: Any, input: str | bytes | None = None) -> tuple[int, dict[str, Any]]:
        proc = run_cli(args, input=input, json_out=True, root=root)
        return proc.returncode, parse_one_object(proc)

    return call


@pytest.fixture
def cli_raw(root: str) -> Callable[..., subprocess.CompletedProcess[bytes]]:
    """``cli_raw(*args, input=None, json=False, root=ROOT, cwd=None, env=None)``."""
    default_root = root

    def call(*args: Any, input: str | bytes | None = None, json: bool = False,
             root: str | None = default_root, cwd: str | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
        return run_cli(args, input=input, json_out=json, root=root, cwd=cwd, env=env)

    return call


def take_snapshot(root: str) -> dict[str, Any]:
    tree: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in (".git", ".agent-tx")]
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                tree[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                tree[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                h = hashlib.sha256()
                with open(full, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
                tree[rel] = ("file", stat.S_IMODE(st.st_mode), h.hexdigest())
    meta = {}
    for name in ("wal.bin", "history.jsonl"):
        try:
            with open(os.path.join(root, ".agent-tx", name), "rb") as f:
                meta[name] = f.read()
        except FileNotFoundError:
            meta[name] = None
    return {"tree": tree, **meta}


@pytest.fixture
def snapshot(root: str) -> Callable[[], dict[str, Any]]:
    return lambda: take_snapshot(root)


# Descriptors: an engine dropped without ``engine.close()`` is a reference cycle; its log and
# lock descriptors are closed when the cyclic collector frees it. The suite's tests drop many,
# so when many descriptors are open after a test, collect (never close what may be in use: a
# module-scoped fixture's engine is still alive).
_FDS_SWEEP_AT = 256


@pytest.fixture(autouse=True)
def _collect_engines_left_open() -> Any:
    yield
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        return
    if open_fds >= _FDS_SWEEP_AT:
        import gc

        gc.collect()
