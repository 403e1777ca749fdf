"""The whole error tree of agent-2pc.

Every error carries the contract's ``code`` (CONTRACT.md, "Error codes") and the CLI exit status
that goes with it. Errors are grouped by what the caller may conclude:

    Agent2PCError                         code              exit
    |-- InputError          (bad input or usage: nothing was changed)                2
    |   |-- UsageError                    usage
    |   |-- UnknownTid                    unknown_tid
    |   |-- BadState                      bad_state
    |   |-- PathOutsideRoot               path_outside_root
    |   |-- PathForbidden                 path_forbidden
    |   |-- NotFound                      not_found
    |   |-- NotAFile                      not_a_file
    |   |-- NoMatch                       no_match
    |   |-- AmbiguousMatch                ambiguous_match
    |   |-- UnknownSavepoint              unknown_savepoint
    |   |-- InvalidPatch                  invalid_patch
    |   |-- PatchRejected                 patch_rejected
    |   |-- InvalidManifest               invalid_manifest
    |   `-- InvalidBundle                 invalid_bundle   (a .a2pc file import refuses)
    |   `-- BinaryContent                 binary_content   (a merge of a file that is not text)
    |   `-- UnknownWorkspace              unknown_workspace (no node serves it in the store)
    |-- WorkspaceError      (the workspace or host cannot serve the request as it is)  2
    |   |-- NotInitialized                not_initialized
    |   |-- CorruptWal                    corrupt_wal      (refuse to guess: says where)
    |   |-- ApplyIncomplete               apply_incomplete (decided commit; recover finishes it)
    |   |-- IoFailed                      io_error         (the disk refused a write, an fsync...)
    |   |-- UntrustedWorkspace            untrusted_workspace (not made here: `agent-2pc trust`)
    |   |-- IsolationUnavailable          isolation_unavailable
    |   |-- WorkspaceReadOnly             workspace_read_only (e.g. inside a staged view)
    |   `-- DaemonUnavailable             daemon_unavailable (no daemon, or it died mid-request)
    |   `-- StoreUnavailable              store_unavailable (the global store: unreachable)
    |   `-- NodeUnavailable               node_unavailable (a workspace's node is not alive)
    |-- Refusal             (a definite no: nothing happened, safe to retry or give up)  1
    |   |-- TransactionAborted            conflict | verification_failed | timeout | ...
    |   |-- CheckFailed                   verification_failed | command_failed | timeout |
    |   |                                 limit_exceeded (a command failed; tx stays active)
    |   |-- Busy                          busy             (a lock wait ran out of time)
    |   |-- InFlight                      in_flight        (hook check: transactions are live)
    |   |-- Tampered                      tampered         (a bundle, a history line: bad hash)
    |   |-- MergeConflict                 merge_conflict   (overlapping edits; markers written)
    |   `-- FenceRefusal                  intent_in_flight | intent_fenced | intent_conflict |
    |                                     read_set_stale | domain_race | stale_lease
    `-- UnknownOutcome      (something may have happened: hold the fence)            1

A bug is not an Agent2PCError: an invariant violation raises AssertionError and crashes.

Messages speak of the library's parameters, quoted as in `timeout_ms` must be ..., never of a
face's spelling of them: ``params`` names those the message quotes, and a face may respell them
(the CLI shows --timeout-ms, cli/output.py). ``params`` is not part of the JSON result.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Agent2PCError(Exception):
    """Base class: ``code`` is the contract's error code, ``exit_status`` the CLI's."""

    code = "internal"
    exit_status = 2

    def __init__(self, message: str, *, code: str | None = None,
                 params: tuple[str, ...] = (), **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.params = params
        self.details = details

    def to_json(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        err.update(self.details)
        return err


# -- bad input: exit 2, nothing changed ---------------------------------------------------------


class InputError(Agent2PCError):
    exit_status = 2


class UsageError(InputError):
    code = "usage"


class UnknownTid(InputError):
    code = "unknown_tid"


class BadState(InputError):
    code = "bad_state"


class PathOutsideRoot(InputError):
    code = "path_outside_root"


class PathForbidden(InputError):
    code = "path_forbidden"


class NotFound(InputError):
    code = "not_found"


class NotAFile(InputError):
    code = "not_a_file"


class NoMatch(InputError):
    code = "no_match"


class AmbiguousMatch(InputError):
    code = "ambiguous_match"


class UnknownSavepoint(InputError):
    code = "unknown_savepoint"


class InvalidPatch(InputError):
    code = "invalid_patch"


class PatchRejected(InputError):
    code = "patch_rejected"


class InvalidManifest(InputError):
    code = "invalid_manifest"


class InvalidBundle(InputError):
    """A bundle (.a2pc) that is not one export writes: not the format, truncated, an unknown
    version, a path out of the root, a size past the limits. Nothing was imported."""

    code = "invalid_bundle"
class SqlFailed(InputError):
    """A staged SQL statement failed (or its server could not be reached): the server's
    message, and ``sqlstate`` (participants/postgres.py)."""

    code = "sql_failed"
class UnknownWorkspace(InputError):
    """A global transaction's step names a workspace no node serves in the store
    (docs/distributed.md)."""

    code = "unknown_workspace"


class BinaryContent(InputError):
    """A three-way merge was asked of content that is not text (it holds a NUL byte)."""

    code = "binary_content"


# -- the workspace or host cannot serve: exit 2 ------------------------------------------------


class WorkspaceError(Agent2PCError):
    exit_status = 2


class NotInitialized(WorkspaceError):
    code = "not_initialized"


class CorruptWal(WorkspaceError):
    """A damaged record that is not a torn tail: recovery refuses to guess."""

    code = "corrupt_wal"


class ApplyIncomplete(WorkspaceError):
    """The decision is commit but applying it failed (disk full, say); recover finishes it."""

    code = "apply_incomplete"


class IoFailed(WorkspaceError):
    """The disk refused a write, an fsync or a rename (EIO, ENOSPC, ...): the step stopped
    there, retried nothing, and what it wrote may or may not be on disk. ``recover`` (or the
    next command) finishes or undoes it, all or nothing. The CLI's face of an OSError."""

    code = "io_error"

    @classmethod
    def from_os_error(cls, exc: OSError) -> IoFailed:
        import errno

        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        what = "an fsync" if type(exc).__name__ == "FsyncFailed" else "the disk"
        where = f" ({exc.filename})" if exc.filename else ""
        return cls(f"{what} failed: {exc.strerror or exc}{where}; the step stopped there and "
                   "retried nothing. Run 'agent-2pc recover' once the disk is healthy: it "
                   "finishes or undoes what was begun, all or nothing", errno=name)
class UntrustedWorkspace(WorkspaceError):
    """A workspace this user did not make here (a clone, a copy, another user's): its log is
    not applied until the user trusts it (``agent-2pc trust``, $AGENT2PC_SAFE_DIRECTORY)."""

    code = "untrusted_workspace"


class IsolationUnavailable(WorkspaceError):
    code = "isolation_unavailable"


class WorkspaceReadOnly(WorkspaceError):
    code = "workspace_read_only"


class DaemonUnavailable(WorkspaceError):
    """The workspace's daemon is not there (``daemon stop``, ``daemon status``), refused a
    second start, or died in the middle of a request: what that request did is finished or
    undone by the next call (direct, or through a restarted daemon), all or nothing."""

    code = "daemon_unavailable"


class StoreUnavailable(WorkspaceError):
    """The store of global transactions (Postgres) cannot be reached, or refused a statement
    (docs/distributed.md)."""

    code = "store_unavailable"


class NodeUnavailable(WorkspaceError):
    """A workspace's node is registered in the store but not alive (stopped, killed, cut
    off), or another live process already serves that node name."""

    code = "node_unavailable"


# -- a definite no: exit 1 ---------------------------------------------------------------------


class Refusal(Agent2PCError):
    exit_status = 1


class TransactionAborted(Refusal):
    """The transaction was aborted; ``code`` says why (conflict, verification_failed, timeout).

    ``tid`` names the transaction and ``reason`` is the readable cause.
    """

    code = "conflict"

    def __init__(self, message: str, *, code: str = "conflict", tid: str | None = None,
                 **details: Any) -> None:
        super().__init__(message, code=code, **details)
        self.tid = tid
        self.reason = message


class CheckFailed(Refusal):
    """A command run in the staged view failed (a check, an exec). Nothing was staged by it,
    and the transaction stays active: fix and run again, or abort. ``details["result"]`` is
    the run's result (exit code, log, ...)."""

    code = "verification_failed"

    def __init__(self, message: str, *, code: str = "verification_failed",
                 tid: str | None = None, **details: Any) -> None:
        super().__init__(message, code=code, **details)
        self.tid = tid


class Busy(Refusal):
    code = "busy"


class InFlight(Refusal):
    """``hook check`` found live transactions; ``details["result"]`` is ``{in_flight: [...]}``
    (the JSON answer carries it beside the error)."""

    code = "in_flight"


class Tampered(Refusal):
    """A history line (or a bundle) fails its hash: it was edited, deleted, moved or damaged
    after it was written. ``details`` name where (``line``, ``tid``)."""

    code = "tampered"
class MergeConflict(Refusal):
    """``merge`` found overlapping edits: the output holds conflict markers;
    ``details["result"]`` is ``{conflicts: N, ranges: [...], output}`` (the JSON answer
    carries it beside the error)."""

    code = "merge_conflict"


class FenceRefusal(Refusal):
    """The effect fence said no; ``code`` is one of the fence refusal codes."""

    code = "intent_in_flight"


class UnknownOutcome(Agent2PCError):
    """An effect may or may not have happened; the fence stays closed until reconciled."""

    code = "unknown_outcome"
    exit_status = 1
