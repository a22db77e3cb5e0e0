package stage

import (
	"fmt"
	"testing"
)

// A value loaded while writes landed may be stale: it is neither trusted
// nor cached.
func TestValues_CacheLocked_RefusesALoadALandingOvertook(t *testing.T) {
	for _, forget := range []Forget{ForgetAtLanding, ForgetLanded} {
		vs := NewValues(forget)
		epoch := vs.EpochLocked()
		vs.StageLocked("k", 7)
		vs.LandLocked(vs.TakeStagedLocked())
		if vs.CacheLocked("k", 0, epoch) {
			t.Errorf("forget %d: CacheLocked(k = 0 loaded before 7 landed) = true, want false", forget)
		}
		if _, ok := vs.GetLocked("k"); ok {
			t.Errorf("forget %d: the stale load was cached", forget)
		}
	}
}

// A landing drops a key's write only if no later write of it is in
// memory.
func TestValues_LandLocked_KeepsALaterWriteOfTheKey(t *testing.T) {
	vs := NewValues(ForgetLanded)
	vs.StageLocked("k", 1)
	taken := vs.TakeStagedLocked()
	vs.StageLocked("k", 2)
	vs.LandLocked(taken)
	if v, ok := vs.GetLocked("k"); !ok || v != 2 {
		t.Fatalf("GetLocked(k) after the first write landed = %d, %v; want the second, 2", v, ok)
	}
	if !vs.StagedLocked() {
		t.Fatal("the second write is no longer staged")
	}
	vs.LandLocked(vs.TakeStagedLocked())
	if n := vs.LenLocked(); n != 0 {
		t.Fatalf("LenLocked after every write landed = %d, want 0", n)
	}
}

// ForgetAtLanding forgets every read at a landing; ForgetLanded only the
// reads of the keys that landed.
func TestValues_LandLocked_ForgetsReadsAsItsPolicySays(t *testing.T) {
	for _, tc := range []struct {
		forget Forget
		kept   bool
	}{{ForgetAtLanding, false}, {ForgetLanded, true}} {
		vs := NewValues(tc.forget)
		vs.CacheLocked("read", 5, vs.EpochLocked())
		vs.CacheLocked("written", 0, vs.EpochLocked())
		vs.StageLocked("written", 1)
		vs.LandLocked(vs.TakeStagedLocked())
		if _, ok := vs.GetLocked("read"); ok != tc.kept {
			t.Errorf("forget %d: read of an unwritten key kept = %v, want %v", tc.forget, ok, tc.kept)
		}
		if _, ok := vs.GetLocked("written"); ok {
			t.Errorf("forget %d: the landed key is still in the layer", tc.forget)
		}
	}
}

// The cache holds MaxCachedValues reads at the most.
func TestValues_CacheLocked_IsBounded(t *testing.T) {
	for _, forget := range []Forget{ForgetAtLanding, ForgetLanded} {
		vs := NewValues(forget)
		for i := range MaxCachedValues + 10 {
			if !vs.CacheLocked(fmt.Sprint(i), 1, vs.EpochLocked()) {
				t.Fatalf("forget %d: CacheLocked refused a current value", forget)
			}
		}
		if n := vs.LenLocked(); n > MaxCachedValues {
			t.Errorf("forget %d: %d reads cached, want at most %d", forget, n, MaxCachedValues)
		}
	}
}
