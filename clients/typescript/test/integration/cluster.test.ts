// A 3-node cluster over an embedded etcd (cmd/etcd-dev): the node that
// owns a conversation is SIGKILLed while one participant only reads. The
// reader sends nothing, so it never sees moved: it must notice its
// connection's end, find the conversation's new owner across the nodes
// and attach there by itself; deliveries resume, each record once.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "../../src/index.js";
import { Etcd, Server, bytes, freePort, take, text } from "./harness.js";

let etcd: Etcd;
const nodes: Server[] = [];

before(async () => {
  etcd = await Etcd.start();
  for (let i = 1; i <= 3; i++) {
    const port = await freePort();
    nodes.push(await Server.start(["--etcd-endpoints", etcd.endpoints, "--node-id", `node${i}`, "--lease-ttl", "2s"], `127.0.0.1:${port}`));
  }
});

after(async () => {
  for (const n of nodes) await n.stop();
  await etcd?.stop();
});

test("the owner is killed while a reader only reads: the reader follows the failover, nothing lost", async () => {
  const addrs = nodes.map((n) => n.tcp);
  const conv = 9001;
  const fast = { minBackoffMs: 50, maxBackoffMs: 500 };
  const reader = await connect(addrs, fast);
  const writer = await connect([...addrs].reverse(), fast);
  try {
    const r = await reader.enroll(conv);
    const w = await writer.enroll(conv);
    const owner = reader.addressOf(conv);
    assert.equal(writer.addressOf(conv), owner, "both followed moved to the one owner");
    const it = reader.deliveries();
    const before = [];
    for (let i = 0; i < 5; i++) before.push(await writer.tell(w, bytes(`before ${i}`)));
    await take(it, 5, (d) => d.kind === "record");

    await nodes.find((n) => n.tcp === owner)!.kill();
    const after = [];
    for (let i = 0; i < 5; i++) after.push(await writer.tell(w, bytes(`after ${i}`)));
    const got = await take(it, 5, (d) => d.kind === "record", 30_000);
    assert.deepEqual(got.map((d) => text(d.payload)), [0, 1, 2, 3, 4].map((i) => `after ${i}`));
    assert.deepEqual(got.map((d) => d.seq), after);
    assert.notEqual(reader.addressOf(conv), owner, "the reader is on the new owner");
    assert.ok(reader.credential(conv, r.participant)!.generation > r.generation, "re-attached there");
    await reader.ack(got.at(-1)!.credential, got.at(-1)!.seq);
  } finally {
    reader.close();
    writer.close();
  }
});
