// The daemon transport against a real daemon: it is picked when the socket answers, bypassed on
// demand, gives the CLI's typed errors, and a daemon killed mid-session leaves the client
// working through the CLI on a recovered workspace.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { Agent2PC, CliTransport, DaemonTransport, WorkspaceError } from "agent-2pc";

import { cli, cliBin, daemonStatus, read, workspace } from "./workspace.js";

const open = (root, options = {}) => new Agent2PC({ root, bin: cliBin(), ...options });

/** SIGKILL the workspace's daemon and wait until it no longer runs. */
async function killDaemon(root) {
  const { pid } = daemonStatus(root);
  assert.ok(pid > 0, "a daemon runs");
  process.kill(pid, "SIGKILL");
  for (let i = 0; i < 200 && daemonStatus(root).running; i++) {
    await new Promise((r) => setTimeout(r, 25));
  }
  assert.equal(daemonStatus(root).running, false, "the killed daemon is gone");
}

/** What a typed error says, to compare two ways of getting it. */
const said = (err) => ({
  class: err.constructor.name, code: err.code, exitCode: err.exitCode, message: err.message,
  tid: err.tid, details: err.details,
});
const failure = (promise) => promise.then(() => assert.fail("it succeeded"), (e) => e);

describe("the daemon transport", { concurrency: 2 }, () => {
  it("Agent2PC picks the daemon when its socket answers; daemon: false and AGENT2PC_NO_DAEMON=1 bypass it", async (t) => {
    const root = workspace(t, { "a.txt": "a\n" }, { daemon: true });
    const client = open(root);
    assert.ok(client.transport instanceof DaemonTransport);
    const tx = await client.begin();
    await tx.stageWrite("a.txt", "b\n");
    assert.equal(client.transport.calls.daemon, 2);
    assert.equal(client.transport.calls.fallback, 0);
    assert.ok(client.transport.connected);
    const served = daemonStatus(root).requests;
    for (const other of [open(root, { daemon: false }),
      open(root, { env: { ...process.env, AGENT2PC_NO_DAEMON: "1" } })]) {
      assert.ok(other.transport instanceof CliTransport);
      assert.equal((await other.get(tx.tid).status()).state, "active");
    }
    // Each daemonStatus is one request of its own; the bypassing clients made none.
    assert.equal(daemonStatus(root).requests, served + 1);
    await tx.commit();
    assert.equal(read(root, "a.txt"), "b\n");
    await client.close();
  });

  it("a typed error through the socket is the CLI's: same class, code, exitCode, message, details", async (t) => {
    const root = workspace(t, { "a.txt": "one one\n", "s.txt": "v1\n" }, { daemon: true });
    const viaDaemon = open(root);
    const viaCli = open(root, { daemon: false });
    const tx = await viaDaemon.begin();
    const cases = [
      (c) => c.get("tx-19990101-000000-000000").commit(),
      (c) => c.get(tx.tid).stageWrite("../outside.txt", "x"),
      (c) => c.get(tx.tid).stageReplace("a.txt", "one", "two"),
      (c) => c.get(tx.tid).stageReplace("a.txt", "absent", "two"),
      (c) => c.get(tx.tid).rollbackTo("nope"),
      (c) => c.get(tx.tid).stagePatch("not a patch\n"),
      (c) => c.get(tx.tid).stageDelete("missing.txt"),
    ];
    for (const step of cases) {
      const a = await failure(step(viaDaemon));
      const b = await failure(step(viaCli));
      assert.deepEqual(said(a), said(b), `${step}`);
    }
    assert.ok(viaDaemon.transport.calls.daemon >= cases.length + 1);
    assert.equal(viaDaemon.transport.calls.fallback, 0);
    // A refused commit (a conflict): the same TransactionAborted both ways.
    const conflicted = [];
    for (const [i, c] of [viaDaemon, viaCli].entries()) {
      const t2 = await c.begin();
      await t2.recordRead("s.txt");
      await t2.stageWrite("s.txt", "mine\n");
      writeFileSync(`${root}/s.txt`, `someone else's ${i}\n`);
      const err = await failure(t2.commit());
      conflicted.push({ ...said(err), message: err.message.replaceAll(t2.tid, "T"),
        tid: err.tid === t2.tid });
    }
    assert.equal(conflicted[0].class, "TransactionAborted");
    assert.deepEqual(conflicted[0], conflicted[1]);
  });

  it("a socket path longer than sun_path is reached through /proc/self/fd", async (t) => {
    const base = realpathSync(mkdtempSync(join(tmpdir(), "a2pc-ts-long-")));
    const root = join(base, "x".repeat(60), "y".repeat(60));
    t.after(() => {
      try { cli(root, "daemon", "stop"); } finally { rmSync(base, { recursive: true, force: true }); }
    });
    mkdirSync(root, { recursive: true });
    execFileSync("git", ["init", "-q", root]);
    execFileSync(cliBin(), ["init", "--root", root], { stdio: "ignore" });
    cli(root, "daemon", "start");
    assert.ok(Buffer.byteLength(join(root, ".agent-tx/daemon.sock")) > 107);
    const client = open(root);
    const tx = await client.begin();
    await tx.stageWrite("a.txt", "long\n");
    await tx.commit();
    assert.deepEqual(client.transport.calls, { daemon: 3, fallback: 0 });
    assert.equal(read(root, "a.txt"), "long\n");
  });

  it("a daemon killed between calls: the next call goes through the CLI and finds the transaction as it was", async (t) => {
    const root = workspace(t, { "a.txt": "a\n" }, { daemon: true });
    const client = open(root);
    const tx = await client.begin();
    await tx.stageWrite("a.txt", "staged through the daemon\n");
    assert.equal(client.transport.calls.daemon, 2);
    await killDaemon(root);
    await tx.stageWrite("b.txt", "staged through the CLI\n");
    assert.equal(await tx.state(), "active");
    assert.deepEqual((await tx.diff({ stat: true })).files.map((f) => f.path).sort(),
      ["a.txt", "b.txt"]);
    assert.equal((await tx.commit()).state, "committed");
    assert.equal(client.transport.calls.daemon, 2, "no request went to the dead daemon");
    assert.equal(client.transport.calls.fallback, 4);
    assert.equal(read(root, "a.txt"), "staged through the daemon\n");
    assert.equal(read(root, "b.txt"), "staged through the CLI\n");
    // A daemon started again is found again.
    cli(root, "daemon", "start");
    assert.equal((await client.status()).transactions.length, 0);
    assert.equal(client.transport.calls.daemon, 3);
  });

  it("a daemon killed in the middle of a commit: daemon_unavailable (exit 2), then the CLI finds it rolled forward", async (t) => {
    const root = workspace(t, { "a.txt": "a\n" }, { stopDaemon: true });
    // The daemon dies at the named crash point, after the decision is durable.
    const env = { ...process.env, AGENT2PC_CRASH_AT: "commit.after_decision",
      AGENT2PC_NO_DAEMON: "1" };
    delete env.AGENT2PC_ROOT;
    execFileSync(cliBin(), ["--root", root, "daemon", "start", "--json"], { env });
    const client = open(root);
    const tx = await client.begin();
    await tx.stageWrite("a.txt", "committed\n");
    await tx.stageWrite("new.txt", "new\n");
    const err = await failure(tx.commit());
    assert.ok(err instanceof WorkspaceError, `${err}`);
    assert.equal(err.code, "daemon_unavailable");
    assert.equal(err.exitCode, 2);
    assert.equal(client.transport.calls.daemon, 4);
    for (let i = 0; i < 200 && daemonStatus(root).running; i++) {
      await new Promise((r) => setTimeout(r, 25));
    }
    // The next call runs the CLI, whose engine recovers what the dead daemon left.
    assert.equal(await tx.state(), "committed");
    assert.equal(client.transport.calls.fallback, 1);
    assert.equal(read(root, "a.txt"), "committed\n");
    assert.equal(read(root, "new.txt"), "new\n");
  });
});
