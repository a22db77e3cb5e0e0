// The codec against the golden frames of testdata/wire (the Go package
// wire pins the same bytes): every client message encodes to its file
// byte for byte, every server message decodes to the values it holds.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { decode, encode } from "@msgpack/msgpack";
import {
  AckGapError, CODES, FrameReader, MovedError, ProtocolError, ReceiptExpiredError, ServerError,
  StaleAuthorityError, TokenExpiredError, decodeFrame, encodeFrame, errorFromWire, newToken, tokenTime,
  type ClientMessage,
} from "../../src/index.js";

const dir = fileURLToPath(new URL("../../../../../testdata/wire/", import.meta.url));
const golden = (name: string) => new Uint8Array(readFileSync(dir + name));
const files = readdirSync(dir).filter((f) => f.endsWith(".bin"));

test("every client golden frame encodes byte for byte, whatever the key order given", () => {
  const clients = files.filter((f) => f.startsWith("client_"));
  assert.ok(clients.length >= 11, `found ${clients.length} client frames`);
  for (const f of clients) {
    const want = golden(f);
    const m = decode(want.subarray(4)) as Record<string, unknown>;
    // Rebuilt with the keys reversed: the codec owns the order.
    const shuffled = Object.fromEntries(Object.entries(m).reverse()) as unknown as ClientMessage;
    assert.deepEqual(encodeFrame(shuffled), want, f);
  }
});

test("every server golden frame decodes to its values", () => {
  const servers = files.filter((f) => f.startsWith("server_"));
  assert.ok(servers.length >= 40, `found ${servers.length} server frames`);
  for (const f of servers) {
    const b = golden(f);
    const m = decodeFrame(b) as unknown as Record<string, unknown>;
    const raw = decode(b.subarray(4), { useBigInt64: true }) as Record<string, unknown>;
    assert.deepEqual(Object.keys(m).sort(), Object.keys(raw).sort(), f);
    for (const [k, v] of Object.entries(raw)) {
      const want = typeof v === "bigint" && k !== "incarnation" ? Number(v) : k === "incarnation" ? BigInt(v as number) : v;
      assert.deepEqual(m[k], want instanceof Uint8Array ? new Uint8Array(want) : want, `${f}: ${k}`);
    }
    // Decoded then encoded again in the file's key order, the bytes are the file's.
    const again = encode(Object.fromEntries(Object.keys(raw).map((k) => [k, typeof m[k] === "bigint" ? Number(m[k]) : m[k]])));
    assert.deepEqual(again, b.subarray(4), `${f} re-encoded`);
  }
});

test("the worked exchange's values", () => {
  const w = decodeFrame(golden("server_welcome.bin"));
  assert.equal(w.t, "welcome");
  if (w.t !== "welcome") return;
  assert.equal(w.max_frame, 1 << 20);
  assert.equal(w.incarnation, 3n);
  const wc = decodeFrame(golden("server_welcome_cluster.bin"));
  assert.ok(wc.t === "welcome" && wc.incarnation === (1n << 40n) + 3n && wc.node === "node-a");
  const tw = decodeFrame(golden("server_welcome_token_window.bin"));
  assert.ok(tw.t === "welcome" && tw.token_window === 3_600_000 && tw.token_skew === 60_000);
  const e = decodeFrame(golden("server_enrolled.bin"));
  assert.ok(e.t === "enrolled" && e.secret.length === 32 && e.receipt_expires_at === 1767225600000 && e.replay === undefined);
  const d = decodeFrame(golden("server_delivery_record.bin"));
  assert.ok(d.t === "delivery" && d.seq === 2 && new TextDecoder().decode(d.payload) === "hi");
});

test("error answers become typed errors with their extras", () => {
  const err = (f: string) => {
    const m = decodeFrame(golden(f));
    assert.equal(m.t, "error");
    return errorFromWire(m as Extract<typeof m, { t: "error" }>);
  };
  const gap = err("server_error_ack_gap.bin");
  assert.ok(gap instanceof AckGapError && gap.cursor === 12 && gap.code === "ack_gap");
  const moved = err("server_error_moved.bin");
  assert.ok(moved instanceof MovedError && moved.owner === "127.0.0.1:7402");
  assert.ok(err("server_error_moved_no_owner.bin").owner === undefined);
  const re = err("server_error_receipt_expired.bin");
  assert.ok(re instanceof ReceiptExpiredError && re.participant === 7 && re.generation === 6 && re.reason === "superseded");
  const sa = err("server_error_stale_authority_secret.bin");
  assert.ok(sa instanceof StaleAuthorityError && sa.generation === undefined);
  const te = err("server_error_token_expired.bin");
  assert.ok(te instanceof TokenExpiredError && te.oldest === 1767225600000);
  assert.equal(err("server_error_compacted.bin").first, 300);
  assert.equal(err("server_error_backlog_full.bin").limit, 100000);
});

test("every code has its own class; an unknown code is a plain ServerError", () => {
  assert.equal(CODES.length, 22);
  const classes = new Set(CODES.map((code) => errorFromWire({ t: "error", id: 1, code, detail: "" }).constructor));
  assert.equal(classes.size, CODES.length);
  for (const code of CODES) assert.ok(errorFromWire({ t: "error", id: 1, code, detail: "" }) instanceof ServerError);
  const u = errorFromWire({ t: "error", id: 1, code: "from_the_future", detail: "" });
  assert.equal(u.constructor, ServerError);
  assert.equal(u.code, "from_the_future");
});

test("unknown keys are ignored and unknown enumerated values accepted", () => {
  const body = encode({ t: "delivery", conversation: 1, recipient: 2, seq: 3, kind: "teleported", participant: 4, extra: { x: [1, 2] } });
  const f = new Uint8Array(4 + body.length);
  new DataView(f.buffer).setUint32(0, body.length);
  f.set(body, 4);
  const m = decodeFrame(f);
  assert.ok(m.t === "delivery" && m.kind === "teleported" && !("extra" in m));
});

test("bad frames are ProtocolErrors", () => {
  const frame = (body: Uint8Array, len = body.length) => {
    const f = new Uint8Array(4 + body.length);
    new DataView(f.buffer).setUint32(0, len);
    f.set(body, 4);
    return f;
  };
  const told = golden("server_told.bin");
  const cases: [string, Uint8Array][] = [
    ["trailing bytes", frame(new Uint8Array([...told.subarray(4), 0xc0]))],
    ["not a map", frame(encode([1, 2]))],
    ["no t", frame(encode({ id: 1 }))],
    ["unknown t", frame(encode({ t: "surprise" }))],
    ["missing field", frame(encode({ t: "told", id: 1, conversation: 42 }))],
    ["negative seq", frame(encode({ t: "told", id: 1, conversation: 42, seq: -1 }))],
    ["seq beyond 2^53", frame(encode({ t: "told", id: 1, conversation: 42, seq: 2n ** 60n }, { useBigInt64: true }))],
    ["short secret", frame(encode({ t: "enrolled", id: 1, conversation: 1, participant: 0, generation: 1, secret: new Uint8Array(31), cursor: 0, receipt_expires_at: 1 }))],
    ["string where bin", frame(encode({ t: "delivery", conversation: 1, recipient: 2, seq: 3, kind: "record", participant: 4, payload: "hi" }))],
    ["length past the bytes", frame(told.subarray(4), told.length)],
    ["declared bin past the bytes", frame(new Uint8Array([0x81, 0xa1, 0x74, 0xc6, 0xff, 0xff, 0xff, 0xff]))],
  ];
  for (const [name, f] of cases) assert.throws(() => decodeFrame(f), ProtocolError, name);
  assert.throws(() => decodeFrame(frame(new Uint8Array(0), 2 << 20)), /exceeds max_frame/);
});

test("a stream cut anywhere yields the same frames; an oversized header is refused from the header alone", () => {
  const all = files.filter((f) => f.startsWith("server_")).map(golden);
  const stream = new Uint8Array(all.reduce((n, f) => n + f.length, 0));
  let at = 0;
  for (const f of all) {
    stream.set(f, at);
    at += f.length;
  }
  for (const step of [1, 3, 7, 64, stream.length]) {
    const r = new FrameReader();
    const got: Uint8Array[] = [];
    for (let i = 0; i < stream.length; i += step) got.push(...r.push(stream.slice(i, i + step)));
    assert.deepEqual(got, all, `chunks of ${step}`);
  }
  const r = new FrameReader();
  assert.throws(() => r.push(new Uint8Array([0x00, 0x20, 0x00, 0x00])), /exceeds max_frame/);
});

test("tokens are UUIDv7, time-ordered, never zero", () => {
  const now = Date.now();
  const ts = Array.from({ length: 5000 }, () => newToken(now));
  for (const t of ts) {
    assert.equal(t.length, 16);
    assert.equal(t[6]! >> 4, 7, "version");
    assert.equal(t[8]! >> 6, 2, "variant");
    assert.ok(t.some((x) => x !== 0));
  }
  assert.equal(tokenTime(ts[0]!), now);
  const hex = ts.map((t) => Buffer.from(t).toString("hex"));
  assert.deepEqual([...hex].sort(), hex, "drawn in order");
  assert.equal(new Set(hex).size, hex.length);
});
