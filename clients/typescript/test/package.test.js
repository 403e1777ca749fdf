// The package as users get it: `npm pack`, installed from the tarball into a new project, and
// the product document's example run there, verbatim, through the real CLI found on the PATH.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";

import { cliBin, packageDir, read, workspace } from "./workspace.js";

// ../shared/reference/product-agent-2pc.txt, the TypeScript example, verbatim.
const EXAMPLE = `import { Agent2PC } from "agent-2pc";
const client = new Agent2PC();
const session = await client.begin({ timeoutMs: 30000 });
await session.stageWrite("src/routes.ts", "// Route Handlers");
await session.stageCommand("npm run test");
await session.commit();
`;

// The project's test, run by the example's `npm run test` in the staged view: it passes only
// if it sees the staged file, which the real tree does not have yet (and fails on demand).
const CHECK = `import { readFileSync } from "node:fs";
if (process.env.CHECK_FAILS) process.exit(1);
if (readFileSync("src/routes.ts", "utf8") !== "// Route Handlers") process.exit(1);
`;

// A consumer's use of the types: narrowing errors by class and by code, typed answers.
const TYPED = `import { Agent2PCError, TransactionAborted, type ErrorCode, type DiffResult } from "agent-2pc";
const tx = await client.begin({ label: "typed" });
const diff: DiffResult = await tx.diff({ stat: true });
const paths: string[] = diff.files.map((f) => f.path);
try {
  await tx.commit();
} catch (err) {
  if (err instanceof TransactionAborted) {
    const code: ErrorCode = err.code;
    const exit: 1 | 2 = err.exitCode;
    const seen: [ErrorCode, 1 | 2, string | undefined, string, string[]] =
      [code, exit, err.tid, err.reason, paths];
    void seen;
  } else if (err instanceof Agent2PCError && err.code === "unknown_tid") {
    throw err;
  }
}
// @ts-expect-error: a path is a string (were the declarations \`any\`, this line would fail)
await tx.stageWrite(1, "x");
`;

function pack(t) {
  const dest = realpathSync(mkdtempSync(join(tmpdir(), "a2pc-pack-")));
  t.after(() => rmSync(dest, { recursive: true, force: true }));
  const out = execFileSync("npm", ["pack", "--json", "--ignore-scripts", "--pack-destination", dest],
    { cwd: packageDir, encoding: "utf8" });
  const [info] = JSON.parse(out);
  return { tarball: join(dest, info.filename), files: info.files.map((f) => f.path).sort() };
}

test("npm pack holds the built ESM with its type declarations and nothing else", async (t) => {
  const { files } = pack(t);
  assert.ok(files.includes("dist/index.js"));
  assert.ok(files.includes("dist/index.d.ts"));
  assert.ok(files.includes("package.json"));
  assert.ok(files.includes("README.md"));
  assert.deepEqual(files.filter((f) => !/^(dist\/[\w-]+\.(js|d\.ts)|package\.json|README\.md)$/.test(f)), []);
  const manifest = JSON.parse(readFileSync(join(packageDir, "package.json"), "utf8"));
  assert.equal(manifest.name, "agent-2pc");
  assert.equal(manifest.type, "module");
  assert.equal(manifest.engines.node, ">=20");
  assert.deepEqual(Object.keys(manifest.dependencies ?? {}), [], "no runtime dependencies");
});

test("the product's example runs verbatim from the installed tarball: a failing check stops it, a passing one commits", async (t) => {
  const { tarball } = pack(t);
  const root = workspace(t, {
    "package.json": JSON.stringify({ name: "app", private: true, scripts: { test: "node check.mjs" } }),
    "check.mjs": CHECK,
    ".gitignore": "node_modules/\n",
  });
  execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", "--ignore-scripts", tarball],
    { cwd: root, stdio: "ignore" });
  writeFileSync(join(root, "example.mjs"), EXAMPLE);
  // The CLI is found on the PATH, the workspace from the working directory.
  const env = { ...process.env, PATH: `${dirname(cliBin())}:${process.env.PATH}` };
  delete env.AGENT2PC_BIN;
  delete env.AGENT2PC_ROOT;

  // `npm run test` fails (the check inherits the environment): CheckFailed, nothing written.
  writeFileSync(join(root, "run-failing.mjs"), `import { CheckFailed } from "agent-2pc";
try { await import("./example.mjs"); } catch (err) {
  console.log(JSON.stringify({ name: err.name, code: err.code, exitCode: err.exitCode,
    checkFailed: err instanceof CheckFailed }));
}
`);
  const out = execFileSync(process.execPath, ["run-failing.mjs"],
    { cwd: root, env: { ...env, CHECK_FAILS: "1" }, encoding: "utf8" });
  assert.deepEqual(JSON.parse(out), {
    name: "CheckFailed", code: "verification_failed", exitCode: 1, checkFailed: true,
  });
  assert.equal(read(root, "src/routes.ts"), null);

  // It passes, and only in the staged view (the tree has no src/routes.ts): committed.
  execFileSync(process.execPath, ["example.mjs"], { cwd: root, env, stdio: "pipe" });
  assert.equal(read(root, "src/routes.ts"), "// Route Handlers");
  const list = JSON.parse(execFileSync(cliBin(), ["list", "--json", "--root", root], { encoding: "utf8" }));
  assert.deepEqual(list.transactions.map((r) => r.state).sort(), ["active", "committed"]);

  // The bundled declarations type-check a consumer on their own (strict, no @types/node),
  // and they are precise: the @ts-expect-error line must be an error.
  writeFileSync(join(root, "consumer.mts"), EXAMPLE + TYPED);
  writeFileSync(join(root, "tsconfig.json"), JSON.stringify({
    compilerOptions: {
      strict: true, noEmit: true, module: "nodenext", moduleResolution: "nodenext",
      target: "es2022", lib: ["es2022"], types: [],
    },
    files: ["consumer.mts"],
  }));
  const tsc = join(packageDir, "node_modules/typescript/bin/tsc");
  try {
    execFileSync(process.execPath, [tsc, "-p", "tsconfig.json"], { cwd: root, encoding: "utf8" });
  } catch (err) {
    assert.fail(`the consumer does not type-check:\n${err.stdout}`);
  }
});
