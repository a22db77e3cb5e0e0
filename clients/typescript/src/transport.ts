// A Transport carries whole frames (length prefix included) to and from
// one server: a TCP stream cut into frames, or a WebSocket whose every
// binary message is one frame (PROTOCOL.md, Over WebSocket).

import { FrameReader } from "./codec.js";
import { ProtocolError } from "./errors.js";

export interface Transport {
  /** send writes one whole frame; after the transport ended it does nothing. */
  send(frame: Uint8Array): void;
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
      let open = false;
      let ended = false;
      const t: Transport = {
        send: (frame) => {
          if (!ended && ws.readyState === 1) ws.send(frame);
        },
        close: () => ws.close(1000),
        // A browser's WebSocket cannot stop reading: there the delivery
        // queue is bounded only by the server's own write limits.
        pause: ws.pause ? () => ws.pause!() : undefined,
        resume: ws.resume ? () => ws.resume!() : undefined,
        onFrame: () => {},
        onClose: () => {},
      };
      const end = (why: Error) => {
        if (ended) return;
        ended = true;
        signal.removeEventListener("abort", abort);
        if (open) t.onClose(why);
        else reject(why);
      };
      const abort = () => {
        ws.close();
        end(signal.reason instanceof Error ? signal.reason : new Error("aborted"));
      };
      if (signal.aborted) return abort();
      signal.addEventListener("abort", abort, { once: true });
      ws.onopen = () => {
        open = true;
        signal.removeEventListener("abort", abort);
        resolve(t);
      };
      ws.onmessage = (ev) => {
        if (!(ev.data instanceof ArrayBuffer)) {
          ws.close(1003);
          end(new ProtocolError("text message from the server"));
          return;
        }
        t.onFrame(new Uint8Array(ev.data));
      };
      ws.onerror = () => end(new Error(`websocket ${url}: error`));
      ws.onclose = (ev) => end(new Error(`websocket ${url}: closed (${ev.code}${ev.reason ? " " + ev.reason : ""})`));
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
