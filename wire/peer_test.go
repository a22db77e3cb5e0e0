package wire

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A client that dialled an HTTP listener (participantd's health port, say)
// reads "HTTP" as a frame length of 1213486160: the error says what the
// peer is instead of quoting the number.
func TestReadFrame_FromAnHTTPListener_NamesTheLikelyMistake(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer hs.Close()
	nc, err := net.Dial("tcp", hs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// What an HTTP server answers at once: a request it cannot parse. The
	// hello frame alone has no line end, so a server waits for more; send
	// one, as a client's bytes may well contain.
	if _, err := nc.Write([]byte("\x00\x00\x00\x10not a request\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_, err = NewReader(bufio.NewReader(nc), DefaultMaxFrame).ReadFrame()
	var fe *FrameTooLargeError
	if !errors.As(err, &fe) || !errors.Is(err, ErrFrameTooLarge) || fe.Peer() != PeerHTTPServer {
		t.Fatalf("ReadFrame from an HTTP server = %v, want a FrameTooLargeError from an HTTP server", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "HTTP") || !strings.Contains(msg, "health listener") || strings.Contains(msg, "1213486160") {
		t.Errorf("error = %q, want it to name HTTP and the health listener, not the length", msg)
	}
}

func TestFrameTooLargeError_Peer(t *testing.T) {
	header := func(s string) uint64 {
		b := []byte(s)
		return uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
	}
	for _, c := range []struct {
		length uint64
		want   Peer
		says   string
	}{
		{header("HTTP"), PeerHTTPServer, "health listener"},
		{header("GET "), PeerHTTPClient, "HTTP request"},
		{header("POST"), PeerHTTPClient, "HTTP request"},
		{header("\x15\x03\x03\x00"), PeerTLS, "TLS"},
		{header("\x16\x03\x01\x02"), PeerTLS, "TLS"},
		{DefaultMaxFrame + 1, PeerUnknown, "exceeds the limit"},
		{header("\x7f\x00\x00\x00"), PeerUnknown, "exceeds the limit"},
	} {
		e := &FrameTooLargeError{Length: c.length, Max: DefaultMaxFrame}
		if got := e.Peer(); got != c.want || !strings.Contains(e.Error(), c.says) {
			t.Errorf("header %#x: Peer() = %d, Error() = %q; want %d and %q", c.length, got, e.Error(), c.want, c.says)
		}
	}
	// A length within the limit is a frame, whatever its bytes.
	if p := (&FrameTooLargeError{Length: header("HTTP"), Max: 1 << 31}).Peer(); p != PeerUnknown {
		t.Errorf("Peer within the limit = %d, want PeerUnknown", p)
	}
}
