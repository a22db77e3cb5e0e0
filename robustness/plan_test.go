package robustness_test

import (
	"testing"
	"time"
)

// TestPlan_ShortRunMeetsEveryNemesis: the short run's fixed seeds together
// inject every nemesis, so that `go test ./...` exercises each fault; and
// a plan is a function of its seed.
func TestPlan_ShortRunMeetsEveryNemesis(t *testing.T) {
	met := map[string]int{}
	for _, seed := range shortSeeds {
		events := plan(seed, shortDuration, nodeCount, nemeses)
		for _, e := range events {
			met[e.Nemesis]++
			if e.At+e.Hold > shortDuration {
				t.Errorf("seed %d: %v ends after the run", seed, e)
			}
		}
		again := plan(seed, shortDuration, nodeCount, nemeses)
		if len(again) != len(events) || (len(events) > 0 && again[len(again)-1] != events[len(events)-1]) {
			t.Errorf("seed %d: two plans differ", seed)
		}
	}
	for _, n := range nemeses {
		if met[n.name] == 0 {
			t.Errorf("the short run (seeds %v, %v each) never injects %s; it injects %v", shortSeeds, shortDuration, n.name, met)
		}
	}
}

func TestPlan_LongRunKeepsInjecting(t *testing.T) {
	events := plan(11, 30*time.Minute, nodeCount, nemeses)
	if len(events) < 300 {
		t.Fatalf("a 30 m plan has %d events, want one every few seconds", len(events))
	}
}
