// The error tree of agent-2pc, as typed exceptions (the Python library's agent_2pc.errors).
//
// Every error carries the contract's `code` and the CLI's exit status (`exitCode`), grouped by
// what the caller may conclude:
//
//   Agent2PCError
//   |-- InputError          bad input or usage: nothing was changed           exit 2
//   |-- WorkspaceError      the workspace or host cannot serve the request     exit 2
//   |-- Refusal             a definite no: nothing happened                    exit 1
//   |   |-- TransactionAborted   commit said no (conflict, verification_failed, timeout, ...)
//   |   |-- CheckFailed          a command run in the staged view failed; the tx stays active
//   |   `-- FenceRefusal         the effect fence said no
//   |-- UnknownOutcome      something may have happened                        exit 1
//   `-- TransportError      the client could not reach agent-2pc (no CLI, no JSON answer)

/** The contract's error codes (../shared/design/CONTRACT.md), and those the engine adds.
 * Any other string may come from a newer agent-2pc: the type stays open. */
export type ErrorCode =
  | "usage" | "not_initialized" | "unknown_tid" | "bad_state" | "path_outside_root"
  | "path_forbidden" | "not_found" | "not_a_file" | "no_match" | "ambiguous_match"
  | "unknown_savepoint" | "invalid_patch" | "patch_rejected" | "invalid_manifest"
  | "invalid_bundle"
  | "conflict" | "verification_failed" | "timeout" | "command_failed" | "limit_exceeded"
  | "effect_failed" | "effect_unknown" | "busy" | "in_flight" | "merge_conflict" | "tampered"
  | "intent_in_flight" | "intent_fenced" | "intent_conflict" | "read_set_stale"
  | "domain_race" | "stale_lease" | "unknown_outcome"
  | "corrupt_wal" | "isolation_unavailable" | "apply_incomplete" | "io_error"
  | "untrusted_workspace" | "workspace_read_only" | "daemon_unavailable"
  | "internal" | "transport_error"
  | (string & {});

/** The CLI's exit status: 1 the answer is no, 2 bad input or a workspace that cannot serve. */
export type ExitCode = 1 | 2;

export interface ErrorInit {
  code: ErrorCode;
  exitCode: ExitCode;
  message: string;
  /** The transaction the error is about, when the answer names one. */
  tid?: string | undefined;
  /** Everything else the answer carried: the error's extra fields (`matches`, `path`, `hunk`,
   * ...) and, for a failed check, the run's result (`exit_code`, `passed`, `log`, ...). */
  details?: Record<string, unknown> | undefined;
}

export class Agent2PCError extends Error {
  readonly code: ErrorCode;
  readonly exitCode: ExitCode;
  readonly tid: string | undefined;
  readonly details: Record<string, unknown>;

  constructor(init: ErrorInit) {
    super(init.message);
    this.name = new.target.name;
    this.code = init.code;
    this.exitCode = init.exitCode;
    this.tid = init.tid;
    this.details = init.details ?? {};
  }
}

export class InputError extends Agent2PCError {}
export class WorkspaceError extends Agent2PCError {}
export class Refusal extends Agent2PCError {}

/** The transaction was aborted; `code` says why, `reason` is the readable cause. */
export class TransactionAborted extends Refusal {
  get reason(): string {
    return this.message;
  }
}

/** A command run in the staged view failed (a check, an exec): nothing was staged by it and
 * the transaction stays active. `result` is the run's result (exit_code, passed, log, ...). */
export class CheckFailed extends Refusal {
  get result(): Record<string, unknown> {
    return this.details;
  }
}

export class FenceRefusal extends Refusal {}
export class UnknownOutcome extends Agent2PCError {}

/** The client could not get an answer from agent-2pc: the CLI is missing or could not start,
 * or it ended without the one JSON object it promises (a crash). Not a contract code. */
export class TransportError extends Agent2PCError {}

const WORKSPACE_CODES = new Set([
  "not_initialized", "corrupt_wal", "apply_incomplete", "io_error", "untrusted_workspace",
  "isolation_unavailable", "workspace_read_only", "daemon_unavailable",
]);
const CHECK_CODES = new Set(["verification_failed", "command_failed", "limit_exceeded", "timeout"]);
const FENCE_CODES = new Set([
  "intent_in_flight", "intent_fenced", "intent_conflict", "read_set_stale", "domain_race",
  "stale_lease",
]);

/** The failure `{ok: false, error: {code, message, ...}, ...}` that every face of agent-2pc
 * answers (the CLI's --json, MCP, the daemon), as the typed exception `errors.py` raised. */
export function errorFromAnswer(answer: Record<string, unknown>, exitCode?: number): Agent2PCError {
  const raw = (answer.error ?? {}) as Record<string, unknown>;
  const code = typeof raw.code === "string" ? raw.code : "internal";
  const message = typeof raw.message === "string" ? raw.message : `agent-2pc failed (${code})`;
  const tid = typeof answer.tid === "string" ? answer.tid
    : typeof raw.tid === "string" ? raw.tid : undefined;
  const details: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(answer)) {
    if (k !== "ok" && k !== "error" && k !== "tid") details[k] = v;
  }
  for (const [k, v] of Object.entries(raw)) {
    if (k !== "code" && k !== "message" && k !== "tid") details[k] = v;
  }
  let exit: ExitCode;
  if (exitCode === 1 || exitCode === 2) exit = exitCode;
  else exit = answer.state === "aborted" || CHECK_CODES.has(code) || FENCE_CODES.has(code) ? 1 : 2;
  const init: ErrorInit = { code, exitCode: exit, message, tid, details };
  if (exit === 2) return WORKSPACE_CODES.has(code) ? new WorkspaceError(init) : new InputError(init);
  if (answer.state === "aborted") return new TransactionAborted(init);
  if (code === "unknown_outcome" || code === "effect_unknown") return new UnknownOutcome(init);
  if (FENCE_CODES.has(code)) return new FenceRefusal(init);
  if (CHECK_CODES.has(code)) return new CheckFailed(init);
  return new Refusal(init);
}
