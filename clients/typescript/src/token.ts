// Tokens: one per intended operation, drawn before its first send and
// reused on every retry (PROTOCOL.md, Tokens are bearer secrets; Token
// window).

let lastMs = 0;
let seqInMs = 0;

// Random bytes are drawn 4 KiB at a time: one getRandomValues call per
// 512 tokens rather than per token.
const pool = new Uint8Array(4096);
let poolAt = pool.length;

/**
 * newToken returns a UUIDv7 (RFC 9562): 48 bits of unix milliseconds, the
 * version, 12 bits that order the draws of one millisecond in this
 * process, the variant, then 62 random bits from crypto.getRandomValues.
 * An enroll's or attach's token is a bearer secret until its receipt
 * expires, hence the secure generator. Never all zero.
 */
export function newToken(now = Date.now()): Uint8Array {
  if (now > lastMs) {
    lastMs = now;
    seqInMs = 0;
  } else {
    seqInMs++;
    if (seqInMs > 0xfff) {
      // 4096 draws in one millisecond: borrow the next one, as the
      // clock will soon reach it.
      lastMs++;
      seqInMs = 0;
    }
  }
  const t = new Uint8Array(16);
  if (poolAt === pool.length) {
    crypto.getRandomValues(pool);
    poolAt = 0;
  }
  t.set(pool.subarray(poolAt, poolAt + 8), 8);
  pool.fill(0, poolAt, poolAt + 8); // a drawn byte is never handed out twice, nor kept
  poolAt += 8;
  const ms = lastMs;
  t[0] = Math.floor(ms / 2 ** 40) & 0xff;
  t[1] = Math.floor(ms / 2 ** 32) & 0xff;
  t[2] = (ms >>> 24) & 0xff;
  t[3] = (ms >>> 16) & 0xff;
  t[4] = (ms >>> 8) & 0xff;
  t[5] = ms & 0xff;
  t[6] = 0x70 | (seqInMs >>> 8);
  t[7] = seqInMs & 0xff;
  t[8] = 0x80 | (t[8]! & 0x3f);
  return t;
}

/** tokenTime returns the unix milliseconds a UUIDv7 token was drawn at. */
export function tokenTime(t: Uint8Array): number {
  let ms = 0;
  for (let i = 0; i < 6; i++) ms = ms * 256 + t[i]!;
  return ms;
}

/** toHex formats bytes as lowercase hex (a token: 32 digits, a secret: 64). */
export function toHex(b: Uint8Array): string {
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** fromHex parses hex digits; it throws on anything else. */
export function fromHex(s: string): Uint8Array {
  if (s.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(s)) throw new TypeError(`not hex: ${JSON.stringify(s.slice(0, 80))}`);
  const b = new Uint8Array(s.length / 2);
  for (let i = 0; i < b.length; i++) b[i] = parseInt(s.slice(2 * i, 2 * i + 2), 16);
  return b;
}
