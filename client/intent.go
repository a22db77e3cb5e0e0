package client

import "fmt"

// IntentOp names the operation of an Intent.
type IntentOp string

// The operations that mint a secret, whose lost answer can only be
// recovered by retrying with the same token.
const (
	IntentEnroll IntentOp = "enroll"
	IntentAttach IntentOp = "attach"
)

// Intent is an enroll or attach the client is about to send for the first
// time, passed to Options.OnIntent. A caller that persists it can recover
// the operation's answer after its own crash: the server replays the
// original answer to a retry carrying the same token (docs/PROTOCOL.md,
// Replays), which for an attach must also present the same credential.
//
// To retry, pass Token with WithToken to Enroll (same Conversation) or
// Attach (Presented as the credential).
type Intent struct {
	Op           IntentOp
	Conversation uint64
	// Presented is the credential an attach presents; zero for an enroll.
	Presented Credential
	Token     Token
}

// String describes the intent without the secret.
func (in Intent) String() string {
	if in.Op == IntentAttach {
		return fmt.Sprintf("attach of %v with token %v", in.Presented, in.Token)
	}
	return fmt.Sprintf("enroll in conversation %d with token %v", in.Conversation, in.Token)
}

// intend calls Options.OnIntent, if set. Its error stops the operation
// before anything is sent.
func (c *Client) intend(in Intent) error {
	if c.opts.OnIntent == nil {
		return nil
	}
	if err := c.opts.OnIntent(in); err != nil {
		return fmt.Errorf("client: %v not sent: OnIntent: %w", in, err)
	}
	return nil
}
