// Test fixtures: a real workspace (a git repository with agent-2pc init) in a temp directory,
// driven through the real CLI: $AGENT2PC_BIN, else the repository's .venv/bin/agent-2pc.
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync }
  from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const packageDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const repoDir = resolve(packageDir, "../..");

/** The agent-2pc executable the tests drive. */
export function cliBin() {
  const bin = process.env.AGENT2PC_BIN || join(repoDir, ".venv/bin/agent-2pc");
  if (!existsSync(bin)) {
    throw new Error(`no agent-2pc CLI at ${bin}: make the repository's .venv ` +
      "(python3 -m venv .venv && .venv/bin/pip install -e .) or set AGENT2PC_BIN");
  }
  return bin;
}

/** A fresh workspace holding `files` ({path: content}); removed after the test `t`. With
 * `daemon`, a daemon serves it (`agent-2pc daemon start`), stopped after the test, which
 * fails if the daemon answered no request but its own status. */
export function workspace(t, files = {}, { daemon = false, stopDaemon = false } = {}) {
  const dir = realpathSync(mkdtempSync(join(tmpdir(), "a2pc-ts-")));
  t.after(() => {
    try {
      if (stopDaemon) cli(dir, "daemon", "stop"); // one the test started, if still running
      if (daemon) {
        const status = daemonStatus(dir);
        cli(dir, "daemon", "stop");
        if (!(status.requests > 1)) throw new Error("the daemon served no request");
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  execFileSync("git", ["init", "-q", dir]);
  for (const [path, content] of Object.entries(files)) put(dir, path, content);
  execFileSync(cliBin(), ["init", "--root", dir], { stdio: "ignore" });
  if (daemon) cli(dir, "daemon", "start");
  return dir;
}

/** `agent-2pc --root DIR ARGS... --json`'s answer, with no daemon in the way. */
export function cli(dir, ...args) {
  const env = { ...process.env, AGENT2PC_NO_DAEMON: "1" };
  delete env.AGENT2PC_ROOT;
  const out = execFileSync(cliBin(), ["--root", dir, ...args, "--json"],
    { encoding: "utf8", env });
  return JSON.parse(out);
}

/** `agent-2pc daemon status --json`: {running, pid, requests, ...}. */
export function daemonStatus(dir) {
  return cli(dir, "daemon", "status");
}

export function put(dir, path, content) {
  mkdirSync(dirname(join(dir, path)), { recursive: true });
  writeFileSync(join(dir, path), content);
}

/** A file's content in the real tree, or null when absent. */
export function read(dir, path) {
  return existsSync(join(dir, path)) ? readFileSync(join(dir, path), "utf8") : null;
}

/** The files of the tree outside .git and .agent-tx, with their content. */
export function snapshot(dir) {
  const out = execFileSync("git", ["-C", dir, "ls-files", "-co", "--exclude-standard"],
    { encoding: "utf8" });
  const files = {};
  for (const path of out.split("\n").filter(Boolean).sort()) files[path] = read(dir, path);
  return files;
}
