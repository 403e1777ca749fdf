// The client: Agent2PC (a workspace) and Transaction (one transaction), the Python library's
// API (coordinator/client.py, docs/library.md) in TypeScript's spelling. Every step resolves
// with the object the CLI prints with --json, without `ok`, and rejects with the typed errors
// of errors.ts.
//
//   const client = new Agent2PC();                    // or new Agent2PC({ root })
//   const session = await client.begin({ timeoutMs: 30000 });
//   await session.stageWrite("src/routes.ts", "// Route Handlers");
//   await session.stageCommand("npm run test");
//   await session.commit();                           // rejects with TransactionAborted on a no

import { CliTransport } from "./cli-transport.js";
import { DaemonTransport } from "./daemon-transport.js";
import type {
  AbortResult, CheckResult, CommitResult, CompactResult, DeleteResult, DiffResult, ExecResult,
  PatchResult, ReadResult, RecoverResult, ReplaceResult, SavepointResult, StatusResult,
  TransactionRow, TransactionState, WriteResult,
} from "./results.js";
import type { Answer, Env, Operation, Params, Transport } from "./transport.js";

export interface Agent2PCOptions {
  /** The workspace at or above this directory (default: $AGENT2PC_ROOT, else the working
   * directory's). */
  root?: string;
  /** The agent-2pc executable for the CLI transport (default: $AGENT2PC_BIN, else
   * `agent-2pc` on the PATH). */
  bin?: string;
  /** The CLI's environment (default: this process's). */
  env?: Env;
  /** Use the workspace's daemon when one serves it (default true; false, or
   * AGENT2PC_NO_DAEMON=1 in `env`: never, and the CLI is told the same). */
  daemon?: boolean;
  /** Another way to reach agent-2pc (default: a DaemonTransport that falls back to a
   * CliTransport, or the CliTransport alone with `daemon: false`). */
  transport?: Transport;
}

export interface BeginOptions {
  /** Past this many milliseconds the transaction is aborted (`timeout`); 0: none. */
  timeoutMs?: number;
  /** A note shown by status and list. */
  label?: string;
}

export interface CommandOptions {
  /** Kill it after this many milliseconds (default 10 min). */
  timeoutMs?: number;
  /** Stage the files it writes that match these globs. */
  promote?: string[];
  /** Run it in this directory of the staged view (default: the root). */
  workingDir?: string;
  /** Variables added to its environment (recorded with the check). */
  env?: Record<string, string>;
  /** Confine it: host read-only, private /tmp, no network (`network: true` allows it). */
  sandbox?: boolean;
  network?: boolean;
  /** Run it under limits (the CLI's stage-governed): max_runtime_ms, max_cpu_ms, max_procs,
   * max_memory_mb, max_files_written, max_forks_per_s, max_deletes_per_s, max_disk_mb. */
  limits?: Record<string, number>;
}

export interface ExecOptions {
  timeoutMs?: number;
  /** Stage what it changed even when it fails (it still rejects). */
  keepOnFailure?: boolean;
  sandbox?: boolean;
  network?: boolean;
}

export class Agent2PC {
  readonly transport: Transport;
  readonly root: string | undefined;

  constructor(options: Agent2PCOptions = {}) {
    this.root = options.root;
    this.transport = options.transport ?? defaultTransport(options);
  }

  /** Create the workspace at `root` (idempotent) and open it. */
  static async init(root = ".", options: Omit<Agent2PCOptions, "root"> = {}): Promise<Agent2PC> {
    const client = new Agent2PC({ ...options, root });
    await client.call("init", {});
    return client;
  }

  /** Start a transaction. */
  async begin(options: BeginOptions = {}): Promise<Transaction> {
    const answer = await this.call("begin", {
      timeout_ms: options.timeoutMs, label: options.label,
    });
    return new Transaction(this, answer.tid as string);
  }

  /** A handle on an existing transaction; each step checks the tid (`unknown_tid`). */
  get(tid: string): Transaction {
    return new Transaction(this, tid);
  }

  /** Run `body` in a transaction: commit when it resolves, abort when it throws (and rethrow).
   * The Python library's `with client.transaction() as tx`. A commit that is refused rejects
   * with TransactionAborted. */
  async transaction<T>(body: (tx: Transaction) => Promise<T>, options: BeginOptions = {}
  ): Promise<T> {
    const tx = await this.begin(options);
    let value: T;
    try {
      value = await body(tx);
    } catch (err) {
      const reason = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
      try {
        if (await tx.state() === "active") await tx.abort(reason.slice(0, 500));
      } catch {
        // The body's error is the one to see; a transaction left active times out.
      }
      throw err;
    }
    if (await tx.state() === "active") await tx.commit();
    return value;
  }

  /** Live transactions, or one (`tid`). */
  async status(tid?: string): Promise<StatusResult> {
    return await this.call("status", { tid }) as StatusResult;
  }

  /** All transactions, finished ones included (`state` filters). */
  async transactions(state?: TransactionState): Promise<TransactionRow[]> {
    const answer = await this.call("transactions", { state });
    return answer.transactions as TransactionRow[];
  }

  async recover(): Promise<RecoverResult> {
    return await this.call("recover", {}) as RecoverResult;
  }

  async compact(): Promise<CompactResult> {
    return await this.call("compact", {}) as CompactResult;
  }

  /** Release the transport (a daemon connection; nothing for the CLI). */
  async close(): Promise<void> {
    await this.transport.close?.();
  }

  /** One operation of the library through the transport (for what this class lacks). */
  call(op: Operation, params: Params): Promise<Answer> {
    return this.transport.call(op, params);
  }
}

/** The daemon's socket when one accepts a connection, else the CLI (docs/daemon.md). */
function defaultTransport(options: Agent2PCOptions): Transport {
  const env = options.env ?? process.env;
  const daemon = options.daemon !== false && env.AGENT2PC_NO_DAEMON !== "1";
  const cli = new CliTransport({
    root: options.root, bin: options.bin,
    env: daemon ? env : { ...env, AGENT2PC_NO_DAEMON: "1" },
  });
  return daemon ? new DaemonTransport({ root: options.root, env, fallback: cli }) : cli;
}

export class Transaction {
  readonly client: Agent2PC;
  readonly tid: string;

  constructor(client: Agent2PC, tid: string) {
    this.client = client;
    this.tid = tid;
  }

  private step(op: Operation, params: Params = {}): Promise<Answer> {
    return this.client.call(op, { tid: this.tid, ...params });
  }

  /** The transaction's row of `status --tid`. */
  async status(): Promise<TransactionRow> {
    const answer = await this.step("status");
    return (answer.transactions as TransactionRow[])[0] as TransactionRow;
  }

  /** The state's name: active, preparing, prepared, committing, committed, aborting, aborted. */
  async state(): Promise<TransactionState> {
    return (await this.status()).state;
  }

  /** Remember `path`'s content hash (null: absent); commit aborts with `conflict` if it
   * changes meanwhile. */
  async recordRead(path: string): Promise<string | null> {
    return (await this.recordReadResult(path)).sha256;
  }

  /** recordRead, answering `{path, sha256}` as the CLI's record-read. */
  async recordReadResult(path: string): Promise<ReadResult> {
    return await this.step("record_read", { path }) as ReadResult;
  }

  /** Stage `content` (text, written as UTF-8, or bytes) at `path`; `mode`: permission bits
   * (0o644, 0o755; default: an existing file keeps its own, a new one gets 0o644). */
  async stageWrite(path: string, content: string | Uint8Array, options: { mode?: number } = {}
  ): Promise<WriteResult> {
    return await this.step("stage_write", { path, content, mode: options.mode }) as WriteResult;
  }

  async stageDelete(path: string): Promise<DeleteResult> {
    return await this.step("stage_delete", { path }) as DeleteResult;
  }

  /** Replace `old` by `new` in the staged `path`: exactly one occurrence (`no_match`,
   * `ambiguous_match`) unless `all`. */
  async stageReplace(path: string, old: string, replacement: string,
    options: { all?: boolean } = {}): Promise<ReplaceResult> {
    return await this.step("stage_replace", {
      path, old, new: replacement, all: options.all,
    }) as ReplaceResult;
  }

  /** Apply a unified diff (git or plain, one or many files) to the staged view. */
  async stagePatch(patch: string | Uint8Array): Promise<PatchResult> {
    return await this.step("stage_patch", { patch }) as PatchResult;
  }

  /** Run a check (with /bin/sh -c) in the staged view and record it: commit runs it again if
   * the staged content changed and aborts with `verification_failed` if its latest run
   * failed. A failing run rejects with CheckFailed; the transaction stays active. */
  async stageCommand(command: string, options: CommandOptions = {}): Promise<CheckResult> {
    return await this.step("stage_cmd", {
      command, timeout_ms: options.timeoutMs, promote: options.promote,
      working_dir: options.workingDir, env: options.env, sandbox: options.sandbox,
      network: options.network, limits: options.limits,
    }) as CheckResult;
  }

  /** stageCommand under the Python library's name. */
  stageCmd(command: string, options: CommandOptions = {}): Promise<CheckResult> {
    return this.stageCommand(command, options);
  }

  /** Run a command (no shell) in the staged view and stage what it created, changed and
   * deleted. A failing command stages nothing and rejects with CheckFailed
   * (`command_failed`, or `timeout`). */
  async exec(argv: string[], options: ExecOptions = {}): Promise<ExecResult> {
    return await this.step("exec", {
      timeout_ms: options.timeoutMs, keep_on_failure: options.keepOnFailure,
      sandbox: options.sandbox, network: options.network, argv,
    }) as ExecResult;
  }

  async savepoint(name: string): Promise<SavepointResult> {
    return await this.step("savepoint", { name }) as SavepointResult;
  }

  /** Undo the steps staged since the savepoint `name` (`unknown_savepoint`). */
  async rollbackTo(name: string): Promise<SavepointResult> {
    return await this.step("rollback_to", { name }) as SavepointResult;
  }

  /** The staged changes: per file and as a unified diff (`stat`: the files only). */
  async diff(options: { stat?: boolean } = {}): Promise<DiffResult> {
    return await this.step("diff", { stat: options.stat }) as DiffResult;
  }

  /** Prepare and commit, all or nothing. Rejects with TransactionAborted (`code`: conflict,
   * verification_failed, timeout, ...) when the answer is no; then nothing was applied. */
  async commit(): Promise<CommitResult> {
    return await this.step("commit") as CommitResult;
  }

  async abort(reason?: string): Promise<AbortResult> {
    return await this.step("abort", { reason }) as AbortResult;
  }
}
