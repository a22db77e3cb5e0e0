// The Node entry point: TCP for "host:port", WebSocket for ws:// and wss:// URLs.

import { Client, type ClientOptions } from "./client.js";
import { nodeDial } from "./node.js";

export * from "./common.js";

/**
 * connect returns a Client of the node at addr ("host:port" over TCP, or a
 * ws:// / wss:// URL over WebSocket), or of the cluster whose nodes are
 * listed; see Client.connect.
 */
export function connect(addr: string | string[], opts: Partial<ClientOptions> & { signal?: AbortSignal } = {}): Promise<Client> {
  return Client.connect(addr, { dial: nodeDial, ...opts });
}
