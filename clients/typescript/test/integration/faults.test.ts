// Faults injected between the client and a real participantd: a proxy
// that sees every frame drops answers, cuts connections, injects pushes
// and error answers; a fake node answers moved; the server is SIGKILLed.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import {
  connect, toHex, InDoubtError, LostError, StaleAuthorityError, type Credential, type Intent,
} from "../../src/index.js";
import { FakeNode, Proxy, Server, bytes, take, text } from "./harness.js";

let server: Server;
let proxy: Proxy;
before(async () => {
  server = await Server.start();
  proxy = await Proxy.start(server.tcp);
});
after(async () => {
  await proxy.close();
  await server.stop();
});

let nextConv = 5000;
const fast = { minBackoffMs: 10, maxBackoffMs: 100 };
const hex = (v: unknown) => toHex(v as Uint8Array);

test("an attach whose answer is lost is retried with the same token and credential, and replayed", async () => {
  const conv = nextConv++;
  const intents: Intent[] = [];
  const creds: Credential[] = [];
  const lost: unknown[] = [];
  const c = await connect(proxy.addr, { ...fast, onIntent: (i) => void intents.push(i), onCredential: (cr) => void creds.push(cr), onLost: (_, e) => lost.push(e) });
  try {
    const first = await c.enroll(conv);
    // Cut the connection; drop the answer of the re-attach that follows
    // (and cut again), as a crash of the network between commit and answer.
    let dropped = 0;
    proxy.fromServer = (m) => (m.t === "attached" && dropped++ === 0 ? "cut" : "pass");
    proxy.cutAll();
    const seq = await c.tell(first, bytes("after the lost answer"));
    proxy.fromServer = () => "pass";
    assert.ok(seq > 0);
    const attaches = proxy.log.filter((f) => f.dir === "c2s" && f.m.t === "attach" && f.m.conversation === conv);
    assert.ok(attaches.length >= 2, `${attaches.length} attaches sent`);
    // The retry is the same request: token and presented generation.
    assert.equal(hex(attaches[1]!.m.token), hex(attaches[0]!.m.token));
    assert.equal(attaches[1]!.m.generation, 1);
    const replays = proxy.log.filter((f) => f.dir === "s2c" && f.m.t === "attached" && f.m.replay !== undefined);
    assert.ok(replays.length >= 1, "the server replayed the lost attach");
    // The replay's binding died with its connection ("unbound"): the
    // client attached again with the credential it minted.
    const now = c.credential(conv, first.participant)!;
    assert.equal(now.generation, 3);
    assert.deepEqual(creds.map((cr) => cr.generation), [1, 2, 3]);
    assert.deepEqual(intents.map((i) => [i.op, i.presented?.generation]), [["enroll", undefined], ["attach", 1], ["attach", 2]]);
    assert.equal(hex(intents[1]!.token), hex(attaches[0]!.m.token), "onIntent saw the token before it was sent");
    assert.deepEqual(lost, []);
  } finally {
    c.close();
  }
});

test("SIGKILL mid-stream through the proxy: every retried tell carries its first token, and is replayed or applied once", async () => {
  const conv = nextConv++;
  const c = await connect(proxy.addr, fast);
  try {
    const s = await c.enroll(conv);
    const from = proxy.log.length;
    const N = 300;
    const calls: Promise<number>[] = [];
    let killed: Promise<void> | null = null;
    for (let i = 0; i < N; i++) {
      calls.push(c.tell(s, bytes(`k${i}`)));
      if (i === 150) killed = server.kill().then(() => server.restart());
      if (i % 25 === 0) await new Promise((r) => setImmediate(r));
    }
    await killed;
    const seqs = await Promise.all(calls);
    assert.equal(new Set(seqs).size, N);
    const tells = proxy.log.slice(from).filter((f) => f.dir === "c2s" && f.m.t === "tell");
    const tokens = new Map<string, string>();
    for (const t of tells) {
      const k = hex(t.m.token);
      const p = text(t.m.payload as Uint8Array);
      assert.equal(tokens.get(k) ?? p, p, "one token, one payload");
      tokens.set(k, p);
    }
    assert.equal(tokens.size, N, "no token minted for a retry");
    const replayed = proxy.log.slice(from).filter((f) => f.dir === "s2c" && f.m.t === "told" && f.m.replay === "committed").length;
    console.log(`# ${tells.length - N} tells resent after the kill, ${replayed} answered as replays`);
    assert.ok(tells.length > N, "some tells were in flight at the kill and were resent");
  } finally {
    c.close();
  }
});

test("in_doubt from the server is retried with the same token and learns the outcome", async () => {
  const conv = nextConv++;
  const c = await connect(proxy.addr, fast);
  try {
    const s = await c.enroll(conv);
    let doubted = 0;
    proxy.fromServer = (m) => {
      if (m.t === "told" && doubted++ === 0) {
        proxy.inject({ t: "error", id: m.id, code: "in_doubt", detail: "internal error" });
        return "drop";
      }
      return "pass";
    };
    const from = proxy.log.length;
    const seq = await c.tell(s, bytes("doubted"));
    proxy.fromServer = () => "pass";
    const tells = proxy.log.slice(from).filter((f) => f.dir === "c2s" && f.m.t === "tell");
    assert.equal(tells.length, 2);
    assert.equal(hex(tells[1]!.m.token), hex(tells[0]!.m.token));
    const told = proxy.log.slice(from).filter((f) => f.dir === "s2c" && f.m.t === "told");
    assert.equal(told.at(-1)!.m.replay, "committed");
    assert.equal(told.at(-1)!.m.seq, seq);
  } finally {
    c.close();
  }
});

test("an aborted tell whose request went out is InDoubtError with its token; retrying with it replays", async () => {
  const conv = nextConv++;
  const c = await connect(proxy.addr, fast);
  try {
    const s = await c.enroll(conv);
    const ac = new AbortController();
    proxy.fromServer = (m) => (m.t === "told" ? "drop" : "pass");
    proxy.fromClient = (m) => {
      if (m.t === "tell") setTimeout(() => ac.abort(new Error("caller gave up")), 50);
      return "pass";
    };
    const err = await c.tell(s, bytes("maybe"), { signal: ac.signal }).catch((e: unknown) => e);
    proxy.fromServer = () => "pass";
    proxy.fromClient = () => "pass";
    assert.ok(err instanceof InDoubtError, String(err));
    assert.ok(err.token);
    const seq = await c.tell(s, bytes("maybe"), { token: err.token });
    const last = proxy.log.filter((f) => f.dir === "s2c" && f.m.t === "told").at(-1)!;
    assert.equal(last.m.replay, "committed");
    assert.equal(last.m.seq, seq);
    // Aborted before anything was sent: the signal's reason, not in doubt.
    const pre = new AbortController();
    pre.abort(new Error("never mind"));
    await assert.rejects(c.tell(s, bytes("never"), { signal: pre.signal }), /never mind/);
  } finally {
    c.close();
  }
});

test("deliveries are deduplicated on (conversation, seq); a compacted push is surfaced in order", async () => {
  const conv = nextConv++;
  const a = await connect(server.tcp);
  const b = await connect(proxy.addr, fast);
  try {
    const ca = await a.enroll(conv);
    const cb = await b.enroll(conv);
    proxy.fromServer = (m) => {
      if (m.t === "delivery" && m.kind === "record") proxy.inject(m); // every record twice
      return "pass";
    };
    const s1 = await a.tell(ca, bytes("one"));
    const s2 = await a.tell(ca, bytes("two"));
    const it = b.deliveries();
    const got = await take(it, 2, (d) => d.kind === "record");
    proxy.fromServer = () => "pass";
    assert.deepEqual(got.map((d) => [d.seq, text(d.payload)]), [[s1, "one"], [s2, "two"]]);
    proxy.inject({ t: "compacted", conversation: conv, recipient: cb.participant, first: s2 + 1 });
    const s3 = await a.tell(ca, bytes("three"));
    const [cm, rec] = await take(it, 2, (d) => d.kind === "compacted" || d.kind === "record");
    assert.equal(cm!.kind, "compacted");
    assert.equal(cm!.first, s2 + 1);
    assert.equal(rec!.seq, s3);
  } finally {
    a.close();
    b.close();
  }
});

test("a participant taken over by another session is lost: the binding check notices, onLost is told", async () => {
  const conv = nextConv++;
  const lost: [Credential, LostError][] = [];
  const first = await connect(server.tcp, { onLost: (cr, e) => void lost.push([cr, e]) });
  const second = await connect(server.tcp);
  try {
    const cred = await first.enroll(conv);
    await second.attach(cred);
    await first.checkBindings();
    assert.equal(lost.length, 1);
    assert.ok(lost[0]![1].cause instanceof StaleAuthorityError || lost[0]![1].cause.code === "no_binding", String(lost[0]![1].cause));
    await assert.rejects(first.tell(cred, bytes("no")), LostError);
  } finally {
    first.close();
    second.close();
  }
});

test("a reader's re-attach refused backlog_full past the wait is tried again, and its deliveries resume", async () => {
  const conv = nextConv++;
  const writer = await connect(server.tcp);
  const reader = await connect(proxy.addr, { minBackoffMs: 10, maxBackoffMs: 100, backlogWaitMs: 50 });
  try {
    const w = await writer.enroll(conv);
    await reader.enroll(conv);
    // For the next 600 ms every attach is refused backlog_full by the
    // proxy, as a full conversation would: nothing reaches the server.
    const until = Date.now() + 600;
    let refused = 0;
    proxy.fromClient = (m) => {
      if (m.t === "attach" && Date.now() < until) {
        refused++;
        proxy.inject({ t: "error", id: m.id, code: "backlog_full", detail: "backlog full", limit: 1 });
        return "drop";
      }
      return "pass";
    };
    proxy.cutAll();
    const seq = await writer.tell(w, bytes("for the reader"));
    const [d] = await take(reader.deliveries(), 1, (d) => d.kind === "record" && d.seq === seq, 10_000);
    proxy.fromClient = () => "pass";
    assert.equal(text(d!.payload), "for the reader");
    assert.ok(refused >= 2, `${refused} attaches refused`);
  } finally {
    proxy.fromClient = () => "pass";
    writer.close();
    reader.close();
  }
});

test("a process that dies with an attach in doubt recovers it from its persisted intent", async () => {
  const conv = nextConv++;
  const boot = await connect(server.tcp);
  const cred = await boot.enroll(conv);
  await boot.detach(cred);
  boot.close();
  // The first process persists its intent, sends the attach, and dies
  // before the answer (the proxy swallows it).
  let persisted: Intent | null = null;
  proxy.fromServer = (m) => (m.t === "attached" ? "drop" : "pass");
  const first = await connect(proxy.addr, { onIntent: (i) => void (persisted = i) });
  const ac = new AbortController();
  proxy.fromClient = (m) => {
    if (m.t === "attach") setTimeout(() => ac.abort(new Error("crash")), 50);
    return "pass";
  };
  const err = await first.attach(cred, { signal: ac.signal }).catch((e: unknown) => e);
  first.close();
  assert.ok(err instanceof InDoubtError, String(err));
  proxy.fromServer = () => "pass";
  proxy.fromClient = () => "pass";
  assert.ok(persisted);
  const intent = persisted as Intent;
  assert.equal(toHex(err.token!), toHex(intent.token), "the in-doubt error names the intent's token");
  // Presenting generation 1 with a new token would now be stale_authority:
  // the attach committed. The intent's token replays it.
  const second = await connect(server.tcp);
  try {
    const again = await second.attach(intent.presented!, { token: intent.token });
    assert.equal(again.generation, 3, "replayed generation 2, then attached with it");
    assert.ok((await second.tell(again, bytes("recovered"))) > 0);
  } finally {
    second.close();
  }
});

test("moved is followed to the owner with the same token", async () => {
  // A fake node that owns nothing: every request is moved to the real one.
  const fake = await FakeNode.start(() => proxy.addr);
  const conv = nextConv++;
  const c = await connect(fake.addr, fast);
  try {
    const from = proxy.log.length;
    const cred = await c.enroll(conv);
    const seq = await c.tell(cred, bytes("via the owner"));
    assert.ok(seq > 0);
    const enrollsAtFake = fake.seen.filter((m) => m.t === "enroll");
    const enrollsAtOwner = proxy.log.slice(from).filter((f) => f.dir === "c2s" && f.m.t === "enroll");
    assert.equal(enrollsAtFake.length, 1);
    assert.equal(enrollsAtOwner.length, 1);
    assert.equal(hex(enrollsAtOwner[0]!.m.token), hex(enrollsAtFake[0]!.token));
    assert.equal(fake.seen.filter((m) => m.t === "tell").length, 0, "the route stuck to the owner");
  } finally {
    c.close();
    await fake.close();
  }
});
