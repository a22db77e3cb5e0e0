package faultstore_test

import (
	"fmt"
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/store"
)

// The two fault switches of seed 004: fail_append fails outbox appends,
// fail_flush fails a flush that covers an outbox append.
func Example_seedSwitches() {
	mem := store.NewMemory()
	fs := faultstore.New(mem)
	failAppend := faultstore.NewSwitch(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix("outbox/")))
	failFlush := faultstore.NewSwitch(faultstore.When(faultstore.Fail, faultstore.Kind(faultstore.OpFlush), faultstore.Prefix("outbox/")))
	fs.SetRules(failAppend, failFlush)

	failAppend.Set(true)
	_, err := fs.Append("oplog/1", []byte("op"), 0)
	fmt.Println("barrier 1:", err, fs.Flush())
	_, err = fs.Append("outbox/1", []byte("row"), 0)
	fmt.Println("barrier 2:", err)
	failAppend.Set(false)

	failFlush.Set(true)
	_, err = fs.Append("outbox/1", []byte("row"), 0)
	fmt.Println("barrier 2:", err, fs.Flush())

	mem.Crash()
	n, _ := mem.Len("outbox/1")
	fmt.Println("outbox rows after a crash:", n)
	// Output:
	// barrier 1: <nil> <nil>
	// barrier 2: faultstore: injected fault: #2 append "outbox/1" not performed
	// barrier 2: <nil> faultstore: injected fault: #4 flush [outbox/1] not performed
	// outbox rows after a crash: 0
}

// A crash-cut test: the workload is killed at every op in turn, and each
// time the check sees what a restarted process would find.
func ExampleCutLoop() {
	var t *testing.T // the test's *testing.T
	faultstore.CutLoop{
		Workload: func(s *faultstore.Store) error {
			if _, err := s.Append("oplog/1", []byte("op"), 0); err != nil {
				return err
			}
			// The oplog row must be durable before its outbox row is appended.
			if err := s.Flush(); err != nil {
				return err
			}
			if _, err := s.Append("outbox/1", []byte("row"), 0); err != nil {
				return err
			}
			return s.Flush()
		},
		Check: func(t faultstore.TB, mem store.DurableStore, run faultstore.CutRun) {
			oplog, _ := mem.Len("oplog/1")
			outbox, _ := mem.Len("outbox/1")
			if outbox > oplog {
				t.Errorf("outbox has %d rows, oplog %d: an outbox row outlived its oplog row", outbox, oplog)
			}
		},
	}.Run(t)
}
