// The transport through the daemon (docs/daemon.md): JSON-RPC 2.0, one JSON object a line, on
// the Unix socket <root>/.agent-tx/daemon.sock. One connection; calls go one at a time, so
// requests are answered in order.
//
// What the daemon does not serve (init, stage_cmd, exec) goes to the fallback transport (the
// CLI), as does everything while no daemon answers: each call first makes sure it has a live
// connection (a daemon stopped or restarted between two calls: reconnect, else the fallback).
// A daemon that dies while a request is on the wire rejects that call with `daemon_unavailable`
// (exit 2): how far the request went is unknown; the next call, through the CLI, finds the
// transaction finished or undone by the engine's recovery.
//
// Answers and errors are those of the CLI transport: the same objects (the CLI's --json
// without `ok`), the same typed errors with the same code, exit status and message.

import { closeSync, openSync, statSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { dirname, join, resolve } from "node:path";

import { checkParams } from "./cli-transport.js";
import { errorFromAnswer, WorkspaceError } from "./errors.js";
import type { Answer, Env, Operation, Params, Transport } from "./transport.js";

/** The operations the daemon serves (its method has the operation's name). */
const DAEMON_OPS = new Set<Operation>([
  "begin", "status", "transactions", "recover", "compact", "record_read", "stage_write",
  "stage_delete", "stage_replace", "stage_patch", "savepoint", "rollback_to", "diff", "commit",
  "abort",
]);
/** Content parameters: text as is, bytes as `<name>_b64`. */
const BYTES_PARAMS = new Set(["content", "patch", "old", "new"]);
/** The longest path a Unix socket address holds (sun_path, with its NUL). */
const SUN_PATH_MAX = 107;
/** The protocol version this client speaks (`hello`'s `protocol`). */
const PROTOCOL = 1;

export interface DaemonTransportOptions {
  /** Where calls go when no daemon answers, and the steps the daemon does not serve. */
  fallback: Transport;
  /** The workspace: the one at or above this directory (default: $AGENT2PC_ROOT, else the
   * working directory). */
  root?: string | undefined;
  /** Read for $AGENT2PC_ROOT (default: this process's environment). */
  env?: Env | undefined;
}

/** The workspace root as the CLI finds it: the nearest directory at or above `start` (default
 * $AGENT2PC_ROOT, else the working directory) that holds `.agent-tx/`; undefined if none. */
export function findRoot(start?: string, env: Env = process.env): string | undefined {
  let dir = resolve(start ?? (env.AGENT2PC_ROOT || process.cwd()));
  if (!isDir(dir)) return undefined; // the CLI's answer: not_initialized
  for (;;) {
    if (isDir(join(dir, ".agent-tx"))) return dir;
    const up = dirname(dir);
    if (up === dir) return undefined;
    dir = up;
  }
}

function isDir(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

/** A connection to the daemon serving the workspace `root`, or undefined when none accepts
 * one (no socket, or one a dead daemon left). */
function connectDaemon(root: string): Promise<Socket | undefined> {
  const dir = join(root, ".agent-tx");
  let path = join(dir, "daemon.sock");
  let fd: number | undefined;
  if (Buffer.byteLength(path) > SUN_PATH_MAX) {
    // Too long for an address: reach it through an open descriptor of its directory.
    try {
      fd = openSync(dir, "r");
    } catch {
      return Promise.resolve(undefined);
    }
    path = `/proc/self/fd/${fd}/daemon.sock`;
  }
  return new Promise((done) => {
    const sock = connect({ path });
    const finish = (value: Socket | undefined) => {
      if (fd !== undefined) closeSync(fd);
      fd = undefined;
      done(value);
    };
    sock.once("connect", () => {
      sock.removeAllListeners("error");
      finish(sock);
    });
    sock.once("error", () => {
      sock.destroy();
      finish(undefined);
    });
  });
}

/** One request in flight: its answer line resolves it; the connection's end rejects it. */
interface Pending {
  resolve(line: string): void;
  reject(why: string): void;
}

export class DaemonTransport implements Transport {
  readonly fallback: Transport;
  /** How many calls each way went (the daemon's, the fallback's). */
  readonly calls = { daemon: 0, fallback: 0 };
  private readonly start: string | undefined;
  private readonly env: Env;
  private root: string | undefined;
  private sock: Socket | undefined;
  private buffered = "";
  private pending: Pending | undefined;
  private nextId = 0;
  private queue: Promise<unknown> = Promise.resolve();

  constructor(options: DaemonTransportOptions) {
    this.fallback = options.fallback;
    this.start = options.root === undefined ? undefined : resolve(options.root);
    this.env = options.env ?? process.env;
  }

  /** Whether the last call found a daemon connection (false before the first call). */
  get connected(): boolean {
    return this.sock !== undefined && !this.sock.destroyed;
  }

  call(op: Operation, params: Params): Promise<Answer> {
    // One at a time: a request is sent once the one before it is answered.
    const run = this.queue.then(() => this.callNow(op, params));
    this.queue = run.catch(() => undefined);
    return run;
  }

  async close(): Promise<void> {
    await this.queue;
    this.drop();
    await this.fallback.close?.();
  }

  private async callNow(op: Operation, params: Params): Promise<Answer> {
    const sock = DAEMON_OPS.has(op) ? await this.connection() : undefined;
    if (sock === undefined) {
      this.calls.fallback++;
      return this.fallback.call(op, params);
    }
    checkParams(params);
    this.calls.daemon++;
    const id = ++this.nextId;
    const line = await this.request(sock, id, op, wireParams(params));
    let msg: Record<string, unknown>;
    try {
      msg = JSON.parse(line) as Record<string, unknown>;
    } catch {
      this.drop();
      throw unavailable(op, "the daemon answered a line that is not JSON");
    }
    if (msg.error !== undefined) throw errorOfRpc(op, msg.error as Record<string, unknown>);
    if (msg.id !== id) {
      this.drop();
      throw unavailable(op, `the daemon answered request ${String(msg.id)}, not ${id}`);
    }
    return answerOf(op, msg.result);
  }

  /** The live connection, after a reconnect if the daemon went away; undefined: none. */
  private async connection(): Promise<Socket | undefined> {
    // Let the event loop deliver a hang-up that arrived while idle: such a daemon is gone,
    // and a request written to it would be lost. Two turns: one poll for I/O between them.
    for (let i = 0; i < 2; i++) await new Promise((r) => setImmediate(r));
    if (this.sock !== undefined && (this.sock.destroyed || this.sock.readableEnded)) this.drop();
    if (this.sock !== undefined) return this.sock;
    this.root ??= findRoot(this.start, this.env);
    if (this.root === undefined) return undefined;
    const sock = await connectDaemon(this.root);
    if (sock === undefined) return undefined;
    sock.setEncoding("utf8");
    sock.on("data", (chunk: string) => this.received(chunk));
    const gone = () => {
      if (this.sock === sock) this.sock = undefined;
      sock.destroy();
      const pending = this.pending;
      this.pending = undefined;
      pending?.reject("the connection closed before the answer");
    };
    sock.on("end", gone);
    sock.on("close", gone);
    sock.on("error", gone);
    sock.unref(); // an idle connection does not keep the process alive
    this.sock = sock;
    this.buffered = "";
    // A daemon dying as it accepts leaves a connection that closes unanswered: `hello` first
    // (it changes nothing), so that a step is only sent to a daemon that answers, and one
    // that speaks another protocol is not used.
    let hello: Record<string, unknown> | undefined;
    try {
      const line = await this.request(sock, ++this.nextId, "hello", {});
      hello = (JSON.parse(line) as Record<string, unknown>).result as Record<string, unknown>;
    } catch {
      hello = undefined;
    }
    if (hello?.protocol !== PROTOCOL) {
      this.drop();
      return undefined;
    }
    return sock;
  }

  private request(sock: Socket, id: number, op: string, params: Record<string, unknown>
  ): Promise<string> {
    return new Promise((done, fail) => {
      this.pending = {
        resolve: done,
        reject: (why) => fail(unavailable(op, why)),
      };
      sock.ref(); // waiting for an answer keeps the process alive
      sock.write(JSON.stringify({ jsonrpc: "2.0", id, method: op, params }) + "\n");
    }).finally(() => {
      if (!sock.destroyed) sock.unref();
    }) as Promise<string>;
  }

  private received(chunk: string): void {
    this.buffered += chunk;
    for (;;) {
      const at = this.buffered.indexOf("\n");
      if (at < 0) return;
      const line = this.buffered.slice(0, at);
      this.buffered = this.buffered.slice(at + 1);
      const pending = this.pending;
      this.pending = undefined;
      pending?.resolve(line);
    }
  }

  private drop(): void {
    this.sock?.destroy();
    this.sock = undefined;
    this.buffered = "";
  }
}

function unavailable(op: string, why: string): WorkspaceError {
  return new WorkspaceError({
    code: "daemon_unavailable", exitCode: 2,
    message: `the daemon did not answer ${op} (${why}): it may have died; whether the step ` +
      "happened is unknown until the next call, which finds it finished or undone",
  });
}

/** The library's parameters as the daemon takes them: bytes as base64 (`content_b64`), the
 * unset ones left out. */
function wireParams(params: Params): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(params)) {
    if (value === undefined || value === null) continue;
    if (BYTES_PARAMS.has(name) && value instanceof Uint8Array) {
      out[`${name}_b64`] = Buffer.from(value.buffer, value.byteOffset, value.byteLength)
        .toString("base64");
    } else {
      out[name] = value;
    }
  }
  return out;
}

/** The daemon's result as the CLI's --json answer (without `ok`). */
function answerOf(op: Operation, result: unknown): Answer {
  if (op === "transactions") return { transactions: result }; // the daemon: a bare list
  return (result ?? {}) as Answer;
}

/** A JSON-RPC error as the error the CLI would have answered: the same `{ok: false, error:
 * {code, message, ...details}, tid?, state?, ...}` object (results.failure in Python), the
 * parameters in the message spelled as the CLI's flags, then the same typed error. */
function errorOfRpc(op: Operation, err: Record<string, unknown>): Error {
  const data = err.data as Record<string, unknown> | undefined;
  const rpcMessage = typeof err.message === "string" ? err.message : "the daemon refused";
  if (!data || typeof data.code !== "string") {
    return unavailable(op, `a protocol error: ${rpcMessage}`);
  }
  const details = { ...(data.details as Record<string, unknown> | undefined ?? {}) };
  const answer: Record<string, unknown> = { ok: false };
  if (data.type === "TransactionAborted" || data.type === "CheckFailed") {
    const tid = details.tid;
    delete details.tid;
    if (typeof tid === "string" && tid) {
      answer.tid = tid;
      if (data.type === "TransactionAborted") answer.state = "aborted";
    }
  }
  const result = details.result;
  if (result !== null && typeof result === "object" && !Array.isArray(result)) {
    Object.assign(answer, result);
  }
  delete details.result;
  let message = rpcMessage;
  for (const name of Array.isArray(data.params) ? data.params : []) {
    if (typeof name === "string") {
      message = message.replaceAll(`\`${name}\``, `--${name.replaceAll("_", "-")}`);
    }
  }
  answer.error = { code: data.code, message, ...details };
  const exit = typeof data.exit_status === "number" ? data.exit_status : undefined;
  return errorFromAnswer(answer, exit);
}
