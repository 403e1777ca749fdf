"""Record what real agent-2pc processes do to the disk: strace, then a parser.

A workload's commands run as real CLI processes under ``strace -f -xx -y``: every file-system
call of the process and of everything it starts (SQLite's writes to the fence store, the
sweeper, the staged view's helpers) is recorded with its arguments, every string byte
hex-escaped (so nothing in a path or a payload can confuse the parser) and every descriptor
annotated with the path it names. Why the system-call level and not the storage layer's own
calls: it sees the code that bypasses storage/ (SQLite is C; a stray ``open(..., "w")`` in the
engine), it needs no cooperation from the code under test (a new call site cannot hide from
it), and it records what the kernel was asked, which is what a persistence model reasons
about. What it cannot see: writes through a shared memory map (SQLite's ``-shm`` wal-index,
which is not durable state: SQLite rebuilds it when the first connection opens after a
crash), and time stamps and ownership (the model ignores them).

``parse`` turns strace's text into ``Call`` objects, one per completed system call, in the
order strace saw them complete.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

TRACED = (
    # what changes files and names
    "open,openat,openat2,creat,write,pwrite64,writev,pwritev,pwritev2,truncate,ftruncate,"
    "fallocate,rename,renameat,renameat2,link,linkat,unlink,unlinkat,mkdir,mkdirat,rmdir,"
    "symlink,symlinkat,chmod,fchmod,fchmodat,copy_file_range,sendfile,splice,"
    # what exec's capture reads of a file in the staged view before moving it into the root
    "pread64,"
    # what makes it durable
    "fsync,fdatasync,sync,syncfs,sync_file_range,msync,"
    # descriptors and processes (which file a descriptor names, and its position)
    "close,close_range,lseek,dup,dup2,dup3,fcntl,clone,clone3,fork,vfork,execve,mmap,"
    # which mount namespace (the staged view's processes see another tree at the same
    # paths), which working directory
    "unshare,setns,chdir,fchdir,"
    # HTTP calls of the API participant (when its request left, when its answer came)
    "connect,sendto,sendmsg,recvfrom,recvmsg"
)
STRSIZE_MAX = 1 << 26  # bytes of a write strace prints; a larger write fails the parse

_LINE = re.compile(r"^(\d+) +(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)\) += (.*)$", re.S)
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$", re.S)
_RET = re.compile(r"^(-?\d+|0x[0-9a-f]+|\?)(?:<(.*)>(?:\(deleted\))?)?"
                  r"(?: (E[A-Z0-9]+) \(.*\)| \(.*\)| <.*>)?$", re.S)
_STR = re.compile(r'^"((?:\\x[0-9a-f]{2})*)"(\.\.\.)?$')
_NS_PID = re.compile(r"^-?\d+ /\* (\d+) in strace's PID NS \*/")
_FD = re.compile(r"^(-?\d+|AT_FDCWD)<(.*)>(\(deleted\))?$", re.S)


class TraceError(Exception):
    """The trace holds something the parser or the model cannot account for."""


@dataclass
class Call:
    pid: int
    name: str
    args: list[str]
    ret: int | None  # None: no return (the process died in the call)
    ret_path: str | None = None  # the path annotation of a returned descriptor
    errno: str | None = None
    index: int = 0  # position in the whole trace
    raw: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.ret is not None and self.errno is None and self.ret >= 0


def strace_path() -> str | None:
    return shutil.which("strace")


def traced(argv: list[str], out: str, inject: str | None = None) -> list[str]:
    """``argv`` run under strace, writing the trace to ``out``; ``inject`` makes a system call
    fail for real (``fsync:error=EIO:when=1``: the first fsync; the trace says INJECTED)."""
    exe = strace_path()
    if exe is None:
        raise TraceError("strace is not installed (apt-get install strace)")
    return [exe, "-f", "-qq", "-xx", "-y", "-yy", "--pidns-translation", "-s",
            str(STRSIZE_MAX), "-e", "signal=none", "-e", f"trace={TRACED}",
            *(["-e", f"inject={inject}"] if inject else []), "-o", out, *argv]


def run_traced(argv: list[str], out: str, *, cwd: str | None = None,
               env: dict[str, str] | None = None, timeout_s: float = 300.0,
               stdin: bytes | None = None, inject: str | None = None
               ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(traced(argv, out, inject), cwd=cwd, env=env, input=stdin,
                          capture_output=True, timeout=timeout_s, check=False)


def unhex(s: str) -> bytes:
    """The bytes of a strace string argument (``"\\x41\\x42"``); fails on a cut one."""
    m = _STR.match(s)
    if m is None:
        raise TraceError(f"not a string argument: {s[:80]!r}")
    if m.group(2):
        raise TraceError("a string argument was cut short (raise STRSIZE_MAX)")
    return bytes.fromhex(m.group(1).replace("\\x", ""))


def fd_arg(s: str) -> tuple[int | None, str | None]:
    """(descriptor, the path strace resolved it to) of a descriptor argument; None for
    AT_FDCWD's number. The path is raw: ``socket:[...]``, ``TCP:[...]``, a file's path."""
    m = _FD.match(s)
    if m is None:
        try:
            return int(s), None
        except ValueError:
            raise TraceError(f"not a descriptor argument: {s[:80]!r}") from None
    num = None if m.group(1) == "AT_FDCWD" else int(m.group(1))
    path = _annotation(m.group(2))
    return num, path + " (deleted)" if m.group(3) else path


def _annotation(text: str) -> str:
    """A descriptor's annotation: hex escapes decoded (paths), other forms kept."""
    if "\\x" in text:
        text = re.sub(r"\\x([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), text)
        # Paths are bytes; strace escapes every byte, so decode as the OS does.
        return os.fsdecode(text.encode("latin-1"))
    return text


def split_args(body: str) -> list[str]:
    """Top-level arguments: strings hold only hex escapes, so commas split outside braces,
    brackets and angle brackets (descriptor annotations)."""
    out: list[str] = []
    depth = 0
    start = 0
    in_str = False
    i = 0
    while i < len(body):
        ch = body[i]
        if in_str:
            if ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[<(":
            depth += 1
        elif ch in "}])" or (ch == ">" and body[i - 1] != "-"):  # "->" inside TCP:[a->b]
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(body[start:i].strip())
            start = i + 1
        i += 1
    tail = body[start:].strip()
    if tail:
        out.append(tail)
    return out


def parse(path: str) -> list[Call]:
    """Every completed call of a trace file, in the order strace printed their completion."""
    pending: dict[int, str] = {}
    calls: list[Call] = []
    with open(path, encoding="latin-1") as f:
        for line in f:
            line = line.rstrip("\n")
            m = _LINE.match(line)
            if m is None:
                continue
            pid, rest = int(m.group(1)), m.group(2)
            if rest.startswith("+++") or rest.startswith("---"):
                continue
            if rest.endswith("<unfinished ...>"):
                pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
                continue
            r = _RESUMED.match(rest)
            if r is not None:
                head = pending.pop(pid, None)
                if head is None:
                    continue  # began before the trace did
                rest = head + r.group(2)
            call = _parse_call(pid, rest)
            if call is not None:
                call.index = len(calls)
                calls.append(call)
    for pid, head in pending.items():  # died inside the call (a crash point, a kill)
        m2 = re.match(r"^(\w+)\(", head)
        if m2:
            calls.append(Call(pid, m2.group(1), split_args(head[len(m2.group(0)):]), None,
                              index=len(calls), raw=head))
    return calls


def _parse_call(pid: int, text: str) -> Call | None:
    m = _CALL.match(text)
    if m is None:
        return None
    name, body, ret_text = m.group(1), m.group(2), m.group(3)
    ret_text = ret_text.strip()
    ns = _NS_PID.search(ret_text)
    if ns is not None:  # a pid returned inside a PID namespace: strace says which it is
        ret_text = ns.group(1) + ret_text[ns.end():]
    r = _RET.match(ret_text)
    if r is None:
        raise TraceError(f"cannot read the return value of {text[:200]!r}")
    if r.group(1) == "?":
        ret = None
    elif r.group(1).startswith("0x"):
        ret = int(r.group(1), 16)
    else:
        ret = int(r.group(1))
    ret_path = _annotation(r.group(2)) if r.group(2) is not None else None
    return Call(pid, name, split_args(body), ret, ret_path, r.group(3), raw=text)
