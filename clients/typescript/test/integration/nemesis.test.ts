// The client's fault model (issue 26): one client runs a workload on a
// real participantd through two frame proxies (two "nodes" of one server)
// while a nemesis kills and restarts the server, holds every frame (a
// pause), drops answers on open connections, cuts connections, and makes
// the two addresses name each other in moved storms; some tells are over
// max_record_bytes. Afterwards the server's history is read back (its
// records through a witness participant that never acks, its
// participants with participantctl inspect, offline) and every call's
// answer is checked against it:
//
//   - a success committed, and nothing the client did on its own undid it
//     (a detached participant is not bound again by the client);
//   - a refusal (anything but InDoubtError) applied nothing;
//   - no call outlived its own timeout by more than a little;
//   - every record addressed to the reader held throughout reached the
//     application once per seq; nothing reached a detached participant
//     before the application attached it again;
//   - onLost was never told (nobody else took a participant), a left
//     participant is retired.
//
// TS_NEMESIS_SECONDS sets how long the nemesis runs (default 6; npm run
// test:nemesis runs 60).

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import {
  connect, InDoubtError, TooLargeError, type Client, type Credential, type Delivery, type LostError,
} from "../../src/index.js";
import { Proxy, Server, bytes, inspect, text } from "./harness.js";

const SECONDS = Number(process.env.TS_NEMESIS_SECONDS ?? "6");
const CALL_MS = 2500; // each call's own timeout
const SLACK_MS = 1000; // how late past it a call may settle
const CONVS = [8001, 8002];

let server: Server;
let p1: Proxy;
let p2: Proxy;
before(async () => {
  server = await Server.start();
  p1 = await Proxy.start(server.tcp);
  p2 = await Proxy.start(server.tcp);
});
after(async () => {
  await p1.close();
  await p2.close();
  await server.stop();
});

// Outcome is one call's final answer: after in_doubt the workload asks
// again with the token until the answer settles (or gives up, in doubt).
interface Outcome {
  op: "tell" | "detach" | "attach" | "leave";
  conv: number;
  participant: number;
  payload?: string;
  seq?: number;
  err?: unknown;
  /** The longest any one call of it took, ms. */
  ms: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const rnd = (n: number) => Math.floor(Math.random() * n);

test(`the client under a nemesis for ${SECONDS} s: every answer agrees with the server's history`, async () => {
  // One client per role: a connection binds one participant per
  // conversation.
  const lost: [Credential, LostError][] = [];
  const opts = {
    minBackoffMs: 20, maxBackoffMs: 300, answerTimeoutMs: 800, dialTimeoutMs: 1000, backlogWaitMs: 1000,
    bindingCheckIntervalMs: 500, onLost: (cr: Credential, e: LostError) => void lost.push([cr, e]),
  };
  const [ca, cr, cd, cl] = await Promise.all([0, 1, 2, 3].map(() => connect([p1.addr, p2.addr], opts)));
  const clients = [ca!, cr!, cd!, cl!];
  const boot = await connect(server.tcp);
  const witness = new Map<number, Credential>();
  for (const v of CONVS) witness.set(v, await boot.enroll(v));
  boot.close(); // the witnesses detach, and keep every record until they read them

  const outcomes: Outcome[] = [];
  let worst = 0;
  // call runs f with its own timeout and, while it is in doubt, again
  // with its token, at most 6 times.
  const call = async <T>(o: Omit<Outcome, "ms">, f: (co: { signal: AbortSignal; token?: Uint8Array }) => Promise<T>): Promise<Outcome> => {
    let token: Uint8Array | undefined;
    let ms = 0;
    for (let i = 0; ; i++) {
      const t0 = Date.now();
      const r = await f({ signal: AbortSignal.timeout(CALL_MS), ...(token ? { token } : {}) }).then((v) => ({ v }), (err: unknown) => ({ err }));
      ms = Math.max(ms, Date.now() - t0);
      worst = Math.max(worst, ms);
      if ("v" in r) return record({ ...o, seq: r.v as number, ms });
      if (!(r.err instanceof InDoubtError) || i === 5) return record({ ...o, err: r.err, ms });
      token = r.err.token;
    }
  };
  const record = (o: Outcome) => (outcomes.push(o), o);

  // Per conversation: a writer, a reader held bound throughout, a cycler
  // (tell, detach, attach again), and a leaver that leaves midway.
  const roles = new Map<number, { a: Credential; r: Credential; d: Credential; l: Credential }>();
  for (const v of CONVS) roles.set(v, { a: await ca!.enroll(v), r: await cr!.enroll(v), d: await cd!.enroll(v), l: await cl!.enroll(v) });
  // The application's view of each cycler: the seq its last detach
  // returned, until it calls attach again.
  const detachedAt = new Map<string, number>();
  const violations: string[] = [];
  const got = new Map<string, number[]>(); // deliveries per conv/recipient
  let stop = false;

  const consume = async (c: Client) => {
    let n = 0;
    for await (const d of c.deliveries() as AsyncIterable<Delivery>) {
      if (d.kind === "compacted") continue;
      const k = `${d.conversation}/${d.recipient}`;
      const seqs = got.get(k) ?? [];
      if (seqs.length > 0 && d.seq <= seqs.at(-1)!) violations.push(`${k}: seq ${d.seq} after ${seqs.at(-1)}`);
      seqs.push(d.seq);
      got.set(k, seqs);
      const at = detachedAt.get(k);
      if (at !== undefined && d.seq > at) violations.push(`${k}: delivery ${d.seq} after its detach at ${at}, before the application attached it`);
      if (++n % 7 === 0) void c.ack(d.credential, d.seq, { signal: AbortSignal.timeout(CALL_MS) }).catch(() => {});
    }
  };
  const consumers = clients.map(consume);
  const writer = async (v: number) => {
    const { a } = roles.get(v)!;
    for (let i = 0; !stop; i++) {
      if (i % 9 === 8) {
        const o = await call({ op: "tell", conv: v, participant: a.participant, payload: "oversized" }, (co) => ca!.tell(a, new Uint8Array((1 << 19) + 1), co));
        // The limit is the welcome's of the session the call gets: a call
        // that got none before its deadline (the server down, a pause) ends
        // with its signal's reason, unsent, and only then.
        const unsentAtDeadline = (o.err as { name?: string } | undefined)?.name === "TimeoutError" && o.ms >= CALL_MS;
        if (!(o.err instanceof TooLargeError) && !unsentAtDeadline) violations.push(`oversized tell: ${String(o.err ?? o.seq)} after ${o.ms} ms`);
        continue;
      }
      const payload = `${v}/a/${i}`;
      await call({ op: "tell", conv: v, participant: a.participant, payload }, (co) => ca!.tell(a, bytes(payload), co));
    }
  };

  const cycler = async (v: number) => {
    const { d } = roles.get(v)!;
    const k = `${v}/${d.participant}`;
    for (let i = 0; !stop; i++) {
      const payload = `${v}/d/${i}`;
      await call({ op: "tell", conv: v, participant: d.participant, payload }, (co) => cd!.tell(d, bytes(payload), co));
      const o = await call({ op: "detach", conv: v, participant: d.participant }, (co) => cd!.detach(d, co));
      if (o.seq !== undefined) detachedAt.set(k, o.seq);
      else if (!(o.err instanceof InDoubtError) && (o.err as { code?: string })?.code !== "no_binding") continue; // still bound
      await sleep(50 + rnd(100)); // records meanwhile must not reach it
      detachedAt.delete(k);
      for (let j = 0; j < 20 && !stop; j++) {
        const at = await call({ op: "attach", conv: v, participant: d.participant }, (co) => cd!.attach(d, co));
        if (at.seq !== undefined || at.err === undefined) break;
      }
    }
    // It ends detached: the end state must show it unbound.
    for (let j = 0; j < 20; j++) {
      const o = await call({ op: "detach", conv: v, participant: d.participant }, (co) => cd!.detach(d, co));
      if (o.seq !== undefined || (o.err as { code?: string })?.code === "no_binding") return;
      if ((o.err as { code?: string })?.code === undefined && !(o.err instanceof InDoubtError)) return;
    }
  };

  const leaver = async (v: number) => {
    const { l } = roles.get(v)!;
    await sleep(rnd(SECONDS * 1000));
    for (let j = 0; j < 20; j++) {
      const o = await call({ op: "leave", conv: v, participant: l.participant }, (co) => cl!.leave(l, co));
      if (o.seq !== undefined) return;
    }
  };

  const faults: string[] = [];
  const nemesis = async () => {
    const until = Date.now() + SECONDS * 1000;
    const kinds = ["kill", "hold", "drop", "cut", "moved"];
    for (let i = 0; Date.now() < until; i++) {
      const kind = kinds[i < kinds.length ? i : rnd(kinds.length)]!;
      faults.push(kind);
      switch (kind) {
        case "kill":
          await server.kill();
          await server.restart();
          break;
        case "hold":
          p1.hold();
          p2.hold();
          await sleep(1200);
          p1.release();
          p2.release();
          break;
        case "drop": {
          const drop = (m: Record<string, unknown>) => (m.id !== undefined && Math.random() < 0.3 ? "drop" : "pass");
          p1.fromServer = drop;
          p2.fromServer = drop;
          await sleep(1000);
          p1.fromServer = () => "pass";
          p2.fromServer = () => "pass";
          break;
        }
        case "cut":
          p1.cutAll();
          p2.cutAll();
          break;
        case "moved": {
          const storm = (other: Proxy) => (m: Record<string, unknown>, reply: (r: Record<string, unknown>) => void) => {
            if (m.id === undefined || m.t === "ping" || m.t === "bye") return "pass" as const;
            reply({ t: "error", id: m.id, code: "moved", detail: "storm", owner: other.addr });
            return "drop" as const;
          };
          p1.fromClient = storm(p2);
          p2.fromClient = storm(p1);
          await sleep(1000);
          p1.fromClient = () => "pass";
          p2.fromClient = () => "pass";
          break;
        }
      }
      await sleep(200 + rnd(300));
    }
    stop = true;
  };

  await Promise.all([nemesis(), ...CONVS.flatMap((v) => [writer(v), cycler(v), leaver(v)])]);
  console.log(`# faults: ${faults.join(" ")}; ${outcomes.length} calls, the longest ${worst} ms`);

  // A last record per conversation, once the faults are over: the reader
  // has everything up to it once it arrives.
  const last = new Map<number, number>();
  for (const v of CONVS) {
    const { a } = roles.get(v)!;
    for (let j = 0; j < 10 && !last.has(v); j++) {
      const o = await call({ op: "tell", conv: v, participant: a.participant, payload: `${v}/a/last` }, (co) => ca!.tell(a, bytes(`${v}/a/last`), co));
      if (o.seq !== undefined) last.set(v, o.seq);
    }
    assert.ok(last.has(v), `conversation ${v}: the last tell never succeeded`);
  }
  const deadline = Date.now() + 20_000;
  for (const v of CONVS) {
    const k = `${v}/${roles.get(v)!.r.participant}`;
    while ((got.get(k)?.at(-1) ?? 0) < last.get(v)! && Date.now() < deadline) await sleep(50);
  }
  for (const c of clients) c.close();
  await Promise.all(consumers);

  // The server's history: participants offline, records through the
  // witnesses after a restart.
  await server.halt();
  const report = inspect(server.data);
  await server.restart();
  const w = await connect(server.tcp);
  const history = new Map<number, Delivery[]>();
  try {
    const it = w.deliveries();
    for (const v of CONVS) {
      const lastSeq = report.conversations.find((r) => r.conversation_id === v)!.last_seq;
      await w.attach(witness.get(v)!);
      const recs: Delivery[] = [];
      while ((recs.at(-1)?.seq ?? 0) < lastSeq) {
        const r = await it.next();
        if (r.done) break;
        if (r.value.conversation === v) recs.push(r.value);
      }
      history.set(v, recs);
    }
  } finally {
    w.close();
  }

  // Every call's answer against the history.
  const bySeq = new Map<string, Delivery>();
  const byPayload = new Map<string, Delivery[]>();
  for (const [v, recs] of history) {
    for (const d of recs) {
      bySeq.set(`${v}@${d.seq}`, d);
      if (d.kind === "record") {
        const p = text(d.payload);
        byPayload.set(p, [...(byPayload.get(p) ?? []), d]);
      }
    }
  }
  const counts: Record<string, number> = {};
  for (const o of outcomes) {
    const verdict = o.err === undefined ? "ok" : o.err instanceof InDoubtError ? "in_doubt" : (o.err as { code?: string }).code ?? (o.err as Error).name;
    counts[`${o.op} ${verdict}`] = (counts[`${o.op} ${verdict}`] ?? 0) + 1;
    if (o.ms > CALL_MS + SLACK_MS) violations.push(`${o.op} took ${o.ms} ms, past its ${CALL_MS} ms`);
    if (o.op === "tell" && o.payload !== "oversized") {
      const found = byPayload.get(o.payload!) ?? [];
      if (found.length > 1) violations.push(`tell ${o.payload} applied ${found.length} times`);
      if (o.err === undefined && (found.length !== 1 || found[0]!.seq !== o.seq)) violations.push(`tell ${o.payload} answered seq ${o.seq}, history has ${found.map((d) => d.seq)}`);
      if (o.err !== undefined && !(o.err instanceof InDoubtError) && found.length > 0) violations.push(`tell ${o.payload} refused (${String(o.err)}) but applied at ${found[0]!.seq}`);
    }
    if ((o.op === "detach" || o.op === "leave") && o.err === undefined) {
      const d = bySeq.get(`${o.conv}@${o.seq}`);
      const want = o.op === "detach" ? "detached" : "left";
      if (d?.kind !== want || d.participant !== o.participant) violations.push(`${o.op} of ${o.participant} answered seq ${o.seq}, history has ${d?.kind} of ${d?.participant}`);
    }
  }
  for (const v of CONVS) {
    const { r, d, l } = roles.get(v)!;
    const rep = report.conversations.find((x) => x.conversation_id === v)!;
    const pd = rep.participants.find((x) => x.participant === d.participant)!;
    const pl = rep.participants.find((x) => x.participant === l.participant)!;
    // The cycler ended detached; nothing bound it again.
    if (pd.bound) violations.push(`conversation ${v}: the cycler ended bound (generation ${pd.generation})`);
    const lastOfD = history.get(v)!.filter((x) => x.participant === d.participant && x.kind !== "record").at(-1);
    if (lastOfD && lastOfD.kind === "attached") violations.push(`conversation ${v}: the cycler's last event is attached`);
    if (!pl.retired && outcomes.some((o) => o.op === "leave" && o.conv === v && o.err === undefined)) violations.push(`conversation ${v}: left but not retired`);
    // The reader: every record and event of others after it joined, up
    // to the last tell, once.
    const joinR = history.get(v)!.find((x) => x.kind === "joined" && x.participant === r.participant)!.seq;
    const want = history.get(v)!.filter((x) => x.seq > joinR && x.seq <= last.get(v)! && x.participant !== r.participant).map((x) => x.seq);
    const seqs = got.get(`${v}/${r.participant}`) ?? [];
    assert.deepEqual(seqs.filter((s) => s <= last.get(v)!), want, `conversation ${v}: the reader's deliveries`);
  }
  console.log(`# ${JSON.stringify(counts)}`);
  assert.deepEqual(lost.map(([cr, e]) => `${cr.conversation}/${cr.participant}: ${e.cause.code}`), [], "onLost");
  assert.deepEqual(violations, []);
});

export type { Client };
