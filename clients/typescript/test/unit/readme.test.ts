// The README's "From TypeScript" snippet is readme/snippet.ts, which the
// build type-checks (tsc), so the snippet cannot drift from the API.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const pkg = fileURLToPath(new URL("../../../", import.meta.url));

test("README's From TypeScript snippet is readme/snippet.ts, which tsc checks", () => {
  const readme = readFileSync(pkg + "../../README.md", "utf8");
  const section = readme.split("\n## From TypeScript\n")[1];
  assert.ok(section, "README has a From TypeScript section");
  const block = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
  assert.equal(block, readFileSync(pkg + "readme/snippet.ts", "utf8"));
});
