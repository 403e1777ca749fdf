// How a client reaches agent-2pc. The client speaks in operations of the Python library
// (coordinator/client.py) with the library's parameter names (`tid`, `path`, `timeout_ms`, ...,
// also the MCP tools' argument names); a transport carries one to agent-2pc and brings back
// the answer.
//
// Transports:
//   - CliTransport (cli-transport.ts): runs the `agent-2pc` CLI with --json, one process a step.
//   - DaemonTransport (daemon-transport.ts): JSON-RPC on the daemon's Unix socket
//     (.agent-tx/daemon.sock, docs/daemon.md); the CLI for what the daemon does not serve and
//     while no daemon answers. Agent2PC's default.

/** The operations a transport serves: the library's method names. */
export type Operation =
  | "init" | "begin" | "status" | "transactions" | "recover" | "compact"
  | "record_read" | "stage_write" | "stage_delete" | "stage_replace" | "stage_patch"
  | "stage_cmd" | "exec" | "savepoint" | "rollback_to" | "diff" | "commit" | "abort";

/** Parameter values: strings, numbers, flags, lists (repeatable options), string maps
 * (`env`, `limits`) and file content (bytes). `undefined` means "not given". */
export type ParamValue =
  | string | number | boolean | string[] | Uint8Array | Record<string, string | number>
  | undefined;
export type Params = Record<string, ParamValue>;

/** An environment for the CLI (variables to values), as process.env. */
export type Env = Record<string, string | undefined>;

/** The success answer of a step: the CLI's --json object without `ok`. */
export type Answer = Record<string, unknown>;

export interface Transport {
  /** Run one operation. Resolves with the answer; rejects with an Agent2PCError (a subclass
   * that says what the caller may conclude, with the contract's `code` and `exitCode`). */
  call(op: Operation, params: Params): Promise<Answer>;
  /** Release what the transport holds (a connection); the CLI transport holds nothing. */
  close?(): Promise<void>;
}
