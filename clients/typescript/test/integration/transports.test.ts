// The client against a real participantd, over TCP and over WebSocket:
// the README walkthrough, pipelining, and a SIGKILL with a restart in the
// middle of a stream of tells, with nothing lost and nothing applied twice.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { connect, type Client, type Credential, type Delivery } from "../../src/index.js";
import { Server, bytes, take, text } from "./harness.js";

let server: Server;
before(async () => {
  server = await Server.start();
});
after(async () => {
  await server.stop();
});

const transports: [string, () => string][] = [
  ["tcp", () => server.tcp],
  ["websocket", () => server.wsURL],
];

let nextConv = 1000;

for (const [name, addr] of transports) {
  describe(`over ${name}`, () => {
    test("the README walkthrough: alice tells bob, bob receives and acks, sees alice detach", async () => {
      const conv = nextConv++;
      const alice = await connect(addr());
      const bob = await connect(addr());
      try {
        const a = await alice.enroll(conv);
        const b = await bob.enroll(conv);
        assert.deepEqual([a.participant, a.generation, b.participant, b.generation], [0, 1, 1, 1]);
        const seq = await alice.tell(a, bytes("hello, bob"));
        const it = bob.deliveries();
        const [d] = await take(it, 1, (d) => d.kind === "record");
        assert.equal(d!.seq, seq);
        assert.equal(d!.participant, a.participant);
        assert.equal(text(d!.payload), "hello, bob");
        assert.equal(await bob.ack(d!.credential, d!.seq), seq);
        await alice.detach(a);
        const [e] = await take(it, 1, (d) => d.kind === "detached");
        assert.equal(e!.cause, "clean");
        assert.equal(e!.participant, a.participant);
        await alice.ping();
      } finally {
        alice.close();
        bob.close();
      }
    });

    test("pipelining: a thousand tells in flight at once, on several conversations, each seq once", async () => {
      const c = await connect(addr());
      try {
        const convs = [nextConv++, nextConv++, nextConv++, nextConv++];
        const creds = await Promise.all(convs.map((v) => c.enroll(v)));
        const calls: Promise<number>[] = [];
        for (let i = 0; i < 1000; i++) calls.push(c.tell(creds[i % 4]!, bytes(`m${i}`)));
        const seqs = await Promise.all(calls);
        for (let k = 0; k < 4; k++) {
          const mine = seqs.filter((_, i) => i % 4 === k);
          // One conversation's requests are applied in the order sent.
          assert.deepEqual(mine, [...mine].sort((x, y) => x - y), `conversation ${convs[k]} in order`);
          assert.equal(new Set(mine).size, 250);
        }
      } finally {
        c.close();
      }
    });

    test("a reader that does not read stops reading its connection: the queue stays bounded, nothing is lost", async () => {
      const conv = nextConv++;
      const writer = await connect(addr());
      const reader = await connect(addr(), { maxQueuedDeliveryBytes: 4096 });
      try {
        const w = await writer.enroll(conv);
        await reader.enroll(conv);
        const payload = new Uint8Array(1000).fill(7);
        const seqs = await Promise.all(Array.from({ length: 200 }, () => writer.tell(w, payload)));
        // Wait for the server to have pushed what the reader will take in:
        // once paused, the queue stops growing.
        let last = -1;
        while (reader.queued.bytes !== last) {
          last = reader.queued.bytes;
          await new Promise((r) => setTimeout(r, 200));
        }
        assert.ok(reader.queued.bytes < 200 * 1000 / 2, `${reader.queued.bytes} bytes queued unread`);
        const got = await take(reader.deliveries(), 200, (d) => d.kind === "record");
        assert.deepEqual(got.map((d) => d.seq), seqs);
      } finally {
        writer.close();
        reader.close();
      }
    });

    test("SIGKILL and restart in the middle of a stream: every tell answered once, nothing lost, retries replayed", async () => {
      const conv = nextConv++;
      const reattached: Credential[] = [];
      const sender = await connect(addr(), { minBackoffMs: 20, maxBackoffMs: 200, onReattach: (c) => reattached.push(c) });
      const reader = await connect(addr(), { minBackoffMs: 20, maxBackoffMs: 200 });
      try {
        const s = await sender.enroll(conv);
        const r = await reader.enroll(conv);
        const N = 400;
        const calls: Promise<number>[] = [];
        let killed: Promise<void> | null = null;
        for (let i = 0; i < N; i++) {
          calls.push(sender.tell(s, bytes(`m${i}`)));
          if (i === N / 2) {
            killed = server.kill().then(() => server.restart());
          }
          if (i % 50 === 0) await new Promise((res) => setImmediate(res));
        }
        await killed;
        const seqs = await Promise.all(calls);
        assert.equal(new Set(seqs).size, N, "each tell its own record");
        // The reader resumes from its durable cursor on the restarted
        // server: every payload arrives, once.
        const got = await take(reader.deliveries(), N, (d: Delivery) => d.kind === "record", 30_000);
        assert.deepEqual(got.map((d) => text(d.payload)).sort(), Array.from({ length: N }, (_, i) => `m${i}`).sort());
        assert.deepEqual(got.map((d) => d.seq), [...seqs].sort((x, y) => x - y));
        const last = got.at(-1)!;
        await reader.ack(last.credential, last.seq);
        assert.ok(reattached.length >= 1, "the sender re-attached after the restart");
        assert.ok(sender.credential(conv, s.participant)!.generation > s.generation);
        assert.ok(reader.credential(conv, r.participant)!.generation > r.generation);
      } finally {
        sender.close();
        reader.close();
      }
    });
  });
}

export type { Client };
