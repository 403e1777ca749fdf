"""WASI modules run in the staged view (isolation/wasi.py, isolation/_wasi_main.py).

The test modules are WebAssembly text, compiled here by wasmtime: ``wat(body)`` wraps a body in
a prelude that imports WASI preview1 and defines small helpers over the preopened view (fd 3):
``$cat`` prints a file (following symlinks, as wasi-libc's open does), ``$put`` writes one,
``$rm`` deletes one, ``$exists`` tells whether it opens, ``$print_args`` / ``$print_env`` print
argv / environ one per line, ``$print_preopen`` the preopen's name, ``$sleep_s`` blocks in a
host call. A failed WASI call exits with its errno as the status (ENOENT: 44; wasmtime refuses
statuses of 126 and up). ``$"text"`` in a body is the (pointer, length) of a string in the
module's memory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
import wasmtime

from agent_2pc.errors import InputError, IsolationUnavailable, NotFound, UsageError
from agent_2pc.isolation import _view as view_module
from agent_2pc.isolation import wasi
from agent_2pc.isolation.wasi import (
    EXIT_FUEL,
    EXIT_MEMORY,
    EXIT_SETUP,
    EXIT_TRAP,
    WasmResult,
    run_wasm,
)

from .conftest import SRC, nobody_can_run, pids_matching

pytestmark = pytest.mark.timeout(60)

ENOENT = 44  # WASI's errno

PRELUDE = """
(module
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read"
    (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_unlink_file"
    (func $path_unlink_file (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_prestat_get"
    (func $fd_prestat_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_prestat_dir_name"
    (func $fd_prestat_dir_name (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get"
    (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get"
    (func $environ_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get"
    (func $environ_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") MEMORY_PAGES)
  ;; 0..63 scratch, 1024.. strings, 8192.. a read buffer, 16384.. argv/environ
  (func $write (param $fd i32) (param $ptr i32) (param $len i32) (result i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (call $fd_write (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 8)))
  (func $print (param $ptr i32) (param $len i32)
    (drop (call $write (i32.const 1) (local.get $ptr) (local.get $len))))
  (func $ok (param $errno i32)
    (if (local.get $errno)
      (then (call $proc_exit (local.get $errno)))))
  (func $try_open (param $dir i32) (param $path i32) (param $len i32) (param $oflags i32)
    (result i32)  ;; oflags 0: to read (rights fd_read); else to write (every right)
    (call $path_open (local.get $dir) (i32.const 1) (local.get $path) (local.get $len)
      (local.get $oflags)
      (if (result i64) (local.get $oflags) (then (i64.const 0x1fffffff)) (else (i64.const 2)))
      (i64.const 0) (i32.const 0) (i32.const 16)))
  (func $open_in (param $dir i32) (param $path i32) (param $len i32) (param $oflags i32)
    (result i32)
    (call $ok (call $try_open (local.get $dir) (local.get $path) (local.get $len)
      (local.get $oflags)))
    (i32.load (i32.const 16)))
  (func $cat_in (param $dir i32) (param $path i32) (param $len i32) (local $fd i32)
    (local.set $fd (call $open_in (local.get $dir) (local.get $path) (local.get $len)
      (i32.const 0)))
    (i32.store (i32.const 24) (i32.const 8192))
    (i32.store (i32.const 28) (i32.const 4096))
    (call $ok (call $fd_read (local.get $fd) (i32.const 24) (i32.const 1) (i32.const 32)))
    (call $print (i32.const 8192) (i32.load (i32.const 32)))
    (call $ok (call $fd_close (local.get $fd))))
  (func $cat (param $path i32) (param $len i32)
    (call $cat_in (i32.const 3) (local.get $path) (local.get $len)))
  (func $put_in (param $dir i32) (param $path i32) (param $plen i32) (param $data i32)
    (param $dlen i32) (local $fd i32)
    (local.set $fd (call $open_in (local.get $dir) (local.get $path) (local.get $plen)
      (i32.const 9)))  ;; O_CREAT | O_TRUNC
    (call $ok (call $write (local.get $fd) (local.get $data) (local.get $dlen)))
    (call $ok (call $fd_close (local.get $fd))))
  (func $put (param $path i32) (param $plen i32) (param $data i32) (param $dlen i32)
    (call $put_in (i32.const 3) (local.get $path) (local.get $plen) (local.get $data)
      (local.get $dlen)))
  (func $rm (param $path i32) (param $len i32)
    (call $ok (call $path_unlink_file (i32.const 3) (local.get $path) (local.get $len))))
  (func $exists (param $path i32) (param $len i32) (result i32)
    (if (result i32) (call $try_open (i32.const 3) (local.get $path) (local.get $len)
                                     (i32.const 0))
      (then (i32.const 0))
      (else (drop (call $fd_close (i32.load (i32.const 16)))) (i32.const 1))))
  (func $print_lines (param $n i32)  ;; the NUL-separated strings at 20480, one per line
    (local $i i32)
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (if (i32.eqz (i32.load8_u (i32.add (i32.const 20480) (local.get $i))))
        (then (i32.store8 (i32.add (i32.const 20480) (local.get $i)) (i32.const 10))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (call $print (i32.const 20480) (local.get $n)))
  (func $print_args
    (call $ok (call $args_sizes_get (i32.const 40) (i32.const 44)))
    (call $ok (call $args_get (i32.const 16384) (i32.const 20480)))
    (call $print_lines (i32.load (i32.const 44))))
  (func $print_env
    (call $ok (call $environ_sizes_get (i32.const 40) (i32.const 44)))
    (call $ok (call $environ_get (i32.const 16384) (i32.const 20480)))
    (call $print_lines (i32.load (i32.const 44))))
  (func $print_preopen (param $fd i32)
    (call $ok (call $fd_prestat_get (local.get $fd) (i32.const 48)))
    (call $ok (call $fd_prestat_dir_name (local.get $fd) (i32.const 8192)
                                         (i32.load (i32.const 52))))
    (call $print (i32.const 8192) (i32.load (i32.const 52))))
  (func $sleep_s (param $s i64)  ;; poll_oneoff on the monotonic clock: a blocking host call
    (i64.store (i32.const 64) (i64.const 0))
    (i32.store8 (i32.const 72) (i32.const 0))
    (i32.store (i32.const 80) (i32.const 1))
    (i64.store (i32.const 88) (i64.mul (local.get $s) (i64.const 1000000000)))
    (i64.store (i32.const 96) (i64.const 0))
    (i32.store16 (i32.const 104) (i32.const 0))
    (call $ok (call $poll_oneoff (i32.const 64) (i32.const 128) (i32.const 1) (i32.const 40))))
BODY
DATA
)
"""


def wat(body: str, *, memory_pages: int = 1) -> bytes:
    """A WASI module: the prelude, ``body`` (with $"text" strings), its data segment."""
    strings: list[tuple[int, bytes]] = []
    offset = 1024

    def lit(m: re.Match[str]) -> str:
        nonlocal offset
        data = m.group(1).encode().decode("unicode_escape").encode("latin-1")
        strings.append((offset, data))
        out = f"(i32.const {offset}) (i32.const {len(data)})"
        offset += len(data)
        assert offset < 8192
        return out

    body = re.sub(r'\$"((?:[^"\\]|\\.)*)"', lit, body)
    data = "\n".join(f'  (data (i32.const {off}) "{_escape(raw)}")' for off, raw in strings)
    text = PRELUDE.replace("MEMORY_PAGES", str(memory_pages)).replace("BODY", body)
    return bytes(wasmtime.wat2wasm(text.replace("DATA", data)))


def _escape(raw: bytes) -> str:
    return "".join("\\%02x" % b for b in raw)


def start(body: str) -> str:
    return f'(func (export "_start") {body})'


LOOP = start("(loop $l (br $l))")
GROW_THEN_ABORT = start("(loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) "
                        "(i32.const -1)))) unreachable")


@pytest.fixture
def module_file(shared_tmp):
    """module_file(bytes or wat body) -> the path of a .wasm outside the repo."""
    count = [0]

    def make(code: bytes | str, **kw) -> str:
        count[0] += 1
        path = os.path.join(shared_tmp, f"m{count[0]}.wasm")
        with open(path, "wb") as f:
            f.write(code if isinstance(code, (bytes, bytearray)) else wat(code, **kw))
        return path

    return make


def run_ok(view, module, args=(), **kw) -> WasmResult:
    res = run_wasm(view, module, args, timeout_s=30, **kw)
    assert res.passed, (res, res.message, res.tail)
    return res


# -- what the module sees and writes -----------------------------------------------------------


def test_the_module_sees_the_staged_view_at_its_root(staged, tier, module_file):
    mod = module_file(start("""
        (call $cat $"src/app.py")
        (call $cat $"new/deep/made.txt")
        (call $print_preopen (i32.const 3)) (call $print $"|\\n")
        (if (call $exists $"gone.txt") (then (call $print $"gone.txt present\\n"))
                                       (else (call $print $"gone.txt absent\\n")))
        (if (call $exists $"old/only.txt") (then (call $print $"only present\\n"))
                                           (else (call $print $"only absent\\n")))
        (if (call $exists $"README.md") (then (call $print $"README present\\n")))"""))
    with staged.view(tier) as view:
        res = run_ok(view, mod)
        gone = run_wasm(view, module_file(start('(call $cat $"gone.txt")')), timeout_s=30)
    assert (gone.exit_code, gone.outcome) == (ENOENT, "exit")
    assert res.tier == tier and res.outcome == "exit" and res.module_exit_code == 0
    assert res.tail.splitlines() == ["def answer():", "    return 42",
                                     "created by the transaction", "/|", "gone.txt absent",
                                     "only absent", "README present"]
    assert staged.tree_hash() == staged.before


def test_what_the_module_writes_is_captured_and_the_tree_is_untouched(staged, tier,
                                                                     module_file):
    mod = module_file(start("""
        (call $put $"made_by_wasm.txt" $"from the module\\n")
        (call $put $"src/util.py" $"X = 2\\n")
        (call $rm $"README.md")
        (call $rm $"new/deep/made.txt")"""))
    with staged.view(tier) as view:
        res = run_ok(view, mod)
        assert staged.tree_hash() == staged.before  # while the view is open, too
        captured = {c.path: c for c in view.capture().changes}
        assert {p: c.op for p, c in captured.items()} == {
            "made_by_wasm.txt": "write", "src/util.py": "write", "README.md": "delete",
            "new/deep/made.txt": "delete"}
        for path, content in (("made_by_wasm.txt", b"from the module\n"),
                              ("src/util.py", b"X = 2\n")):
            with open(captured[path].source, "rb") as f:
                assert f.read() == content
    assert res.exit_code == 0
    assert staged.tree_hash() == staged.before
    assert not os.path.exists(os.path.join(staged.root, "made_by_wasm.txt"))


def test_args_and_only_the_given_environment_reach_the_module(staged, module_file,
                                                              monkeypatch):
    monkeypatch.setenv("A2PC_SECRET_OF_THE_CALLER", "not for the module")
    mod = module_file(start("(call $print_args) (call $print $\"--\\n\") (call $print_env)"))
    with staged.view(None) as view:
        res = run_ok(view, mod, ["one", "two words", "ünï", "--fuel", ""],
                     env={"GREETING": "hello", "EMPTY": ""})
    assert res.tail.split("\n") == [os.path.basename(mod), "one", "two words", "ünï", "--fuel",
                                    "", "--", "GREETING=hello", "EMPTY=", ""]
    assert res.args == ["one", "two words", "ünï", "--fuel", ""]


def test_a_module_staged_in_the_transaction_is_the_one_that_runs(staged, module_file):
    real = os.path.join(staged.root, "tools", "hello.wasm")
    os.makedirs(os.path.dirname(real))
    with open(real, "wb") as f:
        f.write(wat(start('(call $print $"the committed one\\n")')))
    staged.tx.stage_write("tools/hello.wasm", wat(start('(call $print $"the staged one\\n")')))
    staged.before = staged.tree_hash()
    with staged.view(None) as view:
        assert run_ok(view, "tools/hello.wasm").tail == "the staged one\n"
        assert run_ok(view, real).tail == "the staged one\n"  # absolute, inside the repo
        assert run_ok(view, real).module == "tools/hello.wasm"
    staged.tx.stage_delete("tools/hello.wasm")
    with staged.view(None) as view:
        with pytest.raises(NotFound):
            run_wasm(view, "tools/hello.wasm")
        assert view._runs == 0
    assert staged.tree_hash() == staged.before


def test_the_workspace_is_hidden_from_the_module(staged, overlay_tier, module_file):
    # The view binds the real .agent-tx/ back (for nested agent-2pc calls); a module must not
    # reach the write-ahead log or the blobs through it.
    assert os.path.exists(os.path.join(staged.root, ".agent-tx", "lock"))
    mod = module_file(start("""
        (if (call $exists $".agent-tx/lock") (then (call $print $"lock visible\\n"))
                                             (else (call $print $"lock hidden\\n")))
        (call $put $".agent-tx/planted" $"x")"""))
    with staged.view(overlay_tier) as view:
        res = run_wasm(view, mod, timeout_s=30)
        assert view.capture().changes == []
    assert res.tail.splitlines()[0] == "lock hidden"
    # the write was refused (a read-only tmpfs: wasmtime says EIO)
    assert res.outcome == "exit" and res.exit_code not in (0, None)
    assert not os.path.exists(os.path.join(staged.root, ".agent-tx", "planted"))


def test_symlinks_cannot_lead_the_module_out_of_the_view(staged, module_file, shared_tmp):
    secret = os.path.join(shared_tmp, "secret.txt")
    with open(secret, "w") as f:
        f.write("outside\n")
    os.symlink(secret, os.path.join(staged.root, "out-abs"))
    os.symlink("../secret.txt", os.path.join(staged.root, "out-rel"))
    os.symlink("src/util.py", os.path.join(staged.root, "in-link"))
    staged.before = staged.tree_hash()
    mod = module_file(start("""
        (call $cat $"in-link")
        (if (call $exists $"out-abs") (then (call $print $"abs reached\\n")))
        (if (call $exists $"out-rel") (then (call $print $"rel reached\\n")))"""))
    with staged.view(None) as view:
        res = run_ok(view, mod)
    assert res.tail == "X = 1\n"
    assert staged.tree_hash() == staged.before


def test_extra_directories_are_read_only(staged, module_file, shared_tmp):
    extra = os.path.join(shared_tmp, "extra")
    os.mkdir(extra)
    with open(os.path.join(extra, "lib.txt"), "w") as f:
        f.write("from the extra dir\n")
    reader = module_file(start("""(call $print_preopen (i32.const 4)) (call $print $"\\n")
                                  (call $cat_in (i32.const 4) $"lib.txt")"""))
    writer = module_file(start('(call $put_in (i32.const 4) $"new.txt" $"x")'))
    with staged.view(None) as view:
        res = run_ok(view, reader, dirs=[(extra, "/lib")])
        assert res.tail == "/lib\nfrom the extra dir\n"
        res = run_wasm(view, writer, dirs=[extra], timeout_s=30)
        assert res.exit_code not in (0, None)  # EPERM from wasmtime
        with pytest.raises(UsageError):
            run_wasm(view, reader, dirs=[os.path.join(staged.root, "src")])
        with pytest.raises(UsageError):
            run_wasm(view, reader, dirs=["relative/dir"])
    assert os.listdir(extra) == ["lib.txt"]


def test_not_as_root_the_runner_hides_the_workspace_in_a_user_namespace(shared_tmp,
                                                                        module_file):
    # As root the runner makes a mount namespace only; otherwise a user namespace too. (A
    # whole view as another user is tested in test_tiers.py; here the runner runs on its own,
    # as nobody, where a view would start it.)
    nobody_can_run()
    if view_module._userns_refusal() is not None:
        pytest.skip(view_module._userns_refusal())
    work = os.path.join(shared_tmp, "work")
    os.makedirs(os.path.join(work, ".agent-tx"))
    with open(os.path.join(work, ".agent-tx", "lock"), "w"):
        pass
    nobody = 65534
    os.chown(work, nobody, nobody)
    mod = module_file(start("""
        (if (call $exists $".agent-tx/lock") (then (call $print $"lock visible\\n"))
                                             (else (call $print $"lock hidden\\n")))
        (call $put $"by-wasm.txt" $"mine\\n")"""))
    proc = subprocess.run(["setpriv", f"--reuid={nobody}", f"--regid={nobody}",
                           "--clear-groups", sys.executable, "-I", wasi.WASI_MAIN,
                           "--module", mod], cwd=work, capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "lock hidden\n"), proc.stderr
    with open(os.path.join(work, "by-wasm.txt")) as f:
        assert f.read() == "mine\n"
    assert os.stat(os.path.join(work, "by-wasm.txt")).st_uid == nobody
    assert os.listdir(os.path.join(work, ".agent-tx")) == ["lock"]


# -- how a module ends ---------------------------------------------------------------------------


def test_the_modules_exit_status_is_passed_through(staged, module_file):
    with staged.view(None) as view:
        res = run_wasm(view, module_file(start("(call $proc_exit (i32.const 3))")),
                       timeout_s=30)
        assert (res.exit_code, res.module_exit_code, res.outcome, res.tripped) == \
            (3, 3, "exit", None)
        assert not res.passed
        # a module may exit with one of the runner's own numbers: the report tells them apart
        res = run_wasm(view, module_file(start(f"(call $proc_exit (i32.const {EXIT_FUEL}))")),
                       fuel=10**6, timeout_s=30)
        assert (res.exit_code, res.outcome, res.tripped) == (EXIT_FUEL, "exit", None)


def test_an_infinite_loop_is_stopped_by_fuel_and_reported(staged, module_file):
    with staged.view(None) as view:
        res = run_wasm(view, module_file(LOOP), fuel=1_000_000, timeout_s=30)
    assert (res.exit_code, res.outcome, res.tripped, res.timed_out) == \
        (EXIT_FUEL, "fuel", "fuel", False)
    assert not res.passed and res.fuel_consumed == 1_000_000
    assert "fuel exhausted" in res.message and "--fuel" in res.message
    assert "agent-2pc wasi: fuel exhausted" in res.tail
    out = res.to_json()
    assert out["tripped"] == "fuel" and out["passed"] is False
    assert out["wasm"]["outcome"] == "fuel" and out["wasm"]["fuel"] == 1_000_000


def test_fuel_is_counted_for_a_module_that_finishes(staged, module_file):
    with staged.view(None) as view:
        res = run_ok(view, module_file(start('(call $print $"done\\n")')), fuel=10**6)
    assert res.tail == "done\n" and 0 < res.fuel_consumed < 10**6


def test_a_memory_hungry_module_is_stopped_by_the_memory_limit(staged, module_file):
    with staged.view(None) as view:
        res = run_wasm(view, module_file(GROW_THEN_ABORT), max_memory_mb=16, timeout_s=30)
        assert (res.exit_code, res.outcome, res.tripped) == \
            (EXIT_MEMORY, "memory", "max_memory_mb")
        assert "memory limit reached" in res.message and "16 MiB" in res.message
        assert "unreachable" in res.message  # what the module did when its grow failed
        assert res.memory_peak_bytes <= 16 << 20
        # a module whose initial memory is over the limit does not start
        res = run_wasm(view, module_file(start("nop"), memory_pages=512), max_memory_mb=16,
                       timeout_s=30)
        assert (res.exit_code, res.tripped) == (EXIT_MEMORY, "max_memory_mb")
        # the same module with room enough runs
        res = run_ok(view, module_file(start('(call $print $"fits\\n")'), memory_pages=512),
                     max_memory_mb=64)
        assert res.tail == "fits\n"


def test_a_module_that_copes_with_a_refused_grow_has_not_tripped(staged, module_file):
    copes = start("(loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))"
                  '(call $print $"made do\\n")')
    with staged.view(None) as view:
        res = run_ok(view, module_file(copes), max_memory_mb=8)
    assert res.tripped is None and res.tail == "made do\n"
    assert 7 << 20 <= res.memory_peak_bytes <= 8 << 20


def test_a_deadline_stops_a_module_that_runs_too_long(staged, module_file):
    with staged.view(None) as view:
        t0 = time.monotonic()
        res = run_wasm(view, module_file(LOOP), timeout_s=0.5)
        elapsed = time.monotonic() - t0
    assert (res.timed_out, res.exit_code, res.outcome, res.tripped) == \
        (True, None, "timeout", "timeout_ms")
    assert "deadline passed" in res.message and not res.passed
    assert 0.5 <= elapsed < 10


def test_a_module_blocked_in_a_host_call_is_ended_after_the_deadline(staged, module_file):
    with staged.view(None) as view:
        t0 = time.monotonic()
        res = run_wasm(view, module_file(start("(call $sleep_s (i64.const 60))")),
                       timeout_s=0.5)
        elapsed = time.monotonic() - t0
    assert (res.timed_out, res.tripped) == (True, "timeout_ms")
    assert "blocked in a host call" in res.message
    assert elapsed < 10


def test_a_trap_exits_nonzero_with_the_trap_message(staged, module_file):
    divide = start("(drop (i32.div_u (i32.const 1) (i32.sub (i32.const 1) (i32.const 1))))")
    with staged.view(None) as view:
        res = run_wasm(view, module_file(divide), timeout_s=30)
    assert (res.exit_code, res.outcome, res.tripped) == (EXIT_TRAP, "trap", None)
    assert res.message.startswith("trap: integer divide by zero")
    assert "agent-2pc wasi: trap: integer divide by zero" in res.tail


# -- refused before anything runs -----------------------------------------------------------------


def test_a_missing_or_malformed_module_is_refused_before_anything_runs(staged, module_file,
                                                                       shared_tmp):
    no_start = module_file(wasmtime.wat2wasm('(module (func (export "main")))'))
    foreign = module_file(wasmtime.wat2wasm(
        '(module (import "env" "launch_missiles" (func)) (func (export "_start")))'))
    garbage = module_file(b"this is not webassembly")
    truncated = module_file(wat(start("nop"))[:-3])
    with staged.view(None) as view:
        cases = [
            (os.path.join(shared_tmp, "absent.wasm"), NotFound, "absent.wasm"),
            ("gone.txt", NotFound, "no such file in the staged view"),  # staged delete
            ("src", UsageError, "not a regular file"),
            (garbage, UsageError, "is not WebAssembly"),
            (truncated, UsageError, "not a valid WebAssembly module"),
            (no_start, UsageError, "exports no _start"),
            (foreign, UsageError, "env.launch_missiles"),
            ("", UsageError, "empty"),
        ]
        for module, error, text in cases:
            with pytest.raises(error) as info:
                run_wasm(view, module)
            assert isinstance(info.value, InputError)
            assert text in str(info.value), (module, str(info.value))
        good = module_file(start("nop"))
        for kw in ({"fuel": 0}, {"fuel": -1}, {"fuel": True}, {"max_memory_mb": 0},
                   {"max_memory_mb": 1.5}, {"timeout_s": 0}, {"env": {"A=B": "c"}},
                   {"args": "not a list"}, {"args": ["nul\0byte"]}):
            with pytest.raises(UsageError):
                run_wasm(view, good, **kw)
        assert view._runs == 0  # nothing ran
        assert [n for n in os.listdir(view.dir) if n.startswith("wasm-")] == []


def test_without_wasmtime_running_a_module_is_isolation_unavailable(staged, module_file,
                                                                    monkeypatch):
    mod = module_file(start("nop"))
    monkeypatch.setitem(sys.modules, "wasmtime", None)
    with staged.view(None) as view:
        with pytest.raises(IsolationUnavailable) as info:
            run_wasm(view, mod)
        assert view._runs == 0
    assert "pip install 'agent-2pc[wasi]'" in str(info.value)


def test_the_isolation_package_does_not_import_wasmtime():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, agent_2pc.isolation, agent_2pc.isolation.wasi; "
                               "print('wasmtime' in sys.modules)"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=SRC), check=True)
    assert out.stdout.strip() == "False"


# -- cleanup --------------------------------------------------------------------------------------


def test_nothing_outlives_the_run(staged, tier, module_file):
    scratch = staged.scratch
    with staged.view(tier) as view:
        res = run_wasm(view, module_file(LOOP), timeout_s=0.3)
        assert res.tripped == "timeout_ms"
        assert pids_matching(view.dir) == []  # no runner process is left
        assert [n for n in os.listdir(view.dir) if n.startswith("wasm-")] == []
        view_dir = view.dir
    assert not os.path.exists(view_dir)
    assert [n for n in os.listdir(scratch) if n.startswith("view-")] == []
    with open("/proc/self/mountinfo") as f:
        assert staged.root not in f.read()
    assert staged.tree_hash() == staged.before


# -- the entry point on its own -------------------------------------------------------------------


def test_the_entry_point_runs_a_module_in_the_current_directory(shared_tmp, module_file):
    work = os.path.join(shared_tmp, "work")
    os.mkdir(work)
    with open(os.path.join(work, "in.txt"), "w") as f:
        f.write("input\n")
    env = dict(os.environ, PYTHONPATH=SRC)
    main = [sys.executable, "-m", "agent_2pc.isolation._wasi_main"]

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*main, *argv], cwd=work, env=env, capture_output=True,
                              text=True, timeout=30)

    copy = module_file(start('(call $cat $"in.txt") (call $put $"out.txt" $"output\\n")'))
    out = run("--module", copy)
    assert (out.returncode, out.stdout) == (0, "input\n")
    with open(os.path.join(work, "out.txt")) as f:
        assert f.read() == "output\n"
    report = os.path.join(shared_tmp, "report.json")
    out = run("--module", module_file(LOOP), "--fuel", "1000", "--report", report)
    assert out.returncode == EXIT_FUEL
    assert out.stderr.startswith("agent-2pc wasi: fuel exhausted")
    with open(report) as f:
        assert json.load(f)["tripped"] == "fuel"
    text = os.path.join(shared_tmp, "args.wat")
    with open(text, "w") as f:  # WebAssembly text is accepted as it is
        f.write(wat_text(start("(call $print_args)")))
    out = run("--module", text, "--argv0", "prog", "--", "a", "--b")
    assert (out.returncode, out.stdout) == (0, "prog\na\n--b\n")
    out = run("--module", os.path.join(shared_tmp, "absent.wasm"))
    assert out.returncode == EXIT_SETUP and "cannot read" in out.stderr
    out = run("--module", copy, "--fuel", "0")
    assert out.returncode == EXIT_SETUP and "--fuel" in out.stderr


def wat_text(body: str) -> str:
    """The text of ``wat(body)`` for a body without strings."""
    assert '$"' not in body
    return PRELUDE.replace("MEMORY_PAGES", "1").replace("BODY", body).replace("DATA", "")


def test_files_in_the_view_cannot_stand_in_for_the_runner(staged, module_file, monkeypatch):
    # The runner starts with -I: neither the view's files (its working directory) nor a
    # relative PYTHONPATH can replace it or what it imports.
    for rel in ("wasmtime/__init__.py", "agent_2pc/__init__.py"):
        staged.tx.stage_write(rel, "import os\nos._exit(99)\n")
    monkeypatch.setenv("PYTHONPATH", ".")
    with staged.view(None) as view:
        res = run_ok(view, module_file(start('(call $print $"the real runner\\n")')))
    assert res.tail == "the real runner\n"
