package participant

import "testing"

// The one eviction rule of a commit (backlog.excess), which an install
// and a batch about to be cloned (evictSharedLocked) both apply: the
// payloads past the window, and, when the service is still past its
// hard bound (a quarter past the budget) without them, down to the
// budget.
func TestBacklog_Excess(t *testing.T) {
	const window, budget = 100, 1000 // hard bound 1250
	bl := newBacklog(budget, window, backlogLimits{})
	for _, c := range []struct {
		name           string
		payload, total int64
		want           int64
	}{
		{"within the window and the bound", 80, 900, 0},
		{"past the window alone", 130, 900, 30},
		{"at the hard bound, within the window", 80, 1250, 0},
		{"past the hard bound, within the window", 80, 1300, 300},
		{"the window alone brings the service under the bound", 200, 1300, 100},
		{"the window alone brings the service to the bound", 150, 1300, 50},
		{"past the bound beyond the window", 200, 1500, 500},
	} {
		if got := bl.excess(c.payload, c.total); got != c.want {
			t.Errorf("%s: excess(payload=%d, total=%d) = %d, want %d", c.name, c.payload, c.total, got, c.want)
		}
	}
}
