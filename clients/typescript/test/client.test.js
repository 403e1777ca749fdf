// The client against a real workspace through the real CLI (the transport with no daemon).
import assert from "node:assert/strict";
import { readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import {
  Agent2PC, Agent2PCError, CheckFailed, InputError, TransactionAborted, TransportError,
} from "agent-2pc";

import { cliBin, put, read, snapshot, workspace } from "./workspace.js";

// The same tests run twice: through the CLI (no daemon), and with a daemon serving each
// workspace (the default transport then talks to its socket): the answers and errors must be
// the same.
for (const daemon of [false, true]) {
const way = daemon ? "through the daemon" : "over the CLI";
const ws = (t, files) => workspace(t, files, { daemon });
const open = (root) => new Agent2PC({ root, bin: cliBin() });
const cliOnly = { skip: daemon && "about the CLI itself" };

// Each test has its own workspace: they run side by side.
describe(`the client ${way}`, { concurrency: 3 }, () => {
  it("begin, stage every kind of step, diff, commit: the tree changes only at commit", async (t) => {
    const root = ws(t, { "a.txt": "one\ntwo\n", "b.txt": "keep\n", "gone.txt": "bye\n" });
    const client = open(root);
    const tx = await client.begin({ timeoutMs: 30000, label: "all steps" });
    assert.match(tx.tid, /^tx-/);
    assert.equal((await tx.stageWrite("src/new.ts", "export const x = 1;\n")).bytes, 20);
    assert.equal((await tx.stageReplace("b.txt", "keep", "kept")).replacements, 1);
    const patch = "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n";
    assert.deepEqual((await tx.stagePatch(patch)).files, ["a.txt"]);
    assert.equal((await tx.stageDelete("gone.txt")).op, "delete");
    const before = snapshot(root);
    const diff = await tx.diff();
    const status = Object.fromEntries(diff.files.map((f) => [f.path, f.status]));
    assert.deepEqual(status, {
      "a.txt": "modified", "b.txt": "modified", "gone.txt": "deleted", "src/new.ts": "added",
    });
    assert.match(diff.diff, /\+TWO/);
    assert.equal((await tx.diff({ stat: true })).files.length, 4);
    assert.equal(await tx.state(), "active");
    assert.deepEqual(snapshot(root), before, "nothing reaches the tree before commit");
    const done = await tx.commit();
    assert.equal(done.state, "committed");
    assert.equal(done.tid, tx.tid);
    assert.deepEqual(snapshot(root), {
      "a.txt": "one\nTWO\n", "b.txt": "kept\n", "src/new.ts": "export const x = 1;\n",
    });
    assert.equal(await tx.state(), "committed");
  });

  it("abort leaves nothing: the tree as before, the transaction aborted", async (t) => {
    const root = ws(t, { "a.txt": "original\n" });
    const client = open(root);
    const tx = await client.begin();
    await tx.stageWrite("a.txt", "changed\n");
    await tx.stageWrite("new/file.txt", "new\n");
    await tx.stageDelete("a.txt");
    const before = snapshot(root);
    const answer = await tx.abort("changed my mind");
    assert.equal(answer.state, "aborted");
    assert.deepEqual(snapshot(root), before);
    assert.equal(read(root, "new/file.txt"), null);
    assert.equal(await tx.state(), "aborted");
    assert.equal((await tx.abort()).state, "aborted", "abort again answers the same");
    await assert.rejects(tx.commit(), (err) => err instanceof InputError && err.code === "bad_state");
  });

  it("a file changed under a recorded read: commit rejects with TransactionAborted, code conflict", async (t) => {
    const root = ws(t, { "shared.txt": "v1\n" });
    const tx = await open(root).begin();
    assert.match(await tx.recordRead("shared.txt"), /^[0-9a-f]{64}$/);
    await tx.stageWrite("shared.txt", "mine\n");
    await tx.stageWrite("other.txt", "also mine\n");
    put(root, "shared.txt", "someone else's\n");
    const err = await tx.commit().then(() => assert.fail("commit succeeded"), (e) => e);
    assert.ok(err instanceof TransactionAborted, `${err}`);
    assert.ok(err instanceof Agent2PCError);
    assert.equal(err.code, "conflict");
    assert.equal(err.exitCode, 1);
    assert.equal(err.tid, tx.tid);
    assert.equal(err.reason, err.message);
    assert.equal(read(root, "shared.txt"), "someone else's\n");
    assert.equal(read(root, "other.txt"), null, "all or nothing: no file of the transaction applied");
    assert.equal(await tx.state(), "aborted");
  });

  it("a failing check: stageCommand rejects with CheckFailed, then commit with verification_failed", async (t) => {
    const root = ws(t);
    const tx = await open(root).begin();
    await tx.stageWrite("a.txt", "x\n");
    const ok = await tx.stageCommand("test -f a.txt");
    assert.equal(ok.passed, true);
    assert.equal(ok.exit_code, 0);
    const err = await tx.stageCommand("grep -q y a.txt").then(() => assert.fail("check passed"), (e) => e);
    assert.ok(err instanceof CheckFailed, `${err}`);
    assert.equal(err.code, "verification_failed");
    assert.equal(err.exitCode, 1);
    assert.equal(err.result.passed, false);
    assert.equal(err.result.exit_code, 1);
    assert.equal(await tx.state(), "active", "a failed check leaves the transaction active");
    const abort = await tx.commit().then(() => assert.fail("commit succeeded"), (e) => e);
    assert.ok(abort instanceof TransactionAborted, `${abort}`);
    assert.equal(abort.code, "verification_failed");
    assert.equal(read(root, "a.txt"), null);
  });

  it("an unknown tid is an InputError with code unknown_tid, exit status 2", async (t) => {
    const root = ws(t);
    const client = open(root);
    const tx = client.get("tx-20260101-120000-a1b2c3");
    for (const step of [() => tx.commit(), () => tx.stageWrite("a", "b"), () => tx.diff()]) {
      await assert.rejects(step(), (err) => {
        assert.ok(err instanceof InputError, `${err}`);
        assert.equal(err.code, "unknown_tid");
        assert.equal(err.exitCode, 2);
        assert.equal(err.tid, "tx-20260101-120000-a1b2c3");
        return true;
      });
    }
  });

  it("savepoint and rollbackTo undo the steps after the savepoint only", async (t) => {
    const root = ws(t, { "a.txt": "a\n" });
    const tx = await open(root).begin();
    await tx.stageWrite("first.txt", "1\n");
    assert.equal((await tx.savepoint("s1")).name, "s1");
    await tx.stageWrite("second.txt", "2\n");
    await tx.stageDelete("a.txt");
    assert.equal((await tx.diff()).files.length, 3);
    assert.equal((await tx.rollbackTo("s1")).name, "s1");
    assert.deepEqual((await tx.diff()).files.map((f) => f.path), ["first.txt"]);
    await assert.rejects(tx.rollbackTo("nope"), { code: "unknown_savepoint", exitCode: 2 });
    await tx.commit();
    assert.deepEqual(snapshot(root), { "a.txt": "a\n", "first.txt": "1\n" });
  });

  it("bad input is refused with the contract's code and nothing is staged", async (t) => {
    const root = ws(t, { "a.txt": "same same\n" });
    const tx = await open(root).begin();
    const cases = [
      [() => tx.stageWrite("../escape.txt", "x"), "path_outside_root"],
      [() => tx.stageWrite(".agent-tx/x", "x"), "path_forbidden"],
      [() => tx.stageDelete("absent.txt"), "not_found"],
      [() => tx.stageReplace("a.txt", "nothing like it", "x"), "no_match"],
      [() => tx.stageReplace("a.txt", "same", "x"), "ambiguous_match"],
      [() => tx.stagePatch("not a diff"), "invalid_patch"],
      [() => tx.stageReplace("a.txt", "a\0b", "x"), "usage"],
    [() => tx.stageWrite("a.txt", "lone \ud800 surrogate"), "usage"],
    [() => tx.stageWrite("b\udfff.txt", "x"), "usage"],
    ];
    for (const [step, code] of cases) {
      await assert.rejects(step(), (err) => {
        assert.ok(err instanceof InputError, `${code}: ${err}`);
        assert.equal(err.code, code);
        assert.equal(err.exitCode, 2);
        return true;
      });
    }
    assert.deepEqual((await tx.diff()).files, []);
  });

  it("content travels as bytes: binary, dashes, modes, replace --all", async (t) => {
    const root = ws(t, { "flags.txt": "--json --json\n" });
    const tx = await open(root).begin();
    const bytes = new Uint8Array([0, 1, 2, 255, 10, 0]);
    assert.equal((await tx.stageWrite("bin.dat", bytes)).bytes, 6);
    await tx.stageWrite("run.sh", "#!/bin/sh\necho hi\n", { mode: 0o755 });
    await tx.stageWrite("dash.txt", "--content\n");
    assert.equal((await tx.stageReplace("flags.txt", "--json", "--root", { all: true })).replacements, 2);
    await tx.commit();
    assert.deepEqual(new Uint8Array(readFileSync(`${root}/bin.dat`)), bytes);
    assert.equal(statSync(`${root}/run.sh`).mode & 0o777, 0o755);
    assert.equal(read(root, "dash.txt"), "--content\n");
    assert.equal(read(root, "flags.txt"), "--root --root\n");
  });

  it("transaction(): commits when the body resolves, aborts and rethrows when it throws", async (t) => {
    const root = ws(t);
    const client = open(root);
    const value = await client.transaction(async (tx) => {
      await tx.stageWrite("kept.txt", "yes\n");
      return 42;
    }, { label: "scope" });
    assert.equal(value, 42);
    assert.equal(read(root, "kept.txt"), "yes\n");
    const boom = new Error("boom");
    let seen;
    await assert.rejects(client.transaction(async (tx) => {
      seen = tx;
      await tx.stageWrite("dropped.txt", "no\n");
      throw boom;
    }), (err) => err === boom);
    assert.equal(read(root, "dropped.txt"), null);
    assert.equal(await seen.state(), "aborted");
    const rows = await client.transactions();
    assert.deepEqual(rows.map((r) => r.state).sort(), ["aborted", "committed"]);
  });

  it("no CLI where it was looked for: TransportError, not a crash", cliOnly, async (t) => {
    const root = ws(t);
    const client = new Agent2PC({ root, bin: `${root}/no-such-agent-2pc` });
    await assert.rejects(client.begin(), (err) => {
      assert.ok(err instanceof TransportError, `${err}`);
      assert.equal(err.code, "transport_error");
      assert.match(err.message, /AGENT2PC_BIN/);
      return true;
    });
    await assert.rejects(new Agent2PC({ root: `${root}/absent`, bin: cliBin() }).begin(),
      { code: "not_initialized", exitCode: 2 });
  });
});

describe(`the rest of the surface ${way}`, { concurrency: 3 }, () => {
  it("stageCommand's options reach the check: env, workingDir, promote, limits", async (t) => {
    const root = ws(t, { "sub/x.txt": "x\n" });
    const tx = await open(root).begin();
    const env = await tx.stageCommand('test "$GREETING" = hello', { env: { GREETING: "hello" } });
    assert.equal(env.passed, true);
    const dir = await tx.stageCommand("test -f x.txt", { workingDir: "sub", timeoutMs: 20000 });
    assert.equal(dir.passed, true);
    await tx.stageCommand("echo made > out.gen", { promote: ["*.gen"] });
    assert.deepEqual((await tx.diff()).files.map((f) => f.path), ["out.gen"], "promoted");
    const governed = await tx.stageCommand("true", { limits: { max_runtime_ms: 20000 } });
    assert.equal(governed.tripped, null, "a governed run answers `tripped`");
    const tripped = await tx.stageCommand("sleep 5", { limits: { max_runtime_ms: 200 } })
      .then(() => assert.fail("the limit did not trip"), (e) => e);
    assert.ok(tripped instanceof CheckFailed, `${tripped}`);
    assert.equal(tripped.code, "limit_exceeded");
    assert.equal(tripped.result.tripped, "max_runtime_ms");
    await tx.abort();
  });

  it("exec stages what a command changed; a failing one stages nothing", async (t) => {
    const root = ws(t, { "old.txt": "old\n" });
    const tx = await open(root).begin();
    const run = await tx.exec(["sh", "-c", "echo new > new.txt && rm old.txt"]);
    assert.deepEqual(run.captured.map((c) => [c.path, c.op]).sort(),
      [["new.txt", "write"], ["old.txt", "delete"]]);
    await assert.rejects(tx.exec(["sh", "-c", "echo bad > bad.txt; exit 4"]),
      (err) => err instanceof CheckFailed && err.code === "command_failed" && err.exitCode === 1);
    assert.deepEqual((await tx.diff()).files.map((f) => f.path).sort(), ["new.txt", "old.txt"]);
    await tx.commit();
    assert.deepEqual(snapshot(root), { "new.txt": "new\n" });
  });

  it("status, transactions, recover, compact and Agent2PC.init answer the CLI's objects", async (t) => {
    const root = ws(t);
    const client = await Agent2PC.init(root, { bin: cliBin() });
    const live = await client.begin({ label: "live" });
    const done = await client.begin();
    await done.abort();
    assert.deepEqual((await client.status()).transactions.map((r) => r.tid), [live.tid]);
    assert.equal((await client.status(live.tid)).transactions[0].label, "live");
    assert.deepEqual((await client.transactions("aborted")).map((r) => r.tid), [done.tid]);
    const recovered = await client.recover();
    assert.deepEqual(recovered.rolled_forward, []);
    assert.ok(Array.isArray(recovered.rolled_back));
    assert.equal(typeof (await client.compact()).after_bytes, "number");
    assert.equal(await live.state(), "active");
  });

  it("parallel transactions from one process: disjoint ones all commit, a lost update is a conflict", async (t) => {
    const root = ws(t, { "counter.txt": "0\n" });
    const client = open(root);
    const txs = await Promise.all([0, 1, 2, 3].map(() => client.begin()));
    await Promise.all(txs.map((tx, i) => tx.stageWrite(`part${i}.txt`, `${i}\n`)));
    const bumps = await Promise.all([client.begin(), client.begin()]);
    for (const tx of bumps) {
      await tx.recordRead("counter.txt");
      await tx.stageWrite("counter.txt", "1\n");
    }
    const results = await Promise.allSettled([...txs, ...bumps].map((tx) => tx.commit()));
    assert.deepEqual(results.slice(0, 4).map((r) => r.status), Array(4).fill("fulfilled"));
    const outcome = results.slice(4).map((r) => r.status === "fulfilled" ? "committed" : r.reason.code);
    assert.deepEqual(outcome.sort(), ["committed", "conflict"]);
    assert.deepEqual(snapshot(root), {
      "counter.txt": "1\n", "part0.txt": "0\n", "part1.txt": "1\n", "part2.txt": "2\n",
      "part3.txt": "3\n",
    });
  });

  it("a CLI that dies without its answer is a TransportError", cliOnly, async (t) => {
    const root = ws(t);
    const fake = join(root, "dying-cli");
    writeFileSync(fake, "#!/bin/sh\necho 'Traceback: boom' >&2\nexit 1\n", { mode: 0o755 });
    await assert.rejects(new Agent2PC({ root, bin: fake }).begin(), (err) => {
      assert.ok(err instanceof TransportError, `${err}`);
      assert.match(err.message, /exited with status 1 without a JSON answer: Traceback: boom/);
      return true;
    });
  });
});
}
