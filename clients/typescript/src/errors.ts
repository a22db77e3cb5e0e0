// Errors. A server's error answer is a ServerError of the class of its
// code (StaleAuthorityError for stale_authority, ...), so callers test
// `err instanceof StaleAuthorityError` or `err.code`; never the detail,
// which is for people. The client's own failures have classes of their
// own.

import type { ErrorAnswer } from "./codec.js";

/** Base of every error this package throws. */
export class ParticipantdError extends Error {
  override name = "ParticipantdError";
}

/** Code is the machine-readable code of an error answer (PROTOCOL.md, Errors). */
export type Code =
  | "bad_request" | "unknown_participant" | "retired" | "stale_authority" | "no_binding"
  | "binding_occupied" | "token_conflict" | "ack_gap" | "ack_regression" | "too_large"
  | "capacity_exceeded" | "backlog_full" | "invite_required" | "invite_invalid"
  | "receipt_expired" | "token_expired" | "token_invalid" | "in_doubt" | "unavailable"
  | "shutting_down" | "compacted" | "moved";

/**
 * ServerError is an error answer. Its extras are set when the server sent
 * them: generation (stale_authority with the right secret,
 * receipt_expired), cursor (ack_gap, ack_regression), limit (too_large,
 * capacity_exceeded, backlog_full), participant and reason
 * (receipt_expired), oldest (token_expired), newest (token_invalid),
 * owner (moved), first (compacted).
 */
export class ServerError extends ParticipantdError {
  override name = "ServerError";
  readonly code: string;
  readonly detail: string;
  generation?: number;
  cursor?: number;
  limit?: number;
  participant?: number;
  reason?: string;
  oldest?: number;
  newest?: number;
  owner?: string;
  first?: number;

  constructor(code: string, detail: string, extras: Partial<ErrorAnswer> = {}) {
    super(`participantd: ${code}${extras.reason ? ` (${extras.reason})` : ""}${detail ? `: ${detail}` : ""}`);
    this.code = code;
    this.detail = detail;
    const { generation, cursor, limit, participant, reason, oldest, newest, owner, first } = extras;
    Object.assign(this, dropUndefined({ generation, cursor, limit, participant, reason, oldest, newest, owner, first }));
  }
}

function dropUndefined(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
}

export class BadRequestError extends ServerError { override name = "BadRequestError"; }
export class UnknownParticipantError extends ServerError { override name = "UnknownParticipantError"; }
export class RetiredError extends ServerError { override name = "RetiredError"; }
export class StaleAuthorityError extends ServerError { override name = "StaleAuthorityError"; }
export class NoBindingError extends ServerError { override name = "NoBindingError"; }
export class BindingOccupiedError extends ServerError { override name = "BindingOccupiedError"; }
export class TokenConflictError extends ServerError { override name = "TokenConflictError"; }
export class AckGapError extends ServerError { override name = "AckGapError"; }
export class AckRegressionError extends ServerError { override name = "AckRegressionError"; }
export class TooLargeError extends ServerError { override name = "TooLargeError"; }
export class CapacityExceededError extends ServerError { override name = "CapacityExceededError"; }
/** backlog_full past ClientOptions.backlogWait of retries: nothing was done; retry later with the same token. */
export class BacklogFullError extends ServerError { override name = "BacklogFullError"; }
export class InviteRequiredError extends ServerError { override name = "InviteRequiredError"; }
export class InviteInvalidError extends ServerError { override name = "InviteInvalidError"; }
export class ReceiptExpiredError extends ServerError { override name = "ReceiptExpiredError"; }
/** token_expired: nothing was done now, but an earlier send of the token may have committed. */
export class TokenExpiredError extends ServerError { override name = "TokenExpiredError"; }
export class TokenInvalidError extends ServerError { override name = "TokenInvalidError"; }
/**
 * InDoubtError: the outcome is unknown. From the server it is retried by
 * the client with the same token; the client throws it itself when the
 * call was aborted after its request went out: `token` then names the
 * operation, and retrying with it ({ token }) learns the outcome without
 * applying it twice.
 */
export class InDoubtError extends ServerError {
  override name = "InDoubtError";
  token?: Uint8Array;
}
export class UnavailableError extends ServerError { override name = "UnavailableError"; }
export class ShuttingDownError extends ServerError { override name = "ShuttingDownError"; }
export class CompactedError extends ServerError { override name = "CompactedError"; }
export class MovedError extends ServerError { override name = "MovedError"; }

const byCode: Record<Code, typeof ServerError> = {
  bad_request: BadRequestError,
  unknown_participant: UnknownParticipantError,
  retired: RetiredError,
  stale_authority: StaleAuthorityError,
  no_binding: NoBindingError,
  binding_occupied: BindingOccupiedError,
  token_conflict: TokenConflictError,
  ack_gap: AckGapError,
  ack_regression: AckRegressionError,
  too_large: TooLargeError,
  capacity_exceeded: CapacityExceededError,
  backlog_full: BacklogFullError,
  invite_required: InviteRequiredError,
  invite_invalid: InviteInvalidError,
  receipt_expired: ReceiptExpiredError,
  token_expired: TokenExpiredError,
  token_invalid: TokenInvalidError,
  in_doubt: InDoubtError,
  unavailable: UnavailableError,
  shutting_down: ShuttingDownError,
  compacted: CompactedError,
  moved: MovedError,
};

/** CODES lists every code the protocol defines. */
export const CODES = Object.keys(byCode) as Code[];

/** errorFromWire returns the typed error of an error answer; an unknown code is a plain ServerError. */
export function errorFromWire(m: ErrorAnswer): ServerError {
  const cls = Object.prototype.hasOwnProperty.call(byCode, m.code) ? byCode[m.code as Code] : ServerError;
  return new cls(m.code, m.detail, m);
}

/** ClosedError: a call on a closed Client, or one cut short by close(). */
export class ClosedError extends ParticipantdError { override name = "ClosedError"; }

/** ConnectionLostError: a request without a token (ping) whose connection ended before its answer. */
export class ConnectionLostError extends ParticipantdError { override name = "ConnectionLostError"; }

/** ProtocolError: the server broke the protocol (an undecodable frame, an unexpected answer). */
export class ProtocolError extends ParticipantdError { override name = "ProtocolError"; }

/** RejectedError: the server refused the connection (`rejected`). */
export class RejectedError extends ParticipantdError {
  override name = "RejectedError";
  constructor(readonly reason: string, readonly detail: string) {
    super(`participantd: connection rejected: ${reason}: ${detail}`);
  }
}

/**
 * LostError: a participant this client can no longer use. `cause` is the
 * refusal that showed it: StaleAuthorityError (another session attached
 * it), ReceiptExpiredError, RetiredError, UnknownParticipantError,
 * TokenExpiredError, TokenInvalidError, or NoBindingError.
 */
export class LostError extends ParticipantdError {
  override name = "LostError";
  constructor(readonly conversation: number, readonly participant: number, override readonly cause: ServerError) {
    super(`participantd: participant ${participant} of conversation ${conversation} lost: ${cause.message}`);
  }
}
