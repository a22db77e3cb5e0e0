// The example page in headless Chromium (Debian's, no browser download)
// against a real participantd over --ws-listen: two participants enroll,
// tell and receive; the server is SIGKILLed and restarted, the page
// reconnects, re-attaches and keeps chatting. A screenshot is written to
// artifacts/chat.png.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, statSync } from "node:fs";
import { createServer, type Server as HttpServer } from "node:http";
import { extname, join, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium, type Browser, type Page } from "playwright-core";
import { Server } from "../integration/harness.js";

const pkg = fileURLToPath(new URL("../../../", import.meta.url));
const chromiumPath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const types: Record<string, string> = { ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".map": "application/json" };

let server: Server;
let http: HttpServer;
let origin = "";
let browser: Browser;

before(async () => {
  server = await Server.start(["--ws-allowed-origins", "127.0.0.1:*"]);
  // The package directory, read only: the page, dist/ and node_modules/@msgpack.
  http = createServer((req, res) => {
    const path = normalize(decodeURIComponent(new URL(req.url!, "http://x").pathname));
    const file = join(pkg, path);
    const allowed = ["/examples/", "/dist/", "/node_modules/@msgpack/"].some((p) => path.startsWith(p));
    if (!allowed || !existsSync(file) || !statSync(file).isFile()) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "content-type": types[extname(file)] ?? "application/octet-stream" }).end(readFileSync(file));
  });
  await new Promise<void>((r) => http.listen(0, "127.0.0.1", r));
  origin = `http://127.0.0.1:${(http.address() as { port: number }).port}`;
  browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox", "--disable-gpu"] });
});

after(async () => {
  await browser?.close();
  await new Promise((r) => http?.close(r));
  await server?.stop();
});

type Chat = { state: { ready: boolean; status: string; reattaches: number }; send(who: number, text: string): Promise<number>; logs(): string[][] };

const logsOf = (page: Page) => page.evaluate(() => (window as unknown as { chat: Chat }).chat.logs());
const waitLine = (page: Page, who: number, line: string) =>
  page.waitForFunction(([w, l]) => (window as unknown as { chat: Chat }).chat.logs()[w as number]?.includes(l as string), [who, line], { timeout: 20_000 });

test("two participants chat in a page, across a server restart; screenshot in artifacts/chat.png", async () => {
  const page = await browser.newPage({ viewport: { width: 900, height: 520 } });
  const errors: string[] = [];
  page.on("pageerror", (e) => errors.push(e.message));
  const conv = 7000 + Math.floor(Math.random() * 1000);
  await page.goto(`${origin}/examples/chat.html?ws=${encodeURIComponent(server.wsURL)}&conversation=${conv}`);
  await page.waitForFunction(() => (window as unknown as { chat?: Chat }).chat?.state.ready, undefined, { timeout: 20_000 });

  await page.evaluate(() => (window as unknown as { chat: Chat }).chat.send(0, "hello, bob"));
  await waitLine(page, 1, "alice: hello, bob");
  await page.evaluate(() => (window as unknown as { chat: Chat }).chat.send(1, "hi alice"));
  await waitLine(page, 0, "bob: hi alice");

  await server.kill();
  await server.restart();
  // Typed into the page's form: the tell waits for the reconnection
  // and re-attachment, then commits once.
  await page.fill("#form-alice input", "still there after the restart?");
  await page.click("#form-alice button");
  await waitLine(page, 1, "alice: still there after the restart?");
  await page.evaluate(() => (window as unknown as { chat: Chat }).chat.send(1, "yes, nothing lost"));
  await waitLine(page, 0, "bob: yes, nothing lost");
  const reattaches = await page.evaluate(() => (window as unknown as { chat: Chat }).chat.state.reattaches);
  assert.ok(reattaches >= 2, `${reattaches} re-attachments`);

  const logs = await logsOf(page);
  assert.equal(logs[1]!.filter((l) => l === "alice: hello, bob").length, 1, "no repeat after the restart");
  mkdirSync(join(pkg, "artifacts"), { recursive: true });
  const shot = join(pkg, "artifacts/chat.png");
  await page.screenshot({ path: shot });
  console.log(`# screenshot: ${shot}`);
  assert.deepEqual(errors, []);
  await page.close();
});
