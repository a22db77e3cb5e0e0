// A session is one connection: the handshake, then requests matched to
// their answers by id (pipelined: any number in flight), and the pushes.

import {
  decodeFrame, encodeFrame, DEFAULT_MAX_FRAME,
  type Answer, type CompactedPush, type DeliveryPush, type RequestBody, type Request, type Welcome,
} from "./codec.js";
import { ProtocolError, RejectedError, TooLargeError } from "./errors.js";
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

/** What a session's owner sets: the bounds of its answers. */
export interface SessionOptions {
  /**
   * How long a request waits for its answer, not counting time the
   * session spent paused, before the session takes its connection for
   * broken and ends; negative: forever.
   */
  answerTimeoutMs: number;
}

interface Pending {
  resolve(a: Answer): void;
  reject(e: Error): void;
  /** When the request was sent, Date.now(). */
  at: number;
}

export class Session {
  readonly welcome: Welcome;
  /** dead resolves, with why, once the session ended. */
  readonly dead: Promise<Error>;
  private why: Error | null = null;
  private markDead!: (why: Error) => void;
  // Pending calls by id; a Map iterates in insertion order, so the first
  // entry is the oldest request still unanswered.
  private pending = new Map<number, Pending>();
  private answerTimer: ReturnType<typeof setTimeout> | null = null;
  private paused = false;
  // Time paused does not count against an answer: a request's wait starts
  // at the later of its send and the last resume.
  private resumedAt = 0;

  private constructor(readonly addr: string, private readonly t: Transport, welcome: Welcome,
    private readonly nextId: () => number, hooks: SessionHooks, private readonly so: SessionOptions) {
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
    nextId: () => number, hooks: SessionHooks, so: SessionOptions): Promise<Session> {
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
    return new Session(addr, t, welcome, nextId, hooks, so);
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
   * rejects with SessionLost when the session ends first (the request may
   * have been applied if it was sent), with the signal's reason when
   * signal aborts first (likewise), and with a TooLargeError, before
   * anything is sent, when the frame would exceed the server's max_frame.
   * onSent is called once the frame was handed to the connection: from
   * then on the request may be applied.
   */
  call(body: RequestBody, signal?: AbortSignal, onSent?: () => void): Promise<Answer> {
    if (this.why) return Promise.reject(new SessionLost(this.why.message));
    if (signal?.aborted) return Promise.reject(signal.reason);
    const id = this.nextId();
    const frame = encodeFrame({ ...body, id } as Request);
    if (frame.length - 4 > this.welcome.max_frame) {
      return Promise.reject(new TooLargeError("too_large", `a ${body.t} frame of ${frame.length - 4} bytes is over the server's max_frame`, { limit: this.welcome.max_frame }));
    }
    const p = new Promise<Answer>((resolve, reject) => {
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
        at: Date.now(),
      });
    });
    if (this.t.send(frame) === false) {
      // The transport ended under us: nothing went out; its onClose ends
      // the session, which rejects the call.
      return p;
    }
    onSent?.();
    this.armAnswerTimer();
    return p;
  }

  // armAnswerTimer makes sure a timer watches the oldest unanswered
  // request while there is one.
  private armAnswerTimer(): void {
    if (this.answerTimer !== null || this.so.answerTimeoutMs < 0 || this.why) return;
    this.answerTimer = setTimeout(() => {
      this.answerTimer = null;
      this.checkAnswers();
    }, this.so.answerTimeoutMs);
    (this.answerTimer as { unref?: () => void }).unref?.();
  }

  // checkAnswers ends the session when its oldest request has waited
  // answerTimeoutMs (paused time aside) for an answer on an open
  // connection: the server or the path to it lost it, and only a new
  // connection (the calls retry there, with their tokens) can tell.
  private checkAnswers(): void {
    const oldest = this.pending.values().next();
    if (oldest.done || this.why) return;
    if (!this.paused) {
      const waited = Date.now() - Math.max(oldest.value.at, this.resumedAt);
      if (waited >= this.so.answerTimeoutMs) {
        this.end(new SessionLost(`no answer from ${this.addr} within ${this.so.answerTimeoutMs} ms`));
        return;
      }
    }
    this.armAnswerTimer();
  }

  /** bye sends bye (the server ends this session's bindings as detached/clean), then ends the session. */
  bye(id: number): void {
    if (this.why) return;
    this.t.send(encodeFrame({ t: "bye", id }));
    this.end(new SessionLost("closed"));
  }

  pause(): void {
    this.paused = true;
    this.t.pause?.();
  }

  resume(): void {
    this.paused = false;
    this.resumedAt = Date.now();
    this.t.resume?.();
  }

  /** end ends the session once: every call in flight rejects with SessionLost. */
  end(why: Error): void {
    if (this.why) return;
    this.why = why;
    if (this.answerTimer !== null) clearTimeout(this.answerTimer);
    this.answerTimer = null;
    this.t.close();
    const lost = new SessionLost(why.message);
    for (const p of this.pending.values()) p.reject(lost);
    this.pending.clear();
    this.markDead(why);
  }
}
