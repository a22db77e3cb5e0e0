package wsframe

import (
	"bytes"
	"net"
	"testing"
)

// recorder is a net.Conn that records each write as one message.
type recorder struct {
	net.Conn
	msgs [][]byte
}

func (r *recorder) Write(p []byte) (int, error) {
	r.msgs = append(r.msgs, bytes.Clone(p))
	return len(p), nil
}

func frame(body string) []byte {
	return append([]byte{0, 0, 0, byte(len(body))}, body...)
}

// TestConn_OneMessageAFrame: frames written together leave as one message
// each; a frame written in pieces leaves once whole; FlushPartial sends
// the rest as it is.
func TestConn_OneMessageAFrame(t *testing.T) {
	r := &recorder{}
	c := &Conn{Conn: r}
	two := append(frame("ab"), frame("cde")...)
	if n, err := c.Write(two); err != nil || n != len(two) {
		t.Fatalf("Write(two frames) = %d, %v", n, err)
	}
	third := frame("fghi")
	for _, piece := range [][]byte{third[:2], third[2:5], third[5:]} {
		if _, err := c.Write(piece); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Write(frame("xyz")[:3]); err != nil {
		t.Fatal(err)
	}
	if err := c.FlushPartial(); err != nil {
		t.Fatal(err)
	}
	want := [][]byte{frame("ab"), frame("cde"), third, frame("xyz")[:3]}
	if len(r.msgs) != len(want) {
		t.Fatalf("messages = %q, want %q", r.msgs, want)
	}
	for i := range want {
		if !bytes.Equal(r.msgs[i], want[i]) {
			t.Fatalf("message %d = %q, want %q", i, r.msgs[i], want[i])
		}
	}
}
