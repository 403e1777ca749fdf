"""Run one WASI (preview1) command module with wasmtime, in the current directory: the process
that ``wasi.run_wasm`` starts inside a staged view (docs/wasi.md).

    python -I .../_wasi_main.py --module M.wasm [--precompiled] [--fuel N]
        [--max-memory-mb N] [--deadline-ms N] [--env NAME[=VALUE]]... [--dir HOST[::GUEST]]...
        [--argv0 NAME] [--report FILE] [--pythonpath DIR] -- ARGS...

(``python -m agent_2pc.isolation._wasi_main ...`` works too.) Standalone on purpose: the
standard library and ``wasmtime`` only, no import of the package, so that ``run_wasm`` can start
it with ``-I`` and nothing in the view (a staged ``agent_2pc/`` at the repo root, a relative
``PYTHONPATH``) can stand in for it.

- The current directory (the view's root) is preopened **read-write at "/"**: the module sees
  the repo as its whole file system (fd 3). ``/src/a.py`` and ``src/a.py`` name the same file
  (wasi-libc's working directory is "/"). ``--dir HOST[::GUEST]`` adds read-only preopens.
- ``.agent-tx/`` at the root, which a view binds back to the real workspace, is hidden: before
  the module runs, this process enters a mount namespace of its own (and a user namespace when
  it is not root) and mounts an empty read-only tmpfs over it. If that fails, nothing runs.
- stdin, stdout and stderr are this process's own. The environment is only what ``--env``
  gives (``NAME=VALUE``, or ``NAME`` for our own value). ``argv[0]`` is ``--argv0`` (default:
  the module's file name).
- Budgets: ``--fuel N`` (wasmtime fuel: about one unit per instruction executed), ``--max-memory-
  mb N`` (each linear memory; a grow past it fails, and a module that does not then finish
  with status 0 is reported as stopped by the limit), ``--deadline-ms N`` (epoch interruption;
  a module blocked in a host call is ended DEADLINE_GRACE_S later).

Exit status: the module's own (``proc_exit(n)``, 0 when ``_start`` returns; a code outside
0..255 becomes 1), or one of ours, with one line on stderr that starts ``agent-2pc wasi:`` and
names what happened:

    EXIT_SETUP    121  the module could not be started (bad arguments, unreadable or invalid
                       module, .agent-tx/ could not be hidden)
    EXIT_MEMORY   122  the memory limit (--max-memory-mb) stopped it
    EXIT_FUEL     123  the fuel (--fuel) ran out
    EXIT_DEADLINE 124  the deadline (--deadline-ms) passed
    EXIT_TRAP     134  any other trap (as the wasmtime CLI)

A module may exit with one of these numbers itself: ``--report FILE`` receives one JSON object
(``outcome``, ``tripped``, ``exit_code``, ``module_exit_code``, ``message``, ``fuel_consumed``,
``memory_peak_bytes``) that says which it was; ``run_wasm`` reads that, never the status alone.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

EXIT_SETUP = 121
EXIT_MEMORY = 122
EXIT_FUEL = 123
EXIT_DEADLINE = 124
EXIT_TRAP = 134

# outcome -> tripped (the option names of the CLI, as stage-governed reports them)
TRIPPED = {"fuel": "fuel", "memory": "max_memory_mb", "deadline": "timeout_ms"}

GUEST_ROOT = "/"
HIDDEN = (".agent-tx",)
DEADLINE_GRACE_S = 1.0
MODULE_BYTES_MAX = 512 << 20
FUEL_MAX = (1 << 63) - 1
MEMORY_MB_MAX = 1 << 20  # 1 TiB: memory64 may go that far; wasm32 stops at 4 GiB anyway
DEADLINE_MS_MAX = 30 * 24 * 3600 * 1000
PREFIX = "agent-2pc wasi: "

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
PROT_READ, PROT_WRITE = 1, 2
MAP_PRIVATE, MAP_ANONYMOUS, MAP_NORESERVE = 0x02, 0x20, 0x4000
PAGE = 65536


def engine_config(wasmtime: Any, *, fuel: bool, epoch: bool, memory_limit: bool) -> Any:
    """The wasmtime Config for these options. ``run_wasm`` compiles with it and this process
    deserializes with it: both sides must agree (wasmtime checks)."""
    cfg = wasmtime.Config()
    cfg.consume_fuel = fuel
    cfg.epoch_interruption = epoch
    if memory_limit:
        # Memories without a reservation or guard pages, bounds-checked in code: ours
        # (_MemoryLimit) then sees every grow, and can say that the limit refused one.
        cfg.memory_reservation = 0
        cfg.memory_guard_size = 0
        cfg.memory_reservation_for_growth = 0
        # Copy-on-write memory images are for wasmtime's own mmap memories: with a memory
        # creator, a module with data segments makes wasmtime 50 panic ("memory_image is Some
        # only for mmap-based memories") unless they are off.
        cfg.memory_init_cow = False
    return cfg


def is_wat(data: bytes) -> bool:
    """WebAssembly text rather than a binary (which starts with b"\\0asm")."""
    return not data.startswith(b"\0asm") and data.lstrip()[:1] in (b"(", b";")


class Outcome(Exception):
    """How the run ended, when it did not end by the module's own exit."""

    def __init__(self, outcome: str, status: int, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.status = status
        self.message = message


class _MemoryLimit:
    """A wasmtime memory creator that enforces ``limit`` bytes per linear memory and records
    the grows it refused (the store's own limiter refuses silently: memory.grow returns -1 and
    nobody can tell afterwards that the limit was the reason)."""

    def __init__(self, wasmtime: Any, limit: int) -> None:
        from wasmtime import _ffi as ffi

        self.ffi = ffi
        self.limit = limit
        self.refused: list[int] = []  # byte sizes asked for and refused
        self.peak = 0
        self.mems: dict[int, list[int]] = {}  # key -> [base, size, capacity]
        self.next_key = 1
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap = libc.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        self.munmap = libc.munmap
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        fin_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        # ctypes callbacks: kept on self, so that they live as long as the engine.
        self._get = ffi.wasmtime_memory_get_callback_t(self._get_memory)
        self._grow = ffi.wasmtime_memory_grow_callback_t(self._grow_memory)
        self._fin = fin_t(self._free_memory)
        self._new = ffi.wasmtime_new_memory_callback_t(self._new_memory)
        self._fin_creator = fin_t(lambda env: None)
        creator: Any = ffi.wasmtime_memory_creator_t()  # (its fields are typed as pointers)
        creator.env = None
        creator.new_memory = self._new
        creator.finalizer = self._fin_creator
        self.creator = creator

    def install(self, cfg: Any) -> None:
        self.ffi.wasmtime_config_host_memory_creator_set(cfg.ptr(), ctypes.byref(self.creator))

    def _error(self, message: str) -> int:
        err = self.ffi.wasmtime_error_new(message.encode("utf-8"))
        return ctypes.cast(err, ctypes.c_void_p).value or 0

    def _over(self, size: int) -> str:
        self.refused.append(size)
        return (f"a linear memory of {size} bytes is over the limit of {self.limit} bytes "
                f"({self.limit >> 20} MiB, max_memory_mb)")

    def _new_memory(self, env: Any, ty: Any, minimum: int, maximum: int, reserved: int,
                    guard: int, ret: Any) -> int:
        try:
            if minimum > self.limit:
                return self._error(self._over(minimum))
            cap = max(min(maximum, self.limit), reserved + guard, minimum, PAGE)
            base = self.mmap(None, cap, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
            if base is None or base == ctypes.c_void_p(-1).value:
                return self._error(f"cannot map {cap} bytes for a linear memory: "
                                   f"{os.strerror(ctypes.get_errno())}")
            key = self.next_key
            self.next_key += 1
            self.mems[key] = [base, minimum, cap]
            self.peak = max(self.peak, minimum)
            ret[0].env = key
            ret[0].get_memory = self._get
            ret[0].grow_memory = self._grow
            ret[0].finalizer = self._fin
            return 0
        except BaseException as e:  # never let an exception cross into wasmtime
            return self._error(f"cannot make a linear memory: {e!r}")

    def _get_memory(self, env: int, size_p: Any, max_p: Any) -> int:
        base, size, cap = self.mems[env]
        size_p[0] = size
        max_p[0] = min(cap, self.limit)
        return base

    def _grow_memory(self, env: int, new_size: int) -> int:
        try:
            mem = self.mems[env]
            if new_size > self.limit:
                return self._error(self._over(new_size))
            if new_size > mem[2]:  # past the module's own maximum (wasmtime checks it first)
                return self._error(f"a linear memory cannot grow past {mem[2]} bytes")
            mem[1] = new_size  # the pages are mapped already: untouched ones cost nothing
            self.peak = max(self.peak, new_size)
            return 0
        except BaseException as e:
            return self._error(f"cannot grow a linear memory: {e!r}")

    def _free_memory(self, env: int) -> None:
        mem = self.mems.pop(env, None)
        if mem is not None:
            self.munmap(mem[0], mem[2])


def hide(root: str, names: tuple[str, ...] = HIDDEN) -> list[str]:
    """Mount an empty read-only tmpfs over each directory ``root/NAME``, in a mount namespace
    of this process's own (and a user namespace when not root). Returns what it hid. Must run
    while the process has one thread (unshare(CLONE_NEWUSER) refuses otherwise)."""
    targets = [os.path.join(root, n) for n in names if os.path.isdir(os.path.join(root, n))
               and not os.path.islink(os.path.join(root, n))]
    if not targets:
        return []
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()

    def check(rc: int, what: str) -> None:
        if rc != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"{what}: {os.strerror(e)}")

    check(libc.unshare(CLONE_NEWNS | (0 if uid == 0 else CLONE_NEWUSER)), "unshare")
    if uid != 0:
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map",
                           f"{uid} {uid} 1"), ("/proc/self/gid_map", f"{gid} {gid} 1")):
            with open(path, "w") as f:
                f.write(text)
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    for t in targets:
        check(libc.mount(b"agent-2pc-hidden", os.fsencode(t), b"tmpfs",
                         MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=4k,mode=0555"),
              f"mount tmpfs on {t}")
    return targets


class _Report:
    """The JSON report, written once; the descriptor is opened before the module runs (and
    before .agent-tx/ is hidden, where the report usually lives)."""

    def __init__(self, path: str | None) -> None:
        self.fd = None if path is None else os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self.lock = threading.Lock()
        self.done = False

    def finish(self, status: int, outcome: str, message: str | None,
               module_exit_code: int | None = None, **extra: Any) -> bool:
        """Write the report and the stderr line; False when another thread finished first."""
        with self.lock:
            if self.done:
                return False
            self.done = True
            if message:
                try:
                    sys.stderr.write(PREFIX + message.rstrip("\n") + "\n")
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
            if self.fd is not None:
                data = {"outcome": outcome, "tripped": TRIPPED.get(outcome),
                        "exit_code": status, "module_exit_code": module_exit_code,
                        "message": message, **extra}
                try:
                    os.write(self.fd, json.dumps(data).encode())
                    os.close(self.fd)
                except OSError:
                    pass
            return True


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{PREFIX}cannot run the module: {message}\n")
        sys.exit(EXIT_SETUP)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="agent-2pc-wasi", description="Run a WASI preview1 command module in "
                "the current directory (preopened read-write at /).")
    p.add_argument("--module", required=True, help="the module: .wasm, .wat, or --precompiled")
    p.add_argument("--precompiled", action="store_true",
                   help="--module was serialized by run_wasm with the same options")
    p.add_argument("--fuel", type=int)
    p.add_argument("--max-memory-mb", type=int)
    p.add_argument("--deadline-ms", type=int)
    p.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]")
    p.add_argument("--dir", action="append", default=[], metavar="HOST[::GUEST]",
                   help="an extra directory, read-only")
    p.add_argument("--argv0")
    p.add_argument("--report")
    p.add_argument("--pythonpath", action="append", default=[],
                   help="where else to look for wasmtime (appended to sys.path)")
    p.add_argument("args", nargs="*")
    return p


def _check_args(p: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    for name, value, top in (("--fuel", ns.fuel, FUEL_MAX),
                             ("--max-memory-mb", ns.max_memory_mb, MEMORY_MB_MAX),
                             ("--deadline-ms", ns.deadline_ms, DEADLINE_MS_MAX)):
        if value is not None and not 0 < value <= top:
            p.error(f"{name} must be between 1 and {top}")
    for a in [*ns.args, *ns.env, *ns.dir, ns.argv0 or ""]:
        if "\0" in a:
            p.error("an argument holds a NUL byte")
    for e in ns.env:
        if not e.split("=", 1)[0]:
            p.error(f"--env {e!r}: no name")


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    ns = p.parse_args(argv)
    _check_args(p, ns)
    try:
        report = _Report(ns.report)
    except OSError as e:
        sys.stderr.write(f"{PREFIX}cannot run the module: cannot write the report: {e}\n")
        return EXIT_SETUP
    try:
        return _run(ns, report)
    except Outcome as o:
        report.finish(o.status, o.outcome, o.message)
        return o.status
    except Exception as e:  # a bug: say so, with the traceback, and still write the report
        import traceback

        traceback.print_exc()
        report.finish(EXIT_SETUP, "setup", f"cannot run the module: internal error: {e!r}")
        return EXIT_SETUP


def _setup_error(message: str) -> Outcome:
    return Outcome("setup", EXIT_SETUP, f"cannot run the module: {message}")


def _run(ns: argparse.Namespace, report: _Report) -> int:
    root = os.getcwd()
    try:
        with open(ns.module, "rb") as f:
            data = f.read(MODULE_BYTES_MAX + 1)
    except OSError as e:
        raise _setup_error(f"cannot read {ns.module}: {e.strerror or e}") from None
    if len(data) > MODULE_BYTES_MAX:
        raise _setup_error(f"{ns.module} is larger than {MODULE_BYTES_MAX >> 20} MiB")
    dirs: list[tuple[str, str]] = []
    for spec in ns.dir:
        host, _, guest = spec.partition("::")
        if not os.path.isdir(host):
            raise _setup_error(f"--dir {host}: not a directory")
        dirs.append((host, guest or host))
    env = []
    for spec in ns.env:
        name, eq, value = spec.partition("=")
        if eq:
            env.append((name, value))
        elif name in os.environ:
            env.append((name, os.environ[name]))
    try:
        hide(root)  # before any thread exists
    except OSError as e:
        raise _setup_error(f"cannot hide {', '.join(HIDDEN)} from the module "
                           f"({e.strerror or e})") from None

    sys.path.extend(ns.pythonpath)
    try:
        import wasmtime
    except ImportError as e:
        raise _setup_error(f"the wasmtime package is not installed ({e})") from None

    limit = None if ns.max_memory_mb is None else ns.max_memory_mb << 20
    cfg = engine_config(wasmtime, fuel=ns.fuel is not None, epoch=ns.deadline_ms is not None,
                        memory_limit=limit is not None)
    memory = None
    if limit is not None:
        memory = _MemoryLimit(wasmtime, limit)
        memory.install(cfg)
    engine = wasmtime.Engine(cfg)
    try:
        if ns.precompiled:
            module = wasmtime.Module.deserialize(engine, data)
        else:
            if not data.startswith(b"\0asm") and not is_wat(data):
                raise _setup_error(f"{ns.module} is not a WebAssembly module (neither the binary "
                                   "format nor the text format)")
            module = wasmtime.Module(engine, data)
    except (wasmtime.WasmtimeError, ValueError) as e:
        raise _setup_error(f"{ns.module} is not a valid WebAssembly module: {e}") from None

    store = wasmtime.Store(engine)
    wasi = wasmtime.WasiConfig()
    wasi.argv = [ns.argv0 or os.path.basename(ns.module), *ns.args]
    wasi.env = env
    wasi.inherit_stdin()
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    try:
        wasi.preopen_dir(root, GUEST_ROOT, True)
        for host, guest in dirs:
            wasi.preopen_dir(host, guest, False)
    except wasmtime.WasmtimeError as e:
        raise _setup_error(f"cannot preopen a directory: {e}") from None
    store.set_wasi(wasi)
    if ns.fuel is not None:
        store.set_fuel(ns.fuel)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()

    def budgets() -> dict[str, Any]:
        out: dict[str, Any] = {"fuel_consumed": None, "memory_peak_bytes": None}
        if ns.fuel is not None:
            try:
                out["fuel_consumed"] = ns.fuel - store.get_fuel()
            except wasmtime.WasmtimeError:
                pass
        if memory is not None:
            out["memory_peak_bytes"] = memory.peak
        return out

    if ns.deadline_ms is not None:
        store.set_epoch_deadline(1)
        _start_watchdog(engine, ns.deadline_ms, report)

    started = False
    try:
        instance = linker.instantiate(store, module)
        start = instance.exports(store).get("_start")
        if not isinstance(start, wasmtime.Func):
            raise _setup_error(f"{ns.module} is not a WASI command: it exports no _start "
                               "function")
        started = True
        start(store)
        code = 0
    except wasmtime.ExitTrap as e:
        code = e.code
    except (wasmtime.Trap, wasmtime.WasmtimeError) as e:
        o = _classify(e, wasmtime, ns, memory, started)
        report.finish(o.status, o.outcome, o.message, **budgets())
        return o.status
    status = code if 0 <= code <= 255 else 1
    if memory is not None and memory.refused and code != 0:
        o = _memory_outcome(memory, f"then the module exited with status {code}")
        report.finish(o.status, o.outcome, o.message, module_exit_code=code, **budgets())
        return o.status
    report.finish(status, "exit", None, module_exit_code=code, **budgets())
    return status


def _memory_outcome(memory: _MemoryLimit, then: str) -> Outcome:
    asked = max(memory.refused)
    return Outcome("memory", EXIT_MEMORY,
                   f"memory limit reached (max_memory_mb): the module asked for a linear "
                   f"memory of {asked} bytes ({asked / (1 << 20):.1f} MiB), over the limit of "
                   f"{memory.limit >> 20} MiB (--max-memory-mb); {then}")


def _classify(e: Exception, wasmtime: Any, ns: argparse.Namespace,
              memory: _MemoryLimit | None, started: bool) -> Outcome:
    """What ended the run. ``started``: the error came out of _start (else out of
    instantiation: a missing import, a memory over the limit, a trap in a start function)."""
    code = e.trap_code if isinstance(e, wasmtime.Trap) else None
    text = str(e).strip()
    if code == wasmtime.TrapCode.OUT_OF_FUEL:
        return Outcome("fuel", EXIT_FUEL, f"fuel exhausted (fuel): the module used up its "
                       f"budget of {ns.fuel} fuel (--fuel)")
    if code == wasmtime.TrapCode.INTERRUPT:
        return Outcome("deadline", EXIT_DEADLINE, f"deadline passed (timeout_ms): the module "
                       f"was still running after {ns.deadline_ms} ms (--deadline-ms)")
    if memory is not None and memory.refused:
        return _memory_outcome(memory, f"then: {text}")
    if isinstance(e, wasmtime.Trap) or started:
        # Out of _start, an error that is not a trap is still the module's doing: a host
        # call that failed fatally (proc_exit with a status wasmtime refuses, 126 and up).
        return Outcome("trap", EXIT_TRAP, f"trap: {_trap_text(text)}")
    return Outcome("setup", EXIT_SETUP, f"cannot run the module: {_trap_text(text)}")


def _trap_text(text: str) -> str:
    """wasmtime's "error while executing at wasm backtrace: ... Caused by: CAUSE" as "CAUSE",
    then the backtrace."""
    head, sep, cause = text.partition("Caused by:")
    if not sep:
        return text
    cause = " ".join(line.strip() for line in cause.strip().splitlines())
    cause = cause.removeprefix("wasm trap: ")
    frames = [line.strip() for line in head.splitlines()[1:] if line.strip()]
    return cause + "".join(f"\n    at {f}" for f in frames)


def _start_watchdog(engine: Any, deadline_ms: int, report: _Report) -> None:
    """After ``deadline_ms``, interrupt the module (an epoch tick: it traps at its next loop
    head or call); if it is blocked in a host call and still running DEADLINE_GRACE_S later,
    end the process."""

    def watch() -> None:
        time.sleep(deadline_ms / 1000)
        engine.increment_epoch()
        time.sleep(DEADLINE_GRACE_S)
        if report.finish(EXIT_DEADLINE, "deadline",
                         f"deadline passed (timeout_ms): the module was still running after "
                         f"{deadline_ms} ms (--deadline-ms), blocked in a host call"):
            os._exit(EXIT_DEADLINE)

    threading.Thread(target=watch, name="wasi-deadline", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
