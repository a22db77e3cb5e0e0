// The integration tests' harness: a real participantd (the binary `make
// test-clients` builds, or one built here), and a TCP proxy that sees
// every frame and can drop, hold or cut.

import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, connect as netConnect, type Server as NetServer, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { decode, encode } from "@msgpack/msgpack";
import { FrameReader } from "../../src/index.js";

const pkg = fileURLToPath(new URL("../../../", import.meta.url));
const repo = join(pkg, "../..");

/**
 * binary returns the participantd binary: $TS_PARTICIPANTD_BIN, or
 * .bin/participantd, built if absent. (Not PARTICIPANTD_*: participantd
 * refuses to start with an environment variable of its prefix it does not
 * know, and the child inherits the environment.)
 */
export function binary(name = "participantd"): string {
  if (name === "participantd" && process.env.TS_PARTICIPANTD_BIN) return process.env.TS_PARTICIPANTD_BIN;
  const bin = join(pkg, ".bin", name);
  if (!existsSync(bin)) execFileSync("go", ["build", "-o", bin, `./cmd/${name}`], { cwd: repo, stdio: "inherit" });
  return bin;
}

/** freePort returns a loopback port free a moment ago (for a node that must advertise its address). */
export async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as { port: number }).port;
  await new Promise((r) => s.close(r));
  return port;
}

/** Etcd is cmd/etcd-dev: an embedded etcd of one member, for cluster mode. */
export class Etcd {
  endpoints = "";
  private proc: ChildProcess | null = null;
  private readonly data = mkdtempSync(join(tmpdir(), "participantd-ts-etcd-"));

  static async start(): Promise<Etcd> {
    const e = new Etcd();
    const p = spawn(binary("etcd-dev"), ["--members", "1", "--data", e.data], { stdio: ["ignore", "pipe", "ignore"] });
    e.proc = p;
    e.endpoints = await new Promise<string>((resolve, reject) => {
      let out = "";
      p.stdout!.on("data", (c: Buffer) => {
        out += c.toString();
        const i = out.indexOf("\n");
        if (i >= 0) resolve(out.slice(0, i).trim());
      });
      p.once("exit", (code) => reject(new Error(`etcd-dev exited (${code})`)));
    });
    return e;
  }

  async stop(): Promise<void> {
    const p = this.proc;
    if (p && p.exitCode === null) {
      const exited = new Promise((r) => p.once("exit", r));
      p.kill("SIGTERM");
      await exited;
    }
    rmSync(this.data, { recursive: true, force: true });
  }
}

/** Server is one participantd process over a data directory it keeps across restarts. */
export class Server {
  tcp = "";
  ws = "";
  private proc: ChildProcess | null = null;
  private exited: Promise<void> = Promise.resolve();
  /** The data directory, kept across restarts. */
  readonly data = mkdtempSync(join(tmpdir(), "participantd-ts-"));

  constructor(private readonly extra: string[] = []) {}

  static async start(extra: string[] = [], listen = "127.0.0.1:0"): Promise<Server> {
    const s = new Server(extra);
    await s.run(listen, "127.0.0.1:0");
    return s;
  }

  /** wsURL is the WebSocket URL of the server. */
  get wsURL(): string {
    return `ws://${this.ws}/`;
  }

  private run(listen: string, ws: string): Promise<void> {
    const p = spawn(binary(), [
      "--data", this.data, "--listen", listen, "--ws-listen", ws, "--health-listen", "127.0.0.1:0",
      "--wal-segment-size", "1048576", "--log-format", "json", ...this.extra,
    ], { stdio: ["ignore", "ignore", "pipe"] });
    this.proc = p;
    this.exited = new Promise((r) => p.once("exit", () => r()));
    return new Promise((resolve, reject) => {
      let buf = "";
      let all = "";
      let tcpUp = false;
      let wsUp = false;
      const onData = (chunk: Buffer) => {
        buf += chunk.toString();
        all = (all + chunk.toString()).slice(-4000);
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          let m: Record<string, unknown>;
          try {
            m = JSON.parse(line);
          } catch {
            continue;
          }
          if (m.message === "serving") {
            this.tcp = m.listen as string;
            tcpUp = true;
          }
          if (m.message === "serving WebSocket") {
            this.ws = m.ws_listen as string;
            wsUp = true;
          }
          if (tcpUp && wsUp) {
            p.stderr!.off("data", onData);
            p.stderr!.resume();
            resolve();
          }
        }
      };
      p.stderr!.on("data", onData);
      p.once("exit", (code) => reject(new Error(`participantd exited (${code}) before serving: ${all}`)));
    });
  }

  /** kill SIGKILLs the process and waits for it: nothing is drained. */
  async kill(): Promise<void> {
    this.proc?.kill("SIGKILL");
    await this.exited;
  }

  /** restart starts the process again on the same addresses and data. */
  async restart(): Promise<void> {
    for (let i = 0; ; i++) {
      try {
        return await this.run(this.tcp, this.ws);
      } catch (e) {
        if (i >= 20) throw e; // the port is still held by the previous process's sockets
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }

  /** halt ends the process (SIGTERM: a drain) and keeps the data, for inspect and restart. */
  async halt(): Promise<void> {
    if (this.proc?.exitCode === null && this.proc.signalCode === null) this.proc.kill("SIGTERM");
    await this.exited;
  }

  /** stop ends the process (SIGTERM: a drain) and removes the data. */
  async stop(): Promise<void> {
    if (this.proc?.exitCode === null && this.proc.signalCode === null) this.proc.kill("SIGTERM");
    await this.exited;
    rmSync(this.data, { recursive: true, force: true });
  }
}

/** What a proxy does with a frame. */
export type Verdict = "pass" | "drop" | "cut" | "defer";

type Msg = Record<string, unknown>;

/**
 * Proxy forwards TCP connections to target frame by frame, decoding each
 * (msgpack) for the hooks: fromClient and fromServer return a verdict for
 * every frame ("cut" drops it and cuts the connection, both ways; "defer"
 * keeps it until forward, frames after it passing it by); reply
 * sends a frame back to where m came from, as if from the other side.
 * While held, frames are kept, in order, until release.
 */
export class Proxy {
  addr = "";
  fromClient: (m: Msg, reply: (r: Msg) => void) => Verdict = () => "pass";
  fromServer: (m: Msg, reply: (r: Msg) => void) => Verdict = () => "pass";
  private held = false;
  private readonly heldFrames: (() => void)[] = [];
  private readonly deferred: (() => void)[] = [];
  /** Every frame seen, in order, with its direction. */
  readonly log: { dir: "c2s" | "s2c"; m: Msg }[] = [];
  private readonly conns = new Set<{ c: Socket; s: Socket }>();
  private server: NetServer | null = null;

  static async start(target: string): Promise<Proxy> {
    const p = new Proxy();
    const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
    p.server = createServer((c) => {
      const s = netConnect({ host, port });
      const pair = { c, s };
      p.conns.add(pair);
      const cut = () => {
        c.destroy();
        s.destroy();
        p.conns.delete(pair);
      };
      p.pipe(c, s, "c2s", cut);
      p.pipe(s, c, "s2c", cut);
      c.on("error", cut).on("close", cut);
      s.on("error", cut).on("close", cut);
    });
    await new Promise<void>((r) => p.server!.listen(0, "127.0.0.1", r));
    const a = p.server.address();
    if (a === null || typeof a === "string") throw new Error("proxy address");
    p.addr = `127.0.0.1:${a.port}`;
    return p;
  }

  private pipe(from: Socket, to: Socket, dir: "c2s" | "s2c", cut: () => void): void {
    const r = new FrameReader();
    r.maxFrame = 1 << 30;
    const reply = (m: Msg) => {
      if (!from.destroyed) from.write(frameOf(m));
    };
    const handle = (f: Uint8Array) => {
      const m = decode(f.subarray(4)) as Msg;
      this.log.push({ dir, m });
      const v = (dir === "c2s" ? this.fromClient : this.fromServer)(m, reply);
      if (v === "cut") return cut();
      if (v === "defer") this.deferred.push(() => void (to.destroyed || to.write(f)));
      if (v === "pass" && !to.destroyed) to.write(f);
    };
    from.on("data", (chunk: Buffer) => {
      for (const f of r.push(new Uint8Array(chunk))) {
        if (this.held) this.heldFrames.push(() => handle(f));
        else handle(f);
      }
    });
  }

  /** hold keeps every frame, both ways, until release: a pause of the path (or of the server) with connections open. */
  hold(): void {
    this.held = true;
  }

  /** release lets the held frames go, in order, and stops holding. */
  release(): void {
    this.held = false;
    for (const h of this.heldFrames.splice(0)) h();
  }

  /** forward lets the frames a "defer" verdict kept go on, in order: a request overtaken on its way. */
  forward(): void {
    for (const f of this.deferred.splice(0)) f();
  }

  /** inject sends m to every client connection, as if the server had. */
  inject(m: Msg): void {
    const f = frameOf(m);
    for (const { c } of this.conns) c.write(f);
  }

  /** cutAll cuts every connection. */
  cutAll(): void {
    for (const { c, s } of this.conns) {
      c.destroy();
      s.destroy();
    }
    this.conns.clear();
  }

  async close(): Promise<void> {
    this.cutAll();
    await new Promise((r) => this.server!.close(r));
  }
}

function frameOf(m: Msg): Buffer {
  const body = encode(m);
  const f = Buffer.alloc(4 + body.length);
  f.writeUInt32BE(body.length);
  f.set(body, 4);
  return f;
}

/** inspect runs participantctl inspect --json over a stopped server's data directory. */
export function inspect(data: string): InspectReport {
  const out = execFileSync(binary("participantctl"), ["inspect", "--data", data, "--json"], { encoding: "utf8" });
  return JSON.parse(out) as InspectReport;
}

/** InspectReport is what participantctl inspect --json prints (the fields the tests read). */
export interface InspectReport {
  conversations: {
    conversation_id: number;
    last_seq: number;
    participants: { participant: number; generation: number; retired: boolean; bound: boolean; cursor: number }[];
  }[];
}

/** take reads n deliveries that match pred from it, failing after ms. */
export async function take<T>(it: AsyncIterator<T>, n: number, pred: (d: T) => boolean = () => true, ms = 20_000): Promise<T[]> {
  const got: T[] = [];
  const deadline = Date.now() + ms;
  while (got.length < n) {
    const left = deadline - Date.now();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const r = await Promise.race([
      it.next(),
      new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error(`timed out with ${got.length} of ${n} deliveries`)), Math.max(left, 0)))),
    ]).finally(() => clearTimeout(timer));
    if (r.done) throw new Error(`deliveries ended after ${got.length} of ${n}`);
    if (pred(r.value)) got.push(r.value);
  }
  return got;
}

export const text = (b?: Uint8Array) => new TextDecoder().decode(b);
export const bytes = (s: string) => new TextEncoder().encode(s);

/**
 * FakeNode is a node that owns nothing: it welcomes, answers ping, and
 * answers every other request moved to owner() (absent when it returns
 * undefined). Every request it received is in seen.
 */
export class FakeNode {
  addr = "";
  readonly seen: Msg[] = [];
  private server: NetServer | null = null;
  private readonly socks = new Set<Socket>();

  static async start(owner: () => string | undefined): Promise<FakeNode> {
    const n = new FakeNode();
    n.server = createServer((sock: Socket) => {
      n.socks.add(sock);
      sock.on("close", () => n.socks.delete(sock));
      const r = new FrameReader();
      const send = (m: Msg) => {
        const body = encode(m);
        const f = Buffer.alloc(4 + body.length);
        f.writeUInt32BE(body.length);
        f.set(body, 4);
        sock.write(f);
      };
      sock.on("data", (chunk: Buffer) => {
        for (const f of r.push(new Uint8Array(chunk))) {
          const m = decode(f.subarray(4)) as Msg;
          n.seen.push(m);
          if (m.t === "hello") send({ t: "welcome", version: 1, server: "fake", incarnation: 1, connection: 1, max_frame: 1 << 20, max_record_bytes: 1 << 19, node: "fake" });
          else if (m.t === "ping") send({ t: "pong", id: m.id });
          else if (m.t !== "bye") send({ t: "error", id: m.id, code: "moved", detail: "owned elsewhere", owner: owner() });
        }
      });
      sock.on("error", () => {});
    });
    await new Promise<void>((r) => n.server!.listen(0, "127.0.0.1", r));
    n.addr = `127.0.0.1:${(n.server.address() as { port: number }).port}`;
    return n;
  }

  async close(): Promise<void> {
    for (const s of this.socks) s.destroy();
    await new Promise((r) => this.server!.close(r));
  }
}

/** upTo reads deliveries from it until one with seq `seq` (for recipient, when given), and returns them all. */
export async function upTo<T extends { seq: number; recipient: number }>(it: AsyncIterator<T>, seq: number, recipient?: number, ms = 20_000): Promise<T[]> {
  const got: T[] = [];
  await take(it, 1, (d) => {
    got.push(d);
    return d.seq === seq && (recipient === undefined || d.recipient === recipient);
  }, ms);
  return got;
}

/** within rejects with a timeout error if p has not settled in ms: a call that must not hang. */
export function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    p,
    new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error(`${what}: still pending after ${ms} ms`)), ms))),
  ]).finally(() => clearTimeout(timer));
}
