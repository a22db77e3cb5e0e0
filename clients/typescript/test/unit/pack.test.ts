// What `npm pack` would publish: the compiled package (dist/src, without
// source maps, whose sources are not shipped), README.md, LICENSE (the
// repository's, Apache-2.0, as package.json says) and package.json, and
// nothing else: no tests, no sources, no binaries the tests built.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const pkg = fileURLToPath(new URL("../../../", import.meta.url));

test("npm pack holds dist/src, README.md, LICENSE and package.json, and nothing else", () => {
  const out = execFileSync("npm", ["pack", "--dry-run", "--json", "--ignore-scripts"], { cwd: pkg, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  const files = (JSON.parse(out) as { files: { path: string }[] }[])[0]!.files.map((f) => f.path).sort();
  const sources = readdirSync(pkg + "src").filter((f) => f.endsWith(".ts")).map((f) => f.slice(0, -3));
  const want = [
    "LICENSE", "README.md", "package.json",
    ...sources.flatMap((s) => [`dist/src/${s}.js`, `dist/src/${s}.d.ts`]),
  ].sort();
  // A file of dist/src without a source (a stale build) fails here too.
  assert.deepEqual(files, want);
});

test("the package's license is the repository's: Apache-2.0, and LICENSE is its text", () => {
  const meta = JSON.parse(readFileSync(pkg + "package.json", "utf8")) as { license: string };
  assert.equal(meta.license, "Apache-2.0");
  assert.equal(readFileSync(pkg + "LICENSE", "utf8"), readFileSync(pkg + "../../LICENSE", "utf8"));
});
