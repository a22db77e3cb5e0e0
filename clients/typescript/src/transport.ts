// A Transport carries whole frames (length prefix included) to and from
// one server: a TCP stream cut into frames, or a WebSocket whose every
// binary message is one frame (PROTOCOL.md, Over WebSocket).

import { FrameReader } from "./codec.js";
import { ProtocolError } from "./errors.js";

export interface Transport {
  /**
   * send writes one whole frame. After the transport ended it does
   * nothing and may return false: the frame certainly did not go out.
   */
  send(frame: Uint8Array): boolean | void;
  /** close ends the transport; onClose follows. */
  close(): void;
  /** pause and resume stop and restart reading, for backpressure; optional. */
  pause?(): void;
  resume?(): void;
  /** maxFrame, set by the session from welcome, bounds the frames a stream transport accepts. */
  maxFrame?: number;
  /** Set by the session: each whole frame received. */
  onFrame: (frame: Uint8Array) => void;
  /** Set by the session: called once when the transport ended, with why. */
  onClose: (why: Error) => void;
}

/** Dialer opens a transport to addr. */
export type Dialer = (addr: string, signal: AbortSignal) => Promise<Transport>;

/** The WebSocket API of browsers (and of the `ws` package, which implements it). */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  /** The `ws` package's pause and resume (stop reading the socket); browsers have none. */
  pause?(): void;
  resume?(): void;
}

/** DialEnd is what dialEnd gives a dialer: the one way its transport ends. */
export interface DialEnd {
  /** end ends the dial or the transport with why, once; later calls do nothing. */
  end: (why: Error) => void;
  /** opened resolves the dial with its transport, unless it already ended. */
  opened: () => void;
  /** ended reports whether end was called (the signal's abort included). */
  ended: () => boolean;
}

/**
 * dialEnd ties a dial's outcome and its transport's end together, so that
 * each dialer writes neither: an end before the transport opened rejects
 * the dial, one after it closes the transport (t.onClose), and either runs
 * once, after cut has dropped the connection. Until the transport opened,
 * the signal's abort ends it too (an already aborted signal at once).
 */
export function dialEnd(
  t: Transport,
  signal: AbortSignal,
  resolve: (t: Transport) => void,
  reject: (why: Error) => void,
  cut: () => void,
): DialEnd {
  let open = false;
  let ended = false;
  const end = (why: Error) => {
    if (ended) return;
    ended = true;
    signal.removeEventListener("abort", abort);
    cut();
    if (open) t.onClose(why);
    else reject(why);
  };
  const abort = () => end(signal.reason instanceof Error ? signal.reason : new Error("aborted"));
  if (signal.aborted) abort();
  else signal.addEventListener("abort", abort, { once: true });
  return {
    end,
    opened: () => {
      if (ended) return;
      open = true;
      signal.removeEventListener("abort", abort);
      resolve(t);
    },
    ended: () => ended,
  };
}

/**
 * webSocketDialer returns a Dialer over WebSocket for URLs ws:// and
 * wss://, built on make (globalThis.WebSocket in a browser, the `ws`
 * package's WebSocket in Node). A text message is a protocol error, as
 * for the server.
 */
export function webSocketDialer(make: (url: string) => WebSocketLike): Dialer {
  return (url, signal) =>
    new Promise<Transport>((resolve, reject) => {
      const ws = make(url);
      ws.binaryType = "arraybuffer";
      const t: Transport = {
        send: (frame) => {
          if (d.ended() || ws.readyState !== 1) return false;
          ws.send(frame);
          return true;
        },
        close: () => ws.close(1000),
        // A browser's WebSocket cannot stop reading: there the delivery
        // queue is bounded only by the server's own write limits.
        pause: ws.pause ? () => ws.pause!() : undefined,
        resume: ws.resume ? () => ws.resume!() : undefined,
        onFrame: () => {},
        onClose: () => {},
      };
      // Closing a socket that is closing or closed does nothing.
      const d = dialEnd(t, signal, resolve, reject, () => ws.close());
      if (d.ended()) return;
      ws.onopen = d.opened;
      ws.onmessage = (ev) => {
        if (!(ev.data instanceof ArrayBuffer)) {
          ws.close(1003);
          d.end(new ProtocolError("text message from the server"));
          return;
        }
        t.onFrame(new Uint8Array(ev.data));
      };
      ws.onerror = () => d.end(new Error(`websocket ${url}: error`));
      ws.onclose = (ev) => d.end(new Error(`websocket ${url}: closed (${ev.code}${ev.reason ? " " + ev.reason : ""})`));
    });
}

/**
 * feedFrames returns the function a byte stream (TCP) feeds its chunks to:
 * it cuts them into frames for t.onFrame, and ends t on a frame larger
 * than the limit t.maxFrame holds at the time.
 */
export function feedFrames(t: Transport & { maxFrame?: number }): (chunk: Uint8Array) => void {
  const r = new FrameReader();
  return (chunk) => {
    if (t.maxFrame) r.maxFrame = t.maxFrame;
    let frames: Uint8Array[];
    try {
      frames = r.push(chunk);
    } catch (e) {
      t.onClose(e instanceof Error ? e : new ProtocolError(String(e)));
      t.close();
      return;
    }
    for (const f of frames) t.onFrame(f);
  };
}
