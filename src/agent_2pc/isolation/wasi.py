"""WASI modules in the staged view (docs/wasi.md).

    from agent_2pc.isolation import StagedView
    from agent_2pc.isolation.wasi import run_wasm

    with StagedView(root, tx.changes(), engine.blobs, scratch_dir=..., trash_dir=...) as view:
        res = run_wasm(view, "tools/fmt.wasm", ["--check", "src"], fuel=10**9,
                       max_memory_mb=256, timeout_s=60)          # WasmResult (a RunResult)
        res.exit_code, res.tripped, res.outcome, res.message, res.tail
        captured = view.capture()                                 # as after view.run

The module runs in a process in the view (``_wasi_main.py``, started through ``view.run``, so
in the view's private mount namespace on the overlay tiers), with the view's root preopened
read-write at "/" and nothing else writable; what it writes is captured like any command's.
The module is read and compiled here first, so that a missing, malformed or non-WASI module is
an error before anything runs; the process in the view loads the compiled artifact from the
view's scratch directory. Importing this module does not import wasmtime (run_wasm does).
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import tempfile

from ..errors import IsolationUnavailable, NotFound, UsageError
from . import _wasi_main as _main
from ._owner import owner_tag
from ._remove import rmtree
from ._view import TAIL_BYTES, TIMEOUT_S_MAX, RunResult, StagedView, _inside

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping

WASI_MAIN = os.path.abspath(_main.__file__)
# The view's own timeout is a backstop behind the runner's deadline (which ends a module
# blocked in a host call DEADLINE_GRACE_S after the deadline): startup plus this much slack.
BACKSTOP_S = 10.0
SYMLINKS_MAX = 40
ARGS_MAX = 100_000

EXIT_SETUP = _main.EXIT_SETUP
EXIT_MEMORY = _main.EXIT_MEMORY
EXIT_FUEL = _main.EXIT_FUEL
EXIT_DEADLINE = _main.EXIT_DEADLINE
EXIT_TRAP = _main.EXIT_TRAP
GUEST_ROOT = _main.GUEST_ROOT


class WasmResult(RunResult):
    """A RunResult for a WASI module, plus what ended it.

    outcome           exit (the module exited, or returned from _start) | trap | fuel |
                      memory | timeout | setup (the runner could not start the module) |
                      crash (the runner died without a report: e.g. killed by the kernel)
    tripped           the budget that stopped it: "fuel", "max_memory_mb", "timeout_ms", or
                      None
    message           the runner's one-line account (a trap's cause and backtrace, which
                      budget ran out), None after a plain exit
    module_exit_code  what the module passed to proc_exit (0 when _start returned), None when
                      it did not exit
    fuel, max_memory_mb, timeout_s   the budgets it had (None: none)
    fuel_consumed, memory_peak_bytes (with a fuel budget / a memory limit; else None)

    ``exit_code`` is the runner's status (the module's own exit status, or EXIT_TRAP,
    EXIT_FUEL, EXIT_MEMORY, EXIT_SETUP); a deadline that passed is ``timed_out`` with
    ``exit_code`` None, as for any command. ``passed``: exit code 0 and nothing tripped.
    """

    # (RunResult may have a ``tripped`` slot of its own, for the governor: then it is used)
    __slots__ = tuple(n for n in ("module", "args", "outcome", "tripped", "message",
                                  "module_exit_code", "fuel", "max_memory_mb", "timeout_s",
                                  "fuel_consumed", "memory_peak_bytes")
                      if n not in RunResult.__slots__)

    module: str
    args: list[str]
    outcome: str
    tripped: str | None
    message: str | None
    module_exit_code: int | None
    fuel: int | None
    max_memory_mb: int | None
    timeout_s: float | None
    fuel_consumed: int | None
    memory_peak_bytes: int | None

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.tripped is None

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["tripped"] = self.tripped
        out["wasm"] = {"module": self.module, "args": self.args, "outcome": self.outcome,
                       "message": self.message, "module_exit_code": self.module_exit_code,
                       "fuel": self.fuel, "fuel_consumed": self.fuel_consumed,
                       "max_memory_mb": self.max_memory_mb,
                       "memory_peak_bytes": self.memory_peak_bytes}
        return out

    def __repr__(self) -> str:
        return (f"WasmResult({self.tier}, {self.outcome}, exit_code={self.exit_code}, "
                f"tripped={self.tripped}, {self.duration_ms} ms)")


def run_wasm(view: StagedView, module: str | os.PathLike[str], args: Iterable[str] = (), *,
             fuel: int | None = None, max_memory_mb: int | None = None,
             timeout_s: float | None = None, env: Mapping[str, str] | None = None,
             dirs: Iterable[str | tuple[str, str]] = (), interactive: bool = False,
             log_path: str | os.PathLike[str] | None = None, tail_bytes: int = TAIL_BYTES,
             stdout_fd: int | None = None) -> WasmResult:
    """Run the WASI preview1 command ``module`` in ``view`` with ``args``.

    module         a .wasm (or WebAssembly text) file: relative to the repo root or absolute.
                   Inside the repo it is read as the staged view shows it (a staged write is
                   run, a staged delete is NotFound); elsewhere as it is.
    fuel           the instruction budget (wasmtime fuel, about one unit per instruction).
    max_memory_mb  the most each linear memory may grow to, in MiB.
    timeout_s      wall time for the module (an epoch deadline; then the view's timeout as
                   a backstop).
    env            the module's environment (default: empty; nothing is inherited).
    dirs           extra directories outside the repo, preopened read-only: a host path
                   (seen at the same path) or (host path, guest path).
    interactive, log_path, tail_bytes, stdout_fd   as for StagedView.run.

    Raises, before anything runs: NotFound (no such module), UsageError (not a file, not
    WebAssembly, not a WASI command, imports that WASI preview1 does not provide, a bad
    budget), IsolationUnavailable (wasmtime is not installed; or the view cannot be made).
    """
    if view._closed:
        raise UsageError("this staged view is closed")
    argv_args = _args(args)
    _check_budget("fuel", fuel, _main.FUEL_MAX)
    _check_budget("max_memory_mb", max_memory_mb, _main.MEMORY_MB_MAX)
    if timeout_s is not None and not 0 < timeout_s <= TIMEOUT_S_MAX:
        raise UsageError(f"the timeout must be between 0 and {TIMEOUT_S_MAX:.0f} s")
    env_flags = _env_flags(env)
    dir_flags = _dir_flags(view, dirs)
    label, data = _read_module(view, module)
    compiled, wasmtime_dir = _compile(data, label, fuel=fuel is not None,
                                      epoch=timeout_s is not None,
                                      memory_limit=max_memory_mb is not None)

    # outside the repo: the runner reads the module and writes its report from inside the
    # view, where .agent-tx/ (the view's own dir) is out of reach
    work = tempfile.mkdtemp(prefix=f"agent-2pc-{os.getuid()}-wasm-{owner_tag()}-")
    os.chmod(work, 0o700)
    fd, artifact = tempfile.mkstemp(prefix="wasm-", suffix=".cwasm", dir=work)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(compiled)
        report = artifact[:-len(".cwasm")] + ".json"
        argv = [sys.executable, "-I", WASI_MAIN, "--module", artifact, "--precompiled",
                "--argv0", os.path.basename(label), "--report", report,
                "--pythonpath", wasmtime_dir]
        view_timeout = None
        if fuel is not None:
            argv += ["--fuel", str(fuel)]
        if max_memory_mb is not None:
            argv += ["--max-memory-mb", str(max_memory_mb)]
        if timeout_s is not None:
            argv += ["--deadline-ms", str(max(1, math.ceil(timeout_s * 1000)))]
            view_timeout = min(timeout_s + _main.DEADLINE_GRACE_S + BACKSTOP_S, TIMEOUT_S_MAX)
        argv += env_flags + dir_flags + ["--", *argv_args]
        try:
            run = view.run(argv, timeout_s=view_timeout, interactive=interactive,
                           log_path=log_path, tail_bytes=tail_bytes, stdout_fd=stdout_fd)
        finally:
            os.unlink(artifact)
        rep = _load_report(report)
    finally:
        rmtree(work)
    return _result(run, rep, label, argv_args, fuel, max_memory_mb, timeout_s)


# -- checking the arguments --------------------------------------------------------------------


def _args(args: Iterable[str]) -> list[str]:
    if isinstance(args, (str, bytes)):
        raise UsageError("the module's arguments are a list of strings")
    out = list(args)
    if len(out) > ARGS_MAX or not all(isinstance(a, str) for a in out):
        raise UsageError("the module's arguments are a list of strings")
    if any("\0" in a for a in out):
        raise UsageError("an argument of the module holds a NUL byte")
    return out


def _check_budget(name: str, value: int | None, top: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= top:
        raise UsageError(f"{name} must be a whole number between 1 and {top}")


def _env_flags(env: Mapping[str, str] | None) -> list[str]:
    out: list[str] = []
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not isinstance(value, str) or not name \
                or "=" in name or "\0" in name or "\0" in value:
            raise UsageError(f"the module's environment: bad variable {name!r}")
        out += ["--env", f"{name}={value}"]
    return out


def _dir_flags(view: StagedView, dirs: Iterable[str | tuple[str, str]]) -> list[str]:
    out: list[str] = []
    for spec in dirs:
        host, guest = (spec, spec) if isinstance(spec, str) else spec
        host = os.fspath(host)
        if not os.path.isabs(host) or not os.path.isdir(host):
            raise UsageError(f"an extra directory for the module must be an absolute path to "
                             f"a directory: {host!r}")
        real = os.path.realpath(host)
        if _inside(real, view.root) or _inside(view.root, real):
            raise UsageError(f"{host} is the repo or inside it: the module sees the repo at "
                             f"{GUEST_ROOT} already (an extra directory is outside the repo)")
        if not guest.startswith("/") or guest == GUEST_ROOT or "::" in host or "\0" in guest:
            raise UsageError(f"bad guest path {guest!r} for {host}")
        out += ["--dir", f"{real}::{guest}"]
    return out


def _read_module(view: StagedView, module: str | os.PathLike[str]) -> tuple[str, bytes]:
    """(how to name it, its bytes), as the staged view shows it when it is in the repo."""
    name = os.fspath(module)
    if not isinstance(name, str) or not name or "\0" in name:
        raise UsageError("the module's path is empty or not a string")
    path = os.path.normpath(name if os.path.isabs(name) else os.path.join(view.root, name))
    for _ in range(SYMLINKS_MAX):
        if _inside(path, view.root):
            rel = os.path.relpath(path, view.root)
            seen = None if rel == "." else view.layer.before(rel)
            if seen is None and rel != ".":
                raise NotFound(f"module {rel}: no such file in the staged view", path=rel)
            if seen is not None and seen.kind == "symlink" and seen.target is not None:
                path = os.path.normpath(os.path.join(os.path.dirname(path), seen.target))
                continue
            if seen is None or seen.kind != "file" or seen.source is None:
                raise UsageError(f"module {rel} is not a regular file")
            return rel, _read(seen.source, rel)
        real = os.path.realpath(path)
        if real != path and _inside(real, view.root):
            path = real
            continue
        try:
            st = os.stat(real)
        except OSError as e:
            raise NotFound(f"module {name}: {e.strerror}", path=name) from None
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"module {name} is not a regular file")
        return name, _read(real, name)
    raise UsageError(f"module {name}: too many levels of symbolic links")


def _read(path: str, label: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(_main.MODULE_BYTES_MAX + 1)
    except OSError as e:
        raise UsageError(f"cannot read module {label}: {e.strerror}") from None
    if len(data) > _main.MODULE_BYTES_MAX:
        raise UsageError(f"module {label} is larger than {_main.MODULE_BYTES_MAX >> 20} MiB")
    return data


def _compile(data: bytes, label: str, *, fuel: bool, epoch: bool,
             memory_limit: bool) -> tuple[bytes, str]:
    """Validate and compile the module for the runner's options; (artifact, the directory
    wasmtime was imported from)."""
    try:
        import wasmtime
    except ImportError as e:
        raise IsolationUnavailable(
            f"running WASI modules needs the wasmtime package (pip install 'agent-2pc[wasi]'): "
            f"{e}", tier="wasi") from None
    if not data.startswith(b"\0asm") and not _main.is_wat(data):
        raise UsageError(f"module {label} is not WebAssembly (neither the binary format, "
                         "which starts with \\0asm, nor the text format)")
    engine = wasmtime.Engine(_main.engine_config(wasmtime, fuel=fuel, epoch=epoch,
                                                 memory_limit=memory_limit))
    try:
        compiled = wasmtime.Module(engine, data)
    except wasmtime.WasmtimeError as e:
        raise UsageError(f"module {label} is not a valid WebAssembly module: "
                         f"{_one_line(str(e))}") from None
    start = [x for x in compiled.exports if x.name == "_start"]
    ty = start[0].type if start else None
    if not isinstance(ty, wasmtime.FuncType) or ty.params or ty.results:
        raise UsageError(f"module {label} is not a WASI command: it exports no _start "
                         "function (of no parameters and no results)")
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    try:
        linker.instantiate_pre(compiled)
    except wasmtime.WasmtimeError as e:
        wasi = {"wasi_snapshot_preview1", "wasi_unstable"}
        other = sorted(f"{i.module}.{i.name}" for i in compiled.imports if i.module not in wasi)
        what = f"imports that WASI preview1 does not provide ({', '.join(other)})" if other \
            else f"cannot be linked with WASI preview1 ({_one_line(str(e))})"
        raise UsageError(f"module {label} {what}") from None
    return bytes(compiled.serialize()), os.path.dirname(os.path.dirname(wasmtime.__file__))


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


# -- the result --------------------------------------------------------------------------------


def _load_report(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            rep = json.load(f)
    except (OSError, ValueError):
        return None
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return rep if isinstance(rep, dict) else None


def _result(run: RunResult, rep: dict[str, Any] | None, label: str, args: list[str],
            fuel: int | None, max_memory_mb: int | None,
            timeout_s: float | None) -> WasmResult:
    res = WasmResult.__new__(WasmResult)
    for slot in RunResult.__slots__:
        setattr(res, slot, getattr(run, slot))
    res.module = label
    res.args = args
    res.fuel = fuel
    res.max_memory_mb = max_memory_mb
    res.timeout_s = timeout_s
    res.fuel_consumed = res.memory_peak_bytes = res.module_exit_code = None
    res.message = None
    res.tripped = None
    if rep is not None:
        res.outcome = str(rep.get("outcome"))
        res.tripped = rep.get("tripped")
        res.message = rep.get("message")
        res.module_exit_code = rep.get("module_exit_code")
        res.fuel_consumed = rep.get("fuel_consumed")
        res.memory_peak_bytes = rep.get("memory_peak_bytes")
        if res.outcome == "deadline":
            res.outcome = "timeout"
    elif run.timed_out:
        res.outcome = "timeout"
        res.tripped = "timeout_ms"
        res.message = f"the module was still running after {timeout_s} s and was killed"
    else:
        res.outcome = "crash"
        res.message = (f"the WASI runner ended without a report (exit status "
                       f"{run.exit_code}); see the log")
    if res.tripped == "timeout_ms":
        res.timed_out = True
        res.exit_code = None
    return res
