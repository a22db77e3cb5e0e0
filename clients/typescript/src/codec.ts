// The wire codec of docs/PROTOCOL.md: a frame is a 4-byte big-endian
// length, then that many bytes of one msgpack map with string keys. The
// same frames travel over TCP (a stream of them) and over WebSocket (one
// frame per binary message, length prefix included).
//
// Decoding checks what the client relies on: the type `t`, and the type
// of every field it reads; unknown keys are ignored, unknown enumerated
// values (kind, cause, replay, reason) accepted. Unsigned integers become
// numbers; one above 2^53 - 1 cannot be held exactly and is a
// ProtocolError, except `incarnation`, a bigint (in cluster mode its high
// bits hold the node's ordinal).

import { Decoder, Encoder } from "@msgpack/msgpack";
import { ProtocolError } from "./errors.js";

/** The largest frame body before `welcome` announces max_frame. */
export const DEFAULT_MAX_FRAME = 1 << 20;

/** Length of a token (bin 16) and of a secret (bin 32). */
export const TOKEN_BYTES = 16;
export const SECRET_BYTES = 32;

// Client messages, in the field order of PROTOCOL.md's tables: the codec
// writes them in that order, as the server and the golden frames do.

export interface Hello { t: "hello"; versions: number[]; auth?: string; client?: string }
export interface Enroll { t: "enroll"; id: number; conversation: number; token: Uint8Array; invite?: Uint8Array }
export interface Attach { t: "attach"; id: number; conversation: number; participant: number; generation: number; secret: Uint8Array; token: Uint8Array }
export interface Tell { t: "tell"; id: number; conversation: number; participant: number; generation: number; token: Uint8Array; payload: Uint8Array }
export interface Ack { t: "ack"; id: number; conversation: number; participant: number; generation: number; through: number }
export interface Detach { t: "detach"; id: number; conversation: number; participant: number; generation: number; token: Uint8Array }
export interface Leave { t: "leave"; id: number; conversation: number; participant: number; generation: number; secret: Uint8Array; token: Uint8Array }
export interface Ping { t: "ping"; id: number }
export interface Bye { t: "bye"; id: number }

export type Request = Enroll | Attach | Tell | Ack | Detach | Leave | Ping | Bye;
export type ClientMessage = Hello | Request;

/** A request without its id: the client sets the id at every send. */
export type RequestBody = Request extends infer R ? (R extends Request ? Omit<R, "id"> : never) : never;

// Server messages.

export interface Welcome {
  t: "welcome"; version: number; server: string; incarnation: bigint; connection: number;
  max_frame: number; max_record_bytes: number; node?: string; token_window?: number; token_skew?: number;
}
export interface Rejected { t: "rejected"; reason: string; detail: string }
export interface Enrolled {
  t: "enrolled"; id: number; conversation: number; participant: number; generation: number;
  secret: Uint8Array; cursor: number; receipt_expires_at: number; replay?: string;
}
export interface Attached extends Omit<Enrolled, "t"> { t: "attached" }
export interface Told { t: "told"; id: number; conversation: number; seq: number; replay?: string }
export interface Acked { t: "acked"; id: number; conversation: number; participant: number; cursor: number; noop: boolean }
export interface Detached { t: "detached"; id: number; conversation: number; participant: number; seq: number; replay?: string }
export interface Left extends Omit<Detached, "t"> { t: "left" }
export interface Pong { t: "pong"; id: number }
export interface ErrorAnswer {
  t: "error"; id: number; code: string; detail: string;
  generation?: number; cursor?: number; limit?: number; participant?: number; reason?: string;
  oldest?: number; newest?: number; owner?: string; first?: number;
}
export interface DeliveryPush {
  t: "delivery"; conversation: number; recipient: number; seq: number; kind: string;
  participant: number; payload?: Uint8Array; cause?: string;
}
export interface CompactedPush { t: "compacted"; conversation: number; recipient: number; first: number }
export interface ByePush { t: "bye"; reason: string }

export type Answer = Enrolled | Attached | Told | Acked | Detached | Left | Pong | ErrorAnswer;
export type ServerMessage = Welcome | Rejected | Answer | DeliveryPush | CompactedPush | ByePush;

const encoder = new Encoder({ ignoreUndefined: true });

/**
 * encodeFrame returns m as a whole frame: its length, then its body. The
 * returned array is the caller's.
 */
export function encodeFrame(m: ClientMessage): Uint8Array {
  const body = encoder.encode(ordered(m));
  const frame = new Uint8Array(4 + body.length);
  new DataView(frame.buffer).setUint32(0, body.length);
  frame.set(body, 4);
  return frame;
}

// ordered rebuilds m with its keys in the protocol's order, whatever order
// the caller built it in.
function ordered(m: ClientMessage): Record<string, unknown> {
  switch (m.t) {
    case "hello": return { t: m.t, versions: m.versions, auth: m.auth, client: m.client };
    case "enroll": return { t: m.t, id: m.id, conversation: m.conversation, token: m.token, invite: m.invite };
    case "attach": return { t: m.t, id: m.id, conversation: m.conversation, participant: m.participant, generation: m.generation, secret: m.secret, token: m.token };
    case "tell": return { t: m.t, id: m.id, conversation: m.conversation, participant: m.participant, generation: m.generation, token: m.token, payload: m.payload };
    case "ack": return { t: m.t, id: m.id, conversation: m.conversation, participant: m.participant, generation: m.generation, through: m.through };
    case "detach": return { t: m.t, id: m.id, conversation: m.conversation, participant: m.participant, generation: m.generation, token: m.token };
    case "leave": return { t: m.t, id: m.id, conversation: m.conversation, participant: m.participant, generation: m.generation, secret: m.secret, token: m.token };
    case "ping": case "bye": return { t: m.t, id: m.id };
  }
}

/** frameLength reads the length prefix at the start of b. */
export function frameLength(b: Uint8Array): number {
  return new DataView(b.buffer, b.byteOffset, 4).getUint32(0);
}

/**
 * decodeFrame decodes a whole frame (length prefix included, as one
 * WebSocket message carries it). maxFrame bounds the body.
 */
export function decodeFrame(frame: Uint8Array, maxFrame = DEFAULT_MAX_FRAME): ServerMessage {
  if (frame.length < 4) throw new ProtocolError(`frame of ${frame.length} bytes has no length`);
  const n = frameLength(frame);
  if (n > maxFrame) throw new ProtocolError(`frame of ${n} bytes exceeds max_frame ${maxFrame}`);
  if (frame.length !== 4 + n) throw new ProtocolError(`frame announces ${n} bytes, carries ${frame.length - 4}`);
  return decodeBody(frame.subarray(4));
}

const decoder = new Decoder({ useBigInt64: true });

/** decodeBody decodes a frame body (without its length). */
export function decodeBody(body: Uint8Array): ServerMessage {
  let v: unknown;
  try {
    v = decoder.decode(body);
  } catch (e) {
    throw new ProtocolError(`undecodable frame: ${(e as Error).message}`);
  }
  if (typeof v !== "object" || v === null || Array.isArray(v) || v instanceof Uint8Array) {
    throw new ProtocolError("frame body is not a map");
  }
  const f = new Fields(v as Record<string, unknown>);
  const t = f.str("t");
  switch (t) {
    case "welcome": {
      const w: Welcome = {
        t, version: f.uint("version"), server: f.str("server"), incarnation: f.big("incarnation"),
        connection: f.uint("connection"), max_frame: f.uint("max_frame"), max_record_bytes: f.uint("max_record_bytes"),
      };
      return withOptional(w, { node: f.optStr("node"), token_window: f.optUint("token_window"), token_skew: f.optUint("token_skew") });
    }
    case "rejected": return { t, reason: f.str("reason"), detail: f.optStr("detail") ?? "" };
    case "enrolled": case "attached": {
      const a = {
        t, id: f.uint("id"), conversation: f.uint("conversation"), participant: f.uint("participant"),
        generation: f.uint("generation"), secret: f.bin("secret", SECRET_BYTES), cursor: f.uint("cursor"),
        receipt_expires_at: f.uint("receipt_expires_at"),
      };
      return withOptional(a, { replay: f.optStr("replay") }) as Enrolled | Attached;
    }
    case "told": return withOptional({ t, id: f.uint("id"), conversation: f.uint("conversation"), seq: f.uint("seq") }, { replay: f.optStr("replay") });
    case "acked": return { t, id: f.uint("id"), conversation: f.uint("conversation"), participant: f.uint("participant"), cursor: f.uint("cursor"), noop: f.bool("noop") };
    case "detached": case "left": {
      const a = { t, id: f.uint("id"), conversation: f.uint("conversation"), participant: f.uint("participant"), seq: f.uint("seq") };
      return withOptional(a, { replay: f.optStr("replay") }) as Detached | Left;
    }
    case "pong": return { t, id: f.uint("id") };
    case "error":
      return withOptional({ t, id: f.uint("id"), code: f.str("code"), detail: f.optStr("detail") ?? "" }, {
        generation: f.optUint("generation"), cursor: f.optUint("cursor"), limit: f.optUint("limit"),
        participant: f.optUint("participant"), reason: f.optStr("reason"), oldest: f.optUint("oldest"),
        newest: f.optUint("newest"), owner: f.optStr("owner"), first: f.optUint("first"),
      });
    case "delivery":
      return withOptional({
        t, conversation: f.uint("conversation"), recipient: f.uint("recipient"), seq: f.uint("seq"),
        kind: f.str("kind"), participant: f.uint("participant"),
      }, { payload: f.optBin("payload"), cause: f.optStr("cause") });
    case "compacted": return { t, conversation: f.uint("conversation"), recipient: f.uint("recipient"), first: f.uint("first") };
    case "bye": return { t, reason: f.optStr("reason") ?? "" };
    default: throw new ProtocolError(`unknown server message ${JSON.stringify(t.slice(0, 64))}`);
  }
}

// withOptional adds the optional fields that are present, in order.
function withOptional<T extends object>(m: T, opt: Record<string, unknown>): T {
  const out: Record<string, unknown> = { ...(m as Record<string, unknown>) };
  for (const [k, v] of Object.entries(opt)) if (v !== undefined) out[k] = v;
  return out as T;
}

// Fields reads typed fields of a decoded map; nil counts as absent.
class Fields {
  constructor(private readonly m: Record<string, unknown>) {}
  private get(k: string): unknown {
    return Object.prototype.hasOwnProperty.call(this.m, k) ? this.m[k] : undefined;
  }
  private missing(k: string, want: string): never {
    throw new ProtocolError(`field ${JSON.stringify(k)}: missing or not ${want}`);
  }
  str(k: string): string { const v = this.optStr(k); return v ?? this.missing(k, "a string"); }
  optStr(k: string): string | undefined {
    const v = this.get(k);
    if (v === undefined || v === null) return undefined;
    return typeof v === "string" ? v : this.missing(k, "a string");
  }
  bool(k: string): boolean { const v = this.get(k); return typeof v === "boolean" ? v : this.missing(k, "a bool"); }
  uint(k: string): number { const v = this.optUint(k); return v ?? this.missing(k, "an unsigned integer"); }
  optUint(k: string): number | undefined {
    const v = this.get(k);
    if (v === undefined || v === null) return undefined;
    if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return v;
    if (typeof v === "bigint" && v >= 0n && v <= BigInt(Number.MAX_SAFE_INTEGER)) return Number(v);
    return this.missing(k, "an unsigned integer below 2^53");
  }
  big(k: string): bigint {
    const v = this.get(k);
    if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return BigInt(v);
    if (typeof v === "bigint" && v >= 0n) return v;
    return this.missing(k, "an unsigned integer");
  }
  bin(k: string, len: number): Uint8Array {
    const v = this.optBin(k);
    if (v === undefined || v.length !== len) this.missing(k, `bin of ${len} bytes`);
    return v;
  }
  optBin(k: string): Uint8Array | undefined {
    const v = this.get(k);
    if (v === undefined || v === null) return undefined;
    return v instanceof Uint8Array ? v : this.missing(k, "bin");
  }
}

/**
 * FrameReader cuts a byte stream (TCP) into whole frames. push returns the
 * frames completed so far; a header announcing more than maxFrame throws
 * before its body is read.
 */
export class FrameReader {
  private buf: Uint8Array = new Uint8Array(0);
  maxFrame = DEFAULT_MAX_FRAME;

  push(chunk: Uint8Array): Uint8Array[] {
    this.buf = this.buf.length === 0 ? chunk : concat(this.buf, chunk);
    const frames: Uint8Array[] = [];
    while (this.buf.length >= 4) {
      const n = frameLength(this.buf);
      if (n > this.maxFrame) throw new ProtocolError(`frame of ${n} bytes exceeds max_frame ${this.maxFrame}`);
      if (this.buf.length < 4 + n) break;
      frames.push(this.buf.slice(0, 4 + n));
      this.buf = this.buf.subarray(4 + n);
    }
    return frames;
  }
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}
