package faultstore

import (
	"errors"
	"testing"

	"github.com/participantd/participantd/store"
)

// bareStore is a DurableStore without Compactor or PageReader.
type bareStore struct{ store.DurableStore }

func TestStore_CompactorOverAStoreWithoutItIsUnsupported(t *testing.T) {
	s := New(bareStore{store.NewMemory()})
	if err := s.Trim("a", 1); !errors.Is(err, store.ErrUnsupported) {
		t.Errorf("Trim = %v, want ErrUnsupported", err)
	}
	if _, err := s.First("a"); !errors.Is(err, store.ErrUnsupported) {
		t.Errorf("First = %v, want ErrUnsupported", err)
	}
	if err := s.PutBytes([]store.Bytes{{Key: "k", Value: []byte("v")}}); !errors.Is(err, store.ErrUnsupported) {
		t.Errorf("PutBytes = %v, want ErrUnsupported", err)
	}
	if _, err := s.GetBytes("k"); !errors.Is(err, store.ErrUnsupported) {
		t.Errorf("GetBytes = %v, want ErrUnsupported", err)
	}
	// ReadPage falls back to ReadFrom.
	mustAppend(t, s, "a", "x", 0)
	if got, err := s.ReadPage("a", 0, 0, 1); err != nil || len(got) != 1 {
		t.Errorf("ReadPage over a store without PageReader = %d entries, %v, want 1, nil", len(got), err)
	}
}

func TestStore_CompactionOpsAreCountedAndInjectable(t *testing.T) {
	mem, s, rec := newObserved()
	for seq := range uint64(3) {
		mustAppend(t, s, "a", "x", seq)
	}
	mustFlush(t, s)
	s.SetRules(When(Fail, Kind(OpTrim, OpPutBytes)))
	if err := s.Trim("a", 1); !errors.Is(err, ErrInjected) {
		t.Fatalf("Trim = %v, want ErrInjected", err)
	}
	if err := s.PutBytes([]store.Bytes{{Key: "k", Value: []byte("v")}}); !errors.Is(err, ErrInjected) {
		t.Fatalf("PutBytes = %v, want ErrInjected", err)
	}
	if first, _ := mem.First("a"); first != 0 {
		t.Errorf("inner First(a) = %d after a failed trim, want 0", first)
	}
	if v, _ := mem.GetBytes("k"); v != nil {
		t.Errorf("inner GetBytes(k) = %q after a failed PutBytes, want nil", v)
	}
	s.SetRules(When(Uncertain, Kind(OpTrim)))
	if err := s.Trim("a", 1); !errors.Is(err, ErrInjected) {
		t.Fatalf("uncertain Trim = %v, want ErrInjected", err)
	}
	if first, _ := s.First("a"); first != 1 {
		t.Errorf("First(a) after an uncertain trim = %d, want 1", first)
	}
	var kinds []OpKind
	for _, r := range rec.sorted() {
		kinds = append(kinds, r.Op.Kind)
	}
	want := []OpKind{OpAppend, OpAppend, OpAppend, OpFlush, OpTrim, OpPutBytes, OpTrim, OpRead}
	if len(kinds) != len(want) {
		t.Fatalf("ops = %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("ops = %v, want %v", kinds, want)
		}
	}
}
