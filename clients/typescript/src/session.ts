// A session is one connection: the handshake, then requests matched to
// their answers by id (pipelined: any number in flight), and the pushes.

import {
  decodeFrame, encodeFrame, DEFAULT_MAX_FRAME,
  type Answer, type CompactedPush, type DeliveryPush, type RequestBody, type Request, type Welcome,
} from "./codec.js";
import { ProtocolError, RejectedError } from "./errors.js";
import type { Dialer, Transport } from "./transport.js";

/** What a session hands its owner: pushes, and its end. */
export interface SessionHooks {
  delivery(s: Session, m: DeliveryPush): void;
  compacted(s: Session, m: CompactedPush): void;
}

/** SessionLost rejects the calls of a session that ended before their answer. */
export class SessionLost extends Error {
  override name = "SessionLost";
}

export class Session {
  readonly welcome: Welcome;
  /** dead resolves, with why, once the session ended. */
  readonly dead: Promise<Error>;
  private why: Error | null = null;
  private markDead!: (why: Error) => void;
  private pending = new Map<number, { resolve(a: Answer): void; reject(e: Error): void }>();

  private constructor(readonly addr: string, private readonly t: Transport, welcome: Welcome,
    private readonly nextId: () => number, hooks: SessionHooks) {
    this.welcome = welcome;
    this.dead = new Promise((r) => (this.markDead = r));
    t.maxFrame = welcome.max_frame;
    t.onFrame = (frame) => {
      let m;
      try {
        m = decodeFrame(frame, welcome.max_frame);
      } catch (e) {
        this.end(e as Error);
        return;
      }
      switch (m.t) {
        case "delivery": return hooks.delivery(this, m);
        case "compacted": return hooks.compacted(this, m);
        case "bye": return this.end(new SessionLost(`server said bye (${m.reason})`));
        case "welcome": case "rejected":
          return this.end(new ProtocolError(`${m.t} after the handshake`));
        default: {
          const p = this.pending.get(m.id);
          if (!p) return; // an answer to a call given up on (aborted)
          this.pending.delete(m.id);
          p.resolve(m);
        }
      }
    };
    t.onClose = (why) => this.end(why);
  }

  /**
   * open dials addr and runs the handshake. It throws a RejectedError when
   * the server refuses, or the dial's error.
   */
  static async open(dial: Dialer, addr: string, signal: AbortSignal, hello: { auth?: string; client?: string },
    nextId: () => number, hooks: SessionHooks): Promise<Session> {
    const t = await dial(addr, signal);
    const welcome = await new Promise<Welcome>((resolve, reject) => {
      const abort = () => {
        t.close();
        reject(signal.reason instanceof Error ? signal.reason : new Error("aborted"));
      };
      signal.addEventListener("abort", abort, { once: true });
      const done = () => signal.removeEventListener("abort", abort);
      t.onFrame = (frame) => {
        done();
        try {
          const m = decodeFrame(frame, DEFAULT_MAX_FRAME);
          if (m.t === "welcome") return resolve(m);
          t.close();
          if (m.t === "rejected") return reject(new RejectedError(m.reason, m.detail));
          reject(new ProtocolError(`${m.t} instead of welcome`));
        } catch (e) {
          t.close();
          reject(e);
        }
      };
      t.onClose = (why) => {
        done();
        reject(why);
      };
      t.send(encodeFrame({ t: "hello", versions: [1], auth: hello.auth, client: hello.client }));
    });
    return new Session(addr, t, welcome, nextId, hooks);
  }

  get alive(): boolean {
    return this.why === null;
  }

  /** reason is why the session ended, or null while alive. */
  get reason(): Error | null {
    return this.why;
  }

  /**
   * call sends body with a fresh id and resolves with its answer. It
   * rejects with SessionLost when the session ends first, and with the
   * signal's reason when signal aborts first (the request may have been
   * applied: the caller decides what that means).
   */
  call(body: RequestBody, signal?: AbortSignal): Promise<Answer> {
    if (this.why) return Promise.reject(new SessionLost(this.why.message));
    const id = this.nextId();
    const p = new Promise<Answer>((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const abort = () => {
        this.pending.delete(id);
        reject(signal!.reason);
      };
      signal?.addEventListener("abort", abort, { once: true });
      this.pending.set(id, {
        resolve: (a) => {
          signal?.removeEventListener("abort", abort);
          resolve(a);
        },
        reject: (e) => {
          signal?.removeEventListener("abort", abort);
          reject(e);
        },
      });
    });
    if (this.pending.has(id)) this.t.send(encodeFrame({ ...body, id } as Request));
    return p;
  }

  /** bye sends bye (the server ends this session's bindings as detached/clean), then ends the session. */
  bye(id: number): void {
    if (this.why) return;
    this.t.send(encodeFrame({ t: "bye", id }));
    this.end(new SessionLost("closed"));
  }

  pause(): void { this.t.pause?.(); }
  resume(): void { this.t.resume?.(); }

  /** end ends the session once: every call in flight rejects with SessionLost. */
  end(why: Error): void {
    if (this.why) return;
    this.why = why;
    this.t.close();
    const lost = new SessionLost(why.message);
    for (const p of this.pending.values()) p.reject(lost);
    this.pending.clear();
    this.markDead(why);
  }
}
