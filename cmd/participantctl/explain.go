package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/participantd/participantd/client"
)

// userError is a refusal told in the user's terms: what the command was
// about (the seq, the participant, the credential file), then the
// protocol's code in brackets for scripts and searches.
type userError struct {
	msg string
	err error
}

func (u *userError) Error() string {
	var ce *client.Error
	if errors.As(u.err, &ce) {
		return fmt.Sprintf("%s [%s]", u.msg, ce.Code)
	}
	return u.msg
}

func (u *userError) Unwrap() error { return u.err }

// unixMilliString formats a token time of the protocol (unix ms) in UTC.
func unixMilliString(ms uint64) string {
	return time.UnixMilli(int64(min(ms, 1<<62))).UTC().Format("2006-01-02T15:04:05.000Z")
}

// what a refused request was about, for explain.
type about struct {
	cred  client.Credential // the participant acting
	creds string            // its credential file
	seq   uint64            // ack: --through
	size  int               // tell: the payload's length
}

// explain restates err, a refusal of a request about a, in the user's
// terms; an error it does not know is returned as is.
func explain(err error, a about) error {
	var ce *client.Error
	var ue *userError
	if err == nil || !errors.As(err, &ce) || errors.As(err, &ue) {
		return err
	}
	p, conv := a.cred.Participant, a.cred.Conversation
	var msg string
	switch ce.Code {
	case client.CodeAckGap:
		msg = fmt.Sprintf("seq %d is not a record addressed to participant %d", a.seq, p)
		if ce.Cursor != nil {
			msg += fmt.Sprintf(" (cursor %d)", *ce.Cursor)
		}
	case client.CodeAckRegression:
		msg = fmt.Sprintf("seq %d is below participant %d's cursor", a.seq, p)
		if ce.Cursor != nil {
			msg += fmt.Sprintf(" %d", *ce.Cursor)
		}
		msg += ": it was acknowledged already"
	case client.CodeTooLarge:
		msg = fmt.Sprintf("the message is %d bytes", a.size)
		if ce.Limit != nil {
			msg += fmt.Sprintf("; the server takes at most %d", *ce.Limit)
		}
	case client.CodeRetired:
		msg = fmt.Sprintf("participant %d has left conversation %d: %s is of no further use", p, conv, a.creds)
	case client.CodeUnknownParticipant:
		msg = fmt.Sprintf("conversation %d has no participant %d (is %s from another server?)", conv, p, a.creds)
	case client.CodeStaleAuthority:
		if ce.Generation != nil && uint64(*ce.Generation) < uint64(a.cred.Generation) {
			// A credential the server minted, ahead of its data: the
			// data went back in time (the server's detail says from
			// which backup).
			msg = fmt.Sprintf("the credential in %s is newer than the server's data: %s", a.creds, ce.Detail)
			break
		}
		msg = fmt.Sprintf("the credential in %s (generation %d) is no longer current: another session attached participant %d since", a.creds, a.cred.Generation, p)
		if ce.Generation != nil {
			msg += fmt.Sprintf(" (generation %d now)", *ce.Generation)
		}
	case client.CodeNoBinding:
		msg = fmt.Sprintf("participant %d of conversation %d is bound to another session now", p, conv)
	case client.CodeReceiptExpired:
		msg = fmt.Sprintf("the answer that operation got is no longer replayed (%s): participant %d is at generation", ce.Reason, p)
		if ce.Generation != nil {
			msg += fmt.Sprintf(" %d", *ce.Generation)
		}
	case client.CodeCapacityExceeded:
		msg = "the server's limit is reached: " + ce.Detail
		if ce.Limit != nil {
			msg += fmt.Sprintf(" (limit %d)", *ce.Limit)
		}
	case client.CodeBacklogFull:
		msg = fmt.Sprintf("conversation %d holds as many unacknowledged records as the server allows (a participant is not reading or not acknowledging); nothing was done: run it again once they catch up", conv)
		if ce.Limit != nil {
			msg += fmt.Sprintf(" (limit %d)", *ce.Limit)
		}
	case client.CodeRateLimited:
		msg = fmt.Sprintf("conversation %d does not exist yet and your address creates conversations faster than the server allows; nothing was done: run it again later", conv)
		if ce.Limit != nil {
			msg += fmt.Sprintf(" (burst %d)", *ce.Limit)
		}
	case client.CodeUnavailable:
		msg = fmt.Sprintf("the server cannot serve conversation %d right now; nothing was done, retry later", conv)
	case client.CodeShuttingDown:
		msg = "the server is shutting down; nothing was done, retry once it is back"
	case client.CodeTokenExpired:
		msg = "the operation's token is older than the server's token window"
		if ce.Oldest != nil {
			msg += fmt.Sprintf(" (it answers for tokens drawn from %s on)", unixMilliString(*ce.Oldest))
		}
		msg += ", and the server no longer knows whether that operation was done; nothing was done now. " +
			"Run it again with a new token (no --token, or --force for a pending enroll) only if you know the first attempt was not done"
	case client.CodeTokenInvalid:
		if ce.Newest != nil {
			msg = fmt.Sprintf("the operation's token is dated ahead of the server's clock by more than it allows (it takes tokens drawn up to %s): "+
				"this machine's clock is ahead, or the server's behind; nothing was done", unixMilliString(*ce.Newest))
			break
		}
		msg = "the server runs a token window and takes only UUIDv7 tokens, such as participantctl draws; this one is not " +
			"(a --token of your own, or a pending operation an older participantctl saved in " + a.creds + "?); nothing was done"
	default:
		return err
	}
	return &userError{msg: msg, err: err}
}
