"""A file system in memory, and the operations a trace did to it (ALICE's "logical" view).

``snapshot`` reads a real directory tree (the workspace before the workload) into ``Node``s
keyed by inode number (hard links share one). ``Interpreter`` replays a trace's system calls
against that picture -- the page cache's view, what every process saw -- and turns each call
into micro-operations on inode numbers:

    link(dir, name, ino)           a name appears (creat, mkdir, symlink, link, rename's target)
    unlink(dir, name, ino)         a name goes (unlink, rmdir, rename's source)
    rename(dir, old, new, ino)     a rename inside one directory (one atomic entry change)
    write(ino, off, data)          bytes of a file
    trunc(ino, size)               a file's size
    chmod(ino, mode)
    fsync(ino)                     a barrier for that file (or directory)
    sync                           a barrier for everything (sync), or for everything on one
                                   file system (syncfs: ``info`` names its inodes)
    mark(label, ...)               no effect: a command's answer, an HTTP request leaving ...

Because operations name inodes, any subset of them applies cleanly (``materialize``): that is
what the persistence models (models.py) choose. A rename across directories is two
operations, the new name and the old name going, so that a model may keep one and not the
other.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field

from .trace import Call, TraceError, fd_arg, split_args, unhex

O_ACCMODE = 0o3
O_CREAT = 0o100
O_TRUNC = 0o1000
O_APPEND = 0o2000
O_DIRECTORY = 0o200000
O_CLOEXEC = 0o2000000
AT_REMOVEDIR = 0x200

FILE, DIR, LINK = "f", "d", "l"
_CLONES = ("clone", "clone3", "fork", "vfork")
_VIEW_SCRATCH = re.compile(r"^/\.agent-tx/(tx|trash)/[^/]+/view-[^/]+/")


@dataclass
class Node:
    kind: str
    mode: int
    dev: int
    data: bytearray | None = None  # files
    target: str | None = None  # links
    entries: dict[str, int] | None = None  # directories

    def copy(self) -> Node:
        return Node(self.kind, self.mode, self.dev,
                    bytearray(self.data) if self.data is not None else None, self.target,
                    dict(self.entries) if self.entries is not None else None)


@dataclass
class Op:
    kind: str
    ino: int | None = None
    dir: int | None = None
    name: str | None = None
    new_name: str | None = None
    off: int = 0
    data: bytes = b""
    size: int = 0
    mode: int = 0
    label: str = ""
    info: dict[str, object] = field(default_factory=dict)
    couple: int | None = None  # a cross-directory rename: the index of the other half
    call: int = -1  # the system call it came from
    failed: bool = False  # a barrier that reported an error (fsync EIO): not a barrier
    index: int = -1


@dataclass
class Fs:
    """A picture of a tree: nodes by inode number, the root's number, and what each inode
    looks like when it is born (for inodes created during the trace)."""

    root: str
    root_ino: int
    nodes: dict[int, Node]
    births: dict[int, Node] = field(default_factory=dict)

    def clone(self) -> Fs:
        """Copy-on-write: nodes are shared until ``own`` copies them."""
        return Fs(self.root, self.root_ino, dict(self.nodes), self.births)


def snapshot(root: str) -> Fs:
    """Read the tree under ``root`` (the workspace, .agent-tx/ included)."""
    root = os.path.realpath(root)
    nodes: dict[int, Node] = {}
    st = os.lstat(root)
    fs = Fs(root, st.st_ino, nodes)
    nodes[st.st_ino] = Node(DIR, stat.S_IMODE(st.st_mode), st.st_dev, entries={})
    stack = [(root, st.st_ino)]
    while stack:
        path, ino = stack.pop()
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            est = entry.stat(follow_symlinks=False)
            entries = nodes[ino].entries
            assert entries is not None
            entries[entry.name] = est.st_ino
            if est.st_ino in nodes:
                continue  # another name of an inode already read
            mode = stat.S_IMODE(est.st_mode)
            if stat.S_ISDIR(est.st_mode):
                nodes[est.st_ino] = Node(DIR, mode, est.st_dev, entries={})
                stack.append((entry.path, est.st_ino))
            elif stat.S_ISLNK(est.st_mode):
                nodes[est.st_ino] = Node(LINK, mode, est.st_dev, target=os.readlink(entry.path))
            elif stat.S_ISREG(est.st_mode):
                with open(entry.path, "rb") as f:
                    nodes[est.st_ino] = Node(FILE, mode, est.st_dev, data=bytearray(f.read()))
            else:
                del entries[entry.name]  # sockets, fifos: not state
    return fs


class _Ofd:
    """An open file description: which inode, where the next write goes."""

    __slots__ = ("ino", "pos", "append", "path")

    def __init__(self, ino: int | None, pos: int, append: bool, path: str) -> None:
        self.ino, self.pos, self.append, self.path = ino, pos, append, path


class Interpreter:
    """Replays calls against a live picture of the tree and emits micro-operations."""

    def __init__(self, fs: Fs, umask: int = 0o022, http_ports: tuple[int, ...] = ()) -> None:
        self.live = Fs(fs.root, fs.root_ino, {k: v.copy() for k, v in fs.nodes.items()},
                       fs.births)
        self.births = fs.births
        self.umask = umask
        self.ops: list[Op] = []
        self.http_ports = http_ports
        self._tables: dict[int, dict[int, tuple[_Ofd, bool]]] = {}  # table -> fd -> (ofd, cloexec)
        self._table_of: dict[int, int] = {}
        self._next_ino = -1  # inodes born in the trace get negative numbers
        self._http_open: dict[int, bool] = {}  # pid -> a request in flight
        # Processes in another mount namespace (the staged view is mounted over the repo's
        # own path there): what they do to "the root" is not the root. Their children too.
        self._foreign: set[int] = set()
        # What was read of files in a staged view's scratch (the kernel wrote them, no call of
        # ours shows it): their content when exec's capture moves them into the root.
        self._scratch: dict[str, bytearray] = {}
        self._cwd: dict[int, str] = {}
        self.cwd0 = fs.root

    # -- the live picture --------------------------------------------------------------------

    def _own(self, ino: int) -> Node:
        return self.live.nodes[ino]  # the live picture owns every node it holds

    def inside(self, path: str) -> bool:
        root = self.live.root
        if not (path == root or path.startswith(root + "/")):
            return False
        # Below a staged view's directory the kernel writes too (overlayfs copies up into
        # its upper directory): scratch that no system call of ours shows. Left out.
        return _VIEW_SCRATCH.search(path[len(root):]) is None

    def lookup(self, path: str) -> tuple[int | None, int | None, str]:
        """(parent directory's inode, the inode at path or None, the last name) for an
        absolute path inside the root. Intermediate symlinks inside the root are followed."""
        rel = os.path.relpath(path, self.live.root)
        if rel == ".":
            return None, self.live.root_ino, ""
        parts = rel.split("/")
        cur = self.live.root_ino
        for depth, part in enumerate(parts[:-1]):
            node = self.live.nodes.get(cur)
            nxt = node.entries.get(part) if node is not None and node.entries is not None \
                else None
            if nxt is None:
                return None, None, parts[-1]
            nnode = self.live.nodes[nxt]
            if nnode.kind == LINK:
                assert nnode.target is not None
                base = os.path.join(self.live.root, *parts[:depth])
                target = os.path.normpath(os.path.join(base, nnode.target))
                if not self.inside(target):
                    return None, None, parts[-1]
                rest = os.path.join(target, *parts[depth + 1:])
                return self.lookup(rest)
            cur = nxt
        node = self.live.nodes.get(cur)
        if node is None or node.entries is None:
            return None, None, parts[-1]
        return cur, node.entries.get(parts[-1]), parts[-1]

    def _emit(self, op: Op, call: Call) -> Op:
        op.call = call.index
        op.index = len(self.ops)
        self.ops.append(op)
        self._apply_live(op)
        return op

    def _apply_live(self, op: Op) -> None:
        apply_op(self.live, op, own=self._own)

    def _birth(self, kind: str, mode: int, dev: int, target: str | None = None) -> int:
        ino = self._next_ino
        self._next_ino -= 1
        node = Node(kind, mode, dev, data=bytearray() if kind == FILE else None, target=target,
                    entries={} if kind == DIR else None)
        self.births[ino] = node
        self.live.nodes[ino] = node.copy()
        return ino

    # -- descriptors ---------------------------------------------------------------------------

    def _table(self, pid: int) -> dict[int, tuple[_Ofd, bool]]:
        tid = self._table_of.setdefault(pid, pid)
        return self._tables.setdefault(tid, {})

    def _ofd(self, call: Call, arg: str) -> _Ofd | None:
        """The open file description an fd argument names; None outside the root."""
        fd, path = fd_arg(arg)
        if fd is None:
            return None
        entry = self._table(call.pid).get(fd)
        if entry is not None:
            return entry[0]
        if path is None or not path.startswith("/") or not self.inside(path.removesuffix(
                " (deleted)")):
            return None
        raise TraceError(f"call {call.index}: descriptor {fd} names {path}, which the trace "
                         f"never saw opened: {call.raw[:200]}")

    def _path(self, call: Call, dirfd_arg: str | None, path_arg: str) -> str:
        path = os.fsdecode(unhex(path_arg))
        if path.startswith("/"):
            return os.path.normpath(path)
        if dirfd_arg is None:
            return os.path.normpath(os.path.join(self._cwd.get(call.pid, self.cwd0), path))
        _, base = fd_arg(dirfd_arg)
        if base is None:
            raise TraceError(f"call {call.index}: no path for the directory descriptor")
        return os.path.normpath(os.path.join(base, path))

    # -- calls ---------------------------------------------------------------------------------

    def feed(self, calls: list[Call]) -> None:
        # Calls come in the order strace printed their completion, and a child's first calls
        # can come before its parent's clone returns (a loaded machine does it). The parent
        # is blocked in the clone meanwhile, so taking the clone at its child's first call
        # is what happened: the child gets its parent's namespace and descriptors as they
        # were then.
        born = {c.ret: c for c in calls if c.name in _CLONES and c.ok and c.ret}
        early: set[int] = set()  # the indices of clones taken at their child's first call
        for call in calls:
            if call.index in early:
                continue
            clone = born.get(call.pid)
            if clone is not None and clone.index > call.index and clone.index not in early:
                early.add(clone.index)
                self._take(clone)
            self._take(call)

    def _take(self, call: Call) -> None:
        if call.pid in self._foreign:
            if call.name in _CLONES and call.ok and call.ret:
                self._foreign.add(call.ret)
            return
        handler = getattr(self, "_c_" + call.name, None)
        if handler is not None:
            handler(call)

    def _c_unshare(self, call: Call) -> None:
        if call.ok and "CLONE_NEWNS" in call.args[0]:
            self._foreign.add(call.pid)

    def _c_setns(self, call: Call) -> None:
        if call.ok:
            self._foreign.add(call.pid)

    def _c_chdir(self, call: Call) -> None:
        if call.ok:
            self._cwd[call.pid] = self._path(call, None, call.args[0])

    def _c_fchdir(self, call: Call) -> None:
        if call.ok:
            _, path = fd_arg(call.args[0])
            if path is not None:
                self._cwd[call.pid] = path

    def mark(self, label: str, **info: object) -> Op:
        op = Op("mark", label=label, info=dict(info))
        op.index = len(self.ops)
        self.ops.append(op)
        return op

    def _fork(self, call: Call, shared: bool, newns: bool = False) -> None:
        if not call.ok or call.ret == 0:
            return
        assert call.ret is not None
        if newns:
            self._foreign.add(call.ret)
        if call.pid in self._cwd:
            self._cwd[call.ret] = self._cwd[call.pid]
        parent = self._table_of.setdefault(call.pid, call.pid)
        if shared:
            self._table_of[call.ret] = parent
        else:
            self._table_of[call.ret] = call.ret
            self._tables[call.ret] = dict(self._tables.get(parent, {}))

    def _c_clone(self, call: Call) -> None:
        flags = next((a for a in call.args if a.startswith("flags=")), "")
        self._fork(call, "CLONE_FILES" in flags, "CLONE_NEWNS" in flags)

    def _c_clone3(self, call: Call) -> None:
        flags = call.args[0] if call.args else ""
        self._fork(call, "CLONE_FILES" in flags, "CLONE_NEWNS" in flags)

    def _c_fork(self, call: Call) -> None:
        self._fork(call, False)

    _c_vfork = _c_fork

    def _c_execve(self, call: Call) -> None:
        if call.ok:
            table = self._table(call.pid)
            for fd in [fd for fd, (_, cloexec) in table.items() if cloexec]:
                del table[fd]

    def _c_close(self, call: Call) -> None:
        fd, _ = fd_arg(call.args[0])
        if fd is not None:
            self._table(call.pid).pop(fd, None)

    def _c_close_range(self, call: Call) -> None:
        first, last = int(call.args[0].split("<")[0]), call.args[1]
        hi = (1 << 31) if last.startswith("~") or last.startswith("0x") else int(last)
        table = self._table(call.pid)
        for fd in [fd for fd in table if first <= fd <= hi]:
            del table[fd]

    def _dup(self, call: Call, src_arg: str, cloexec: bool) -> None:
        if not call.ok:
            return
        fd, _ = fd_arg(src_arg)
        table = self._table(call.pid)
        if fd in table:
            assert call.ret is not None
            table[call.ret] = (table[fd][0], cloexec)

    def _c_dup(self, call: Call) -> None:
        self._dup(call, call.args[0], False)

    def _c_dup2(self, call: Call) -> None:
        self._dup(call, call.args[0], False)

    def _c_dup3(self, call: Call) -> None:
        self._dup(call, call.args[0], "O_CLOEXEC" in call.args[2])

    def _c_fcntl(self, call: Call) -> None:
        cmd = call.args[1]
        if cmd.startswith("F_DUPFD"):
            self._dup(call, call.args[0], cmd == "F_DUPFD_CLOEXEC")
        elif cmd == "F_SETFD" and call.ok:
            fd, _ = fd_arg(call.args[0])
            table = self._table(call.pid)
            if fd in table:
                table[fd] = (table[fd][0], "FD_CLOEXEC" in call.args[2])

    def _c_lseek(self, call: Call) -> None:
        if call.ok:
            ofd = self._ofd(call, call.args[0])
            if ofd is not None:
                assert call.ret is not None
                ofd.pos = call.ret

    def _open(self, call: Call, path: str, flags: str, mode_arg: str | None) -> None:
        if not call.ok:
            return
        assert call.ret is not None
        table = self._table(call.pid)
        if not self.inside(path):
            # Kept without an inode: a file outside the root is no state, but its position is
            # where a copy_file_range from it into the root reads (a large file staged).
            table[call.ret] = (_Ofd(None, 0, False, path), "O_CLOEXEC" in flags)
            return
        parent, ino, name = self.lookup(path)
        if ino is None:
            if "O_CREAT" not in flags or parent is None:
                raise TraceError(f"call {call.index}: {path} opened, yet not in the picture")
            mode = int(mode_arg, 8) & ~self.umask if mode_arg else 0o644
            ino = self._birth(FILE, mode, self.live.nodes[parent].dev)
            self._emit(Op("link", dir=parent, name=name, ino=ino), call)
        elif "O_TRUNC" in flags and self.live.nodes[ino].kind == FILE:
            data = self.live.nodes[ino].data
            if data:
                self._emit(Op("trunc", ino=ino, size=0), call)
        table[call.ret] = (_Ofd(ino, 0, "O_APPEND" in flags, path), "O_CLOEXEC" in flags)

    def _c_openat(self, call: Call) -> None:
        self._open(call, self._path(call, call.args[0], call.args[1]), call.args[2],
                   call.args[3] if len(call.args) > 3 else None)

    def _c_open(self, call: Call) -> None:
        self._open(call, self._path(call, None, call.args[0]), call.args[1],
                   call.args[2] if len(call.args) > 2 else None)

    def _c_creat(self, call: Call) -> None:
        self._open(call, self._path(call, None, call.args[0]), "O_CREAT|O_TRUNC|O_WRONLY",
                   call.args[1])

    def _c_openat2(self, call: Call) -> None:
        raise TraceError(f"call {call.index}: openat2 is not modelled")

    def _write(self, call: Call, ofd: _Ofd | None, data: bytes, off: int | None) -> None:
        if ofd is None or ofd.ino is None or not call.ok:
            return
        assert call.ret is not None
        data = data[: call.ret]
        node = self.live.nodes[ofd.ino]
        if node.kind != FILE:
            raise TraceError(f"call {call.index}: a write to a {node.kind}")
        assert node.data is not None
        pos = off if off is not None else (len(node.data) if ofd.append else ofd.pos)
        if data:
            op = Op("write", ino=ofd.ino, off=pos, data=data)
            op.info["extends"] = pos + len(data) > len(node.data)
            self._emit(op, call)
        if off is None:
            ofd.pos = pos + len(data)

    def _c_write(self, call: Call) -> None:
        fd, path = fd_arg(call.args[0])
        if fd == 1 and call.ok:
            self.mark("stdout", pid=call.pid, data=unhex(call.args[1])[: call.ret or 0])
        self._http(call, path, sent=True)
        self._write(call, self._ofd(call, call.args[0]), unhex(call.args[1]), None)

    def _c_pwrite64(self, call: Call) -> None:
        self._write(call, self._ofd(call, call.args[0]), unhex(call.args[1]), int(call.args[3]))

    def _iov(self, arg: str) -> bytes:
        out = b""
        for part in arg.split("iov_base=")[1:]:
            out += unhex(split_args(part)[0])
        return out

    def _c_writev(self, call: Call) -> None:
        self._write(call, self._ofd(call, call.args[0]), self._iov(call.args[1]), None)

    def _c_pwritev(self, call: Call) -> None:
        self._write(call, self._ofd(call, call.args[0]), self._iov(call.args[1]),
                    int(call.args[3]))

    _c_pwritev2 = _c_pwritev

    def _size(self, call: Call, ino: int | None, size: int) -> None:
        if ino is not None and call.ok:
            self._emit(Op("trunc", ino=ino, size=size), call)

    def _c_ftruncate(self, call: Call) -> None:
        ofd = self._ofd(call, call.args[0])
        self._size(call, ofd.ino if ofd else None, int(call.args[1]))

    def _c_truncate(self, call: Call) -> None:
        path = self._path(call, None, call.args[0])
        if self.inside(path):
            self._size(call, self.lookup(path)[1], int(call.args[1]))

    def _c_fallocate(self, call: Call) -> None:
        ofd = self._ofd(call, call.args[0])
        if ofd is None or ofd.ino is None or not call.ok:
            return
        if call.args[1] not in ("0", "FALLOC_FL_KEEP_SIZE"):
            raise TraceError(f"call {call.index}: fallocate {call.args[1]} is not modelled")
        node = self.live.nodes[ofd.ino]
        assert node.data is not None
        end = int(call.args[2]) + int(call.args[3])
        if call.args[1] == "0" and end > len(node.data):
            self._emit(Op("trunc", ino=ofd.ino, size=end), call)

    def _entry_op(self, call: Call, kind: str, path: str, **kw: object) -> None:
        """unlink or rmdir of ``path``."""
        if not call.ok or not self.inside(path):
            return
        parent, ino, name = self.lookup(path)
        if parent is None or ino is None:
            raise TraceError(f"call {call.index}: {kind} of {path}, not in the picture")
        self._emit(Op("unlink", dir=parent, name=name, ino=ino), call)

    def _c_unlink(self, call: Call) -> None:
        self._entry_op(call, "unlink", self._path(call, None, call.args[0]))

    def _c_unlinkat(self, call: Call) -> None:
        self._entry_op(call, "unlinkat", self._path(call, call.args[0], call.args[1]))

    def _c_rmdir(self, call: Call) -> None:
        self._entry_op(call, "rmdir", self._path(call, None, call.args[0]))

    def _mkdir(self, call: Call, path: str, mode_arg: str) -> None:
        if not call.ok or not self.inside(path):
            return
        parent, ino, name = self.lookup(path)
        if parent is None or ino is not None:
            raise TraceError(f"call {call.index}: mkdir {path} does not fit the picture")
        new = self._birth(DIR, int(mode_arg, 8) & ~self.umask, self.live.nodes[parent].dev)
        self._emit(Op("link", dir=parent, name=name, ino=new), call)

    def _c_mkdir(self, call: Call) -> None:
        self._mkdir(call, self._path(call, None, call.args[0]), call.args[1])

    def _c_mkdirat(self, call: Call) -> None:
        self._mkdir(call, self._path(call, call.args[0], call.args[1]), call.args[2])

    def _symlink(self, call: Call, target_arg: str, path: str) -> None:
        if not call.ok or not self.inside(path):
            return
        parent, _, name = self.lookup(path)
        if parent is None:
            raise TraceError(f"call {call.index}: symlink {path} does not fit the picture")
        new = self._birth(LINK, 0o777, self.live.nodes[parent].dev,
                          target=os.fsdecode(unhex(target_arg)))
        self._emit(Op("link", dir=parent, name=name, ino=new), call)

    def _c_symlink(self, call: Call) -> None:
        self._symlink(call, call.args[0], self._path(call, None, call.args[1]))

    def _c_symlinkat(self, call: Call) -> None:
        self._symlink(call, call.args[0], self._path(call, call.args[1], call.args[2]))

    def _link(self, call: Call, old: str, new: str) -> None:
        if not call.ok or not self.inside(new):
            return
        if not self.inside(old):
            raise TraceError(f"call {call.index}: a link into the root from outside it")
        _, ino, _ = self.lookup(old)
        parent, _, name = self.lookup(new)
        if ino is None or parent is None:
            raise TraceError(f"call {call.index}: link {old} -> {new} does not fit")
        self._emit(Op("link", dir=parent, name=name, ino=ino), call)

    def _c_link(self, call: Call) -> None:
        self._link(call, self._path(call, None, call.args[0]),
                   self._path(call, None, call.args[1]))

    def _c_linkat(self, call: Call) -> None:
        self._link(call, self._path(call, call.args[0], call.args[1]),
                   self._path(call, call.args[2], call.args[3]))

    def _c_pread64(self, call: Call) -> None:
        """A read of a file in a staged view's scratch: remember its bytes (the content of
        the file that exec's capture then moves into the blob store)."""
        _, path = fd_arg(call.args[0])
        if not call.ok or not call.ret or path is None or not self._in_scratch(path):
            return
        data = unhex(call.args[1])[:call.ret]
        off = int(call.args[3])
        buf = self._scratch.setdefault(os.path.normpath(path), bytearray())
        if len(buf) < off:
            buf.extend(bytes(off - len(buf)))
        buf[off:off + len(data)] = data

    def _in_scratch(self, path: str) -> bool:
        root = self.live.root
        return path.startswith(root + "/") and not self.inside(path)

    def _moved_in(self, call: Call, old: str, new: str) -> None:
        """A file of a staged view's scratch renamed into the root (exec's capture moving it
        into the blob store): to the root, a new file with the bytes that were read of it,
        none of them synced, read-only as the store makes it."""
        data = self._scratch.pop(old, None)
        parent, _, name = self.lookup(new)
        if data is None or parent is None:
            raise TraceError(f"call {call.index}: {old} moved into the root, unread")
        ino = self._birth(FILE, 0o444, self.live.nodes[parent].dev)
        self._emit(Op("link", dir=parent, name=name, ino=ino), call)
        if data:
            self._emit(Op("write", ino=ino, off=0, data=bytes(data), info={"extends": True}),
                       call)

    def _rename(self, call: Call, old: str, new: str, flags: str = "0") -> None:
        if not call.ok:
            return
        if not self.inside(old) and not self.inside(new):
            return
        if self._in_scratch(old) and self.inside(new):
            self._moved_in(call, old, new)
            return
        if not (self.inside(old) and self.inside(new)):
            raise TraceError(f"call {call.index}: a rename across the root's edge "
                             f"({old} -> {new})")
        if "RENAME_EXCHANGE" in flags:
            raise TraceError(f"call {call.index}: RENAME_EXCHANGE is not modelled")
        sdir, ino, sname = self.lookup(old)
        ddir, _, dname = self.lookup(new)
        if sdir is None or ino is None or ddir is None:
            raise TraceError(f"call {call.index}: rename {old} -> {new} does not fit")
        if sdir == ddir:
            self._emit(Op("rename", dir=sdir, name=sname, new_name=dname, ino=ino), call)
            return
        add = self._emit(Op("link", dir=ddir, name=dname, ino=ino), call)
        gone = self._emit(Op("unlink", dir=sdir, name=sname, ino=ino, couple=add.index), call)
        add.couple = gone.index

    def _c_rename(self, call: Call) -> None:
        self._rename(call, self._path(call, None, call.args[0]),
                     self._path(call, None, call.args[1]))

    def _c_renameat(self, call: Call) -> None:
        self._rename(call, self._path(call, call.args[0], call.args[1]),
                     self._path(call, call.args[2], call.args[3]))

    def _c_renameat2(self, call: Call) -> None:
        self._rename(call, self._path(call, call.args[0], call.args[1]),
                     self._path(call, call.args[2], call.args[3]), call.args[4])

    def _chmod(self, call: Call, ino: int | None, mode_arg: str) -> None:
        if ino is not None and call.ok:
            self._emit(Op("chmod", ino=ino, mode=int(mode_arg, 8) & 0o7777), call)

    def _c_fchmod(self, call: Call) -> None:
        ofd = self._ofd(call, call.args[0])
        self._chmod(call, ofd.ino if ofd else None, call.args[1])

    def _c_chmod(self, call: Call) -> None:
        path = self._path(call, None, call.args[0])
        if self.inside(path):
            self._chmod(call, self.lookup(path)[1], call.args[1])

    def _c_fchmodat(self, call: Call) -> None:
        path = self._path(call, call.args[0], call.args[1])
        if self.inside(path):
            self._chmod(call, self.lookup(path)[1], call.args[2])

    def _c_fsync(self, call: Call) -> None:
        ofd = self._ofd(call, call.args[0])
        if ofd is None or ofd.ino is None or call.ret is None:
            return
        op = Op("fsync", ino=ofd.ino, failed=not call.ok, label=call.errno or "")
        self._emit(op, call)

    _c_fdatasync = _c_fsync

    def _c_sync(self, call: Call) -> None:
        self._emit(Op("sync"), call)

    def _c_syncfs(self, call: Call) -> None:
        """A barrier for every file and directory of one file system (the descriptor's): its
        op carries the inodes on that file system and whether it is the root's (whose
        journal it commits). A failed one is no barrier: what it was to sync is unsure."""
        ofd = self._ofd(call, call.args[0])
        if ofd is None or ofd.ino is None or call.ret is None:
            return
        dev = self.live.nodes[ofd.ino].dev
        inos = frozenset(i for i, n in self.live.nodes.items() if n.dev == dev)
        root_dev = self.live.nodes[self.live.root_ino].dev == dev
        self._emit(Op("sync", ino=ofd.ino, failed=not call.ok, label=call.errno or "",
                      info={"inos": inos, "root_dev": root_dev}), call)

    def _inside_ofd(self, call: Call, arg: str) -> _Ofd | None:
        ofd = self._ofd(call, arg)
        return ofd if ofd is not None and ofd.ino is not None else None

    def _c_copy_file_range(self, call: Call) -> None:
        """A write into the root of bytes the kernel copied from another file: the bytes are
        the source's, from its position (or the offset given) on. A source in the root is
        read from the picture; one outside it (a file being staged) from the disk, where it
        still is, unchanged, after the run. The positions move as a read's and a write's."""
        dst = self._inside_ofd(call, call.args[2])
        src = self._ofd(call, call.args[0])
        if src is not None and call.ok and call.args[1] == "NULL":
            src.pos += call.ret or 0
        if dst is None or not call.ok or not call.ret:
            return
        if src is None:
            raise TraceError(f"call {call.index}: copy_file_range from a descriptor the trace "
                             "never saw opened")
        n = call.ret
        at = src.pos - n if call.args[1] == "NULL" else int(call.args[1].strip("[]"))
        if src.ino is not None:
            node = self.live.nodes[src.ino]
            assert node.data is not None
            data = bytes(node.data[at:at + n])
        else:
            with open(src.path.removesuffix(" (deleted)"), "rb") as f:
                f.seek(at)
                data = f.read(n)
        if len(data) != n:
            raise TraceError(f"call {call.index}: copy_file_range of {n} bytes from "
                             f"{src.path}, which holds {len(data)} there now")
        off = None if call.args[3] == "NULL" else int(call.args[3].strip("[]"))
        self._write(call, dst, data, off)

    def _c_sendfile(self, call: Call) -> None:
        if self._inside_ofd(call, call.args[0]) is not None and call.ok and call.ret:
            raise TraceError(f"call {call.index}: sendfile into the root is not modelled")

    def _c_splice(self, call: Call) -> None:
        if self._inside_ofd(call, call.args[2]) is not None and call.ok and call.ret:
            raise TraceError(f"call {call.index}: splice into the root is not modelled")

    def _c_mmap(self, call: Call) -> None:
        if len(call.args) < 5 or "MAP_SHARED" not in call.args[3] \
                or "PROT_WRITE" not in call.args[2]:
            return
        ofd = self._inside_ofd(call, call.args[4])
        if ofd is not None and not ofd.path.endswith("-shm"):
            raise TraceError(f"call {call.index}: a writable shared map of {ofd.path} (writes "
                             "through it are invisible to the trace)")

    # HTTP: the first bytes sent to a service port open a request; the first bytes received
    # after that close it (the service may have acted anywhere in between).
    def _http(self, call: Call, annotation: str | None, sent: bool) -> None:
        if not self.http_ports or annotation is None or not annotation.startswith("TCP:"):
            return
        if not any(f":{p}]" in annotation for p in self.http_ports) or not call.ok \
                or not call.ret:
            return
        busy = self._http_open.get(call.pid, False)
        if sent and not busy:
            self._http_open[call.pid] = True
            self.mark("http_send", pid=call.pid)
        elif not sent and busy:
            self._http_open[call.pid] = False
            self.mark("http_recv", pid=call.pid)

    def _c_sendto(self, call: Call) -> None:
        self._http(call, fd_arg(call.args[0])[1], sent=True)

    _c_sendmsg = _c_sendto

    def _c_recvfrom(self, call: Call) -> None:
        self._http(call, fd_arg(call.args[0])[1], sent=False)

    _c_recvmsg = _c_recvfrom

    def _c_read(self, call: Call) -> None:  # not traced by default; kept for completeness
        self._http(call, fd_arg(call.args[0])[1], sent=False)


# -- applying operations to a picture ---------------------------------------------------------


def apply_op(fs: Fs, op: Op, own: object = None, data: bytes | None = None) -> None:
    """Apply one operation to ``fs`` (copy-on-write through ``own``). ``data`` overrides a
    write's bytes (a torn write)."""
    get = own if callable(own) else _owner(fs)
    kind = op.kind
    if kind == "link":
        assert op.dir is not None and op.ino is not None and op.name is not None
        _ensure(fs, op.ino)
        _ensure(fs, op.dir)
        d = get(op.dir)
        d.entries[op.name] = op.ino
    elif kind == "unlink":
        assert op.dir is not None and op.name is not None
        if op.dir in fs.nodes:
            d = fs.nodes[op.dir]
            if d.entries is not None and d.entries.get(op.name) == op.ino:
                get(op.dir).entries.pop(op.name)
    elif kind == "rename":
        assert op.dir is not None and op.ino is not None
        _ensure(fs, op.dir)
        _ensure(fs, op.ino)
        d = get(op.dir)
        if d.entries.get(op.name) == op.ino:
            del d.entries[op.name]
        d.entries[op.new_name] = op.ino
    elif kind == "write":
        assert op.ino is not None
        _ensure(fs, op.ino)
        node = get(op.ino)
        buf = node.data
        payload = op.data if data is None else data
        end = op.off + len(payload)
        if len(buf) < op.off:
            buf.extend(bytes(op.off - len(buf)))
        buf[op.off:end] = payload
    elif kind == "trunc":
        assert op.ino is not None
        _ensure(fs, op.ino)
        node = get(op.ino)
        if len(node.data) > op.size:
            del node.data[op.size:]
        else:
            node.data.extend(bytes(op.size - len(node.data)))
    elif kind == "chmod":
        assert op.ino is not None
        _ensure(fs, op.ino)
        get(op.ino).mode = op.mode


def _ensure(fs: Fs, ino: int) -> None:
    if ino not in fs.nodes:
        born = fs.births.get(ino)
        if born is None:
            raise TraceError(f"inode {ino} is neither in the snapshot nor born in the trace")
        fs.nodes[ino] = born  # shared until written


def _owner(fs: Fs) -> object:
    owned: set[int] = set()

    def get(ino: int) -> Node:
        if ino not in owned:
            fs.nodes[ino] = fs.nodes[ino].copy()
            owned.add(ino)
        return fs.nodes[ino]

    return get


def tree(fs: Fs) -> dict[str, tuple[str, int, bytes | str, int]]:
    """Every path under the root: (kind, mode, content or link target, inode)."""
    out: dict[str, tuple[str, int, bytes | str, int]] = {}
    stack = [("", fs.root_ino)]
    seen_dirs = set()
    while stack:
        rel, ino = stack.pop()
        node = fs.nodes[ino]
        if node.kind == DIR:
            if ino in seen_dirs:
                continue  # a directory linked twice: a half-done rename; keep the first
            seen_dirs.add(ino)
            if rel:
                out[rel] = (DIR, node.mode, b"", ino)
            assert node.entries is not None
            for name, child in node.entries.items():
                if child in fs.nodes or child in fs.births:
                    _ensure(fs, child)
                    stack.append((f"{rel}/{name}" if rel else name, child))
        elif node.kind == LINK:
            out[rel] = (LINK, 0o777, node.target or "", ino)
        else:
            out[rel] = (FILE, node.mode, bytes(node.data or b""), ino)
    return out


def digest(t: dict[str, tuple[str, int, bytes | str, int]]) -> str:
    """A hash of a tree's content (hard links count: which paths share an inode)."""
    h = hashlib.sha256()
    groups: dict[int, str] = {}
    for rel in sorted(t):
        kind, mode, content, ino = t[rel]
        link_of = groups.setdefault(ino, rel) if kind == FILE else rel
        body = content if isinstance(content, bytes) else content.encode()
        h.update(f"{rel}\0{kind}\0{mode:o}\0{link_of}\0".encode())
        h.update(hashlib.sha256(body).digest())
    return h.hexdigest()


def write_out(t: dict[str, tuple[str, int, bytes | str, int]], dest: str,
              exist_ok: set[str] | frozenset[str] = frozenset()) -> None:
    """Make the tree ``t`` under the (empty or missing) directory ``dest``; the directories
    ``exist_ok`` may be there already (mount points)."""
    os.makedirs(dest, exist_ok=True)
    first: dict[int, str] = {}
    modes: list[tuple[str, int]] = []
    for rel in sorted(t):
        kind, mode, content, ino = t[rel]
        path = os.path.join(dest, rel)
        if kind == DIR:
            if rel not in exist_ok or not os.path.isdir(path):
                os.mkdir(path, 0o700)
            modes.append((path, mode))
        elif kind == LINK:
            assert isinstance(content, str)
            os.symlink(content, path)
        elif ino in first:
            os.link(first[ino], path)
        else:
            first[ino] = path
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                assert isinstance(content, bytes)
                view = memoryview(content)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
    for path, mode in reversed(modes):  # deepest first: a 0o555 parent after its children
        os.chmod(path, mode)
