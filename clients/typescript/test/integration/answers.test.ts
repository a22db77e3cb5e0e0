// What the client tells the application must be true (issue 26): a call
// resolves only if it committed and nothing the client did on its own
// undid it; it is in doubt only if a request carrying its token reached
// the wire and no answer settled it; it is refused only if nothing was
// applied. Each test injects one fault through a real participantd and
// the frame proxy.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import {
  connect, toHex, InDoubtError, MovedError, NoBindingError, TooLargeError, UnavailableError, type ClientOptions, type Credential, type Delivery, type Intent, type LostError,
} from "../../src/index.js";
import { FakeNode, Proxy, Server, bytes, take, text, upTo, within } from "./harness.js";

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

let nextConv = 7000;
const fast: Partial<ClientOptions> = { minBackoffMs: 10, maxBackoffMs: 100 };
const pass = () => "pass" as const;
const reset = () => {
  proxy.fromClient = pass;
  proxy.fromServer = pass;
};

test("a detach whose answer is lost is replayed, and the participant is not bound again", async () => {
  const conv = nextConv++;
  const c = await connect(proxy.addr, fast);
  const w = await connect(server.tcp);
  const v = await connect(server.tcp);
  try {
    const d = await c.enroll(conv);
    const cw = await w.enroll(conv);
    await v.enroll(conv);
    let cuts = 0;
    proxy.fromServer = (m) => (m.t === "detached" && m.conversation === conv && cuts++ === 0 ? "cut" : "pass");
    const seq = await c.detach(d);
    reset();
    // A record after the detach: the witness v sees every event of d
    // up to it, in seq order.
    const x = await w.tell(cw, bytes("after the detach"));
    const seen = await upTo(v.deliveries(), x);
    const ofD = seen.filter((e) => e.participant === d.participant).map((e) => [e.kind, e.cause ?? ""]);
    assert.deepEqual(ofD.at(-1), ["detached", "clean"], `events of the detached participant: ${JSON.stringify(ofD)}`);
    assert.equal(seen.filter((e) => e.participant === d.participant && e.kind === "detached").at(-1)!.seq, seq);
    const attaches = proxy.log.filter((f) => f.dir === "c2s" && f.m.t === "attach" && f.m.conversation === conv);
    assert.equal(attaches.length, 0, "no attach after the detach was asked for");
  } finally {
    reset();
    c.close();
    w.close();
    v.close();
  }
});

test("a leave sent while the automatic re-attach is in flight waits for it and commits", async () => {
  const conv = nextConv++;
  const lost: LostError[] = [];
  const c = await connect(proxy.addr, { ...fast, onLost: (_, e) => void lost.push(e) });
  try {
    const p = await c.enroll(conv);
    let leaving: Promise<number> | null = null;
    let seen!: () => void;
    const attachSent = new Promise<void>((r) => (seen = r));
    proxy.fromClient = (m) => {
      if (m.t === "attach" && m.conversation === conv && leaving === null) {
        leaving = c.leave(p);
        seen();
      }
      return "pass";
    };
    proxy.cutAll(); // the client follows its participant: an attach minting generation 2
    await attachSent;
    const seq = await (leaving as unknown as Promise<number>);
    assert.ok(seq > 0);
    assert.deepEqual(lost, []);
    assert.equal(c.credential(conv, p.participant), undefined, "the client forgot the participant it left");
  } finally {
    reset();
    c.close();
  }
});

test("a leave whose answer is lost is replayed; onLost is not told of a participant the application left", async () => {
  const conv = nextConv++;
  const lost: LostError[] = [];
  const c = await connect(proxy.addr, { ...fast, onLost: (_, e) => void lost.push(e) });
  try {
    const p = await c.enroll(conv);
    let cuts = 0;
    proxy.fromServer = (m) => (m.t === "left" && m.conversation === conv && cuts++ === 0 ? "cut" : "pass");
    const from = proxy.log.length;
    const seq = await c.leave(p);
    reset();
    await c.ping(); // answers to requests sent before it have arrived
    const left = proxy.log.slice(from).filter((f) => f.dir === "s2c" && f.m.t === "left");
    assert.equal(left.at(-1)!.m.replay, "committed");
    assert.equal(left.at(-1)!.m.seq, seq);
    assert.deepEqual(lost.map((e) => e.cause.code), []);
    const attaches = proxy.log.slice(from).filter((f) => f.dir === "c2s" && f.m.t === "attach");
    assert.equal(attaches.length, 0, "no attach of a participant being left");
  } finally {
    reset();
    c.close();
  }
});

test("a tell every send of which was answered unavailable is unavailable, not in doubt", async () => {
  const conv = nextConv++;
  // Backoff of 200 to 400 ms: the caller gives up 50 ms after the
  // second refusal went out, while the client waits to retry, with no
  // request in flight (one in flight would rightly be in doubt).
  const c = await connect(proxy.addr, { minBackoffMs: 400, maxBackoffMs: 400 });
  try {
    const p = await c.enroll(conv);
    const ac = new AbortController();
    let sent = 0;
    proxy.fromClient = (m) => {
      if (m.t === "tell" && m.conversation === conv) {
        if (++sent === 2) setTimeout(() => ac.abort(new Error("caller gave up")), 50);
        proxy.inject({ t: "error", id: m.id, code: "unavailable", detail: "storage failing" });
        return "drop";
      }
      return "pass";
    };
    const err = await c.tell(p, bytes("never"), { signal: ac.signal }).catch((e: unknown) => e);
    assert.equal(sent, 2);
    assert.ok(!(err instanceof InDoubtError), `every answer said not applied, got ${String(err)}`);
    assert.ok(err instanceof UnavailableError, String(err));
  } finally {
    reset();
    c.close();
  }
});

test("a tell that never left the process (its re-attach refused unavailable) is not in doubt", async () => {
  const conv = nextConv++;
  let noticed!: () => void;
  const disconnected = new Promise<void>((r) => (noticed = r));
  const c = await connect(proxy.addr, { ...fast, onDisconnect: () => noticed() });
  try {
    const p = await c.enroll(conv);
    proxy.fromClient = (m) => {
      if (m.t === "attach" && m.conversation === conv) {
        proxy.inject({ t: "error", id: m.id, code: "unavailable", detail: "storage failing" });
        return "drop";
      }
      return "pass";
    };
    proxy.cutAll();
    await disconnected;
    const ac = new AbortController();
    let attaches = 0;
    const from = proxy.log.length;
    const inner = proxy.fromClient;
    proxy.fromClient = (m, reply) => {
      if (m.t === "attach" && ++attaches === 3) setTimeout(() => ac.abort(new Error("caller gave up")), 5);
      return inner(m, reply);
    };
    const err = await c.tell(p, bytes("never sent"), { signal: ac.signal }).catch((e: unknown) => e);
    assert.equal(proxy.log.slice(from).filter((f) => f.dir === "c2s" && f.m.t === "tell").length, 0);
    assert.ok(!(err instanceof InDoubtError), `nothing was sent, got ${String(err)}`);
  } finally {
    reset();
    c.close();
  }
});

test("a tell whose request was lost, then answered unavailable, stays in doubt", async () => {
  const conv = nextConv++;
  const c = await connect(proxy.addr, fast);
  try {
    const p = await c.enroll(conv);
    let first = true;
    proxy.fromClient = (m) => {
      if (m.t === "tell" && m.conversation === conv) {
        if (first) {
          first = false;
          return "cut"; // may have been applied, for all the client knows
        }
        proxy.inject({ t: "error", id: m.id, code: "unavailable", detail: "storage failing" });
        return "drop";
      }
      return "pass";
    };
    const err = await c.tell(p, bytes("maybe"), { signal: AbortSignal.timeout(500) }).catch((e: unknown) => e);
    assert.ok(err instanceof InDoubtError, String(err));
  } finally {
    reset();
    c.close();
  }
});

test("a participant re-attached behind another of the client's in the same conversation receives what the other saw", async () => {
  // One connection binds one participant per conversation: p1 is
  // detached while p2 reads, then attached again from its cursor.
  const conv = nextConv++;
  const c = await connect(server.tcp);
  const w = await connect(server.tcp);
  try {
    const cw = await w.enroll(conv);
    const p1 = await c.enroll(conv);
    const it = c.deliveries();
    const s1 = await w.tell(cw, bytes("one"));
    await upTo(it, s1, p1.participant);
    await c.detach(p1);
    const p2 = await c.enroll(conv);
    const s2 = await w.tell(cw, bytes("two"));
    await upTo(it, s2, p2.participant);
    await c.detach(p2);
    await c.attach(p1);
    const got = await upTo(it, s2, p1.participant, 5000);
    assert.deepEqual(got.filter((d) => d.kind === "record").map((d) => [d.recipient, text(d.payload)]), [[p1.participant, "two"]]);
  } finally {
    c.close();
    w.close();
  }
});

test("an ack below the cursor (a retry after a later ack) resolves with the cursor", async () => {
  const conv = nextConv++;
  const c = await connect(server.tcp);
  const w = await connect(server.tcp);
  try {
    const p = await c.enroll(conv);
    const cw = await w.enroll(conv);
    const s1 = await w.tell(cw, bytes("one"));
    const s2 = await w.tell(cw, bytes("two"));
    await take(c.deliveries(), 1, (d) => d.seq === s2);
    assert.equal(await c.ack(p, s2), s2);
    assert.equal(await c.ack(p, s1), s2, "ack_regression means acked");
    assert.equal(await c.ack(p, s2), s2, "noop means acked");
  } finally {
    c.close();
    w.close();
  }
});

test("a tell over max_frame or max_record_bytes is refused too_large before it is sent, once, and nothing else is disturbed", async () => {
  const conv = nextConv++;
  const c = await connect(proxy.addr, fast);
  try {
    const p = await c.enroll(conv);
    const other = await c.enroll(nextConv++);
    const from = proxy.log.length;
    const welcome = c.welcome(conv)!;
    for (const size of [welcome.max_frame + 1, welcome.max_record_bytes + 1]) {
      const err = await c.tell(p, new Uint8Array(size), { signal: AbortSignal.timeout(2000) }).catch((e: unknown) => e);
      assert.ok(err instanceof TooLargeError, `${size} bytes: ${String(err)}`);
      assert.equal(err.limit, welcome.max_record_bytes);
    }
    // Any request's frame is checked against max_frame (here an enroll's invite).
    const err = await c.enroll(nextConv++, { invite: new Uint8Array(welcome.max_frame), signal: AbortSignal.timeout(2000) }).catch((e: unknown) => e);
    assert.ok(err instanceof TooLargeError, String(err));
    assert.equal(err.limit, welcome.max_frame);
    const sent = proxy.log.slice(from).filter((f) => f.dir === "c2s");
    assert.deepEqual(sent.map((f) => f.m.t), [], "nothing sent, no reconnect");
    assert.ok((await c.tell(p, bytes("small"))) > 0);
    assert.ok((await c.tell(other, bytes("small"))) > 0);
    assert.equal(c.credential(conv, p.participant)!.generation, p.generation, "never re-attached");
  } finally {
    reset();
    c.close();
  }
});

test("two nodes naming each other as owner: moved is followed with backoff and a bound, then refused", async () => {
  let a: FakeNode | null = null;
  let b: FakeNode | null = null;
  a = await FakeNode.start(() => b!.addr);
  b = await FakeNode.start(() => a!.addr);
  const c = await connect([a.addr, b.addr], fast);
  try {
    const t0 = Date.now();
    const err = await c.enroll(nextConv++, { signal: AbortSignal.timeout(5000) }).catch((e: unknown) => e);
    const ms = Date.now() - t0;
    const n = [...a.seen, ...b.seen].filter((m) => m.t === "enroll").length;
    console.log(`# ${n} enrolls sent in ${ms} ms`);
    assert.ok(err instanceof MovedError, String(err));
    assert.ok(n <= 20, `${n} enrolls sent`);
  } finally {
    c.close();
    await a.close();
    await b.close();
  }
});

test("a failed onCredential leaves no credential in use; the enroll's token then replays it", async () => {
  const conv = nextConv++;
  const intents: Intent[] = [];
  let fail = true;
  const persisted: Credential[] = [];
  const c = await connect(server.tcp, {
    ...fast,
    onIntent: (i) => void intents.push(i),
    onCredential: (cr) => {
      if (fail) throw new Error("disk full");
      persisted.push(cr);
    },
  });
  const w = await connect(server.tcp);
  try {
    const err = await c.enroll(conv).catch((e: unknown) => e);
    assert.ok(err instanceof InDoubtError, String(err));
    assert.match(String((err as Error).cause), /disk full/);
    const [intent] = intents;
    assert.equal(c.credential(conv, 0), undefined, "the unpersisted credential is not held");
    const cw = await w.enroll(conv);
    const x = await w.tell(cw, bytes("to the unpersisted"));
    fail = false;
    const cred = await c.enroll(conv, { token: intent!.token });
    assert.equal(cred.participant, 0);
    assert.ok(persisted.some((p) => p.generation === cred.generation));
    // Every delivery surfaced for it carries a persisted credential.
    const got = await upTo(c.deliveries(), x, 0);
    for (const d of got) assert.ok(persisted.some((p) => p.generation === d.credential.generation), `delivery ${d.seq} with generation ${d.credential.generation}`);
    assert.ok((await c.tell(cred, bytes("persisted now"))) > 0);
  } finally {
    c.close();
    w.close();
  }
});

test("every request presents a generation onCredential persisted first, a failed onCredential of a re-attach included", async () => {
  const conv = nextConv++;
  const persisted = new Set<number>();
  let failNext = false;
  let release!: () => void;
  const failed = new Promise<void>((r) => (release = r));
  const c = await connect(proxy.addr, {
    ...fast,
    onCredential: (cr) => {
      if (failNext) {
        failNext = false;
        release();
        throw new Error("disk full");
      }
      persisted.add(cr.generation);
    },
  });
  const bad: string[] = [];
  try {
    const p = await c.enroll(conv);
    proxy.fromClient = (m) => {
      if (m.conversation === conv && typeof m.generation === "number" && !persisted.has(m.generation)) bad.push(`${String(m.t)} generation ${m.generation}`);
      return "pass";
    };
    failNext = true;
    proxy.cutAll(); // the follow's attach mints generation 2; its onCredential fails
    await failed;
    const seq = await c.tell(p, bytes("after"));
    assert.ok(seq > 0);
    assert.deepEqual(bad, []);
    assert.ok(persisted.has(c.credential(conv, p.participant)!.generation));
  } finally {
    reset();
    c.close();
  }
});

test("a compacted push repeated (a reconnect, a duplicate) reaches the application once", async () => {
  const conv = nextConv++;
  const c = await connect(proxy.addr, fast);
  const w = await connect(server.tcp);
  try {
    const p = await c.enroll(conv);
    const cw = await w.enroll(conv);
    const s1 = await w.tell(cw, bytes("one"));
    const it = c.deliveries();
    await take(it, 1, (d) => d.seq === s1);
    const push = { t: "compacted", conversation: conv, recipient: p.participant, first: s1 + 1 };
    proxy.inject(push);
    proxy.inject(push);
    const s2 = await w.tell(cw, bytes("two"));
    const got: Delivery[] = await upTo(it, s2, p.participant);
    assert.deepEqual(got.map((d) => [d.kind, d.first ?? d.seq]), [["compacted", s1 + 1], ["record", s2]]);
    assert.equal(text(got.at(-1)!.payload), "two");
  } finally {
    c.close();
    w.close();
  }
});

test("a call without a timeout of its own whose answer is dropped on an open connection is answered", async () => {
  const conv = nextConv++;
  const opts = { ...fast, answerTimeoutMs: 300 };
  const c = await connect(proxy.addr, opts);
  try {
    const p = await c.enroll(conv);
    let dropped = 0;
    proxy.fromServer = (m) => (m.t === "told" && dropped++ === 0 ? "drop" : "pass");
    const from = proxy.log.length;
    const seq = await within(c.tell(p, bytes("answer dropped")), 10_000, "tell");
    const told = proxy.log.slice(from).filter((f) => f.dir === "s2c" && f.m.t === "told");
    assert.equal(told.at(-1)!.m.replay, "committed");
    assert.equal(told.at(-1)!.m.seq, seq);
  } finally {
    reset();
    c.close();
  }
});

test("a call waiting for its participant's turn behind an unanswered attach ends when its signal does", async () => {
  const conv = nextConv++;
  let noticed!: () => void;
  const disconnected = new Promise<void>((r) => (noticed = r));
  let sent!: () => void;
  const attachSent = new Promise<void>((r) => (sent = r));
  const c = await connect(proxy.addr, { ...fast, onDisconnect: () => noticed() }); // answerTimeoutMs: 30 s
  try {
    const p = await c.enroll(conv);
    // The automatic re-attach goes out and is never answered; its
    // connection stays open.
    proxy.fromClient = (m) => {
      if (m.t === "attach" && m.conversation === conv) {
        sent();
        return "drop";
      }
      return "pass";
    };
    proxy.cutAll();
    await disconnected;
    await attachSent;
    const err = await within(c.tell(p, bytes("behind"), { signal: AbortSignal.timeout(300) }).catch((e: unknown) => e), 5000, "tell");
    assert.ok(!(err instanceof InDoubtError), `the tell never went out, got ${String(err)}`);
  } finally {
    reset();
    c.close();
  }
});

test("a detach whose request died with its connection is no_binding on retry, and the participant stays unbound", async () => {
  const conv = nextConv++;
  const c = await connect(proxy.addr, fast);
  try {
    const p = await c.enroll(conv);
    let cuts = 0;
    // The detach never reaches the server; the cut ends the binding (died).
    proxy.fromClient = (m) => (m.t === "detach" && m.conversation === conv && cuts++ === 0 ? "cut" : "pass");
    const from = proxy.log.length;
    const err = await c.detach(p).catch((e: unknown) => e);
    assert.ok(err instanceof NoBindingError, String(err));
    await assert.rejects(c.tell(p, bytes("not bound")), NoBindingError);
    await c.ping();
    const attaches = proxy.log.slice(from).filter((f) => f.dir === "c2s" && f.m.t === "attach");
    assert.equal(attaches.length, 0, "the client did not bind it again");
  } finally {
    reset();
    c.close();
  }
});

test("a tell whose re-attach's onCredential fails ends with that failure, not in doubt under another operation's token", async () => {
  const conv = nextConv++;
  let failing = false;
  let noticed!: () => void;
  const disconnected = new Promise<void>((r) => (noticed = r));
  const c = await connect(proxy.addr, {
    ...fast,
    onDisconnect: () => noticed(),
    onCredential: () => {
      if (failing) throw new Error("disk full");
    },
  });
  try {
    const p = await c.enroll(conv);
    failing = true;
    proxy.cutAll();
    await disconnected;
    const from = proxy.log.length;
    const err = await c.tell(p, bytes("never sent"), { signal: AbortSignal.timeout(2000) }).catch((e: unknown) => e);
    assert.equal(proxy.log.slice(from).filter((f) => f.dir === "c2s" && f.m.t === "tell").length, 0);
    assert.ok(!(err instanceof InDoubtError), `the tell never went out, got ${String(err)}`);
    assert.match(String(err), /onCredential failed: disk full/);
    // Once persisting works, the same attach is replayed, and the tell goes.
    failing = false;
    assert.ok((await c.tell(p, bytes("now"))) > 0);
    const attaches = proxy.log.slice(from).filter((f) => f.dir === "c2s" && f.m.t === "attach");
    assert.equal(new Set(attaches.map((f) => toHex(f.m.token as Uint8Array))).size, 1, "one attach intent, replayed");
  } finally {
    reset();
    c.close();
  }
});

// A tell and an ack sent while the client's own automatic re-attach is in
// flight (its answer held back, then let through) or in doubt (its answer
// lost with its connection): the re-attach commits first and mints the
// next generation, and the tell and the ack must still resolve, with that
// credential, never as the client's own stale_authority, and the
// participant is not lost (the Go client's race, merge 6452b6f).
for (const answer of ["in flight", "in doubt"] as const) {
  test(`a tell and an ack sent while the client's own re-attach is ${answer} commit with the credential it mints`, async () => {
    const conv = nextConv++;
    const lost: LostError[] = [];
    const c = await connect(proxy.addr, { ...fast, onLost: (_, e) => void lost.push(e) });
    const w = await connect(server.tcp);
    try {
      const p = await c.enroll(conv);
      const cw = await w.enroll(conv);
      const first = await w.tell(cw, bytes("to ack"));
      await take(c.deliveries(), 1, (d) => d.seq === first);
      let calls: Promise<[number, number]> | null = null;
      let held: (() => void) | null = null;
      let seen!: () => void;
      const attachSent = new Promise<void>((r) => (seen = r));
      proxy.fromClient = (m) => {
        if (m.t === "attach" && m.conversation === conv && calls === null) {
          calls = Promise.all([c.tell(p, bytes("while attaching")), c.ack(p, first)]);
          seen();
        }
        return "pass";
      };
      proxy.fromServer = (m) => {
        if (m.t !== "attached" || m.conversation !== conv || held !== null) return "pass";
        if (answer === "in doubt") {
          held = () => {};
          return "cut";
        }
        // Held back, so that the tell and the ack are asked for before
        // it arrives, then delivered.
        held = () => proxy.inject(m);
        return "drop";
      };
      proxy.cutAll(); // the client follows its participant: an attach minting generation 2
      await attachSent;
      if (answer === "in flight") {
        await new Promise((r) => setTimeout(r, 50));
        (held as unknown as () => void)();
      }
      const [seq, cursor] = await within(calls as unknown as Promise<[number, number]>, 20_000, "tell and ack");
      assert.ok(seq > first, `the tell committed after the first record (seq ${seq})`);
      assert.ok(cursor >= first, `the ack moved the cursor to ${cursor}`);
      assert.deepEqual(lost.map((e) => e.cause.code), [], "the participant is not lost");
      assert.ok((c.credential(conv, p.participant)?.generation ?? 0) >= 2, "the client holds the generation its re-attach minted");
    } finally {
      reset();
      c.close();
      w.close();
    }
  });
}

// A tell or an ack sent on the connection the participant is bound on,
// overtaken on its way by the client's own attach through another node (a
// moved sent another call of the participant there, whose attach minted
// generation 2): the server refuses it stale_authority, for a generation
// the client itself superseded. The call must wait for that attach and go
// again with the credential it minted (and its token), never report the
// client's own refusal, and the participant is not lost (the Go client's
// race, merge 6452b6f). Both failed before: StaleAuthorityError.
for (const kind of ["tell", "ack"] as const) {
  test(`a${kind === "ack" ? "n" : ""} ${kind} overtaken by the client's own attach through another node commits with the credential that attach minted`, async () => {
    const conv = nextConv++;
    const other = await Proxy.start(server.tcp);
    const lost: LostError[] = [];
    const c = await connect([proxy.addr, other.addr], { ...fast, onLost: (_, e) => void lost.push(e) });
    const w = await connect(server.tcp);
    try {
      const p = await c.enroll(conv);
      const sent = await w.tell(await w.enroll(conv), bytes("to ack"));
      const [first] = await take(c.deliveries(), 1, (d) => d.seq === sent);
      let deferred!: () => void;
      const requestDeferred = new Promise<void>((r) => (deferred = r));
      proxy.fromClient = (m) => {
        if (m.conversation !== conv) return "pass";
        if (m.t === kind && (kind === "ack" || text(m.payload as Uint8Array) === "overtaken")) {
          deferred();
          return "defer";
        }
        if (m.t === "tell" && text(m.payload as Uint8Array) === "mover") {
          proxy.inject({ t: "error", id: m.id, code: "moved", detail: "owned elsewhere", owner: other.addr });
          return "drop";
        }
        return "pass";
      };
      const overtaken: Promise<number> = kind === "tell" ? c.tell(p, bytes("overtaken")) : c.ack(p, first!.seq);
      await requestDeferred;
      // Moved to the other node, where the client attaches the
      // participant (generation 2) and the tell commits.
      await c.tell(p, bytes("mover"));
      assert.ok(other.log.some((f) => f.dir === "c2s" && f.m.t === "attach" && f.m.conversation === conv), "attached through the other node");
      proxy.forward(); // the first request, generation 1, reaches the server now
      const got = await within(overtaken.catch((e: unknown) => e), 20_000, `the overtaken ${kind}`);
      assert.equal(typeof got, "number", `the overtaken ${kind} ended ${String(got)}, want a seq or cursor`);
      assert.deepEqual(lost.map((e) => e.cause.code), [], "the participant is not lost");
    } finally {
      reset();
      c.close();
      w.close();
      await other.close();
    }
  });
}
