// What both entry points export.

export { Client, type CallOptions, type ClientOptions, type Credential, type Delivery, type Intent } from "./client.js";
export * from "./errors.js";
export { newToken, tokenTime, toHex, fromHex } from "./token.js";
export {
  decodeFrame, decodeBody, encodeFrame, FrameReader, DEFAULT_MAX_FRAME,
  type ClientMessage, type ServerMessage, type Welcome,
} from "./codec.js";
export { webSocketDialer, type Dialer, type Transport, type WebSocketLike } from "./transport.js";
