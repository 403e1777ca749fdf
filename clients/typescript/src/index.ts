// agent-2pc for Node: transactions (2PC, write-ahead log, staged view) for coding agents.
export { Agent2PC, Transaction } from "./client.js";
export type {
  Agent2PCOptions, BeginOptions, CommandOptions, ExecOptions,
} from "./client.js";
export { CliTransport } from "./cli-transport.js";
export type { CliTransportOptions } from "./cli-transport.js";
export { DaemonTransport, findRoot } from "./daemon-transport.js";
export type { DaemonTransportOptions } from "./daemon-transport.js";
export type { Answer, Env, Operation, Params, ParamValue, Transport } from "./transport.js";
export {
  Agent2PCError, CheckFailed, errorFromAnswer, FenceRefusal, InputError, Refusal,
  TransactionAborted, TransportError, UnknownOutcome, WorkspaceError,
} from "./errors.js";
export type { ErrorCode, ErrorInit, ExitCode } from "./errors.js";
export type * from "./results.js";
