// The transport that needs nothing running: each step runs the `agent-2pc` CLI with --json
// (spawned directly, never through a shell) and reads the one JSON object it prints.
//
// The binary: the `bin` option, else $AGENT2PC_BIN, else `agent-2pc` on the PATH.
// The workspace: with `root`, the CLI runs in that directory with $AGENT2PC_ROOT removed, so
// that it opens the workspace at or above `root` (as the Python library's Agent2PC(root));
// without, it inherits this process's working directory and environment.

import { spawn } from "node:child_process";
import { stat } from "node:fs/promises";
import { resolve } from "node:path";

import { errorFromAnswer, InputError, TransportError, WorkspaceError } from "./errors.js";
import type { Answer, Env, Operation, Params, ParamValue, Transport } from "./transport.js";

export interface CliTransportOptions {
  /** The agent-2pc executable (default: $AGENT2PC_BIN, else `agent-2pc` on the PATH). */
  bin?: string | undefined;
  /** The workspace: the one at or above this directory. */
  root?: string | undefined;
  /** The environment of the CLI (default: this process's). */
  env?: Env | undefined;
}

/** The library's operation -> the CLI command, where the names differ. */
const COMMANDS: Partial<Record<Operation, string>> = { transactions: "list" };
/** Parameters that travel on standard input (`--stdin`): file content and patches have any
 * size and any bytes, which an argument cannot carry. */
const STDIN_PARAMS = new Set(["content", "patch"]);

export class CliTransport implements Transport {
  readonly bin: string;
  readonly root: string | undefined;
  private readonly env: Env;

  constructor(options: CliTransportOptions = {}) {
    const env = options.env ?? process.env;
    this.bin = options.bin ?? (env.AGENT2PC_BIN || "agent-2pc");
    this.root = options.root === undefined ? undefined : resolve(options.root);
    this.env = { ...env };
    if (this.root !== undefined) delete this.env.AGENT2PC_ROOT;
  }

  async call(op: Operation, params: Params): Promise<Answer> {
    const { argv, input } = toArgv(op, params);
    let cwd: string | undefined;
    if (this.root !== undefined) {
      if (op === "init") argv.push(`--root=${this.root}`);
      else cwd = await this.rootDir();
    }
    const run = await this.spawn(argv, input, cwd);
    return answerOf(run, argv);
  }

  private async rootDir(): Promise<string> {
    const root = this.root as string;
    const info = await stat(root).catch(() => undefined);
    if (!info?.isDirectory()) {
      throw new WorkspaceError({
        code: "not_initialized", exitCode: 2,
        message: `no agent-2pc workspace at or above ${root}: no such directory`,
      });
    }
    return root;
  }

  private spawn(argv: string[], input: Uint8Array | undefined, cwd: string | undefined
  ): Promise<Run> {
    return new Promise((done, fail) => {
      if (argv.some((a) => a.includes("\0"))) {
        // A process argument cannot hold NUL; the CLI would refuse such a value too.
        fail(new InputError({ code: "usage", exitCode: 2,
          message: "an argument holds a NUL character, which no command line can carry" }));
        return;
      }
      const child = spawn(this.bin, argv, {
        cwd, env: this.env, shell: false, windowsHide: true,
        stdio: [input === undefined ? "ignore" : "pipe", "pipe", "pipe"],
      });
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      child.stdout?.on("data", (b: Buffer) => out.push(b));
      child.stderr?.on("data", (b: Buffer) => err.push(b));
      child.on("error", (e: NodeJS.ErrnoException) => {
        const why = e.code === "ENOENT"
          ? `the agent-2pc CLI was not found (${this.bin}): give the \`bin\` option, set ` +
            "AGENT2PC_BIN, or put agent-2pc on the PATH"
          : `could not run ${this.bin}: ${e.message}`;
        fail(new TransportError({ code: "transport_error", exitCode: 2, message: why }));
      });
      child.on("close", (status, signal) => done({
        status, signal, stdout: Buffer.concat(out).toString("utf8"),
        stderr: Buffer.concat(err).toString("utf8"),
      }));
      if (input !== undefined && child.stdin) {
        child.stdin.on("error", () => undefined); // a CLI that exits early: its answer says why
        child.stdin.end(input);
      }
    });
  }
}

interface Run {
  status: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

function answerOf(run: Run, argv: string[]): Answer {
  let answer: unknown;
  try {
    answer = JSON.parse(run.stdout);
  } catch {
    answer = undefined;
  }
  if (answer === null || typeof answer !== "object" || Array.isArray(answer)) {
    const how = run.signal ? `was killed by ${run.signal}` : `exited with status ${run.status}`;
    const tail = run.stderr.trim().split("\n").slice(-5).join("\n");
    throw new TransportError({
      code: "transport_error", exitCode: 2,
      message: `agent-2pc ${argv[0]} ${how} without a JSON answer` + (tail ? `: ${tail}` : ""),
      details: { status: run.status, signal: run.signal, stderr: run.stderr },
    });
  }
  const obj = answer as Record<string, unknown>;
  if (obj.ok === true && run.status === 0) {
    const { ok: _ok, ...rest } = obj;
    return rest;
  }
  throw errorFromAnswer(obj, run.status ?? undefined);
}

/** The CLI's argument list for an operation: `COMMAND --json --name=value ...`, the options
 * named as the parameters with dashes. `--name=value` keeps a value that starts with a dash
 * a value. */
export function toArgv(op: Operation, params: Params): { argv: string[]; input?: Uint8Array } {
  for (const [name, value] of Object.entries(params)) checkText(name, value);
  let command = COMMANDS[op] ?? op.replaceAll("_", "-");
  const argv: string[] = [];
  let input: Uint8Array | undefined;
  let rest: string[] | undefined;
  for (const [name, value] of Object.entries(params)) {
    if (value === undefined || value === null) continue;
    if (STDIN_PARAMS.has(name)) {
      input = typeof value === "string" ? Buffer.from(value, "utf8") : (value as Uint8Array);
      argv.push("--stdin");
    } else if (name === "argv") {
      rest = value as string[]; // exec's command line, after "--"
    } else if (name === "limits") {
      command = "stage-governed"; // a check under limits: --max-runtime-ms=N ...
      for (const [limit, n] of Object.entries(value as Record<string, number>)) {
        argv.push(option(limit, n));
      }
    } else if (name === "mode") {
      argv.push(option(name, (value as number).toString(8).padStart(4, "0")));
    } else {
      argv.push(...options(name, value));
    }
  }
  argv.unshift(command, "--json");
  if (rest !== undefined) argv.push("--", ...rest);
  return input === undefined ? { argv } : { argv, input };
}

/** The checks the CLI's command line makes of parameters, for a transport that has none (the
 * daemon's): text is Unicode (no lone surrogate) and what would be an argument holds no NUL. */
export function checkParams(params: Params): void {
  for (const [name, value] of Object.entries(params)) {
    checkText(name, value);
    if (STDIN_PARAMS.has(name)) continue;
    const texts = typeof value === "string" ? [value] : Array.isArray(value) ? value : [];
    if (texts.some((text) => text.includes("\0"))) {
      throw new InputError({ code: "usage", exitCode: 2,
        message: "an argument holds a NUL character, which no command line can carry" });
    }
  }
}

/** Text goes to agent-2pc as UTF-8, which a lone surrogate ("\uD800") is not: refused, as the
 * Python library refuses it, rather than silently sent as U+FFFD. */
function checkText(name: string, value: ParamValue): void {
  const texts = typeof value === "string" ? [value]
    : Array.isArray(value) ? value
    : value && typeof value === "object" && !(value instanceof Uint8Array)
      ? Object.entries(value).flat().map(String) : [];
  for (const text of texts) {
    const at = text.search(/\p{Cs}/u);
    if (at >= 0) {
      throw new InputError({
        code: "usage", exitCode: 2,
        message: `\`${name}\` is not Unicode text (a lone surrogate at ${at})` +
          (name === "content" || name === "patch" ? "; pass bytes" : ""),
      });
    }
  }
}

function option(name: string, value: string | number): string {
  return `--${name.replaceAll("_", "-")}=${value}`;
}

function options(name: string, value: ParamValue): string[] {
  if (typeof value === "boolean") return value ? [`--${name.replaceAll("_", "-")}`] : [];
  if (Array.isArray(value)) return value.map((v) => option(name, v));
  if (typeof value === "object") { // env: NAME=VALUE, repeated
    return Object.entries(value as Record<string, string>).map(([k, v]) => option(name, `${k}=${v}`));
  }
  return [option(name, value as string | number)];
}
