// Node's transports: TCP for "host:port", WebSocket (the `ws` package)
// for ws:// and wss:// URLs.

import { connect as netConnect } from "node:net";
import { WebSocket as NodeWebSocket } from "ws";
import { dialEnd, feedFrames, webSocketDialer, type Dialer, type Transport, type WebSocketLike } from "./transport.js";

const wsDial = webSocketDialer((url) => new NodeWebSocket(url) as unknown as WebSocketLike);

/** tcpDial opens a TCP transport to "host:port" (a bracketed IPv6 host too). */
export const tcpDial: Dialer = (addr, signal) =>
  new Promise<Transport>((resolve, reject) => {
    const m = /^\[?([^\]]*)\]?:(\d+)$/.exec(addr);
    if (!m) return reject(new TypeError(`address ${JSON.stringify(addr)} is not host:port`));
    const sock = netConnect({ host: m[1], port: Number(m[2]), noDelay: true });
    let corked = false;
    const t: Transport = {
      // Frames sent in one tick go out in one write (cork until the next
      // tick): pipelined calls then cost one syscall, not one each.
      send: (frame) => {
        if (d.ended() || sock.destroyed) return false;
        if (!corked) {
          corked = true;
          sock.cork();
          process.nextTick(() => {
            corked = false;
            sock.uncork();
          });
        }
        sock.write(frame);
        return true;
      },
      // end flushes what was written (a bye), then the timer cuts a peer that does not close.
      close: () => {
        sock.end();
        setTimeout(() => sock.destroy(), 1000).unref();
      },
      pause: () => sock.pause(),
      resume: () => sock.resume(),
      onFrame: () => {},
      onClose: () => {},
    };
    const d = dialEnd(t, signal, resolve, reject, () => sock.destroy());
    if (d.ended()) return;
    const feed = feedFrames(t);
    sock.on("connect", d.opened);
    sock.on("data", (chunk: Buffer) => feed(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength)));
    sock.on("error", (e) => d.end(e));
    sock.on("close", () => d.end(new Error(`tcp ${addr}: connection closed`)));
  });

/** nodeDial picks the transport by the address: ws:// or wss:// URLs over WebSocket, else TCP. */
export const nodeDial: Dialer = (addr, signal) =>
  /^wss?:\/\//.test(addr) ? wsDial(addr, signal) : tcpDial(addr, signal);
