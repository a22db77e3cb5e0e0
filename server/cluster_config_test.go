package server_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/participantd/participantd/server"
)

func TestParseEndpoints(t *testing.T) {
	for in, want := range map[string][]string{
		"":                          nil,
		" , ":                       nil,
		"http://a:1":                {"http://a:1"},
		" http://a:1 ,,http://b:2 ": {"http://a:1", "http://b:2"},
	} {
		if diff := cmp.Diff(want, server.ParseEndpoints(in)); diff != "" {
			t.Errorf("ParseEndpoints(%q) (-want +got):\n%s", in, diff)
		}
	}
}
