"""The tools of ``agent-2pc mcp``: one table, one row per tool.

A row names the tool, says when to use it (the description is written for a model), gives its
input model and the success shape(s) of its result (_models.py), the library call, and honest
annotations. The call goes through the public library (``Agent2PC``, ``Transaction``), runs in a
worker thread and returns exactly the dict the CLI prints with ``--json``, without ``ok`` (it
mirrors cli/commands.py and cli/fence.py); it raises the errors of agent_2pc.errors, which
_server.py turns into ``ok: false`` results or ``isError`` results.

Adding a tool is one ``ToolSpec(...)`` in TOOLS: a name, a description, an input model, an
output model, ``call=lambda rt, a: ...`` and ``ann(...)``. ``requires="attr"`` registers the row
only when ``Transaction`` has that method (for steps being built). ``quick=True`` marks a step that
takes a fraction of a millisecond (it appends to the log, writes a blob): it runs on the event
loop's thread when no other engine call is running, which saves the hop to a worker thread (about
half a millisecond measured, half of a staging step); every other call runs in a worker thread.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel

from ..errors import UsageError
from . import _models as m

if TYPE_CHECKING:
    from ..coordinator.client import Agent2PC, Transaction

INSTRUCTIONS = """\
agent-2pc gives you database-grade transactions over this repository's files (and staged HTTP \
calls). Nothing you stage touches the working tree until you commit; commit applies everything \
atomically or nothing.

Protocol:
1. agent_2pc_begin -> tid.
2. Stage each change: agent_2pc_stage_write (whole file), agent_2pc_stage_diff (replace a unique \
snippet), agent_2pc_stage_patch (unified diff), agent_2pc_stage_delete. Later steps see earlier \
ones. agent_2pc_record_read a file your change relies on but does not modify.
3. Check: agent_2pc_diff to review; agent_2pc_stage_cmd (when offered) to run tests against the \
staged view. agent_2pc_savepoint / agent_2pc_rollback_to to undo part of the work.
4. agent_2pc_commit. Someone else's edits to other lines of a file you staged are merged with \
yours (listed in merged). If it answers ok:false (conflict: someone else changed the same lines \
of a file you staged, or a file you read), nothing was applied: begin again, re-read, redo. \
If you cannot finish, agent_2pc_abort.

Results: ok:true plus the fields; ok:false plus error.code is a definite "no" (conflict, \
timeout, verification_failed, busy, fence refusals) -- nothing half-done. isError results mean \
bad input (unknown_tid, bad_state, path_outside_root, not_found, no_match, ambiguous_match, \
usage, ...): fix the arguments; do not retry unchanged.

Side effects that must happen exactly once (a payment, an e-mail): fence_prepare with an intent \
(idempotency key); status "fresh": do it, then fence_commit with the ticket and the result; \
status "already_done": do NOT do it again, use cert.result.
"""

# Guidance shared by the tools that take a tid.
_TID_ERRORS = (" Errors: unknown_tid (no such transaction: begin one), bad_state (it is already "
               "committed or aborted: begin a new one); ok:false timeout (it expired and was "
               "aborted: begin again) or busy (another process holds it: retry shortly).")
_PATH_ERRORS = (" path_outside_root / path_forbidden: use a path inside the repository, not in "
                ".git/ or .agent-tx/.")
_FENCE_REFUSALS = (" ok:false refusals: intent_in_flight (another holder is running it: wait and "
                   "call again, you will get already_done), intent_fenced (an earlier attempt "
                   "ended with an unknown outcome: fence_reconcile it), intent_conflict (the "
                   "intent was used for another tool/args: a bug, use a new intent), "
                   "read_set_stale (re-read and decide again), domain_race (retry later).")


@dataclass(frozen=True)
class Annotations:
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False


def ann(*, read_only: bool = False, destructive: bool = False, idempotent: bool = False,
        open_world: bool = False) -> Annotations:
    return Annotations(read_only, destructive, idempotent, open_world)


READ_ONLY = ann(read_only=True, idempotent=True)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    input: type[BaseModel]
    output: tuple[type[BaseModel], ...]
    call: Callable[[Runtime, Any], dict[str, Any]]
    annotations: Annotations
    uses_engine: bool = True        # engine calls are serialized (one engine per server)
    requires: str | None = None     # register only when Transaction has this method
    quick: bool = False             # a short step: run on the event loop when the engine is free


class Runtime:
    """What the tools act on: the workspace's client and the fence, opened on first use.

    The root is resolved on each call until a workspace is found (so that `agent-2pc init`
    after the server started is enough); then it is fixed for the server's life.
    """

    def __init__(self, root: str | None = None, store: str | None = None) -> None:
        self.root_arg = root
        self.store_arg = store
        self.engine_lock = threading.Lock()
        self._lock = threading.Lock()
        self._client: Agent2PC | None = None
        self._fence: Any = None
        self._root: str | None = None

    def root(self) -> str:
        if self._root is None:
            from ..storage.workspace import find_root

            self._root = find_root(self.root_arg or os.environ.get("AGENT2PC_ROOT"))
        return self._root

    def client(self) -> Agent2PC:
        with self._lock:
            if self._client is None:
                from ..coordinator.client import Agent2PC

                self._client = Agent2PC(self.root())
            return self._client

    def tx(self, tid: str) -> Transaction:
        """The transaction ``tid`` names, unchecked: each step checks it after its arguments."""
        return self.client().get(tid, check=False)

    def store_url(self) -> str:
        url = self.store_arg or os.environ.get("AGENT2PC_FENCE_STORE")
        if url:
            return str(url)
        return "sqlite:///" + os.path.join(self.root(), ".agent-tx", "fence.db").lstrip("/")

    def fence(self) -> Any:
        with self._lock:
            if self._fence is None:
                from ..fence import open_fence

                self._fence = open_fence(self.store_url())
            return self._fence

    def close(self) -> None:
        with self._lock:
            if self._fence is not None:
                self._fence.close()
                self._fence = None
            if self._client is not None:
                with self.engine_lock:
                    self._client.close()
                self._client = None


# -- calls (they mirror cli/commands.py and cli/fence.py) -----------------------------------------


def _stage_write(rt: Runtime, a: m.StageWriteIn) -> dict[str, Any]:
    if (a.content is None) == (a.content_base64 is None):
        raise UsageError("give exactly one of content | content_base64")
    if a.content is not None:
        try:
            data = a.content.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError("content is not valid Unicode text; send content_base64") from None
    else:
        try:
            data = base64.b64decode(a.content_base64 or "", validate=True)
        except (binascii.Error, ValueError):
            raise UsageError("content_base64 is not valid base64") from None
    mode = int(a.mode, 8) if a.mode is not None else None
    return rt.tx(a.tid).stage_write(a.path, data, mode=mode)


def _stage_api(rt: Runtime, a: m.StageApiIn) -> dict[str, Any]:
    headers: dict[str, str] = {}
    for item in a.header:
        name, sep, value = item.partition(":")
        if not sep:
            raise UsageError(f"a header is \"Name: value\", not {item!r}")
        headers[name.strip()] = value.strip()
    compensate = None
    if a.compensate_method or a.compensate_url or a.compensate_body is not None:
        compensate = {"method": a.compensate_method, "url": a.compensate_url,
                      "body": a.compensate_body}
    return rt.tx(a.tid).stage_api(a.method, a.url, a.body, headers, a.idempotency_key,
                                  compensate)


def _fence_prepare(rt: Runtime, a: m.FencePrepareIn) -> dict[str, Any]:
    from ..fence import EffectRequest

    req = EffectRequest(
        intent=a.intent, domain=a.domain, tool=a.tool, args=a.args,
        agent=a.agent if a.agent is not None else os.environ.get("AGENT2PC_AGENT", ""),
        read_set=[{"domain": r.domain, "seq": r.seq} for r in a.read_set], parent=a.parent,
        known_clock=a.known_clock)
    return rt.fence().prepare(req, takeover=a.takeover).to_json()  # type: ignore[no-any-return]


def _fence_heartbeat(rt: Runtime, a: m.TicketIn) -> dict[str, Any]:
    expires = rt.fence().heartbeat(a.ticket)
    return {"intent": a.ticket.get("intent") if isinstance(a.ticket, dict) else None,
            "lease_expires_at": expires}


def _fence_reconcile(rt: Runtime, a: m.FenceReconcileIn) -> dict[str, Any]:
    cert = rt.fence().reconcile(a.intent, a.action, a.result, a.reason)
    out: dict[str, Any] = {"intent": a.intent,
                           "state": "done" if a.action == "done" else "failed"}
    if cert is not None:
        out["cert"] = cert.to_json()
    return out


def _status(rt: Runtime, a: m.StatusIn) -> dict[str, Any]:
    from ..coordinator.monitor import health

    out = rt.client().status(a.tid)
    out["health"] = health(rt.root())
    return out


def _hook_check(rt: Runtime, a: m.HookCheckIn) -> dict[str, Any]:
    from ..git.hooks import check

    return check(rt.root_arg, missing_ok=a.missing_ok)


def _daemon_status(rt: Runtime, a: m.EmptyIn) -> dict[str, Any]:
    from ..daemon.control import status

    return status(rt.root())


def _fence_status(rt: Runtime, a: m.FenceStatusIn) -> dict[str, Any]:
    fence = rt.fence()
    if a.intent is not None:
        return fence.status(a.intent)  # type: ignore[no-any-return]
    return fence.status(limit=a.limit or 100)  # type: ignore[no-any-return]


# -- the table ------------------------------------------------------------------------------------

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "agent_2pc_begin", "Begin a transaction",
        "Start a transaction over the repository's files; returns {tid}. Use it before changing "
        "any file: stage the changes with the agent_2pc_stage_* tools, check them, then "
        "agent_2pc_commit (or agent_2pc_abort). Errors: not_initialized (the repository has no "
        "workspace: ask the user to run `agent-2pc init`).",
        m.BeginIn, (m.BeginOut,),
        lambda rt, a: {"tid": rt.client().begin(timeout_ms=a.timeout_ms, label=a.label,
                                                git_branch=a.git_branch).tid},
        ann(), quick=True),
    ToolSpec(
        "agent_2pc_record_read", "Record a read",
        "Remember the current content hash of a file that your change relies on but does not "
        "modify; the commit then aborts with conflict if someone changes it meanwhile. Returns "
        "{path, sha256} (sha256 null: the file is absent)." + _TID_ERRORS + _PATH_ERRORS,
        m.TidPathIn, (m.RecordReadOut,),
        lambda rt, a: rt.tx(a.tid).record_read_result(a.path),
        ann(idempotent=True), quick=True),
    ToolSpec(
        "agent_2pc_stage_write", "Stage a file's content",
        "Stage the whole new content of a file (created if absent; parents made at commit). The "
        "tree is untouched until commit. Give content (text) or content_base64 (binary); mode "
        "(\"0755\") only to change permissions. Returns {path, op: \"write\", bytes}. For a "
        "small edit in a big file prefer agent_2pc_stage_diff. Errors: not_a_file (the path is a "
        "directory, or a parent is a file), usage (both or neither content)." + _TID_ERRORS
        + _PATH_ERRORS,
        m.StageWriteIn, (m.WriteOut,), _stage_write,
        ann(idempotent=True), quick=True),
    ToolSpec(
        "agent_2pc_stage_diff", "Stage a text replacement",
        "Stage a replacement of an exact snippet in a file, as the transaction sees it (after "
        "its earlier steps). old must occur exactly once unless all is true. Returns {path, op: "
        "\"replace\", replacements}. Errors: no_match (old is not in the file: re-read it, mind "
        "whitespace), ambiguous_match (old occurs `matches` times: add surrounding lines or set "
        "all), not_found (no such file)." + _TID_ERRORS + _PATH_ERRORS,
        m.StageDiffIn, (m.ReplaceOut,),
        lambda rt, a: rt.tx(a.tid).stage_replace(a.path, a.old, a.new, all=a.all),
        ann(), quick=True),
    ToolSpec(
        "agent_2pc_stage_patch", "Stage a unified diff",
        "Stage a unified diff (git-style with new/deleted/renamed files and modes, or plain "
        "---/+++), one or many files, applied to the staged view so successive patches compose; "
        "all or nothing. Returns {files}. Errors: invalid_patch (malformed: see line), "
        "patch_rejected (a hunk does not match the file: see path, hunk, expected/found; re-read "
        "the file, or use agent_2pc_stage_diff)." + _TID_ERRORS + _PATH_ERRORS,
        m.StagePatchIn, (m.PatchOut,),
        lambda rt, a: rt.tx(a.tid).stage_patch(a.patch),
        ann(), quick=True),
    ToolSpec(
        "agent_2pc_stage_delete", "Stage a deletion",
        "Stage the deletion of a file (directories left empty go at commit). Returns {path, op: "
        "\"delete\"}. Errors: not_found (the file does not exist in the staged view)."
        + _TID_ERRORS + _PATH_ERRORS,
        m.TidPathIn, (m.DeleteOut,),
        lambda rt, a: rt.tx(a.tid).stage_delete(a.path),
        ann(), quick=True),
    ToolSpec(
        "agent_2pc_stage_api", "Stage an HTTP call",
        "Stage an HTTP call that is sent exactly once at commit, after the files' checks passed, "
        "with an Idempotency-Key; if the transaction then aborts, the compensation call (if "
        "given) undoes it. Returns {n, method, url, idempotency_key, compensate}. At commit, a "
        "4xx aborts with effect_failed and an unknown outcome with effect_unknown. Errors: "
        "usage (bad URL, body, header)." + _TID_ERRORS,
        m.StageApiIn, (m.ApiOut,), _stage_api,
        ann(open_world=True), quick=True),
    ToolSpec(
        "agent_2pc_stage_sql", "Stage SQL statements for a Postgres database",
        "Stage SQL statements (a migration, rows) that commit together with the transaction's "
        "files or not at all: they run now in a database transaction that is rolled back, so "
        "an error shows at once (sql_failed with the server's message and sqlstate), and at "
        "commit again, held with PREPARE TRANSACTION until every participant voted yes; a "
        "statement that fails then (another writer got in the way) aborts the commit with "
        "conflict or effect_failed. Statements for one DSN run in one database transaction, "
        "in order. Returns {n, rows_affected}. Errors: usage (a password in the DSN, "
        "BEGIN/COMMIT in the SQL), isolation_unavailable (the server has "
        "max_prepared_transactions = 0)." + _TID_ERRORS,
        m.StageSqlIn, (m.SqlOut,),
        lambda rt, a: rt.tx(a.tid).stage_sql(a.dsn, a.sql),
        ann(open_world=True)),
    ToolSpec(
        "agent_2pc_stage_cmd", "Run a check on the staged view",
        "Run a shell command (tests, a linter, a build) against the repository as it would be "
        "after commit, without touching it. The check is recorded: the commit runs it again if "
        "the staged content changed since, and refuses to commit while its latest run fails. "
        "Returns {exit_code, passed, duration_ms, isolation, log, tail, promoted}. A failing "
        "check answers ok:false with code verification_failed (or timeout) and tail (its last "
        "output): fix, stage, run it again -- the transaction stays active. promote: globs of "
        "files the command writes (generated code, lock files) to stage. sandbox: also confine "
        "it (no network unless network). Errors: isolation_unavailable." + _TID_ERRORS,
        m.StageCmdIn, (m.StageCmdOut,),
        lambda rt, a: rt.tx(a.tid).stage_cmd(a.command, timeout_ms=a.timeout_ms,
                                             promote=a.promote, sandbox=a.sandbox,
                                             network=a.network),
        ann(idempotent=True, open_world=True), requires="stage_cmd"),
    ToolSpec(
        "agent_2pc_exec", "Run a command and stage what it writes",
        "Run a program (a code generator, a formatter, a migration, `npm install`) against the "
        "staged view and stage every file, symlink and empty directory it creates, changes or "
        "deletes. Returns {exit_code, isolation, captured: [{path, op}], skipped, log, tail}; "
        "op is write, delete, symlink or mkdir. A command that fails answers "
        "ok:false (command_failed or timeout, with tail) and stages nothing (keep_on_failure: "
        "stages it all the same); the transaction stays active. sandbox: also confine it (no "
        "network unless network). Errors: isolation_unavailable." + _TID_ERRORS,
        m.ExecIn, (m.ExecOut,),
        lambda rt, a: rt.tx(a.tid).exec(a.argv, timeout_ms=a.timeout_ms, interactive=False,
                                        sandbox=a.sandbox, network=a.network,
                                        keep_on_failure=a.keep_on_failure),
        ann(open_world=True), requires="exec"),
    ToolSpec(
        "agent_2pc_overlay_exec", "Look around in the staged view",
        "Run a command in the staged view and return its output (tail, the last 64 KiB), "
        "capturing nothing and recording no check: for looking at the repository as it would "
        "be after commit (cat, ls, grep, git diff, a quick script). Returns {exit_code, passed, "
        "tail, isolation, log}. sandbox: also confine it (no network unless network)."
        + _TID_ERRORS,
        m.OverlayExecIn, (m.OverlayExecOut,),
        lambda rt, a: rt.tx(a.tid).overlay_exec(a.command, timeout_ms=a.timeout_ms,
                                                sandbox=a.sandbox, network=a.network),
        ann(read_only=True, open_world=True), requires="overlay_exec"),
    ToolSpec(
        "agent_2pc_diff", "Show the staged change",
        "Show what the transaction would change: {files: [{path, status, additions, "
        "deletions}], diff} where diff is a git-style patch (stat: a summary instead). Use it to "
        "review before committing." + _TID_ERRORS,
        m.DiffIn, (m.DiffOut,),
        lambda rt, a: rt.tx(a.tid).diff(stat=a.stat),
        READ_ONLY),
    ToolSpec(
        "agent_2pc_savepoint", "Mark a savepoint",
        "Mark a point in the transaction to roll back to later with agent_2pc_rollback_to. "
        "Returns {name}." + _TID_ERRORS,
        m.SavepointIn, (m.NameOut,),
        lambda rt, a: rt.tx(a.tid).savepoint(a.name),
        ann(), quick=True),
    ToolSpec(
        "agent_2pc_rollback_to", "Roll back to a savepoint",
        "Undo the staging and reads made after the savepoint (it stays, so you can roll back to "
        "it again). Returns {name}. Errors: unknown_savepoint (see the known ones in the "
        "message)." + _TID_ERRORS,
        m.SavepointIn, (m.NameOut,),
        lambda rt, a: rt.tx(a.tid).rollback_to(a.name),
        ann(destructive=True, idempotent=True), quick=True),
    ToolSpec(
        "agent_2pc_status", "Show transactions",
        "Without tid: the live (unfinished) transactions. With tid: that transaction in detail "
        "(state, staged files, reads, savepoints, and code/reason once decided). Returns "
        "{transactions: [...], health: {health, reasons, in_flight, stuck}} (the workspace's "
        "health as 'agent-2pc monitor' sees it). Errors: unknown_tid.",
        m.StatusIn, (m.StatusOut,),
        lambda rt, a: _status(rt, a),
        READ_ONLY, quick=True),
    ToolSpec(
        "agent_2pc_commit", "Commit the transaction",
        "Apply every staged change atomically and durably (and send staged HTTP calls), or "
        "nothing. Returns {tid, state: \"committed\", files, merged}. A file someone else "
        "changed since you staged it is merged with their edit when the two touch different "
        "lines (listed in merged; checks run again on the merged content; no_merge: true "
        "refuses instead). A no is ok:false with state "
        "\"aborted\": conflict (overlapping edits, a binary file, or a file you read was "
        "changed by someone else; their "
        "content stays: begin again and redo on the new content), timeout, verification_failed "
        "(a check fails on the final content), effect_failed / effect_unknown (a staged HTTP "
        "call). Committing again answers the same. Errors: bad_state (it was aborted), "
        "apply_incomplete (decided but not fully applied: run `agent-2pc recover`), "
        "unknown_tid.",
        m.CommitIn, (m.CommitOut,),
        lambda rt, a: rt.tx(a.tid).commit(merge=not a.no_merge),
        ann(destructive=True, idempotent=True, open_world=True)),
    ToolSpec(
        "agent_2pc_git_commit", "Commit the transaction and a git commit of it",
        "Like agent_2pc_commit, and in the same atomic step a git commit holding exactly the "
        "transaction's changes, on top of the branch's current commit (branch: default the one "
        "HEAD is on), with your message and author (\"Name <email>\"; default git's). The "
        "user's other staged or modified files are neither committed nor lost. The "
        "repository's git hooks run as with `git commit` (pre-commit and commit-msg see the "
        "repository as it will be after the commit); a failing hook is ok:false with code "
        "verification_failed and its output: nothing is committed, the transaction stays "
        "active, fix the cause and call again. Returns {tid, state: \"committed\", files, "
        "commit, branch, hooks}. Use it instead of running `git add` and `git commit` "
        "yourself. A no is ok:false with state \"aborted\", as agent_2pc_commit (conflict: a "
        "file changed meanwhile, or the branch was deleted or moved while the commit was "
        "made; commits others added to the branch before simply become the parent). Errors: "
        "usage "
        "(detached HEAD: give branch; an unborn or missing branch; not a git work tree; the "
        "index is locked by a running git; git has no user.name/user.email: ask the user to "
        "set them), bad_state, unknown_tid.",
        m.GitCommitIn, (m.GitCommitOut,),
        lambda rt, a: rt.tx(a.tid).git_commit(a.message, author=a.author, branch=a.branch,
                                              verify=not a.no_verify, sign=a.sign),
        ann(destructive=True)),
    ToolSpec(
        "agent_2pc_export", "Export the transaction to a bundle file",
        "Write an active transaction (its staged changes, the base hash of every file it "
        "touches, its reads, savepoints, label and its checks' results) to one .a2pc file, so "
        "that another agent or a person can review and commit it in their own copy of the "
        "repository (agent_2pc_import there). Nothing is applied; the transaction stays active "
        "here (abort it once handed over, or it may be committed twice: the second commit "
        "would conflict). Returns {tid, path, bytes, sha256}. Errors: usage (a transaction "
        "with staged HTTP calls or a git commit cannot be exported; path is a directory), "
        "io_error (the disk refused: no partial file is left)." + _TID_ERRORS,
        m.ExportIn, (m.ExportOut,),
        lambda rt, a: rt.tx(a.tid).export(a.path),
        ann(idempotent=True)),
    ToolSpec(
        "agent_2pc_import", "Import a bundle file as a transaction",
        "Register a .a2pc bundle (from agent_2pc_export) as a new active transaction of this "
        "workspace. Then review it with agent_2pc_diff, run your own checks with "
        "agent_2pc_stage_cmd (the exporter's checks are only reported, in checks: they are not "
        "run or trusted here), and agent_2pc_commit or agent_2pc_abort it. If a file it changes "
        "or read was changed here since the bundle was made, the commit answers conflict and "
        "applies nothing. Returns {tid, files, again, origin, checks}; importing the same "
        "bundle again while its transaction is live answers that transaction (again: true). "
        "Errors: invalid_bundle (not a bundle, truncated, a newer format version, a path "
        "outside the repository or in .git/, a link pointing out, sizes past the limits), "
        "usage (no such file); ok:false tampered (the bundle's bytes fail their hash: it was "
        "altered; ask for it again). Nothing is imported on an error.",
        m.ImportIn, (m.ImportOut,),
        lambda rt, a: rt.client().import_bundle(a.path, label=a.label),
        ann(idempotent=True)),
    ToolSpec(
        "agent_2pc_abort", "Abort the transaction",
        "Abort: nothing staged reaches the tree. Use it when the task fails or you give up. "
        "Returns {tid, state: \"aborted\"}; aborting again answers the same. Errors: bad_state "
        "(it is already committed), unknown_tid.",
        m.AbortIn, (m.AbortOut,),
        lambda rt, a: rt.tx(a.tid).abort(a.reason),
        ann(destructive=True, idempotent=True)),
    ToolSpec(
        "agent_2pc_undo", "Undo a committed transaction",
        "Take back a committed transaction (tid) as a new transaction: every file it changed "
        "gets back its content and mode from before it, files it created are deleted, files it "
        "deleted come back. Returns {tid (the new one), undoes, state: \"committed\", files}. "
        "Undoing an undo redoes. A no is ok:false, code conflict: a file changed since that "
        "transaction committed (nothing was changed; look at agent_2pc_log and the files). "
        "Errors: bad_state (it was not committed), unknown_tid, not_found (what stood there "
        "before is no longer kept: pre-images are kept for the latest 100 commits or a week).",
        m.TidIn, (m.UndoOut,),
        lambda rt, a: rt.client().undo(a.tid),
        ann(destructive=True)),
    ToolSpec(
        "agent_2pc_log", "Show the history of transactions",
        "Finished transactions, newest first: {entries: [{tid, label, state, at, files, checks, "
        "code, reason, undoes, undone_by, hash, prev}]}; each entry is chained to the one "
        "before by SHA-256. verify: true checks the whole chain and returns {verified, "
        "unchained}; ok:false code tampered names the first history line that was edited, "
        "deleted or moved.",
        m.LogIn, (m.LogOut,),
        lambda rt, a: rt.client().log(limit=a.limit, verify=a.verify),
        READ_ONLY),
    ToolSpec(
        "agent_2pc_compact", "Compact the log",
        "Housekeeping: move finished transactions out of the write-ahead log and collect "
        "garbage. Returns {before_bytes, after_bytes, blobs_collected, preimages_collected}. "
        "Rarely needed (it also happens automatically).",
        m.EmptyIn, (m.CompactOut,),
        lambda rt, a: rt.client().compact(),
        ann(idempotent=True)),
    ToolSpec(
        "agent_2pc_hook_check", "Check that no transaction is in flight",
        "The pre-commit gate's question, for a git commit or a CI step: are transactions of "
        "this workspace still live (active, preparing, committing, aborting)? Call it before "
        "you run `git commit`. Returns {in_flight: [], workspace} when none is. ok:false "
        "in_flight: the live ones are listed in in_flight: [{tid, label, state, age_s, files}]; "
        "commit or abort yours (agent_2pc_commit / agent_2pc_abort), and leave other agents' "
        "alone (wait for them). Read-only. Errors: not_initialized (no workspace; missing_ok: "
        "true passes instead), corrupt_wal (the log is damaged: ask the user).",
        m.HookCheckIn, (m.HookCheckOut,),
        lambda rt, a: _hook_check(rt, a),
        READ_ONLY, uses_engine=False),
    ToolSpec(
        "agent_2pc_daemon_status", "Is the workspace's daemon running",
        "Whether a background daemon (agent-2pc daemon start) serves this workspace on its "
        "Unix socket, and its counters. Returns {running, pid, socket, uptime_s, clients, "
        "requests, commits, fsyncs} (running: false and zeros when none; that is not an "
        "error: every tool works the same without it). Read-only.",
        m.EmptyIn, (m.DaemonStatusOut,), _daemon_status, READ_ONLY, uses_engine=False),
    ToolSpec(
        "fence_prepare", "Ask to run an effect exactly once",
        "Before a side effect that must happen once (a payment, an e-mail, a POST), ask the "
        "fence with an intent (the action's idempotency key). status \"fresh\": you hold the "
        "lease; do the effect, then fence_commit with the ticket and its result (or fence_abort "
        "if it failed). status \"already_done\": it was done before; do NOT do it again; cert."
        "result is what it produced." + _FENCE_REFUSALS + " Errors: usage (bad args), "
        "unknown_parent, store_unavailable.",
        m.FencePrepareIn, (m.FreshOut, m.AlreadyDoneOut), _fence_prepare,
        ann(open_world=True), uses_engine=False),
    ToolSpec(
        "fence_commit", "Record an effect's result",
        "After doing the effect that fence_prepare admitted, record its result: returns {cert}, "
        "the certificate every later attempt is answered with. Idempotent for the same ticket "
        "and result. ok:false stale_lease: the ticket is not the current lease (taken over, "
        "reconciled, already ended, or malformed).",
        m.FenceCommitIn, (m.CertOut,),
        lambda rt, a: {"cert": rt.fence().commit(a.ticket, a.result).to_json()},
        ann(idempotent=True, open_world=True), uses_engine=False),
    ToolSpec(
        "fence_abort", "End a lease without a result",
        "The effect did not complete: outcome \"failed\" (it definitely did not happen; the "
        "intent is free for a retry) or \"unknown\" (it may have happened; the intent is fenced "
        "until fence_reconcile). Returns {intent, state, changed}. ok:false stale_lease: not the "
        "current lease.",
        m.FenceAbortIn, (m.FenceAbortOut,),
        lambda rt, a: rt.fence().abort(a.ticket, a.reason, a.outcome).to_json(),
        ann(open_world=True), uses_engine=False),
    ToolSpec(
        "fence_heartbeat", "Extend a lease",
        "Keep the lease of a long effect alive (call it well within the lease TTL, 60 s by "
        "default). Returns {intent, lease_expires_at}. ok:false stale_lease: you lost the lease; "
        "stop.",
        m.TicketIn, (m.HeartbeatOut,), _fence_heartbeat,
        ann(idempotent=True, open_world=True), uses_engine=False),
    ToolSpec(
        "fence_reconcile", "Settle an unknown outcome",
        "Settle an intent that is fenced (unknown outcome, or a holder whose lease expired) once "
        "you know what happened: action \"clear\" (it did not happen: the intent is free) or "
        "\"done\" with its result (returns the cert). Returns {intent, state, cert?}. Errors: "
        "bad_state (the intent is done or failed, nothing to settle), unknown_intent.",
        m.FenceReconcileIn, (m.ReconcileOut,), _fence_reconcile,
        ann(open_world=True), uses_engine=False),
    ToolSpec(
        "fence_status", "Show the fence's ledger",
        "Without intent: the ledger (counts by state, fenced and running intents, counters). "
        "With intent: that intent's entry (state absent, running, done, failed or fenced; its "
        "cert when done).",
        m.FenceStatusIn, (m.LedgerOut, m.IntentOut), _fence_status,
        ann(read_only=True, idempotent=True, open_world=True), uses_engine=False),
)

# For benchmarks: the same path (validation, worker thread, rendering) doing nothing. Registered
# only when $AGENT2PC_MCP_NOOP=1.
NOOP = ToolSpec(
    "agent_2pc_noop", "Do nothing", "Does nothing (a benchmark baseline). Returns {}.",
    m.EmptyIn, (m.NoopOut,), lambda rt, a: {}, READ_ONLY, uses_engine=False, quick=True)


def available(tools: tuple[ToolSpec, ...] = TOOLS) -> list[ToolSpec]:
    """The rows this build can serve: gated rows only when the library has their step."""
    from ..coordinator.client import Transaction

    out = [t for t in tools if t.requires is None or hasattr(Transaction, t.requires)]
    if os.environ.get("AGENT2PC_MCP_NOOP") == "1":
        out.append(NOOP)
    return out
