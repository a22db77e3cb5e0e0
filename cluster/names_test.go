package cluster_test

import (
	"testing"

	"github.com/participantd/participantd/cluster"
)

// TestScope: every name of a conversation, its checkpoint and receipts
// included, is the conversation's scope (one key range, one fence); a
// name that only looks like one is global.
func TestScope(t *testing.T) {
	for name, want := range map[string]string{
		"oplog/12":                           "12",
		"outbox/12":                          "12",
		"token/12/abc":                       "12",
		"token/12/window":                    "12",
		"checkpoint/12":                      "12",
		"receipt/12/00000000000000000007":    "12",
		"receipt/12":                         "",
		"checkpoint/x1":                      "",
		"checkpoint/":                        "",
		"conversations":                      "",
		"server/incarnation":                 "",
		"receipt/123456789012345678901/0001": "",
	} {
		if got := cluster.Scope(name); got != want {
			t.Errorf("Scope(%q) = %q, want %q", name, got, want)
		}
	}
}
