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

// TestScanScope: a prefix is reported in one scope only when every name
// that begins with it has the prefix's scope (Scope of the prefix and of
// any name under it agree); "token/1" also begins "token/12/…" and is not.
func TestScanScope(t *testing.T) {
	for _, tt := range []struct {
		prefix string
		want   string // Scope(prefix), when ok
		ok     bool
	}{
		{"token/12/", "12", true},
		{"token/12/e/", "12", true},
		{"receipt/12/", "12", true},
		{"token/x/", "", true},
		{"token/12", "", false},
		{"token/", "", false},
		{"oplog/12", "", false},
		{"checkpoint/12", "", false},
		{"", "", false},
	} {
		ok := cluster.ScanScope(tt.prefix)
		if ok != tt.ok {
			t.Errorf("ScanScope(%q) = %v, want %v", tt.prefix, ok, tt.ok)
			continue
		}
		if !ok {
			continue
		}
		got := cluster.Scope(tt.prefix)
		if got != tt.want {
			t.Errorf("Scope(%q) = %q, want %q", tt.prefix, got, tt.want)
		}
		for _, suffix := range []string{"", "a", "7/x", "window", "00000000000000000007"} {
			if sc := cluster.Scope(tt.prefix + suffix); sc != got {
				t.Errorf("Scope(%q) = %q, but ScanScope(%q) and Scope(%[3]q) = %[4]q", tt.prefix+suffix, sc, tt.prefix, got)
			}
		}
	}
}
