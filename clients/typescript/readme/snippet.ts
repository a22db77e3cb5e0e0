import { writeFile } from "node:fs/promises";
import { connect, toHex } from "@participantd/client";

const c = await connect("127.0.0.1:7420", { // or a WebSocket URL: "ws://127.0.0.1:7422/"
  // Every attach, also the re-attach after a reconnect, mints a new
  // credential: persist it, the previous one no longer attaches.
  onCredential: (cred) => writeFile("alice.json", JSON.stringify({ ...cred, secret: toHex(cred.secret) }), { mode: 0o600 }),
  // Another session took the participant over, or it left.
  onLost: (cred, why) => console.error(`lost participant ${cred.participant}: ${why.cause.code}`),
});
const cred = await c.enroll(42); // participant, generation, secret
const seq = await c.tell(cred, new TextEncoder().encode("hello")); // durable when it resolves
console.log(`told seq ${seq}`);
for await (const d of c.deliveries()) { // everyone else's records and events, in seq order
  console.log(d.seq, d.kind, d.participant, new TextDecoder().decode(d.payload));
  await c.ack(d.credential, d.seq);
}
