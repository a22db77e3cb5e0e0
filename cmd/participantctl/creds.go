package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/participantd/participantd/client"
)

// The credential file holds a participant's credential in client's stable
// JSON form, plus, while an enroll or attach is in flight, that operation's
// token, written before the request is sent:
//
//	{"conversation":42,"participant":0,"generation":3,"secret":"<hex>",
//	 "pending":{"op":"attach","token":"<32 hex>"}}
//	{"conversation":42,"pending":{"op":"enroll","token":"<32 hex>"}}
//
// A pending attach presented the credential beside it. If participantctl
// dies after the server committed the operation but before the answer was
// saved, the next run retries with the same token (and the same presented
// credential) and the server replays the answer; the new credential is
// saved and pending dropped. Without it the new generation's secret would
// be lost and the saved one refused: the participant locked out.

// pendingOp is the in-flight operation of a credential file.
type pendingOp struct {
	Op    client.IntentOp `json:"op"`
	Token string          `json:"token"`
}

// credsFile is a credential file's content.
type credsFile struct {
	cred client.Credential // zero while only an enroll is pending
	// pending is the token of an enroll or attach that may have
	// committed; nil when none is.
	pending *pendingIntent
}

// pendingIntent is a decoded pendingOp.
type pendingIntent struct {
	op    client.IntentOp
	token client.Token
}

type credsJSON struct {
	Conversation uint64     `json:"conversation"`
	Participant  *uint64    `json:"participant,omitempty"`
	Generation   *uint64    `json:"generation,omitempty"`
	Secret       string     `json:"secret,omitempty"`
	Pending      *pendingOp `json:"pending,omitempty"`
}

func (f credsFile) marshal() ([]byte, error) {
	j := credsJSON{Conversation: f.cred.Conversation}
	if f.pending == nil || f.pending.op != client.IntentEnroll {
		// The credential's own stable form, so that every field and its
		// checks stay client's.
		raw, err := json.Marshal(f.cred)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, &j); err != nil {
			return nil, err
		}
	}
	if f.pending != nil {
		j.Pending = &pendingOp{Op: f.pending.op, Token: f.pending.token.String()}
	}
	b, err := json.MarshalIndent(j, "", "  ")
	return append(b, '\n'), err
}

func parseCreds(path string, b []byte) (credsFile, error) {
	var f credsFile
	var j credsJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return f, fmt.Errorf("read credentials %s: %w", path, err)
	}
	if j.Pending != nil {
		tok, err := client.ParseToken(j.Pending.Token)
		if err != nil {
			return f, fmt.Errorf("read credentials %s: pending: %w", path, err)
		}
		if j.Pending.Op != client.IntentEnroll && j.Pending.Op != client.IntentAttach {
			return f, fmt.Errorf("read credentials %s: pending operation %q", path, j.Pending.Op)
		}
		f.pending = &pendingIntent{op: j.Pending.Op, token: tok}
	}
	if f.pending != nil && f.pending.op == client.IntentEnroll {
		if j.Participant != nil || j.Generation != nil || j.Secret != "" {
			return f, fmt.Errorf("read credentials %s: a pending enroll beside a credential", path)
		}
		f.cred.Conversation = j.Conversation
		return f, nil
	}
	if err := json.Unmarshal(b, &f.cred); err != nil {
		return f, fmt.Errorf("read credentials %s: %w", path, err)
	}
	return f, nil
}

// readCredsFile reads the credential file at path.
func readCredsFile(path string) (credsFile, error) {
	if path == "" {
		return credsFile{}, errors.New("--creds is required")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return credsFile{}, fmt.Errorf("read credentials: %w", err)
	}
	return parseCreds(path, b)
}

// readCreds reads the credential of the file at path; a file holding only
// a pending enroll is an error that says how to finish it.
func readCreds(path string) (client.Credential, error) {
	f, err := readCredsFile(path)
	if err != nil {
		return client.Credential{}, err
	}
	if f.pending != nil && f.pending.op == client.IntentEnroll {
		return client.Credential{}, fmt.Errorf("%s holds an enroll in conversation %d that may have committed: re-run enroll --conversation %d --creds %s to recover it",
			path, f.cred.Conversation, f.cred.Conversation, path)
	}
	return f.cred, nil
}

// writeCreds saves cred to path, with no operation pending.
func writeCreds(path string, c client.Credential) error {
	return writeCredsFile(path, credsFile{cred: c})
}

// writeIntent saves in to path before its request is sent: for an attach,
// the credential it presents and its token; for an enroll, the
// conversation and its token.
func writeIntent(path string, in client.Intent) error {
	f := credsFile{cred: in.Presented, pending: &pendingIntent{op: in.Op, token: in.Token}}
	if in.Op == client.IntentEnroll {
		f.cred = client.Credential{Conversation: in.Conversation}
	}
	return writeCredsFile(path, f)
}

// writeCredsFile replaces the credential file at path atomically: the new
// content goes to a temporary file in the same directory, mode 0600, which is
// fsync'd and renamed over path, then the directory is fsync'd. A crash
// leaves either the old file or the new one, never a torn one; and the new
// credential is durable before the caller relies on it (the old one no
// longer attaches once the server minted the new one).
func writeCredsFile(path string, c credsFile) error {
	b, err := c.marshal()
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write credentials: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename there is nothing to remove
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("write credentials: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write credentials: %w", err)
	}
	// The content must be durable before the rename makes it the file.
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write credentials: fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write credentials: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write credentials: %w", err)
	}
	// The rename must be durable before the credential is used.
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write credentials: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write credentials: fsync %s: %w", dir, err)
	}
	return nil
}

// attachSaved attaches cred, the credential of s's file, replaying the
// attach pending in the file if there is one, and returns the credential
// saved after it.
func (s *session) attachSaved(ctx context.Context, cred client.Credential) (client.Credential, error) {
	f, err := readCredsFile(s.creds)
	if err != nil {
		return cred, err
	}
	var opts []client.CallOption
	if f.pending != nil && f.pending.op == client.IntentAttach && f.cred == cred {
		opts = append(opts, client.WithToken(f.pending.token))
	}
	got, err := s.Attach(ctx, cred, opts...)
	if err == nil {
		cred = got
	}
	if err != nil && len(opts) > 0 && errors.Is(err, client.ErrReceiptExpired) {
		return cred, &userError{msg: fmt.Sprintf("an earlier attach (token %v, saved in %s) may have minted a newer generation whose answer the server no longer replays: "+
			"this credential cannot attach again; enroll anew", f.pending.token, s.creds), err: err}
	}
	if err != nil && len(opts) > 0 && (errors.Is(err, client.ErrTokenExpired) || errors.Is(err, client.ErrTokenInvalid)) {
		return cred, &userError{msg: fmt.Sprintf("an earlier attach (token %v, saved in %s) is outside the server's token window (too old, or not a UUIDv7): "+
			"whether it minted a newer generation can no longer be told, so this credential cannot attach again; enroll anew", f.pending.token, s.creds), err: err}
	}
	if err == nil {
		err = s.saved()
	}
	return cred, err
}
