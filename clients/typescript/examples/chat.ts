// Two participants chatting in one page, each with its own Client over
// WebSocket (?ws=ws://host:port/ names the server, ?conversation=N the
// conversation). Each keeps its credential in sessionStorage through
// onCredential, so a reload attaches instead of enrolling again. The
// page exposes window.chat for the browser test.

import { connect, type Client, type Credential, type Delivery } from "../src/browser.js";

interface Person {
  name: string;
  client: Client;
  cred: Credential;
  log: string[];
}

const params = new URLSearchParams(location.search);
const ws = params.get("ws") ?? `ws://${location.hostname}:7422/`;
const conversation = Number(params.get("conversation") ?? 42);

const status = document.getElementById("status")!;
const setStatus = (s: string) => {
  status.textContent = s;
  state.status = s;
};

const state = { status: "starting", ready: false, people: [] as Person[], disconnects: 0, reattaches: 0 };
(window as unknown as { chat: unknown }).chat = {
  state,
  send: (who: number, text: string) => send(state.people[who]!, text),
  logs: () => state.people.map((p) => p.log),
};

async function join(name: string): Promise<Person> {
  const client = await connect(ws, {
    clientName: `chat example (${name})`,
    minBackoffMs: 50,
    maxBackoffMs: 500,
    onCredential: (c) => sessionStorage.setItem(`cred:${conversation}:${name}`, JSON.stringify({ ...c, secret: Array.from(c.secret) })),
    onDisconnect: () => {
      state.disconnects++;
      setStatus(`${name}: connection lost, reconnecting`);
    },
    onReattach: () => {
      state.reattaches++;
      setStatus(`${name}: re-attached`);
    },
  });
  const saved = sessionStorage.getItem(`cred:${conversation}:${name}`);
  const cred = saved
    ? await client.attach({ ...JSON.parse(saved), secret: new Uint8Array(JSON.parse(saved).secret) })
    : await client.enroll(conversation);
  const p: Person = { name, client, cred, log: [] };
  void receive(p);
  return p;
}

async function receive(p: Person): Promise<void> {
  const list = document.getElementById(`log-${p.name}`)!;
  for await (const d of p.client.deliveries()) {
    const line = describe(d);
    p.log.push(line);
    const li = document.createElement("li");
    li.textContent = line;
    if (d.kind !== "record") li.className = "event";
    list.appendChild(li);
    if (d.kind !== "compacted") await p.client.ack(d.credential, d.seq);
  }
}

function describe(d: Delivery): string {
  const who = state.people.find((p) => p.cred.participant === d.participant)?.name ?? `p${d.participant}`;
  if (d.kind === "record") return `${who}: ${new TextDecoder().decode(d.payload)}`;
  if (d.kind === "compacted") return `(history before #${d.first} was released)`;
  return `* ${who} ${d.kind}${d.cause ? ` (${d.cause})` : ""}`;
}

async function send(p: Person, text: string): Promise<number> {
  const seq = await p.client.tell(p.cred, new TextEncoder().encode(text));
  const li = document.createElement("li");
  li.textContent = `me: ${text}`;
  li.className = "mine";
  document.getElementById(`log-${p.name}`)!.appendChild(li);
  return seq;
}

for (const name of ["alice", "bob"]) {
  const form = document.getElementById(`form-${name}`) as HTMLFormElement;
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = form.elements.namedItem("text") as HTMLInputElement;
    const p = state.people.find((x) => x.name === name);
    if (p && input.value) void send(p, input.value).then(() => (input.value = ""));
  });
}

try {
  state.people.push(await join("alice"));
  state.people.push(await join("bob"));
  state.ready = true;
  setStatus(`connected to ${ws}, conversation ${conversation}`);
} catch (e) {
  setStatus(`failed: ${(e as Error).message}`);
}
