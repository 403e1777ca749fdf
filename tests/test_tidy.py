"""The house rules, checked over src/ (in the spirit of TigerBeetle's src/tidy.zig).

Each rule is written once, here, and drawn in docs/design.md ("House rules"). An exception is
listed below with its reason; a listed exception that no longer exists fails too, so that the
lists only shrink.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "agent_2pc"


def modules() -> Iterator[tuple[str, ast.Module]]:
    """(path relative to src/agent_2pc, parsed module) for every module of the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path))


def dotted(rel: str) -> str:
    """``cli/main.py`` -> ``agent_2pc.cli.main``; a package's ``__init__.py`` -> its name."""
    parts = ["agent_2pc", *rel[:-len(".py")].split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# -- durability: fsync and rename only through the storage layer's helper -----------------------

DURABLE_CALLS = frozenset({"fsync", "fdatasync", "rename", "renames", "replace"})
DURABLE_HOME = "storage/durable.py"
# Other modules that may call them, with how many calls and why none of them needs the helper
# (its fault injection and its directory fsync): each moves garbage that need not survive a
# crash, or is a tool's own file.
DURABLE_EXCEPTIONS = {
    "storage/scratch.py": (1, "moves a scratch directory into trash/ to delete it later"),
    "isolation/_remove.py": (2, "moves a big tree aside into trash/ before deleting it"),
    "coordinator/compaction.py": (1, "compaction moves unreferenced blobs and pre-images into "
                                 "trash/"),
    "coordinator/kept.py": (1, "publishes what a failed exec session kept aside, in the "
                               "transaction's scratch, which a crash may lose"),
    "fence/_storm.py": (1, "the storm load tool's effect file: what it counts, not the store"),
}


def durable_calls(tree: ast.Module) -> list[int]:
    """Lines that name ``os.fsync`` and the like (called or not) or import them from os."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in DURABLE_CALLS
                and isinstance(node.value, ast.Name) and node.value.id == "os"):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in DURABLE_CALLS for a in node.names):
            lines.append(node.lineno)
    return lines


def test_fsync_and_rename_are_called_only_in_the_storage_helper():
    found = {rel: lines for rel, tree in modules() if rel != DURABLE_HOME
             for lines in [durable_calls(tree)] if lines}
    unexpected = {rel: lines for rel, lines in found.items()
                  if len(lines) > DURABLE_EXCEPTIONS.get(rel, (0, ""))[0]}
    assert not unexpected, (
        f"fsync/rename outside {DURABLE_HOME} (use its fsync_fd, fsync_dir, rename, "
        f"write_atomic): {unexpected}")
    gone = {rel for rel, (count, _) in DURABLE_EXCEPTIONS.items()
            if len(found.get(rel, [])) < count}
    assert not gone, f"lower or remove these entries of DURABLE_EXCEPTIONS: {sorted(gone)}"


# -- no function longer than 70 lines ----------------------------------------------------------

FUNCTION_LINES_MAX = 70
# Today's longer functions and their length in lines: they may shrink, not grow. Split one and
# take it off the list.
LONG_FUNCTIONS = {
    "cli/args.py:parse": 96,
    "demo.py:main": 79,
    "fence/_once.py:once": 100,
    "fence/_once.py:once.deco": 86,
    "fence/_storm.py:_storm_processes": 71,
    "isolation/_capture.py:capture_upper": 86,
    "isolation/_reaper.py:main": 91,
    "isolation/_view.py:StagedView.run": 90,
    "isolation/_view.py:StagedView._spawn_on": 109,
    "isolation/_wasi_main.py:_run": 110,
    "participants/fs.py:FileParticipant._vote": 77,
    "participants/fs.py:FileParticipant._apply_in": 149,
    "web/_app.py:make_app": 134,
}


def functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every function, methods and nested functions included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + child.name, child
            yield from functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from functions(child, f"{prefix}{child.name}.")
        else:
            yield from functions(child, prefix)


def function_lengths() -> dict[str, int]:
    out = {}
    for rel, tree in modules():
        for name, node in functions(tree):
            assert node.end_lineno is not None
            out[f"{rel}:{name}"] = node.end_lineno - node.lineno + 1
    return out


def test_no_function_is_longer_than_70_lines_but_the_listed_ones_which_do_not_grow():
    lengths = function_lengths()
    too_long = {name: n for name, n in lengths.items()
                if n > LONG_FUNCTIONS.get(name, FUNCTION_LINES_MAX)}
    assert not too_long, (
        f"functions over {FUNCTION_LINES_MAX} lines (or longer than listed): {too_long}")
    gone = sorted(set(LONG_FUNCTIONS) - set(lengths))
    assert not gone, f"remove these entries of LONG_FUNCTIONS (no such function): {gone}"


# -- no statement after a raise, return, continue or break in the same block ---------------------

JUMPS = (ast.Raise, ast.Return, ast.Continue, ast.Break)
# Dead statements allowed (none: the last one, in fs.py's Dirs.open, went with issue 11).
UNREACHABLE_EXCEPTIONS: dict[str, int] = {}


def unreachable(tree: ast.Module) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for stmt, after in zip(block, block[1:], strict=False):
                if isinstance(stmt, JUMPS):
                    lines.append(after.lineno)
    return lines


def test_no_statement_follows_a_raise_or_return_in_its_block():
    found = {rel: lines for rel, tree in modules() for lines in [unreachable(tree)] if lines}
    unexpected = {rel: lines for rel, lines in found.items()
                  if len(lines) > UNREACHABLE_EXCEPTIONS.get(rel, 0)}
    assert not unexpected, f"unreachable statements: {unexpected}"
    gone = sorted(rel for rel, n in UNREACHABLE_EXCEPTIONS.items() if len(found.get(rel, [])) < n)
    assert not gone, f"lower or remove these entries of UNREACHABLE_EXCEPTIONS: {gone}"


# -- private modules are imported only from within their own package ---------------------------

# (importing module, private module): why. Each wants the private name exported by its package.
PRIVATE_IMPORT_EXCEPTIONS = {
    ("cli/fence.py", "agent_2pc.fence._storm"):
        "the storm load tool is a command of the fence's CLI, not of its library, whose "
        "surface tests/fence/test_fence_public_api.py pins",
    ("coordinator/kept.py", "agent_2pc.isolation._remove"):
        "discard(); the coordinator is being split (issue 11.2)",
    ("coordinator/monitor.py", "agent_2pc.fence._fence"):
        "the monitor reads the fence's ledger without opening it as a client",
    ("coordinator/monitor.py", "agent_2pc.fence._sqlite"):
        "the monitor reads the fence's ledger without opening it as a client",
    ("coordinator/monitor.py", "agent_2pc.fence._cert"):
        "the monitor checks certificates with the fence's key",
    ("coordinator/runs.py", "agent_2pc.isolation._owner"):
        "sweep(); the coordinator is being split (issue 11.2)",
    ("coordinator/runs.py", "agent_2pc.isolation._capture"):
        "capture_upper(); the coordinator is being split (issue 11.2)",
    ("coordinator/runs.py", "agent_2pc.isolation._layer"):
        "Layer; the coordinator is being split (issue 11.2)",
    ("coordinator/runs.py", "agent_2pc.isolation._view"):
        "SESSION_MARK; the coordinator is being split (issue 11.2)",
}


def imported_modules(rel: str, tree: ast.Module) -> Iterator[str]:
    """Every agent_2pc module ``rel`` imports, as a dotted name (``from p import m``: p.m
    when m is a module)."""
    here = dotted(rel)
    package = here if rel.endswith("__init__.py") else here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield module
            for alias in node.names:
                yield f"{module}.{alias.name}"


def private_module(name: str) -> str | None:
    """The first private module (``_name.py`` or ``_name/``) on the way to ``name``."""
    parts = name.split(".")
    if parts[0] != "agent_2pc":
        return None
    for i in range(1, len(parts)):
        part = parts[i]
        path = SRC.joinpath(*parts[:i + 1])
        if not (path.with_suffix(".py").is_file() or path.is_dir()):
            return None  # a name inside a module, not a module
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i + 1])
    return None


def test_private_modules_are_imported_only_from_their_own_package():
    found = set()
    for rel, tree in modules():
        here = dotted(rel)
        for name in imported_modules(rel, tree):
            private = private_module(name)
            if private is None:
                continue
            owner = private.rpartition(".")[0]
            if here != owner and not here.startswith(owner + "."):
                found.add((rel, private))
    unexpected = sorted(found - set(PRIVATE_IMPORT_EXCEPTIONS))
    assert not unexpected, (
        f"private modules imported from another package (export the name from the package "
        f"instead): {unexpected}")
    gone = sorted(set(PRIVATE_IMPORT_EXCEPTIONS) - found)
    assert not gone, f"remove these entries of PRIVATE_IMPORT_EXCEPTIONS: {gone}"


# -- the CLI's start-up: what its hot path must not import ---------------------------------------

# Agents call the CLI on every step, so its start-up is part of the design (docs/design.md,
# "Start-up cost"). Measured on the machine the rule was written on: argparse ~3 ms with
# gettext; typing, dataclasses, contextlib ~10 ms with what they pull in (inspect, ast, dis);
# hashlib's OpenSSL binding ~3 ms (the builtin _sha256 hashes small files); the MCP SDK and
# pydantic about a second; the rest load only in the commands that use them.
CLI_STARTUP_FORBIDDEN = frozenset({
    "argparse", "gettext", "typing", "dataclasses", "contextlib", "inspect", "ast", "dis",
    "hashlib", "_hashlib", "difflib", "shutil", "subprocess", "threading", "tempfile",
    "asyncio", "socket", "ssl", "sqlite3", "uuid",
    "mcp", "mcp_types", "pydantic", "rich", "psycopg", "httpx", "starlette", "uvicorn", "anyio",
    "wasmtime", "rfc8785",
    "agent_2pc.mcp", "agent_2pc.web", "agent_2pc.fence", "agent_2pc.isolation",
    "agent_2pc.core.patch", "agent_2pc.core.textdiff",
})


# What the console script runs (``python -m`` would add runpy's own imports, contextlib among
# them).
CONSOLE_SCRIPT = "import sys; from agent_2pc.cli.main import main; sys.exit(main())"


def cli_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("AGENT2PC_ROOT", None)  # the workspace is the working directory's
    return env


def imported_at_start(argv: list[str], cwd: Path) -> set[str]:
    """The modules the ``agent-2pc ARGV`` console script imports (``-X importtime``)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", CONSOLE_SCRIPT, *argv],
                          cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {line.rpartition("|")[2].strip() for line in proc.stderr.splitlines()
             if line.startswith("import time:")}
    assert "agent_2pc.cli.main" in names, proc.stderr[-2000:]
    return names


def forbidden(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".")
                                          for f in CLI_STARTUP_FORBIDDEN))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tidy")
    from agent_2pc import Agent2PC

    Agent2PC.init(root).close()
    return root


def test_the_cli_hot_path_imports_nothing_heavy(workspace: Path):
    def run(*argv: str) -> None:
        names = imported_at_start([*argv, "--json"], workspace)
        assert not forbidden(names), f"{argv} imports {forbidden(names)}"

    proc = subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, "begin"], cwd=workspace,
                          env=cli_env(), capture_output=True, text=True, timeout=60,
                          check=True)
    tid = proc.stdout.strip()
    run("--help")
    run("status")
    run("stage-write", "--tid", tid, "--path", "a.txt", "--content", "a\n")
    run("commit", "--tid", tid)
    run("begin")


# -- thin faces: the CLI, the MCP server and the dashboard call the public library -------------

FACES = ("cli/", "mcp/", "web/")
# What a face may import from the coordinator: the library, and the read-only snapshot behind
# monitor, top, web and MCP's status health (docs/monitoring.md).
FACE_IMPORTS = frozenset({"agent_2pc.coordinator.client", "agent_2pc.coordinator.monitor"})


def test_faces_reach_the_coordinator_only_through_the_library():
    found = []
    for rel, tree in modules():
        if not rel.startswith(FACES):
            continue
        for name in imported_modules(rel, tree):
            if name.startswith("agent_2pc.coordinator.") and not any(
                    name == m or name.startswith(m + ".") for m in FACE_IMPORTS):
                found.append((rel, name))
        found += [(rel, f"line {node.lineno}: .{node.attr}") for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and node.attr in ("engine", "_engine")]
    assert not found, f"faces past the library (add the step to Agent2PC/Transaction): {found}"


# -- errors below the faces speak of parameters, not of the CLI's flags -------------------------

# Messages that may still name a flag (none since issue 11).
FLAG_MESSAGE_EXCEPTIONS: dict[str, int] = {}


def error_classes() -> set[str]:
    import agent_2pc.errors as errors

    return {name for name, value in vars(errors).items()
            if isinstance(value, type) and issubclass(value, errors.Agent2PCError)}


def cli_flags() -> re.Pattern[str]:
    """Any of the CLI's options (every ``--name`` string in cli/) as a word."""
    flags = {node.value for rel, tree in modules() if rel.startswith("cli/")
             for node in ast.walk(tree) if isinstance(node, ast.Constant)
             and isinstance(node.value, str) and re.fullmatch(r"--[a-z][a-z-]*", node.value)}
    assert "--timeout-ms" in flags, flags
    return re.compile(r"(?<![\w-])(" + "|".join(sorted(flags)) + r")(?![\w-])")


def flag_messages(tree: ast.Module, classes: set[str], flag: re.Pattern[str]) -> list[int]:
    """Lines where an error of ours is built with a string that names a CLI option."""
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in classes):
            continue
        texts = [c.value for arg in node.args for c in ast.walk(arg)
                 if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        if any(flag.search(text) for text in texts):
            lines.append(node.lineno)
    return lines


def test_errors_below_the_faces_name_parameters_not_cli_flags():
    classes, flag = error_classes(), cli_flags()
    found = {rel: lines for rel, tree in modules() if not rel.startswith(FACES)
             and rel != "demo.py" for lines in [flag_messages(tree, classes, flag)] if lines}
    unexpected = {rel: lines for rel, lines in found.items()
                  if len(lines) > FLAG_MESSAGE_EXCEPTIONS.get(rel, 0)}
    assert not unexpected, (
        "name the parameter, quoted (`timeout_ms`), with params=(...): the CLI shows it as "
        f"its flag (cli/output.py, with_flags): {unexpected}")
    gone = sorted(rel for rel, n in FLAG_MESSAGE_EXCEPTIONS.items()
                  if len(found.get(rel, [])) < n)
    assert not gone, f"lower or remove these entries of FLAG_MESSAGE_EXCEPTIONS: {gone}"
