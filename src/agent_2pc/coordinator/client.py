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

from ..core.paging import LIST_LIMIT
from ..errors import UsageError
from ..storage.workspace import init as init_workspace
from ._locate import check_writable, locate_root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any, Callable

    from .engine import Engine


class Agent2PC:
    """A workspace: the directory tree that holds ``.agent-tx/``."""

    def __init__(self, root: str | os.PathLike[str] | None = None, daemon: bool = True
                 ) -> None:
        """``daemon=False``: work in this process even when a daemon serves the workspace
        (otherwise its steps go to the daemon, with the same answers; docs/daemon.md)."""
        env = os.environ.get("AGENT2PC_ROOT")
        if root is None and env:
            self.root = locate_root(env)
        else:
            self.root = locate_root(cwd=os.fspath(root) if root is not None else None)
        check_writable(self.root)
        remote = None
        if daemon:
            from ..daemon.remote import open_remote

            remote = open_remote(self.root)  # one connect(): is a daemon there?
        self.via_daemon = remote is not None
        if remote is not None:
            self.engine: Engine = remote  # type: ignore[assignment]
        else:  # imported here: through a daemon, a CLI step never loads the engine
            from .engine import Engine

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
    def merge_files(base: str | os.PathLike[str], ours: str | os.PathLike[str],
                    theirs: str | os.PathLike[str], output: str | os.PathLike[str]
                    ) -> dict[str, Any]:
        """Three-way merge of files, no workspace needed: the change ``base`` -> ``theirs``
        merged into ``ours``, written atomically to ``output``. ``{conflicts: 0, output}``;
        overlapping edits raise MergeConflict (exit 1: the output holds conflict markers, the
        error's result the conflicting line ranges), a binary input BinaryContent."""
        from .filemerge import merge_files

        return merge_files(os.fspath(base), os.fspath(ours), os.fspath(theirs),
                           os.fspath(output))

    @staticmethod
    def trust(root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """Trust the workspace at ``root`` (else $AGENT2PC_ROOT, else the one at or above the
        working directory) as the user's own (one that was copied,
        moved across file systems or restored; never one that came with a repository), and
        list its live transactions, which the next command will finish, without touching
        them. ``agent-2pc trust``."""
        from ..storage.workspace import find_root, trust
        from .engine import Engine

        found = find_root(os.fspath(root) if root is not None else os.environ.get(
            "AGENT2PC_ROOT"), trusted=False)
        trust(found)
        engine = Engine(found, recover_dead=False)
        try:
            return {"root": found, "transactions": engine.transactions(finished=False,
                                                                       limit=None)}
        finally:
            engine.close()

    def begin(self, timeout_ms: int | None = None, label: str | None = None,
              git_branch: str | None = None) -> "Transaction":
        """A new transaction. ``git_branch``: bind it to that git branch (the GitAdapter,
        docs/git.md): its commit then refuses (``conflict``) when the branch moved under a
        path the transaction touches, and ``git_commit`` commits onto it."""
        return Transaction(self, self.engine.begin(timeout_ms=timeout_ms, label=label,
                                                   git_branch=git_branch)["tid"])

    def get(self, tid: str, check: bool = True) -> "Transaction":
        """A handle on an existing transaction (checked: unknown ids raise UnknownTid).
        ``check=False`` skips the look-up: each step then checks the tid itself, after its
        own arguments (what the CLI and the MCP server do)."""
        if check:
            self.engine.status(tid)
        return Transaction(self, tid)

    def transaction(self, timeout_ms: int | None = None, label: str | None = None,
                    git_branch: str | None = None) -> "_Scope":
        """``with client.transaction() as tx``: commit on a clean exit, abort on an exception
        (which propagates). A commit that is refused raises TransactionAborted."""
        return _Scope(self, timeout_ms, label, git_branch)

    def recover(self) -> dict[str, Any]:
        return self.engine.recover()

    def compact(self) -> dict[str, Any]:
        return self.engine.compact()

    def transactions(self, state: str | None = None, *, limit: int | None = LIST_LIMIT,
                     before: str | None = None) -> list[dict[str, Any]]:
        """The ``limit`` newest transactions (None: all), oldest first: finished ones in the
        order they finished, then the live ones. The next page, older: ``before=`` the first
        row's tid. Reads the history from its end, as far as the page needs."""
        return self.engine.transactions(state, limit=limit, before=before)

    def decide(self, tid: str, outcome: str, reason: str | None = None) -> dict[str, Any]:
        """The decision of an outside coordinator for ``tid`` ("commit" or "abort"), from any
        process (docs/library.md, "Decided by an outside coordinator"): a prepared transaction
        commits (commit's answer) or aborts (abort's answer); an active one can only abort.
        The same decision again answers the same; the other one is BadState."""
        return self.engine.decide(tid, outcome, reason)

    def in_doubt(self) -> list[dict[str, Any]]:
        """The prepared transactions waiting for their coordinators:
        ``[{tid, coordinator, prepared_ms, files}]``."""
        return self.engine.in_doubt()

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

    def import_bundle(self, path: str | os.PathLike[str], label: str | None = None
                      ) -> dict[str, Any]:
        """Register the bundle file ``path`` (``.a2pc``, made by ``Transaction.export``) as a
        new active transaction of this workspace, with the bundle's staged changes, reads,
        savepoints and base hashes (``label`` replaces the bundle's). ``{tid, files, again,
        origin, checks}``: ``checks`` reports the exporter's checks, which are not run or
        trusted here. Raises InvalidBundle or Tampered (nothing imported). A bundle whose
        transaction is still live here answers it again (``again: true``)."""
        return self.engine.import_bundle(os.fspath(path), label)

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
                         mode: int | None = None, create_dirs: bool = True) -> dict[str, Any]:
        """Stage the content of a file (a path, a binary file object, or an open descriptor,
        read from where it stands to its end and left open), streamed: never held whole in
        memory, hashed once while it is written. ``mode`` and ``create_dirs`` as for
        ``stage_write``. A path that cannot be read (missing, a directory): UsageError."""

        def staged(fd: int) -> dict[str, Any]:
            return self._engine.stage_write(self.tid, path, src_fd=fd, mode=mode,
                                            create_dirs=create_dirs)

        if isinstance(source, int):
            return staged(source)
        if isinstance(source, (str, os.PathLike)):
            from ..sources import open_source

            fd = open_source(os.fspath(source))
            try:
                return staged(fd)
            finally:
                os.close(fd)
        if not hasattr(source, "read"):
            raise UsageError(f"source must be a path, a binary file object or a descriptor, "
                             f"not {type(source).__name__}")
        under = _file_descriptor(source)
        if under is None:
            return self._stage_from_reader(source, staged)
        try:  # a buffered object's descriptor may stand ahead of what it handed out so far
            os.lseek(under, source.tell(), os.SEEK_SET)
        except OSError:  # not seekable (a pipe): its buffer, if any, may hold what comes first
            if hasattr(source, "peek"):
                return self._stage_from_reader(source, staged)
        try:
            return staged(under)
        finally:
            try:
                source.seek(0, os.SEEK_END)  # the object's buffer agrees with its descriptor
            except OSError:
                pass

    def _stage_from_reader(self, source: IO[bytes], staged: Callable[[int], dict[str, Any]]
                           ) -> dict[str, Any]:
        """Stage an object without a usable descriptor (io.BytesIO, a decompressing reader, a
        buffered pipe with bytes in its buffer): its content goes through an unnamed temp file
        next to the blobs, in chunks, so that a read error or a text-mode object fails before
        anything is staged."""
        import tempfile

        from ..storage.hashing import CHUNK

        with tempfile.TemporaryFile(dir=self._engine.blobs.tmp_dir) as spool:
            while True:
                chunk = source.read(CHUNK)
                if not chunk:
                    break
                if not isinstance(chunk, (bytes, bytearray, memoryview)):
                    raise UsageError("source must be a binary file object (it read "
                                     f"{type(chunk).__name__})")
                spool.write(chunk)
            spool.flush()
            os.lseek(spool.fileno(), 0, os.SEEK_SET)
            return staged(spool.fileno())

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

    def commit(self, merge: bool = True) -> dict[str, Any]:
        """Prepare and commit; TransactionAborted when the answer is no. A file that another
        writer changed since it was staged is merged with that change when the two edits do
        not overlap (the answer's ``merged`` lists those files; its checks run again on the
        merged content); ``merge=False``: such a file is a conflict (docs/collaboration.md)."""
        return self._engine.commit(self.tid, merge=merge)

    def export(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Write this (active) transaction to the bundle file ``path`` (``.a2pc``), atomically;
        another workspace imports it with ``Agent2PC.import_bundle``. The transaction stays
        active here. ``{tid, path, bytes, sha256}``; the same transaction always gives the
        same bytes."""
        return self._engine.export_bundle(self.tid, os.fspath(path))

    def git_commit(self, message: str, author: str | None = None,
                   branch: str | None = None, verify: bool = True, sign: bool | None = None
                   ) -> dict[str, Any]:
        """Commit the transaction and, as one atomic unit with its files, a git commit of
        exactly its changes on ``branch`` (default: the branch HEAD is on), by ``author``
        ("Name <email>"; default: git's). git's hooks run as with ``git commit`` (pre-commit,
        prepare-commit-msg and commit-msg in the staged view, post-commit after), unless
        ``verify`` is false (``--no-verify``); a failing hook raises CheckFailed and the
        transaction stays active. ``sign``: GPG-sign the commit (default: commit.gpgSign).
        The answer is commit's plus ``commit`` (the new commit's id), ``branch`` and the
        ``hooks`` that ran. Bad input (detached HEAD, an unborn or missing branch, no git work
        tree, a locked index) is UsageError before anything is staged; a no vote raises
        TransactionAborted, as commit does (docs/git.md). A file another writer changed since
        it was staged is a conflict, never merged: the git commit holds exactly the
        transaction's changes."""
        return self._engine.git_commit(self.tid, message, author, branch, verify, sign)

    def stage_sql(self, dsn: str, sql: str) -> dict[str, Any]:
        """Stage SQL statements for the Postgres database at ``dsn`` (a URL or conninfo
        without a password, or ``env:NAME``): run now in a transaction that is rolled back, so
        an error raises SqlFailed (``sql_failed``, the server's message and ``sqlstate``) at
        once; committed with the files through PREPARE TRANSACTION / COMMIT PREPARED. Returns
        ``{n, rows_affected}``. A server with max_prepared_transactions = 0 raises
        IsolationUnavailable (docs/postgres.md)."""
        return self._engine.stage_sql(self.tid, dsn, sql)

    def abort(self, reason: str | None = None) -> dict[str, Any]:
        return self._engine.abort(self.tid, reason)

    def vote(self, coordinator: dict[str, Any] | str) -> dict[str, Any]:
        """Prepare for an outside coordinator and vote (docs/library.md, "Decided by an
        outside coordinator"): ``{tid, state: "prepared", vote: "yes"}`` once the yes vote is
        durable; then the transaction waits, across exits and crashes, for
        ``Agent2PC.decide``. A no raises TransactionAborted (the transaction is aborted), as
        commit. ``coordinator``: a JSON object naming who decides, without a password."""
        return self._engine.vote(self.tid, coordinator)


class _Scope:
    __slots__ = ("_client", "_timeout_ms", "_label", "_git_branch", "_tx")

    def __init__(self, client: Agent2PC, timeout_ms: int | None, label: str | None,
                 git_branch: str | None = None) -> None:
        self._client, self._timeout_ms, self._label = client, timeout_ms, label
        self._git_branch = git_branch
        self._tx: Transaction | None = None

    def __enter__(self) -> Transaction:
        self._tx = self._client.begin(timeout_ms=self._timeout_ms, label=self._label,
                                      git_branch=self._git_branch)
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


def _file_descriptor(source: Any) -> int | None:
    """The descriptor under a file object, or None (io.BytesIO and the like have none)."""
    import io

    try:
        return int(source.fileno())
    except (AttributeError, io.UnsupportedOperation, OSError, ValueError):
        return None
