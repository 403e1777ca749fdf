// Time a step through the CLI transport and through the daemon's socket: one transaction of
// N stageWrite calls plus begin and commit, on a temp workspace. Prints one JSON object.
//   npm run build && AGENT2PC_BIN=... node bench/steps.mjs
import { Agent2PC } from "agent-2pc";
import { execFileSync } from "node:child_process";
import { mkdtempSync, realpathSync, rmSync } from "node:fs";
const B = process.env.AGENT2PC_BIN || new URL("../../../.venv/bin/agent-2pc", import.meta.url).pathname;
const d = realpathSync(mkdtempSync("/tmp/a2pc-bench-"));
execFileSync("git", ["init", "-q", d]); execFileSync(B, ["init", "--root", d]);
async function run(client, n) {
  const t0 = performance.now();
  const tx = await client.begin();
  for (let i = 0; i < n; i++) await tx.stageWrite(`f${i}.txt`, `x${i}\n`);
  await tx.commit();
  return (performance.now() - t0) / (n + 2);
}
const cliMs = await run(new Agent2PC({ root: d, daemon: false }), 20);
execFileSync(B, ["--root", d, "daemon", "start"]);
const c = new Agent2PC({ root: d });
await run(c, 5); // warm
const dMs = await run(c, 100);
console.log(JSON.stringify({ cli_ms_per_step: +cliMs.toFixed(1), daemon_ms_per_step: +dMs.toFixed(2), speedup: +(cliMs / dMs).toFixed(0), daemon_calls: c.transport.calls }));
await c.close();
execFileSync(B, ["--root", d, "daemon", "stop"]);
rmSync(d, { recursive: true, force: true });
