package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/participantd/participantd/client"
	"github.com/participantd/participantd/wire"
)

func TestTail_TextFromStandardInputPrintsAsText(t *testing.T) {
	ctx := testCtx(t)
	addr, _ := startServer(t, t.TempDir())
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "7", "--creds", a)
	mustCtl(t, ctx, "enroll", "--addr", addr, "--conversation", "7", "--creds", b)
	// What "echo hi | participantctl tell ... -" sends.
	if out, errs, code := ctl(ctx, "hi\n", "tell", "--addr", addr, "--creds", a, "-"); code != 0 {
		t.Fatalf("tell - = exit %d: %s%s", code, out, errs)
	}
	out := mustCtl(t, ctx, "tail", "--addr", addr, "--creds", b, "--records-only", "--count", "1", "--no-ack")
	if !strings.HasSuffix(out, " p0: hi\n") {
		t.Errorf("tail of a told line = %q, want it as the text hi", out)
	}
	out = mustCtl(t, ctx, "tail", "--addr", addr, "--creds", b, "--records-only", "--count", "1", "--json")
	if !strings.Contains(out, `"payload":"hi\n"`) {
		t.Errorf("tail --json of a told line = %q, want the payload exact, newline included", out)
	}
}

func TestPrintDelivery_TextOrHex(t *testing.T) {
	for _, tc := range []struct {
		payload  string
		text     string // the line tail prints
		jsonPart string // what --json prints of the payload
	}{
		{"hello world", "hello world", `"payload":"hello world"`},
		{"hi\n", "hi", `"payload":"hi\n"`},
		{"hi\r\n", "hi", `"payload":"hi\r\n"`},
		{"a\tb", "a\tb", `"payload":"a\tb"`},
		{"héllo ✓\n", "héllo ✓", `"payload":"héllo ✓\n"`},
		// An inner newline would break tail's one line per delivery.
		{"a\nb", "hex:610a62", `"payload_hex":"610a62"`},
		{"hi\n\n", "hex:68690a0a", `"payload_hex":"68690a0a"`},
		{"\n", "", `"payload":"\n"`},
		{"\x00\x01", "hex:0001", `"payload_hex":"0001"`},
		{"\xff", "hex:ff", `"payload_hex":"ff"`},
	} {
		d := client.Delivery{Conversation: 1, Seq: 5, Kind: wire.KindRecord, Participant: 2, Payload: []byte(tc.payload)}
		var text, js bytes.Buffer
		if err := printDelivery(&text, d, false); err != nil {
			t.Fatal(err)
		}
		if err := printDelivery(&js, d, true); err != nil {
			t.Fatal(err)
		}
		if want := "[5] p2: " + tc.text + "\n"; text.String() != want {
			t.Errorf("payload %q prints %q, want %q", tc.payload, text.String(), want)
		}
		if !strings.Contains(js.String(), tc.jsonPart) {
			t.Errorf("payload %q prints as JSON %s, want %s in it", tc.payload, js.String(), tc.jsonPart)
		}
	}
}
