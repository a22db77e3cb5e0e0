package logfirst_test

import (
	"errors"
	"testing"

	"github.com/participantd/participantd/store"
	"github.com/participantd/participantd/store/logfirst"
)

// A CAS or an Append that loads from bbolt, with the store's mutex
// released, while Close runs returns store.ErrClosed: it stages nothing
// into the state Close released (it used to write into a nil map).
func TestStore_LoadThatOutlivesClose_IsErrClosed(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(s *logfirst.Store) error
	}{
		{"CAS", func(s *logfirst.Store) error { return s.CAS("k", 0, 1) }},
		{"Append", func(s *logfirst.Store) error { _, err := s.Append("s", []byte("p"), 0); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, t.TempDir(), noCheckpoint)
			closed := false
			logfirst.SetViewed(s, func() {
				if closed {
					return
				}
				closed = true
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			if err := tc.call(s); !errors.Is(err, store.ErrClosed) {
				t.Fatalf("%s whose load outlived Close = %v, want store.ErrClosed", tc.name, err)
			}
		})
	}
}
