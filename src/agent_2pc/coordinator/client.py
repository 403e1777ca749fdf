"""The Python library: ``Agent2PC`` (a workspace) and ``Transaction`` (one transaction).

Thin over the engine: every method returns the same dict that the CLI prints with ``--json``
(without ``ok``), and raises the errors of agent_2pc.errors. ``Transaction.commit`` raises
``TransactionAborted`` (with ``.code`` and ``.reason``) when the answer is no. The CLI and the
MCP server are faces over this module and nothing below it: a step a face needs is a method
here (docs/library.md lists them). The exceptions to "the same dict": ``Agent2PC.begin`` and
``get`` return a ``Transaction`` (the CLI prints ``{tid}``), ``Transaction.record_read`` the
hash (``record_read_result``: the CLI's ``{path, sha256}``), ``read`` the content, ``state``
the state's name and ``status`` the transaction's row.

    client = Agent2PC(".")                      # the workspace at or above "."
    with client.transaction(label="fix") as tx:  # commits on a clean exit, aborts on exception
        tx.stage_write("a.py", "print(1)\\n")
"""

from __future__ import annotations

import os

from ..errors import UsageError
from ..storage.workspace import init as init_workspace
from ._locate import check_writable, locate_root
from .engine import Engine

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any


class Agent2PC:
    """A workspace: the directory tree that holds ``.agent-tx/``."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        env = os.environ.get("AGENT2PC_ROOT")
        if root is None and env:
            self.root = locate_root(env)
        else:
            self.root = locate_root(cwd=os.fspath(root) if root is not None else None)
        check_writable(self.root)
        self.engine = Engine(self.root)

    @staticmethod
    def find_root(root: str | os.PathLike[str] | None = None) -> str:
        """The root of the workspace at ``root`` exactly, else at $AGENT2PC_ROOT, else the
        nearest one at or above the working directory, without opening it (NotInitialized
        if there is none; inside a staged view the message says why). The CLI's ``--root``."""
        given = os.fspath(root) if root is not None else ""
        return locate_root(given or os.environ.get("AGENT2PC_ROOT"))

    def close(self) -> None:
        """Release the log and the fence's store; the client is not used afterwards."""
        self.engine.close()

    @classmethod
    def init(cls, root: str | os.PathLike[str] = ".") -> "Agent2PC":
        """Create the workspace at ``root`` (idempotent) and open it."""
        return cls(init_workspace(os.fspath(root)))

    @staticmethod
    def trust(root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """Trust the workspace at ``root`` (else $AGENT2PC_ROOT, else the one at or above the
        working directory) as the user's own (one that was copied,
        moved across file systems or restored; never one that came with a repository), and
        list its live transactions, which the next command will finish, without touching
        them. ``agent-2pc trust``."""
        from ..storage.workspace import find_root, trust

        found = find_root(os.fspath(root) if root is not None else os.environ.get(
            "AGENT2PC_ROOT"), trusted=False)
        trust(found)
        engine = Engine(found, recover_dead=False)
        try:
            return {"root": found, "transactions": engine.transactions(finished=False)}
        finally:
            engine.close()

    def begin(self, timeout_ms: int | None = None, label: str | None = None) -> "Transaction":
        return Transaction(self, self.engine.begin(timeout_ms=timeout_ms, label=label)["tid"])

    def get(self, tid: str, check: bool = True) -> "Transaction":
        """A handle on an existing transaction (checked: unknown ids raise UnknownTid).
        ``check=False`` skips the look-up: each step then checks the tid itself, after its
        own arguments (what the CLI and the MCP server do)."""
        if check:
            self.engine.status(tid)
        return Transaction(self, tid)

    def transaction(self, timeout_ms: int | None = None, label: str | None = None
                    ) -> "_Scope":
        """``with client.transaction() as tx``: commit on a clean exit, abort on an exception
        (which propagates). A commit that is refused raises TransactionAborted."""
        return _Scope(self, timeout_ms, label)

    def recover(self) -> dict[str, Any]:
        return self.engine.recover()

    def compact(self) -> dict[str, Any]:
        return self.engine.compact()

    def transactions(self, state: str | None = None) -> list[dict[str, Any]]:
        return self.engine.transactions(state)

    def undo(self, tid: str) -> dict[str, Any]:
        """Take back the committed transaction ``tid`` as a new transaction: each file it
        touched gets back its content and mode from before it (files it created are deleted).
        Answers as commit does, plus ``undoes``. A file changed since ``tid`` committed:
        TransactionAborted (``conflict``), nothing changed; ``tid`` not committed: UnknownTid
        or BadState; what stood there before no longer kept: NotFound."""
        return self.engine.undo(tid)

    def log(self, limit: int | None = None, verify: bool = False) -> dict[str, Any]:
        """``{entries}``: finished transactions, newest first, each with ``hash`` and
        ``prev`` (the SHA-256 chain of the history). ``verify``: ``{verified, unchained}``
        after checking the whole chain, or Tampered naming the first line that fails."""
        if verify:
            return self.engine.verify_log()
        return {"entries": self.engine.log_entries(limit)}

    def status(self, tid: str | None = None) -> dict[str, Any]:
        return self.engine.status(tid)

    def run_batch(self, manifest: dict[str, Any] | str | bytes) -> dict[str, Any]:
        from .batch import run_batch

        return run_batch(self, manifest)


class Transaction:
    def __init__(self, client: Agent2PC, tid: str) -> None:
        self.client = client
        self.tid = tid
        self._engine = client.engine

    def __repr__(self) -> str:
        return f"<Transaction {self.tid}>"

    def state(self) -> str:
        return str(self._engine.status(self.tid)["transactions"][0]["state"])

    def status(self) -> dict[str, Any]:
        row: dict[str, Any] = self._engine.status(self.tid)["transactions"][0]
        return row

    def read(self, path: str) -> bytes | None:
        """``path``'s content as this transaction sees it (None: absent). Reading from the tree
        records the read: the commit aborts with ``conflict`` if the file changes meanwhile.
        Use this for read-modify-write; it cannot lose an update."""
        return self._engine.read(self.tid, path)

    def record_read(self, path: str) -> str | None:
        """Remember ``path``'s content hash; commit aborts with ``conflict`` if it changes."""
        return self.record_read_result(path)["sha256"]  # type: ignore[no-any-return]

    def record_read_result(self, path: str) -> dict[str, Any]:
        """``record_read``, answering ``{path, sha256}`` as the CLI's ``record-read`` does
        (``path`` relative to the root, as resolved)."""
        return self._engine.record_read(self.tid, path)

    def stage_write(self, path: str, content: str | bytes, mode: int | None = None,
                    create_dirs: bool = True) -> dict[str, Any]:
        """Stage ``content`` at ``path``; ``mode``: permission bits (0o644, 0o755; None keeps
        the file's); ``create_dirs=False``: the parent must already be a directory of the
        staged view (``not_found`` otherwise)."""
        if isinstance(content, str):
            try:
                data = content.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise UsageError(f"content is not Unicode text (a lone surrogate at "
                                 f"{exc.start}); pass bytes") from None
        elif isinstance(content, (bytes, bytearray, memoryview)):
            data = bytes(content)
        else:
            raise UsageError(f"content must be str or bytes, not {type(content).__name__}")
        return self._engine.stage_write(self.tid, path, data, mode=mode,
                                        create_dirs=create_dirs)

    def stage_write_file(self, path: str, source: str | os.PathLike[str] | IO[bytes] | int,
                         mode: int | None = None) -> dict[str, Any]:
        """Stage the content of a file (a path, a binary file object, or an open descriptor,
        read from where it stands and left open), streamed."""
        if isinstance(source, int):
            return self._engine.stage_write(self.tid, path, src_fd=source, mode=mode)
        if isinstance(source, (str, os.PathLike)):
            fd = os.open(os.fspath(source), os.O_RDONLY)
            try:
                return self._engine.stage_write(self.tid, path, src_fd=fd, mode=mode)
            finally:
                os.close(fd)
        return self._engine.stage_write(self.tid, path, src_fd=source.fileno(), mode=mode)

    def stage_delete(self, path: str) -> dict[str, Any]:
        return self._engine.stage_delete(self.tid, path)

    def stage_replace(self, path: str, old: str | bytes, new: str | bytes, all: bool = False
                      ) -> dict[str, Any]:
        return self._engine.stage_replace(self.tid, path, old, new, all=all)

    def stage_patch(self, patch: str | bytes) -> dict[str, Any]:
        return self._engine.stage_patch(self.tid, patch)

    def stage_api(self, method: str, url: str, body: Any = None,
                  headers: dict[str, str] | None = None, idempotency_key: str | None = None,
                  compensate: dict[str, Any] | None = None) -> dict[str, Any]:
        """Stage an HTTP call: sent once at commit with an Idempotency-Key, after the files
        were checked; if the transaction then aborts, ``compensate`` ({method, url, body}) is
        sent for it, also exactly once."""
        return self._engine.stage_api(self.tid, method, url, body, headers, idempotency_key,
                                      compensate)

    def stage_cmd(self, command: str | list[str], timeout_ms: int | None = None,
                  promote: list[str] | None = None, sandbox: bool = False,
                  network: bool = False, limits: dict[str, int] | None = None,
                  working_dir: str | None = None, env: dict[str, str] | None = None
                  ) -> dict[str, Any]:
        """Run a check in the staged view (the repo as it would be after commit) and record
        it: the commit runs it again if the staged content changes, and aborts with
        ``verification_failed`` if its latest run failed. A failing run raises CheckFailed
        (the transaction stays active). Files it writes matching ``promote`` globs are staged.
        ``working_dir`` (a directory of the staged view, default the root) is where it runs;
        ``env`` adds variables to its environment."""
        return self._engine.stage_cmd(self.tid, command, timeout_ms, promote, sandbox, network,
                                      limits, working_dir=working_dir, env=env)

    def exec(self, argv: list[str], timeout_ms: int | None = None,
             interactive: bool = False, keep_on_failure: bool = False,
             sandbox: bool = False, network: bool = False, stdout_fd: int | None = None
             ) -> dict[str, Any]:
        """Run a command in the staged view and stage what it created, changed and deleted.
        A failing command stages nothing and raises CheckFailed (``command_failed``), unless
        ``keep_on_failure``: then what it changed is staged all the same (and it still
        raises). A failed session on a terminal keeps its changes aside for ``stage_kept``.
        ``sandbox`` (and ``network``): confined as ``stage_cmd(sandbox=True)``.
        ``interactive``: the command gets this process's terminal (its own pty) and standard
        streams, its output going to ``stdout_fd`` when given (the CLI's ``exec --json``: 2)."""
        return self._engine.exec_cmd(self.tid, argv, timeout_ms, interactive=interactive,
                                     stdout_fd=stdout_fd, keep_on_failure=keep_on_failure,
                                     sandbox=sandbox, network=network)

    def stage_kept(self) -> dict[str, Any]:
        """Stage what the last failed terminal session of exec kept aside."""
        return self._engine.stage_kept(self.tid)

    def stage_wasm(self, module: str, args: list[str] | None = None, fuel: int | None = None,
                   max_memory_mb: int | None = None, timeout_ms: int | None = None,
                   interactive: bool = False, stdout_fd: int | None = None
                   ) -> dict[str, Any]:
        """Run a WASI module (wasmtime) in the staged view and stage what it wrote.
        ``interactive`` and ``stdout_fd`` as for ``exec``."""
        return self._engine.stage_wasm(self.tid, module, args, fuel, max_memory_mb, timeout_ms,
                                       interactive=interactive, stdout_fd=stdout_fd)

    def stage_vm(self) -> dict[str, Any]:
        """Run a step in a microVM: not in this build. Checks the tid (UnknownTid), then
        raises IsolationUnavailable saying what this host lacks (``details["missing"]``)."""
        from .runs import stage_vm_unavailable

        self._engine.status(self.tid)
        raise stage_vm_unavailable()

    def overlay_exec(self, command: str | list[str], timeout_ms: int | None = None,
                     sandbox: bool = False, network: bool = False) -> dict[str, Any]:
        """Run a command in the staged view just to look: its output, nothing captured."""
        return self._engine.view_run(self.tid, command, timeout_ms, sandbox=sandbox,
                                     network=network)

    def savepoint(self, name: str) -> dict[str, Any]:
        return self._engine.savepoint(self.tid, name)

    def rollback_to(self, name: str) -> dict[str, Any]:
        return self._engine.rollback_to(self.tid, name)

    def diff(self, stat: bool = False) -> dict[str, Any]:
        return self._engine.diff(self.tid, stat_only=stat)

    def commit(self) -> dict[str, Any]:
        return self._engine.commit(self.tid)

    def git_commit(self, message: str, author: str | None = None,
                   branch: str | None = None) -> dict[str, Any]:
        """Commit the transaction and, as one atomic unit with its files, a git commit of
        exactly its changes on ``branch`` (default: the branch HEAD is on), by ``author``
        ("Name <email>"; default: git's). The answer is commit's plus ``commit`` (the new
        commit's id) and ``branch``. Bad input (detached HEAD, an unborn or missing branch, no
        git work tree, a locked index) is UsageError before anything is staged; a no vote
        raises TransactionAborted, as commit does (docs/git.md)."""
        self._engine.stage_effect(self.tid, "git", {"message": message, "author": author,
                                                    "branch": branch})
        return self._engine.commit(self.tid)

    def abort(self, reason: str | None = None) -> dict[str, Any]:
        return self._engine.abort(self.tid, reason)


class _Scope:
    __slots__ = ("_client", "_timeout_ms", "_label", "_tx")

    def __init__(self, client: Agent2PC, timeout_ms: int | None, label: str | None) -> None:
        self._client, self._timeout_ms, self._label = client, timeout_ms, label
        self._tx: Transaction | None = None

    def __enter__(self) -> Transaction:
        self._tx = self._client.begin(timeout_ms=self._timeout_ms, label=self._label)
        return self._tx

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        tx = self._tx
        assert tx is not None
        if tx.state() != "active":
            return  # committed or aborted inside the block
        if exc is None:
            tx.commit()
        else:
            tx.abort(reason=f"{type(exc).__name__}: {exc}"[:500])
