"""The typed arguments and results of the MCP tools (pydantic models).

Inputs forbid unknown fields, so a misspelt argument is a clear ``usage`` error instead of being
ignored. Outputs are the *success* shapes of the CLI's JSON objects (docs/cli.md, docs/fence.md)
without ``ok``; _schema.py joins each with the failure shape (``{ok: false, error}``) into the
tool's outputSchema. Output models allow extra fields: the contract may add fields to a result,
and a client that validates against an older schema must not break.

Limits (a bound on everything that comes in): a staged content or a patch is at most
CONTENT_CHARS_MAX characters; bigger files are for the CLI's ``--from-file``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, WithJsonSchema

CONTENT_CHARS_MAX = 16 << 20    # stage_write content, stage_patch patch, stage_diff old/new
NAME_CHARS_MAX = 512            # labels, names, reasons, intents: the library bounds them further
URL_CHARS_MAX = 8192
HEADERS_MAX = 64
LIMIT_MAX = 10_000


class In(BaseModel):
    """Base of every tool's arguments: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


class Out(BaseModel):
    """Base of every tool's success result: more fields may come."""

    model_config = ConfigDict(extra="allow")


Tid = Annotated[str, Field(max_length=64, description="The transaction id that agent_2pc_begin "
                                                      "returned (tx-YYYYMMDD-HHMMSS-xxxxxx).")]
Path = Annotated[str, Field(min_length=1, max_length=4096, description=(
    "A path relative to the workspace root (an absolute path inside the root is accepted). "
    "Paths outside the root, inside .git/ or .agent-tx/ are refused."))]

# A ticket is validated by the fence itself (a malformed or forged one is a stale_lease refusal,
# as in the CLI), so the schema describes it precisely while any JSON object or text gets through.
TICKET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The ticket that fence_prepare returned, unchanged.",
    "properties": {"intent": {"type": "string"}, "generation": {"type": "integer"},
                   "token": {"type": "integer"}, "lease_id": {"type": "string"},
                   "fingerprint": {"type": "string"}},
    "required": ["intent", "generation", "token", "lease_id", "fingerprint"],
}
TicketArg = Annotated[dict[str, Any] | str, WithJsonSchema(TICKET_SCHEMA)]


# -- inputs: transactions ----------------------------------------------------------------------


class BeginIn(In):
    timeout_ms: int | None = Field(None, ge=0, description=(
        "Abort the transaction if it is not committed within this many milliseconds "
        "(default 24 hours; 0: never)."))
    label: str | None = Field(None, max_length=200, description="A note shown by status.")
    git_branch: str | None = Field(None, max_length=1024, description=(
        "Bind the transaction to this git branch: its commit is refused (conflict) if the "
        "branch moves under a file it touches, and agent_2pc_git_commit commits onto it."))


class TidIn(In):
    tid: Tid


class TidPathIn(In):
    tid: Tid
    path: Path


class StageWriteIn(In):
    tid: Tid
    path: Path
    content: str | None = Field(None, max_length=CONTENT_CHARS_MAX, description=(
        "The file's whole new content, as text (UTF-8). Give this or content_base64."))
    content_base64: str | None = Field(None, max_length=CONTENT_CHARS_MAX * 4 // 3 + 4,
                                       description="The content as base64, for binary files.")
    mode: str | None = Field(None, pattern=r"^0?[0-7]{3,4}$", description=(
        "Octal permission bits such as \"0755\" (default: keep the file's; 0644 for a new "
        "file). setuid, setgid and sticky bits are refused."))


class StageDiffIn(In):
    tid: Tid
    path: Path
    old: str = Field(min_length=1, max_length=CONTENT_CHARS_MAX, description=(
        "The exact text to find in the file as the transaction sees it; it must occur exactly "
        "once unless all is true. Include enough context to make it unique."))
    new: str = Field(max_length=CONTENT_CHARS_MAX, description="The text to put instead.")
    all: bool = Field(False, description="Replace every occurrence.")


class StagePatchIn(In):
    tid: Tid
    patch: str = Field(min_length=1, max_length=CONTENT_CHARS_MAX, description=(
        "A unified diff (git-style or plain ---/+++), one or many files."))


class StageApiIn(In):
    tid: Tid
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    url: str = Field(max_length=URL_CHARS_MAX, description="An http:// or https:// URL.")
    body: JsonValue = Field(None, description="The request body, as a JSON value (not text).")
    header: list[Annotated[str, Field(max_length=8192)]] = Field(
        default_factory=list, max_length=HEADERS_MAX,
        description="Request headers as \"Name: value\" strings.")
    idempotency_key: str | None = Field(None, max_length=255, description=(
        "The Idempotency-Key sent with the call (default: one made for this call)."))
    compensate_method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS",
                               None] = Field(None, description=(
                                   "The call that undoes this one if the transaction aborts "
                                   "after it may have happened."))
    compensate_url: str | None = Field(None, max_length=URL_CHARS_MAX)
    compensate_body: JsonValue = None


class DiffIn(In):
    tid: Tid
    stat: bool = Field(False, description="A per-file summary instead of the whole diff.")


class SavepointIn(In):
    tid: Tid
    name: str = Field(min_length=1, max_length=200, description="The savepoint's name.")


class StatusIn(In):
    tid: Tid | None = Field(None, description="Show this transaction in detail (default: list "
                                              "the live transactions).")


class AbortIn(In):
    tid: Tid
    reason: str | None = Field(None, max_length=2000, description="Why (kept in the history).")


class EmptyIn(In):
    pass


class StageCmdIn(In):
    tid: Tid
    command: str = Field(min_length=1, max_length=65536, description=(
        "A shell command line, run by /bin/sh -c in the staged view (e.g. \"pytest -q\")."))
    timeout_ms: int | None = Field(None, ge=1, le=24 * 3600 * 1000,
                                   description="Kill it after this many ms (default 10 min).")
    promote: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        default_factory=list, max_length=64,
        description="Globs of files the command writes that are staged into the transaction.")
    sandbox: bool = Field(False, description="Confine the command further (no network).")
    network: bool = Field(False, description="With sandbox: allow the network.")


class ExecIn(In):
    tid: Tid
    argv: list[Annotated[str, Field(max_length=65536)]] = Field(
        min_length=1, max_length=4096, description="The program and its arguments.")
    timeout_ms: int | None = Field(None, ge=1, le=24 * 3600 * 1000,
                                   description="Kill it after this many ms (default: none).")
    sandbox: bool = Field(False, description="Confine the command further (no network).")
    network: bool = Field(False, description="With sandbox: allow the network.")
    keep_on_failure: bool = Field(False, description=(
        "Stage what the command changed even when it fails (still answered as a failure)."))


class OverlayExecIn(In):
    tid: Tid
    command: str | list[Annotated[str, Field(max_length=65536)]] = Field(description=(
        "A shell command line (run by /bin/sh -c), or a list: the program and its arguments."))
    timeout_ms: int | None = Field(None, ge=1, le=24 * 3600 * 1000,
                                   description="Kill it after this many ms (default 10 min).")
    sandbox: bool = Field(False, description="Confine the command further (no network).")
    network: bool = Field(False, description="With sandbox: allow the network.")


# -- inputs: the effect fence ------------------------------------------------------------------


class ReadAt(In):
    domain: str = Field(min_length=1, max_length=NAME_CHARS_MAX)
    seq: int = Field(ge=0)


class FencePrepareIn(In):
    intent: str = Field(min_length=1, max_length=NAME_CHARS_MAX, description=(
        "The logical action's name, e.g. an idempotency key (\"invoice-42\")."))
    domain: str = Field("default", min_length=1, max_length=NAME_CHARS_MAX,
                        description="What the effect changes (an account, a mailbox).")
    tool: str = Field("", max_length=NAME_CHARS_MAX, description="The tool's name.")
    args: JsonValue = Field(default_factory=dict, description="The effect's arguments (JSON).")
    agent: str | None = Field(None, max_length=NAME_CHARS_MAX,
                              description="Who asks (default: $AGENT2PC_AGENT).")
    read_set: list[ReadAt] = Field(default_factory=list, max_length=256, description=(
        "Domain positions the decision relied on: [{domain, seq}]."))
    parent: str | None = Field(None, max_length=NAME_CHARS_MAX,
                               description="A done intent this effect follows.")
    known_clock: dict[str, int] | None = Field(None, description="A vector clock seen before.")
    takeover: bool = Field(False, description=(
        "Take over an expired lease or an unknown outcome: only for an effect that is safe to "
        "repeat (the effect may already have happened once)."))


class TicketIn(In):
    ticket: TicketArg


class FenceCommitIn(In):
    ticket: TicketArg
    result: JsonValue = Field(None, description="What the effect produced (JSON).")


class FenceAbortIn(In):
    ticket: TicketArg
    reason: str = Field("", max_length=2000)
    outcome: Literal["failed", "unknown"] = Field("failed", description=(
        "failed: it definitely did not happen (frees the intent); unknown: it may have "
        "happened (fences the intent until reconciled)."))


class FenceReconcileIn(In):
    intent: str = Field(min_length=1, max_length=NAME_CHARS_MAX)
    action: Literal["clear", "done"] = Field(description=(
        "clear: it did not happen (frees the intent); done: it happened, with result."))
    result: JsonValue = Field(None, description="With done: the result that happened.")
    reason: str = Field("", max_length=2000)


class FenceStatusIn(In):
    intent: str | None = Field(None, min_length=1, max_length=NAME_CHARS_MAX,
                               description="Show this intent only.")
    limit: int | None = Field(None, ge=1, le=LIMIT_MAX,
                              description="Intents listed per state (default 100).")


class HookCheckIn(In):
    missing_ok: bool = Field(False, description=(
        "Pass (workspace: null) when there is no agent-2pc workspace, instead of the "
        "not_initialized error."))


class CommitIn(In):
    tid: Tid
    no_merge: bool = Field(False, description=(
        "A file someone else changed since you staged it is a conflict. Default (false): "
        "when your edit and theirs touch different lines, they are merged, your checks run "
        "again on the merged content, and the file is listed in merged."))


class GitCommitIn(In):
    tid: Tid
    message: str = Field(min_length=1, max_length=1 << 20, description=(
        "The git commit message (its first line is the subject)."))
    author: str | None = Field(None, max_length=1024, description=(
        "The commit's author as \"Name <email>\"; default: git's user.name and user.email."))
    branch: str | None = Field(None, max_length=1024, description=(
        "The branch to commit onto; default: the branch HEAD is on."))
    no_verify: bool = Field(False, description=(
        "Skip the repository's pre-commit and commit-msg hooks (git commit --no-verify). Only "
        "when the user asked for it: the hooks are the user's own checks."))
    sign: bool | None = Field(None, description=(
        "GPG-sign the commit; default: the repository's commit.gpgSign setting."))


# -- outputs: transactions ---------------------------------------------------------------------


class BeginOut(Out):
    tid: str


class RecordReadOut(Out):
    path: str
    sha256: str | None = Field(description="null for an absent file")


class WriteOut(Out):
    path: str
    op: Literal["write"]
    bytes: int


class DeleteOut(Out):
    path: str
    op: Literal["delete"]


class ReplaceOut(Out):
    path: str
    op: Literal["replace"]
    replacements: int


class PatchOut(Out):
    files: list[str]


class StageSqlIn(In):
    tid: Tid
    dsn: str = Field(max_length=4096, description=(
        "The database: a postgresql:// URL or libpq conninfo without a password (give it "
        "through PGPASSWORD or ~/.pgpass), or env:NAME, an environment variable holding the "
        "DSN. The server needs max_prepared_transactions > 0."))
    sql: str = Field(max_length=1 << 20, description=(
        "One or more SQL statements (no BEGIN/COMMIT: they run in the transaction's own "
        "database transaction)."))


class SqlOut(Out):
    n: int
    rows_affected: int


class ApiOut(Out):
    n: int
    method: str
    url: str
    idempotency_key: str
    compensate: bool


class DiffFile(Out):
    path: str
    status: Literal["added", "modified", "deleted"]
    additions: int
    deletions: int
    old_bytes: int | None = None
    new_bytes: int | None = None
    kind: Literal["symlink", "directory"] | None = Field(default=None, description=(
        "Set for a symbolic link (diffed as git does: mode 120000, its target as content) or "
        "an empty directory made or removed (no patch text but a '# empty directory' line)."))


class DiffOut(Out):
    files: list[DiffFile]
    diff: str


class NameOut(Out):
    name: str


class TxRow(Out):
    tid: str
    state: Literal["active", "preparing", "prepared", "committing", "committed", "aborting",
                   "aborted"]
    label: str | None = None
    created_at: str | None = None
    ops: int | None = None
    files: list[str | dict[str, Any]] | None = None
    reads: list[dict[str, Any]] | None = None
    savepoints: list[str] | None = None
    effects: list[dict[str, Any]] | None = None
    expires_at: str | None = None
    code: str | None = None
    reason: str | None = None


class HealthOut(Out):
    health: Literal["healthy", "degraded", "unhealthy"]
    reasons: list[dict[str, Any]] = Field(description=(
        "Why it is not healthy: {code, severity, message, tid?}; codes: corrupt_wal, "
        "torn_tail, torn_tail_cut, interrupted_commit, interrupted, stuck, disk_nearly_full, "
        "fenced_intents, fence_unreadable."))
    in_flight: int
    stuck: int


class InFlightRow(Out):
    tid: str
    label: str | None
    state: Literal["active", "preparing", "prepared", "committing", "aborting"]
    age_s: float = Field(description="Seconds since the transaction began.")
    files: list[str] = Field(description="The paths it stages (the first 50).")


class HookCheckOut(Out):
    in_flight: list[InFlightRow] = Field(description="Empty on success.")
    workspace: str | None = Field(description="The workspace checked (null: none, with "
                                              "missing_ok).")


class DaemonStatusOut(Out):
    running: bool = Field(description="Does a daemon serve this workspace?")
    pid: int | None = None
    socket: str | None = Field(None, description="Its socket (.agent-tx/daemon.sock).")
    uptime_s: float | None = None
    clients: int = Field(description="Connections open now.")
    requests: int = Field(description="Requests served since it started.")
    commits: int = Field(description="Commits decided through its group commit.")
    fsyncs: int = Field(description="Log fsyncs those commits took (fewer: batched).")


class StatusOut(Out):
    transactions: list[TxRow]
    health: HealthOut | None = None


class ExportIn(In):
    tid: Tid
    path: str = Field(min_length=1, max_length=4096, description=(
        "The bundle file to write, e.g. \"review.a2pc\" (relative to the server's working "
        "directory, or absolute; replaced atomically if it exists)."))


class ImportIn(In):
    path: str = Field(min_length=1, max_length=4096, description=(
        "The bundle file (.a2pc) to import, made by agent_2pc_export or `agent-2pc export`."))
    label: str | None = Field(None, max_length=NAME_CHARS_MAX, description=(
        "A label for the new transaction; default: the bundle's."))


class ExportOut(Out):
    tid: str
    path: str = Field(description="The absolute path of the bundle written.")
    bytes: int
    sha256: str = Field(description="The sha256 of the bundle file.")


class BundleCheck(Out):
    command: str | list[str]
    passed: bool
    exit_code: int | None = None
    current: bool = Field(description="The run saw the content the bundle carries (false: "
                                      "earlier staged content).")


class ImportOut(Out):
    tid: str = Field(description="The new transaction of this workspace (active).")
    files: list[str]
    again: bool = Field(description="True when this bundle was imported before and that "
                                    "transaction is still live: it is answered again.")
    origin: dict[str, Any] = Field(description="{tid, bundle, workspace, created_at}: where "
                                               "the transaction came from.")
    checks: list[BundleCheck] = Field(description="The exporter's checks and how they came "
                                                  "out: a report, not run or trusted here.")


class CommitOut(Out):
    tid: str
    state: Literal["committed"]
    files: list[str]
    diverged: list[str] | None = None
    merged: list[str] = Field(default_factory=list, description=(
        "Files someone else changed since they were staged, whose edits did not overlap "
        "yours: committed with both edits merged."))
    effects: list[dict[str, Any]] | None = None
    uncompensated: list[int] | None = None
    commit: str | None = Field(None, description="The git commit made with it (git-commit).")
    branch: str | None = Field(None, description="The branch that commit is on (git-commit).")


class GitCommitOut(CommitOut):
    commit: str = Field(description="The id of the git commit holding exactly its changes.")
    branch: str = Field(description="The branch now at that commit.")
    hooks: list[dict[str, Any]] | None = Field(None, description=(
        "The git hooks that ran ({hook, exit_code}), in order."))
    git_ignored: list[str] | None = Field(None, description=(
        "New files that git ignores: written to the tree, left out of the commit."))


class AbortOut(Out):
    tid: str
    state: Literal["aborted"]
    effects: list[dict[str, Any]] | None = None
    uncompensated: list[int] | None = None


class UndoOut(CommitOut):
    undoes: str = Field(description="The transaction this new one takes back.")


class LogIn(In):
    limit: int | None = Field(None, ge=1, le=1_000_000, description=(
        "Only the N newest entries (default: all)."))
    verify: bool = Field(False, description=(
        "Check the whole SHA-256 chain of the history instead of listing it."))


class LogOut(Out):
    entries: list[dict[str, Any]] | None = Field(None, description=(
        "Finished transactions, newest first: {tid, label, state, at, created_at, files, "
        "checks, code, reason, undoes, undone_by, hash, prev}."))
    verified: int | None = Field(None, description="With verify: chained lines checked.")
    unchained: int | None = Field(None, description=(
        "With verify: lines an earlier version wrote without hashes (covered by the first "
        "chained line's prev)."))


class CompactOut(Out):
    before_bytes: int
    after_bytes: int
    blobs_collected: int | None = None
    preimages_collected: int | None = None


class RunOut(Out):
    """What a run in the staged view gives (isolation.RunResult.to_json)."""

    isolation: str
    exit_code: int | None
    passed: bool
    timed_out: bool | None = None
    duration_ms: int | float | None = None
    setup_ms: int | float | None = None
    log: str | None = None
    tail: str | None = None


class StageCmdOut(RunOut):
    promoted: list[str] | None = None


class ExecOut(RunOut):
    captured: list[dict[str, Any]]
    skipped: list[dict[str, Any]] | None = None


class OverlayExecOut(RunOut):
    pass


class NoopOut(Out):
    pass


# -- outputs: the effect fence -----------------------------------------------------------------


class Ticket(Out):
    intent: str
    generation: int
    token: int
    lease_id: str
    fingerprint: str


class Certificate(Out):
    intent: str
    parent: str | None
    domain: str
    seq: int
    tool: str
    args: JsonValue
    result: JsonValue
    vector_clock: dict[str, int]
    read_set: list[dict[str, Any]]
    agent: str
    hash: str
    signature: str | None = None


class FreshOut(Out):
    status: Literal["fresh"]
    ticket: Ticket
    lease_expires_at: float
    takeover: bool
    previous: str | None


class AlreadyDoneOut(Out):
    status: Literal["already_done"]
    cert: Certificate


class CertOut(Out):
    cert: Certificate


class FenceAbortOut(Out):
    intent: str
    state: Literal["failed", "fenced", "done"]
    changed: bool


class HeartbeatOut(Out):
    intent: str | None
    lease_expires_at: float


class ReconcileOut(Out):
    intent: str
    state: Literal["done", "failed"]
    cert: Certificate | None = None


class LedgerOut(Out):
    store: str
    clock: str
    lease_ttl: float
    result_ttl: float
    states: dict[str, int]
    domains: int
    fenced: list[str]
    running: list[str]
    counters: dict[str, Any]


class IntentOut(Out):
    intent: str
    state: str
