// npm run bench: the TypeScript client's tell rate from one Node process
// against a participantd it starts (the binary of the integration tests).
// BENCH_ADDR=host:port (or a ws:// URL) measures a running server instead.
// BENCH_INFLIGHT (default 64) tells are kept in flight over one client,
// spread over BENCH_CONVERSATIONS (default 8) conversations, for
// BENCH_SECONDS (default 5) after a one-second warm-up.

import { connect } from "../src/index.js";
import { Server } from "../test/integration/harness.js";

const inflight = Number(process.env.BENCH_INFLIGHT ?? 64);
const convs = Number(process.env.BENCH_CONVERSATIONS ?? 8);
const seconds = Number(process.env.BENCH_SECONDS ?? 5);

const server = process.env.BENCH_ADDR ? null : await Server.start();
const transports = process.env.BENCH_ADDR ? [process.env.BENCH_ADDR] : [server!.tcp, server!.wsURL];
try {
  for (const addr of transports) {
    const c = await connect(addr, { bindingCheckIntervalMs: -1 });
    const base = 1_000_000 + Math.floor(Math.random() * 1_000_000);
    const creds = await Promise.all(Array.from({ length: convs }, (_, i) => c.enroll(base + i)));
    const payload = new Uint8Array(100);
    let counting = false;
    let count = 0;
    let stop = false;
    const lat: number[] = [];
    const worker = async (i: number) => {
      const cred = creds[i % convs]!;
      while (!stop) {
        const t0 = performance.now();
        await c.tell(cred, payload);
        if (counting) {
          count++;
          if (count % 16 === 0) lat.push(performance.now() - t0);
        }
      }
    };
    const workers = Array.from({ length: inflight }, (_, i) => worker(i));
    await new Promise((r) => setTimeout(r, 1000));
    counting = true;
    const t0 = performance.now();
    await new Promise((r) => setTimeout(r, seconds * 1000));
    counting = false;
    const elapsed = (performance.now() - t0) / 1000;
    const n = count;
    stop = true;
    await Promise.all(workers);
    c.close();
    lat.sort((a, b) => a - b);
    const p = (q: number) => lat[Math.min(lat.length - 1, Math.floor(q * lat.length))]?.toFixed(2);
    console.log(`tell@${inflight} ${addr.startsWith("ws") ? "websocket" : "tcp"}: ${(n / elapsed).toFixed(0)} tells/s (${n} in ${elapsed.toFixed(1)} s; p50 ${p(0.5)} ms, p99 ${p(0.99)} ms; ${convs} conversations, 100-byte payloads, one Node process)`);
  }
} finally {
  await server?.stop();
}
