// Which answers settle an operation's token as never committed: the same
// rule as the Go client's settles (client/client.go).

import { test } from "node:test";
import assert from "node:assert/strict";
import { Doubt } from "../../src/client.js";

const refusal = (code: string) => ({ t: "error", id: 1, code, detail: "" }) as never;

test("a refusal after the token check settles an earlier send; one that cannot tell leaves it in doubt", () => {
  for (const code of ["unknown_participant", "stale_authority", "no_binding", "too_large", "backlog_full", "ack_gap"]) {
    const d = new Doubt();
    d.sent(); // a send whose answer was lost
    const before = d.sent();
    d.answered(before, refusal(code));
    assert.equal(d.maybe, false, `${code} proves the token was never committed`);
  }
  for (const code of ["moved", "unavailable", "shutting_down", "token_expired", "token_invalid", "invite_invalid", "retired", "receipt_expired", "some_future_code"]) {
    const d = new Doubt();
    d.sent();
    const before = d.sent();
    d.answered(before, refusal(code));
    assert.equal(d.maybe, true, `${code} says nothing of the earlier send, which may have committed`);
  }
  const d = new Doubt();
  d.answered(d.sent(), refusal("retired"));
  assert.equal(d.maybe, false, "a first send refused leaves nothing in doubt");
});
