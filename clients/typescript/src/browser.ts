// The browser entry point: WebSocket only (browsers cannot open TCP).

import { Client, type ClientOptions } from "./client.js";
import { webSocketDialer, type WebSocketLike } from "./transport.js";

export * from "./common.js";

const dial = webSocketDialer((url) => new WebSocket(url) as unknown as WebSocketLike);

/** connect returns a Client of the node at the ws:// or wss:// URL addr (or of the listed nodes); see Client.connect. */
export function connect(addr: string | string[], opts: Partial<ClientOptions> & { signal?: AbortSignal } = {}): Promise<Client> {
  return Client.connect(addr, { dial, ...opts });
}
