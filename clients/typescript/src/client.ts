// Client: the participantd client for TypeScript, with the Go client's
// semantics (docs/clients.md; package client's doc):
//
//   - one token per intended operation (a UUIDv7), reused on every retry
//     of it: after a lost connection, an in_doubt answer, a moved, a
//     backlog_full, on whichever node the retry lands;
//   - onIntent sees an enroll's or attach's token before its first send,
//     onCredential every credential an enroll or attach minted, before the
//     call returns or the participant is used again;
//   - a participant held bound follows its binding: when its connection
//     ends (EOF, bye, a server restart) or its node no longer owns the
//     conversation (moved, or no_binding at the current generation from a
//     binding check), the client reconnects with backoff and attaches it
//     again with its latest credential, keeping the attach's token and
//     presented credential until its outcome is known;
//   - deliveries are an async iterator, deduplicated on (conversation,
//     recipient, seq), each with the credential to ack it with; a
//     compacted push is a delivery of kind "compacted", once per
//     (conversation, recipient, first);
//   - a call's answer is true: it resolves only if it committed and
//     nothing the client did on its own undid it (a detach or leave stops
//     the automatic re-attach before it is sent); it throws an
//     InDoubtError (with its token) only if a request carrying the token
//     was handed to a connection and no answer proved it not applied;
//     otherwise it throws the refusal, which committed nothing;
//   - every call takes an AbortSignal; a call with none is still bounded
//     by answerTimeoutMs per answer on an open connection, and every
//     retry loop backs off with jitter (moved too, at most maxMoves);
//     too_large, from the server or from the client's own check of
//     max_record_bytes and max_frame before sending, is final.
//
// JavaScript runs one callback at a time, so the client's state needs no
// locks; what must not interleave (two attaches of one participant, an
// attach and a leave) is chained on a promise per participant.

import type { Answer, CompactedPush, DeliveryPush, RequestBody, Welcome } from "./codec.js";
import {
  BacklogFullError, ClosedError, ConnectionLostError, InDoubtError, LostError, MovedError, NoBindingError,
  ProtocolError, RejectedError, ServerError, TooLargeError, errorFromWire,
} from "./errors.js";
import { Session, SessionLost } from "./session.js";
import { newToken } from "./token.js";
import type { Dialer } from "./transport.js";

/** Credential is what a participant presents to attach; every attach replaces generation and secret. */
export interface Credential {
  conversation: number;
  participant: number;
  generation: number;
  secret: Uint8Array;
}

/**
 * Intent is an enroll or attach about to be sent for the first time. A
 * caller that persists it durably can recover the answer after its own
 * crash: enroll again with { token }, or attach `presented` with { token }.
 */
export interface Intent {
  op: "enroll" | "attach";
  conversation: number;
  /** The credential an attach presents; absent for an enroll. */
  presented?: Credential;
  token: Uint8Array;
}

/** Delivery is one record (or lifecycle event, or compacted notice) pushed to a participant the client holds. */
export interface Delivery {
  conversation: number;
  /** The participant it is addressed to. */
  recipient: number;
  /** 0 for kind "compacted". */
  seq: number;
  /** record, joined, attached, detached, died, left, or compacted; accept others. */
  kind: string;
  /** The sender of a record, or the participant a lifecycle event is about. */
  participant: number;
  payload?: Uint8Array;
  /** Why a binding ended, for detached and died. */
  cause?: string;
  /** For kind "compacted": records below it no longer exist. Do not ack a compacted delivery. */
  first?: number;
  /** The latest credential held for the recipient when it arrived: ack with it. */
  credential: Credential;
}

export interface ClientOptions {
  /** How to open a connection; set by the entry point (Node: TCP or ws; browser: WebSocket). */
  dial: Dialer;
  /** Sent in hello when set. */
  auth?: string;
  /** Sent in hello, for the server's logs. */
  clientName?: string;
  /** Bounds of the exponential backoff (with jitter) between reconnections and retries. Defaults 50 ms and 5 s. */
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** Bounds one connection attempt, handshake included. Default 10 s. */
  dialTimeoutMs?: number;
  /** How long backlog_full is retried (same token) before BacklogFullError. Default 30 s; negative: not retried. */
  backlogWaitMs?: number;
  /** How often each bound participant's binding is checked (an ack at its cursor). Default 30 s; negative: never. */
  bindingCheckIntervalMs?: number;
  /**
   * How long a request waits for its answer on an open connection (time
   * the client spent not reading it, backpressure, aside) before the
   * client takes the connection for broken: it ends it, and every call in
   * flight on it retries with its token on a new one. Default 30 s;
   * negative: forever.
   */
  answerTimeoutMs?: number;
  /**
   * How many moved answers one call follows before it throws the last
   * MovedError (nothing was done): the first at once, each further one
   * after a backoff. Default 16.
   */
  maxMoves?: number;
  /** Deliveries queued unread before the client stops reading its connections (answers then wait too). Default 65536. */
  maxQueuedDeliveries?: number;
  /** Payload bytes of deliveries queued unread before the client stops reading its connections. Default 64 MiB. */
  maxQueuedDeliveryBytes?: number;
  /** Maps a moved owner's wire address to the address to dial (a WebSocket URL, say). Default: as is. */
  ownerAddress?: (owner: string) => string;
  /** Called, and awaited, before an enroll's or attach's first send; a throw stops the call before anything is sent. */
  onIntent?: (intent: Intent) => void | Promise<void>;
  /** Called, and awaited, with every credential an enroll or attach minted (re-attachments too): persist it. */
  onCredential?: (cred: Credential) => void | Promise<void>;
  /** A connection ended other than by close(). */
  onDisconnect?: (addr: string, why: Error) => void;
  /** A participant held before was bound again: after its connection ended, its conversation moved, or attach(). */
  onReattach?: (cred: Credential, welcome: Welcome) => void;
  /** A participant the client can no longer use (superseded, retired, its credential refused). */
  onLost?: (cred: Credential, why: LostError) => void;
}

/** Per-call options. */
export interface CallOptions {
  signal?: AbortSignal;
  /** Use this token instead of a fresh one: an InDoubtError's, or a persisted Intent's. */
  token?: Uint8Array;
  /** enroll only: the invitation a server under --enroll-policy invite requires. */
  invite?: Uint8Array;
}

// Doubt is what the sends of one operation's token have shown so far.
// maybe is set once a request carrying the token was handed to a
// connection, and stays set until an answer proves the token was not
// committed: a refusal the server gives only after its token check
// (PROTOCOL.md, Order of checks; SETTLES). A lost answer, in_doubt, and
// every other refusal (moved, unavailable, shutting_down, token_expired,
// token_invalid, invite_*, retired, receipt_expired, a code this client
// does not know) leave it as it was; a success leaves it set, the
// operation having happened.
export class Doubt {
  maybe = false;
  /** How many requests carrying the token were handed to a connection. */
  sends = 0;
  /** The last refusal that committed nothing: what a caller who gives up is told, when nothing may have been applied. */
  last: ServerError | null = null;

  sent(): boolean {
    const before = this.maybe;
    this.maybe = true;
    this.sends++;
    return before;
  }

  answered(before: boolean, a: Answer): void {
    if (a.t !== "error") return;
    if (a.code === "in_doubt") this.maybe = true;
    else if (SETTLES.has(a.code)) this.maybe = false;
    else this.maybe = before;
  }
}

// The refusals the server gives only after its token check found the
// token not committed (PROTOCOL.md, Order of checks), the Go client's
// settles. Every other refusal proves this send was not applied and
// nothing about earlier ones: those given before the token check, retired
// (a deleted conversation refuses a committed token's replay too), and
// receipt_expired (given only for a token that did commit).
const SETTLES = new Set([
  "unknown_participant", "stale_authority", "no_binding", "binding_occupied", "token_conflict", "too_large",
  "capacity_exceeded", "backlog_full", "rate_limited", "ack_gap", "ack_regression",
]);

// Op is what run needs of a call to tell the caller the truth when it
// gives up: the token its requests carry and what their answers showed.
// An attach's are its intent's, which the intent's next attempt replaces.
interface Op {
  token(): Uint8Array | null;
  doubt(): Doubt | null;
}

const op = (token: Uint8Array, d: Doubt): Op => ({ token: () => token, doubt: () => d });

// Unpersisted carries out of run's retry loop the failure of an
// onCredential: the operation that minted the credential committed, the
// application does not have it. The call ends there, in doubt if a
// request of its own may have been applied (an enroll's or attach's own
// credential: it was), else with the failure.
class Unpersisted {
  constructor(readonly cause: Error) {}
}

// attachIntent is an attach whose outcome is not known yet: its token and
// presented credential are kept for every retry, on every node.
interface AttachIntent {
  token: Uint8Array;
  presented: Credential;
  sentOn: Set<Session>;
  supplied: boolean;
  renewed: boolean;
  doubt: Doubt;
}

// member is a participant the client holds. cred is always a credential
// onCredential has persisted (or the application supplied): nothing
// presents or uses a generation before it is.
interface Member {
  cred: Credential;
  /** Bound on purpose: the client follows its binding (re-attaches it) while set. */
  wantBound: boolean;
  /** A leave of it is under way: its refusals are no loss to report. */
  leaving: boolean;
  boundOn: Session | null;
  cursor: number;
  intent: AttachIntent | null;
  nextToken: Uint8Array | null;
  lost: LostError | null;
  following: boolean;
  /** Bound once already: the next binding is a re-attachment (onReattach). */
  everBound: boolean;
  /** Attaches and leaves of the member run one at a time, in this chain. */
  attachChain: Promise<unknown>;
  /** The highest delivery seq handed to the application. */
  seen: number;
  /** The highest first of a compacted push handed to the application. */
  compactedFirst: number;
}

// EnrollWatch records, while an enroll is being answered, the recipients
// of conversation conv whose deliveries arrived before the client held
// them (and were dropped): the enroll's own binding then missed them.
interface EnrollWatch {
  conv: number;
  dropped: Set<number>;
}

const key = (conv: number, p: number) => `${conv}/${p}`;

export class Client {
  private readonly o: Required<Pick<ClientOptions, "minBackoffMs" | "maxBackoffMs" | "dialTimeoutMs" | "backlogWaitMs" | "bindingCheckIntervalMs" | "maxQueuedDeliveries" | "maxQueuedDeliveryBytes" | "answerTimeoutMs" | "maxMoves">> & ClientOptions;
  private readonly nodes: string[];
  private home: string;
  private ids = 0;
  private closed = false;
  private readonly life = new AbortController();
  private readonly sessions = new Map<string, Session>();
  private readonly dialing = new Map<string, Promise<Session>>();
  private readonly route = new Map<number, string>();
  private readonly members = new Map<string, Member>();
  private readonly watches = new Set<EnrollWatch>();
  private readonly queue: Delivery[] = [];
  private queuedBytes = 0;
  private waiter: (() => void) | null = null;
  private paused = false;
  private checker: ReturnType<typeof setInterval> | null = null;
  private readonly sleepers = new Set<() => void>();

  private constructor(nodes: string[], opts: ClientOptions) {
    this.o = {
      minBackoffMs: 50, maxBackoffMs: 5000, dialTimeoutMs: 10_000, backlogWaitMs: 30_000,
      bindingCheckIntervalMs: 30_000, maxQueuedDeliveries: 65536, maxQueuedDeliveryBytes: 64 << 20,
      answerTimeoutMs: 30_000, maxMoves: 16, ...opts,
    };
    this.nodes = [...nodes];
    this.home = nodes[0]!;
  }

  /**
   * connect returns a Client of the node at addr, or of the cluster whose
   * nodes are listed (moved is followed across them), once one node
   * answered the handshake. A RejectedError (auth_failed, ...) or the
   * dial's error of the last node tried is thrown.
   */
  static async connect(addr: string | string[], opts: ClientOptions & { signal?: AbortSignal }): Promise<Client> {
    const nodes = typeof addr === "string" ? [addr] : addr;
    if (nodes.length === 0) throw new TypeError("no address");
    const c = new Client(nodes, opts);
    let last: unknown;
    for (const n of nodes) {
      try {
        await c.session(n, opts.signal);
        c.home = n;
        c.startChecker();
        return c;
      } catch (e) {
        last = e;
        if (opts.signal?.aborted) break;
      }
    }
    c.close();
    throw last;
  }

  /** welcome returns what the node serving conversation conv (or the first node) announced, if connected. */
  welcome(conv?: number): Welcome | undefined {
    return this.sessions.get(conv === undefined ? this.home : this.routeOf(conv))?.welcome;
  }

  /** addressOf returns the address the client sends conversation conv's requests to (its owner, as last learned). */
  addressOf(conv: number): string {
    return this.routeOf(conv);
  }

  /** credential returns the latest credential held for the participant. */
  credential(conversation: number, participant: number): Credential | undefined {
    return this.members.get(key(conversation, participant))?.cred;
  }

  /**
   * enroll creates a participant in conversation conv, binds it to this
   * client and returns its credential, once onCredential has persisted
   * it. Throws a ServerError subclass (CapacityExceededError,
   * InviteRequiredError, ...), or ClosedError, when nothing was applied;
   * an InDoubtError with the token when aborted after the request went
   * out, or when onCredential failed (the enroll committed; the client
   * holds nothing of it; retry with { token } to replay it).
   */
  async enroll(conv: number, co: CallOptions = {}): Promise<Credential> {
    const supplied = co.token !== undefined;
    const token = co.token ?? newToken();
    await this.o.onIntent?.({ op: "enroll", conversation: conv, token });
    const sentOn = new Set<Session>();
    const d = new Doubt();
    const watch: EnrollWatch = { conv, dropped: new Set() };
    this.watches.add(watch);
    try {
      return await this.run(conv, co.signal, op(token, d), async (s, sig) => {
        sentOn.add(s);
        const a = expect(await this.send(s, { t: "enroll", conversation: conv, token, invite: co.invite }, sig, d), "enrolled");
        const cred: Credential = { conversation: a.conversation, participant: a.participant, generation: a.generation, secret: a.secret };
        const k = key(cred.conversation, cred.participant);
        // Persisted before the client holds it or presents it anywhere.
        // A replay older than what the client holds is not persisted
        // again: it would overwrite a later credential.
        const held = this.members.get(k);
        if (!held || (held.intent === null && held.cred.generation < cred.generation)) await this.persist(cred);
        let m = this.members.get(k);
        if (!m) this.members.set(k, (m = newMember(cred)));
        else if (m.intent === null && m.cred.generation < cred.generation) m.cred = cred;
        m.wantBound = true;
        m.cursor = Math.max(m.cursor, a.cursor);
        // A bound replay names this call's binding only if the token went
        // out once, here, by this call; and a binding that missed
        // deliveries before the client held its participant is replaced.
        const here = (a.replay === undefined || (a.replay === "bound" && sentOn.size === 1 && !supplied)) && !watch.dropped.has(cred.participant);
        if (here && s.alive && m.intent === null && m.cred.generation === cred.generation) {
          m.boundOn = s;
          m.everBound = true;
          return cred;
        }
        // Committed, but the binding is not on this connection: attach.
        return this.attachOn(s, m, sig);
      });
    } finally {
      this.watches.delete(watch);
    }
  }

  /**
   * attach presents cred (or the latest credential held for its
   * participant), mints the next generation, binds it to this client and
   * returns the new credential, once onCredential has persisted it. With
   * { token } it replays an attach sent before (an Intent persisted by an
   * earlier process) and then attaches again with the credential that
   * minted. Throws a LostError when the credential cannot be used (its
   * cause: StaleAuthorityError, ReceiptExpiredError, RetiredError, ...),
   * other ServerErrors, ClosedError, or an InDoubtError with the intent's
   * token when aborted after it went out or when onCredential failed (the
   * client keeps the intent and replays it on the next attach).
   */
  async attach(cred: Credential, co: CallOptions = {}): Promise<Credential> {
    const k = key(cred.conversation, cred.participant);
    let m = this.members.get(k);
    if (!m) this.members.set(k, (m = newMember(cred)));
    if (m.lost && cred.generation > m.cred.generation) {
      m.cred = cred;
      m.lost = null;
      m.boundOn = null;
    }
    m.wantBound = true;
    if (co.token && m.intent === null) m.nextToken = co.token;
    const mm = m;
    // An attach aborted in flight is in doubt under its intent's token.
    return this.run(cred.conversation, co.signal, { token: () => mm.intent?.token ?? null, doubt: () => mm.intent?.doubt ?? null },
      (s, sig) => this.attachOn(s, mm, sig));
  }

  /**
   * tell appends payload to the participant's conversation and returns the
   * record's seq, durable when it resolves. The participant must be held
   * bound by this client (enroll, attach). A payload over the server's
   * max_record_bytes is a TooLargeError at once: nothing is sent.
   */
  async tell(cred: Credential, payload: Uint8Array, co: CallOptions = {}): Promise<number> {
    const token = co.token ?? newToken();
    const d = new Doubt();
    return this.run(cred.conversation, co.signal, op(token, d), async (s, sig) => {
      const limit = s.welcome.max_record_bytes;
      if (payload.length > limit) throw new TooLargeError("too_large", `a payload of ${payload.length} bytes is over the server's max_record_bytes`, { limit });
      const m = await this.bound(s, cred, sig);
      const c = m.cred;
      const a = await this.send(s, { t: "tell", conversation: c.conversation, participant: c.participant, generation: c.generation, token, payload }, sig, d);
      if (a.t === "error") throw this.refused(s, m, c.generation, a);
      return expect(a, "told").seq;
    });
  }

  /**
   * ack acknowledges every record through seq `through` for the
   * participant and returns its durable cursor. Acks are cumulative, so a
   * retried one is harmless: an ack at or below the cursor (noop,
   * ack_regression) resolves with the cursor.
   */
  async ack(cred: Credential, through: number, co: CallOptions = {}): Promise<number> {
    return this.run(cred.conversation, co.signal, null, async (s, sig) => {
      const m = await this.bound(s, cred, sig);
      const c = m.cred;
      const a = await s.call({ t: "ack", conversation: c.conversation, participant: c.participant, generation: c.generation, through }, sig);
      if (a.t === "error") {
        if (a.cursor !== undefined) m.cursor = Math.max(m.cursor, a.cursor);
        // Later acks moved the cursor past through: through is acked.
        if (a.code === "ack_regression" && a.cursor !== undefined) return a.cursor;
        throw this.refused(s, m, c.generation, a);
      }
      const cursor = expect(a, "acked").cursor;
      m.cursor = Math.max(m.cursor, cursor);
      return cursor;
    });
  }

  /**
   * detach ends the participant's binding cleanly and returns the seq of
   * its detached record; the client keeps the credential. From the call
   * on, the client no longer re-attaches the participant on its own: a
   * retry after a lost answer replays the detach and never binds the
   * participant again first. Throws NoBindingError when the binding had
   * ended otherwise before the detach committed (a lost connection: the
   * participant is not bound either way).
   */
  async detach(cred: Credential, co: CallOptions = {}): Promise<number> {
    const token = co.token ?? newToken();
    const d = new Doubt();
    const k = key(cred.conversation, cred.participant);
    const r = this.release(k, false);
    try {
      return await this.run(cred.conversation, co.signal, op(token, d), async (s, sig) => {
        const m = this.members.get(k);
        if (!m) throw new NoBindingError("no_binding", "this client does not hold the participant: enroll or attach it first");
        if (m.lost) throw m.lost;
        if (d.sends === 0 && (m.boundOn !== s || !s.alive)) {
          // Not sent yet: bind it where the detach goes, as asked before.
          if (!r.wanted) throw new NoBindingError("no_binding", "the participant was detached: attach it first");
          await this.attachOn(s, m, sig);
        }
        const c = m.cred;
        const a = await this.send(s, { t: "detach", conversation: c.conversation, participant: c.participant, generation: c.generation, token }, sig, d);
        if (a.t === "error") throw this.refused(s, m, c.generation, a);
        if (m.boundOn === s) m.boundOn = null;
        return expect(a, "detached").seq;
      });
    } catch (e) {
      // Nothing applied, and the binding may still be there: follow it
      // again. A no_binding says it is not: the participant stays
      // unbound, as the application asked.
      r.undo(d, e instanceof NoBindingError);
      throw e;
    }
  }

  /**
   * leave retires the participant for good and returns the seq of its
   * left record; the client forgets it. It waits for an attach of the
   * participant in flight (an automatic re-attach) and presents the
   * credential that attach minted; from the call on, the client no longer
   * re-attaches the participant on its own, nor reports its refusals to
   * onLost.
   */
  async leave(cred: Credential, co: CallOptions = {}): Promise<number> {
    const token = co.token ?? newToken();
    const d = new Doubt();
    const k = key(cred.conversation, cred.participant);
    const r = this.release(k, true);
    const leaveOn = async (s: Session, sig: AbortSignal | undefined, m: Member | undefined): Promise<number> => {
      if (m && m.intent !== null && d.sends === 0) {
        // An attach whose outcome is unknown may have minted the
        // generation to present: learn it first (the same attach again).
        await this.attachOnLocked(s, m, sig);
      }
      const c = m?.cred ?? cred;
      const a = expect(await this.send(s, { t: "leave", conversation: c.conversation, participant: c.participant, generation: c.generation, secret: c.secret, token }, sig, d), "left");
      if (this.members.get(k) === m) this.members.delete(k);
      return a.seq;
    };
    try {
      return await this.run(cred.conversation, co.signal, op(token, d), (s, sig) => {
        const m = this.members.get(k);
        return m ? this.turn(m, () => leaveOn(s, sig, m), sig) : leaveOn(s, sig, undefined);
      });
    } catch (e) {
      r.undo(d, false);
      throw e;
    }
  }

  /** ping asks the first node for a pong; not retried (ConnectionLostError). */
  async ping(co: CallOptions = {}): Promise<void> {
    const s = await this.session(this.home, co.signal);
    try {
      expect(await s.call({ t: "ping" }, co.signal), "pong");
    } catch (e) {
      if (e instanceof SessionLost) throw new ConnectionLostError(e.message);
      throw e;
    }
  }

  /**
   * deliveries iterates over the deliveries to every participant the
   * client holds, deduplicated on (conversation, seq), in ascending seq per
   * conversation. It ends at close(). Use one iterator at a time.
   */
  async *deliveries(): AsyncGenerator<Delivery, void, undefined> {
    for (;;) {
      const d = this.queue.shift();
      if (d) {
        this.queuedBytes -= d.payload?.length ?? 0;
        if (this.paused && this.queue.length <= this.o.maxQueuedDeliveries / 2 && this.queuedBytes <= this.o.maxQueuedDeliveryBytes / 2) {
          this.paused = false;
          for (const s of this.sessions.values()) s.resume();
        }
        yield d;
        continue;
      }
      if (this.closed) return;
      await new Promise<void>((r) => (this.waiter = r));
    }
  }

  /** queued returns how many deliveries, and how many payload bytes, wait unread in deliveries(). */
  get queued(): { deliveries: number; bytes: number } {
    return { deliveries: this.queue.length, bytes: this.queuedBytes };
  }

  [Symbol.asyncIterator](): AsyncGenerator<Delivery, void, undefined> {
    return this.deliveries();
  }

  /**
   * close sends bye on every connection (the server ends this client's
   * bindings as detached/clean), closes them and ends deliveries(). Calls
   * in progress throw ClosedError (or InDoubtError with their token).
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.life.abort(new ClosedError("participantd: client closed"));
    if (this.checker) clearInterval(this.checker);
    for (const s of this.sessions.values()) s.bye(++this.ids);
    this.sessions.clear();
    for (const stop of [...this.sleepers]) stop();
    this.wake();
  }

  // run is the retry loop of every call on conversation conv: it gets a
  // session of the node serving conv, runs step on it, and retries step
  // (which resends the same token) after a lost connection, an in_doubt,
  // a moved (on the owner; the first at once, then with backoff, at most
  // maxMoves) or an unreachable node (on the next), and a backlog_full
  // for backlogWaitMs. When the caller's signal ends, or the client
  // closes, it throws an InDoubtError with the token only if a request
  // of the call may have been applied (op's doubt); else the last
  // refusal, which committed nothing, or the signal's reason.
  private async run<T>(conv: number, callerSignal: AbortSignal | undefined, o: Op | null,
    step: (s: Session, sig: AbortSignal | undefined) => Promise<T>): Promise<T> {
    const sig = callerSignal;
    const stopped = () => this.closed || sig?.aborted === true;
    const why = () => (sig?.aborted ? sig.reason : new ClosedError("participantd: client closed"));
    const b = new Backoff(this.o.minBackoffMs, this.o.maxBackoffMs);
    let fullUntil = 0;
    let moves = 0;
    const refusal = (e: ServerError) => {
      const d = o?.doubt();
      if (d) d.last = e;
    };
    for (;;) {
      try {
        if (this.closed) throw new ClosedError("participantd: client closed");
        const addr = this.routeOf(conv);
        let s: Session;
        try {
          s = await this.session(addr, sig);
        } catch (e) {
          if (stopped() || e instanceof RejectedError && !["overloaded", "shutting_down"].includes(e.reason)) throw e;
          this.rotate(conv, addr);
          await this.sleep(b.next(), sig);
          continue;
        }
        return await step(s, sig);
      } catch (e) {
        if (e instanceof Unpersisted) {
          const d = o?.doubt();
          if (d) d.last = null; // the failure, not an earlier refusal, ends the call
          throw this.gaveUp(e.cause, o);
        }
        if (stopped()) throw this.gaveUp(why(), o);
        if (e instanceof SessionLost) {
          await this.sleep(b.next(), sig).catch(() => {});
          continue;
        }
        if (e instanceof MovedError) {
          refusal(e);
          if (++moves > this.o.maxMoves) throw this.gaveUp(e, o);
          if (e.owner) this.moveTo(conv, this.o.ownerAddress?.(e.owner) ?? e.owner);
          else this.rotate(conv, this.routeOf(conv));
          // The first moved is followed at once; more mean the nodes
          // disagree (a lease changing hands): back off.
          if (moves > 1 || !e.owner) await this.sleep(b.next(), sig).catch(() => {});
          continue;
        }
        if (e instanceof InDoubtError || e instanceof ServerError && (e.code === "unavailable" || e.code === "shutting_down")) {
          if (!(e instanceof InDoubtError)) refusal(e);
          await this.sleep(b.next(), sig).catch(() => {});
          continue;
        }
        if (e instanceof BacklogFullError && this.o.backlogWaitMs >= 0) {
          refusal(e);
          const now = Date.now();
          if (fullUntil === 0) fullUntil = now + this.o.backlogWaitMs;
          const d = b.next();
          if (now + d < fullUntil) {
            await this.sleep(d, sig).catch(() => {});
            continue;
          }
        }
        throw e;
      }
    }
  }

  // release stops the client from binding k's member on its own, for a
  // detach or (leaving) a leave about to be sent: no automatic re-attach,
  // and, leaving, no onLost for its refusals. wanted is whether the
  // member was bound on purpose before. undo, for the call's failure,
  // puts that back when no request of it may have been applied (d) and
  // the member is still the one released: no longer leaving, and
  // followed again unless lost or stayUnbound.
  private release(k: string, leaving: boolean): { wanted: boolean; undo(d: Doubt, stayUnbound: boolean): void } {
    const m0 = this.members.get(k);
    const wanted = m0?.wantBound ?? false;
    if (m0) {
      m0.wantBound = false;
      if (leaving) m0.leaving = true;
    }
    return {
      wanted,
      undo: (d, stayUnbound) => {
        const m = this.members.get(k);
        if (!m || m !== m0 || d.maybe) return;
        if (leaving) m.leaving = false;
        if (wanted && !m.lost && !stayUnbound) m.wantBound = true;
      },
    };
  }

  // gaveUp is what a call that stops retrying throws: an InDoubtError
  // with its token if a request of it may have been applied, else the
  // last refusal it met (nothing was applied), else reason.
  private gaveUp(reason: unknown, o: Op | null): unknown {
    const token = o?.token() ?? null;
    const d = o?.doubt() ?? null;
    if (token === null || d === null || !d.maybe) {
      if (reason instanceof ClosedError) return reason;
      return d?.last ?? reason;
    }
    const e = new InDoubtError("in_doubt", `outcome unknown: ${reason instanceof Error ? reason.message : String(reason)}`);
    e.token = token;
    (e as { cause?: unknown }).cause = reason;
    return e;
  }

  // send sends body on s and returns its answer, keeping d (the doubt of
  // the token it carries) up to date.
  private async send(s: Session, body: RequestBody, sig: AbortSignal | undefined, d: Doubt): Promise<Answer> {
    let before = false;
    const a = await s.call(body, sig, () => (before = d.sent()));
    d.answered(before, a);
    return a;
  }

  // persist awaits onCredential(cred); it throws Unpersisted when that
  // fails.
  private async persist(cred: Credential): Promise<void> {
    try {
      await this.o.onCredential?.(cred);
    } catch (err) {
      throw new Unpersisted(new Error(`committed, but onCredential failed: ${err instanceof Error ? err.message : String(err)}`, { cause: err }));
    }
  }

  // turn runs fn after every attach and leave of m queued before it, and
  // before any queued after: one at a time per participant. A caller
  // whose signal aborts while it waits for its turn stops waiting (fn
  // does not run); those queued after it still wait for those before.
  private turn<T>(m: Member, fn: () => Promise<T>, sig?: AbortSignal): Promise<T> {
    const prev = m.attachChain;
    let done!: () => void;
    const mine = new Promise<void>((r) => (done = r));
    m.attachChain = prev.then(() => mine);
    return (async () => {
      try {
        await abortable(prev, sig);
        return await fn();
      } finally {
        done();
      }
    })();
  }

  // bound returns the member of cred, bound on s (attaching it there first).
  private async bound(s: Session, cred: Credential, sig: AbortSignal | undefined): Promise<Member> {
    const m = this.members.get(key(cred.conversation, cred.participant));
    if (!m) throw new NoBindingError("no_binding", "this client does not hold the participant: enroll or attach it first");
    if (m.lost) throw m.lost;
    if (m.boundOn !== s || !s.alive) {
      if (!m.wantBound) throw new NoBindingError("no_binding", "the participant was detached: attach it first");
      await this.attachOn(s, m, sig);
    }
    return m;
  }

  // refused turns an error answer to a request that needed m's binding at
  // generation gen on s into the error to throw, noticing what it shows:
  // moved or no_binding (the node let the binding go: follow it),
  // stale_authority, retired, unknown_participant (lost).
  private refused(s: Session, m: Member, gen: number, a: Answer & { t: "error" }): ServerError | LostError {
    const e = errorFromWire(a);
    const ours = m.boundOn === s && m.cred.generation === gen && m.intent === null && !m.lost;
    if (!ours) return e;
    switch (e.code) {
      case "moved":
        m.boundOn = null;
        return e;
      case "no_binding":
        if (this.nodes.length > 1) {
          m.boundOn = null;
          this.follow(m);
          return e;
        }
        return this.lose(m, e);
      case "stale_authority": case "retired": case "unknown_participant":
        return this.lose(m, e);
    }
    return e;
  }

  // lose marks m lost and tells onLost, unless the application is
  // leaving it: then retired and the like are its own doing.
  private lose(m: Member, e: ServerError): LostError {
    const lost = new LostError(m.cred.conversation, m.cred.participant, e);
    m.lost = lost;
    m.wantBound = false;
    m.boundOn = null;
    if (!m.leaving) this.o.onLost?.(m.cred, lost);
    return lost;
  }

  // attachOn attaches m on s, one attach of m at a time, and returns its
  // new credential. The attach intent (token, presented credential) is
  // kept until an answer settles it, so every retry of it, on any node,
  // is the same request. Throws SessionLost when s ends first, the
  // refusal (MovedError, BacklogFullError, ... which keep the intent),
  // or m's LostError. An automatic attach (auto: follow) does nothing
  // once the application no longer wants m bound (detach, leave).
  private attachOn(s: Session, m: Member, sig: AbortSignal | undefined, auto = false): Promise<Credential> {
    return this.turn(m, () => this.attachOnLocked(s, m, sig, auto), sig);
  }

  // attachOnLocked is attachOn's body; the caller holds m's turn.
  private async attachOnLocked(s: Session, m: Member, sig: AbortSignal | undefined, auto = false): Promise<Credential> {
    const b = new Backoff(this.o.minBackoffMs, this.o.maxBackoffMs);
    for (;;) {
      if (m.lost) throw m.lost;
      if (auto && !m.wantBound) return m.cred;
      if (m.boundOn === s && s.alive) return m.cred;
      if (!s.alive) throw new SessionLost(s.reason?.message ?? "ended");
      let in_ = m.intent;
      if (!in_) {
        const supplied = m.nextToken !== null;
        const token = m.nextToken ?? newToken();
        m.nextToken = null;
        await this.o.onIntent?.({ op: "attach", conversation: m.cred.conversation, presented: m.cred, token });
        in_ = m.intent = { token, presented: m.cred, sentOn: new Set(), supplied, renewed: false, doubt: new Doubt() };
      }
      const p = in_.presented;
      in_.sentOn.add(s);
      const a = await this.send(s, { t: "attach", conversation: p.conversation, participant: p.participant, generation: p.generation, secret: p.secret, token: in_.token }, sig, in_.doubt);
      if (a.t === "attached") {
        const minted: Credential = { conversation: p.conversation, participant: p.participant, generation: a.generation, secret: a.secret };
        // A bound replay names a binding this token made; it is this
        // session's only if the token went out on no other.
        const only = in_.sentOn.size === 1 && !in_.supplied;
        const newer = minted.generation >= m.cred.generation;
        // Persisted before it is used or presented; if that fails the
        // intent stays, and its next attempt replays the same answer.
        if (minted.generation > m.cred.generation) await this.persist(minted);
        m.intent = null;
        if (newer) m.cred = minted;
        m.cursor = Math.max(m.cursor, a.cursor);
        if (newer && s.alive && (a.replay === undefined || (a.replay === "bound" && only))) {
          m.boundOn = s;
          if (m.everBound) this.o.onReattach?.(m.cred, s.welcome);
          m.everBound = true;
          return m.cred;
        }
        m.boundOn = null;
        if (!s.alive) throw new SessionLost("ended during attach");
        continue; // committed, but bound elsewhere or not at all: attach with what it minted
      }
      const e = errorFromWire(expect(a, "error"));
      switch (e.code) {
        case "token_expired":
          if (!in_.renewed && !in_.supplied) {
            // Safe with the same presented credential: had an earlier
            // send committed, this one is refused stale_authority.
            in_.token = newToken();
            in_.renewed = true;
            in_.sentOn.clear();
            await this.o.onIntent?.({ op: "attach", conversation: p.conversation, presented: p, token: in_.token });
            continue;
          }
        // fallthrough: expired again, or a supplied token
        case "token_invalid": case "receipt_expired": case "stale_authority": case "retired": case "unknown_participant":
          m.intent = null;
          throw this.lose(m, e);
        case "in_doubt":
          await this.sleep(b.next(), sig);
          continue;
        case "moved":
          if (m.boundOn === s) m.boundOn = null;
          throw e;
      }
      throw e;
    }
  }

  // follow re-binds m, whose binding ended, on the node serving its
  // conversation, with backoff, until it is bound, lost, detached, or the
  // client closes. It runs once per member at a time.
  private follow(m: Member): void {
    if (m.following || this.closed) return;
    m.following = true;
    const conv = m.cred.conversation;
    this.run(conv, undefined, null, async (s, sig) => {
      if (m.lost || !m.wantBound || this.members.get(key(conv, m.cred.participant)) !== m) return;
      if (m.boundOn === s && s.alive) return;
      await this.attachOn(s, m, sig, true);
    }).then(() => false, (e: unknown) => {
      // Lost (onLost said so), closed, or refused for good (auth_failed):
      // done. A refusal that committed nothing (backlog_full past
      // backlogWaitMs, say) is tried again later, as the Go client's
      // deferred re-attach is.
      return !(e instanceof LostError || e instanceof ClosedError || e instanceof RejectedError);
    }).then((again) => {
      m.following = false;
      if (again && !this.closed && !m.lost && m.wantBound) {
        const t = setTimeout(() => this.follow(m), this.o.maxBackoffMs);
        (t as { unref?: () => void }).unref?.();
      }
    });
  }

  // session returns the live session of addr, dialing it (once at a time)
  // if there is none.
  private async session(addr: string, signal?: AbortSignal): Promise<Session> {
    const s = this.sessions.get(addr);
    if (s?.alive) return s;
    let p = this.dialing.get(addr);
    if (!p) {
      const timeout = AbortSignal.any([this.life.signal, AbortSignal.timeout(this.o.dialTimeoutMs)]);
      p = Session.open(this.o.dial, addr, timeout, { auth: this.o.auth, client: this.o.clientName }, () => ++this.ids, {
        delivery: (s, m) => this.delivered(s, m),
        compacted: (s, m) => this.compactedPush(s, m),
      }, { answerTimeoutMs: this.o.answerTimeoutMs }).then((s) => {
        if (this.closed) {
          s.bye(++this.ids);
          throw new ClosedError("participantd: client closed");
        }
        this.sessions.set(addr, s);
        if (this.paused) s.pause();
        void s.dead.then((why) => this.ended(s, why));
        return s;
      }).finally(() => this.dialing.delete(addr));
      this.dialing.set(addr, p);
    }
    if (!signal) return p;
    if (signal.aborted) throw signal.reason;
    let abort = () => {};
    return Promise.race([p, new Promise<never>((_, reject) => {
      abort = () => reject(signal.reason);
      signal.addEventListener("abort", abort, { once: true });
    })]).finally(() => signal.removeEventListener("abort", abort));
  }

  // ended takes the end of session s: its bindings ended with it; every
  // participant that wants one follows it.
  private ended(s: Session, why: Error): void {
    if (this.sessions.get(s.addr) === s) this.sessions.delete(s.addr);
    if (this.closed) return;
    this.o.onDisconnect?.(s.addr, why);
    for (const m of this.members.values()) {
      if (m.boundOn !== s) continue;
      m.boundOn = null;
      if (m.wantBound && !m.lost) this.follow(m);
    }
  }

  private routeOf(conv: number): string {
    return this.route.get(conv) ?? this.home;
  }

  private moveTo(conv: number, addr: string): void {
    if (!this.nodes.includes(addr)) this.nodes.push(addr);
    this.route.set(conv, addr);
  }

  // rotate sends conv to the node after addr, which did not answer.
  private rotate(conv: number, addr: string): void {
    const i = this.nodes.indexOf(addr);
    this.route.set(conv, this.nodes[(i + 1) % this.nodes.length]!);
  }

  // sleep waits ms; it rejects when signal aborts or the client closes.
  // Sleepers are kept in a set rather than as listeners of one shared
  // signal, which a thousand pipelined retries would pile up on.
  private sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.closed) return reject(new ClosedError("participantd: client closed"));
      if (signal?.aborted) return reject(signal.reason);
      const done = (err?: unknown) => {
        clearTimeout(t);
        this.sleepers.delete(stop);
        signal?.removeEventListener("abort", abort);
        if (err === undefined) resolve();
        else reject(err);
      };
      const stop = () => done(new ClosedError("participantd: client closed"));
      const abort = () => done(signal!.reason);
      const t = setTimeout(() => done(), ms);
      this.sleepers.add(stop);
      signal?.addEventListener("abort", abort, { once: true });
    });
  }

  // delivered hands a delivery to the application once per
  // (conversation, recipient, seq): a participant's deliveries arrive in
  // ascending seq on whichever connection binds it. One for a participant
  // the client does not hold (an enroll not yet persisted, a participant
  // left) is dropped: unacknowledged, it is offered again to its next
  // binding.
  private delivered(_s: Session, p: DeliveryPush): void {
    const m = this.members.get(key(p.conversation, p.recipient));
    if (!m) {
      for (const w of this.watches) if (w.conv === p.conversation) w.dropped.add(p.recipient);
      return;
    }
    if (p.seq <= m.seen) return;
    m.seen = p.seq;
    const d: Delivery = {
      conversation: p.conversation, recipient: p.recipient, seq: p.seq, kind: p.kind, participant: p.participant, credential: m.cred,
    };
    if (p.payload !== undefined) d.payload = p.payload;
    if (p.cause !== undefined) d.cause = p.cause;
    this.enqueue(d);
  }

  // compactedPush hands a compacted notice to the application once per
  // (conversation, recipient, first): a binding is told again after a
  // reconnect. Records below first no longer exist, so none is handed on
  // after it.
  private compactedPush(_s: Session, p: CompactedPush): void {
    const m = this.members.get(key(p.conversation, p.recipient));
    if (!m || p.first <= m.compactedFirst) return;
    m.compactedFirst = p.first;
    m.seen = Math.max(m.seen, p.first - 1);
    this.enqueue({
      conversation: p.conversation, recipient: p.recipient, seq: 0, kind: "compacted", participant: p.recipient, first: p.first, credential: m.cred,
    });
  }

  // enqueue queues d for deliveries(); past maxQueuedDeliveries the client
  // stops reading its connections, so the server feels the backpressure.
  private enqueue(d: Delivery): void {
    this.queue.push(d);
    this.queuedBytes += d.payload?.length ?? 0;
    if (!this.paused && (this.queue.length >= this.o.maxQueuedDeliveries || this.queuedBytes >= this.o.maxQueuedDeliveryBytes)) {
      this.paused = true;
      for (const s of this.sessions.values()) s.pause();
    }
    this.wake();
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  // startChecker checks, every bindingCheckIntervalMs, each participant
  // held bound with an ack at its cursor: a client that only reads learns
  // so that its binding is gone (superseded: lost; moved: follow).
  private startChecker(): void {
    if (this.o.bindingCheckIntervalMs < 0) return;
    this.checker = setInterval(() => void this.checkBindings(), this.o.bindingCheckIntervalMs);
    (this.checker as { unref?: () => void }).unref?.();
  }

  /** checkBindings runs one binding check now (the timer runs it every bindingCheckIntervalMs). */
  async checkBindings(): Promise<void> {
    for (const m of [...this.members.values()]) {
      const s = m.boundOn;
      if (!s?.alive || m.lost || m.intent) continue;
      const c = m.cred;
      try {
        const a = await s.call({ t: "ack", conversation: c.conversation, participant: c.participant, generation: c.generation, through: m.cursor });
        if (a.t === "acked") m.cursor = Math.max(m.cursor, a.cursor);
        else if (a.t === "error") {
          const e = this.refused(s, m, c.generation, a);
          if (e instanceof MovedError) this.follow(m);
        }
      } catch {
        return; // the connection ended (its members follow) or close
      }
    }
  }
}

function newMember(cred: Credential): Member {
  return {
    cred, wantBound: true, leaving: false, boundOn: null, cursor: 0, intent: null, nextToken: null, lost: null, following: false,
    everBound: false, attachChain: Promise.resolve(), seen: 0, compactedFirst: 0,
  };
}

// abortable resolves when p settles (either way), or rejects with sig's
// reason when it aborts first.
function abortable(p: Promise<unknown>, sig: AbortSignal | undefined): Promise<void> {
  const settled = p.then(() => {}, () => {});
  if (!sig) return settled;
  if (sig.aborted) return Promise.reject(sig.reason);
  let abort = () => {};
  return Promise.race([settled, new Promise<never>((_, reject) => {
    abort = () => reject(sig.reason);
    sig.addEventListener("abort", abort, { once: true });
  })]).finally(() => sig.removeEventListener("abort", abort));
}

// expect returns a if it is an answer of type t, throws the typed error of
// an error answer, and a ProtocolError for anything else.
function expect<T extends Answer["t"]>(a: Answer, t: T): Extract<Answer, { t: T }> {
  if (a.t === t) return a as Extract<Answer, { t: T }>;
  if (a.t === "error") throw errorFromWire(a);
  throw new ProtocolError(`${a.t} answers a request expecting ${t}`);
}

/** Backoff is exponential backoff with jitter: each delay is drawn from the upper half of the current step. */
class Backoff {
  private cur = 0;
  constructor(private readonly min: number, private readonly max: number) {}
  next(): number {
    this.cur = this.cur === 0 ? this.min : Math.min(2 * this.cur, this.max);
    return this.cur / 2 + Math.random() * (this.cur / 2);
  }
}
