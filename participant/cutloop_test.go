package participant_test

import (
	"testing"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/outbox"
	"github.com/participantd/participantd/participant"
	"github.com/participantd/participantd/participant/participanttest"
	"github.com/participantd/participantd/store"
)

// TestCrashCutAtEveryOperation cuts the workload at every store operation
// in turn, restarts on what was flushed, and checks the contract: every
// answered operation is there and replays, the outbox is the projection
// of the oplog, seqs have no gap or duplicate, and each binding ended at
// most once. Package cluster runs the same loop over etcd.
func TestCrashCutAtEveryOperation(t *testing.T) {
	var log []participanttest.Answered
	runs := 0
	faultstore.CutLoop{
		Workload: func(s *faultstore.Store) error { return participanttest.CutWorkload(s, &log) },
		Check: func(t faultstore.TB, st store.DurableStore, run faultstore.CutRun) {
			runs++
			participanttest.CheckInvariants(t, st, log)
			if run.Completed {
				participanttest.CheckCompacted(t, st)
			}
		},
	}.Run(t)
	if runs < 50 {
		t.Fatalf("the cut loop ran %d times; the workload should make far more store operations", runs)
	}
	t.Logf("cut at %d operation indices", runs)
}

// TestCutLoop_MemoryBackend runs participanttest.CutLoop, the loop other
// stores run, over the memory store with a stride, so that the loop itself
// is tested where it is cheap.
func TestCutLoop_MemoryBackend(t *testing.T) {
	runs := participanttest.CutLoop{Backend: faultstore.MemoryBackend(nil), Stride: 7, Offset: 3}.Run(t)
	if runs < 10 {
		t.Fatalf("the loop checked %d runs; the workload should make far more store operations", runs)
	}
}

// TestCrashCut_TokenWindow cuts participanttest.WindowWorkload, whose
// compaction passes forget tokens under a token window, at every store
// operation: after the restart every answered tell replays or is
// token_expired, never committed again, and the contract holds
// (Inspect, which CheckInvariants runs, also finds any committed token
// whose index entry is gone above the floor).
func TestCrashCut_TokenWindow(t *testing.T) {
	runs := participanttest.CutLoop{Backend: faultstore.MemoryBackend(nil),
		Workload: participanttest.WindowWorkload, Completed: participanttest.CheckForgotten}.Run(t)
	if runs < 50 {
		t.Fatalf("the loop checked %d runs; the workload should make far more store operations", runs)
	}
}

// TestCrashCut_MaxUnackedAge cuts participanttest.ReleaseWorkload, whose
// compaction passes release records a deaf recipient never acknowledged
// and then trim them, at every store operation: after the restart every
// answered tell replays, the contract holds (CheckInvariants), and the
// completed run trimmed the deaf recipient's history.
func TestCrashCut_MaxUnackedAge(t *testing.T) {
	runs := participanttest.CutLoop{Backend: faultstore.MemoryBackend(nil),
		Workload: participanttest.ReleaseWorkload, Completed: participanttest.CheckReleased}.Run(t)
	if runs < 50 {
		t.Fatalf("the loop checked %d runs; the workload should make far more store operations", runs)
	}
}

// TestCrashCut_TwoSyncs is TestCrashCutAtEveryOperation over a store that
// does not keep its writes' order (faultstore.SetUnordered), so that each
// batch flushes once per barrier, as on etcd: the cuts between the
// barriers leave oplog rows without their outbox rows, which the restart
// repairs.
func TestCrashCut_TwoSyncs(t *testing.T) {
	crashCutCountingGaps(t, func(s *faultstore.Store) { s.SetUnordered(true) })
}

// TestCrashCut_GroupCommitBetweenTheBarriers cuts the workload at every
// store operation over a store that keeps order, so that each batch's
// barriers share one sync, while another writer's group commit lands
// before every outbox append (faultstore.FlushFirst): the oplog rows are
// then durable alone, and a cut before the batch's own flush leaves the
// gap a shared sync can leave. The restart must repair every such gap
// byte for byte (CheckInvariants: the outbox is the oplog's projection,
// Inspect finds nothing left to repair) and replay every answer.
func TestCrashCut_GroupCommitBetweenTheBarriers(t *testing.T) {
	crashCutCountingGaps(t, func(s *faultstore.Store) {
		s.AddRule(faultstore.When(faultstore.FlushFirst, faultstore.Kind(faultstore.OpAppend), faultstore.Prefix(outbox.StreamPrefix)))
	})
}

// crashCutCountingGaps runs the cut loop of TestCrashCutAtEveryOperation
// with setup applied to each run's store, and fails unless some cut left
// a gap (an oplog row without its outbox rows) for reconciliation to
// repair: otherwise the loop would not exercise repair at all.
func crashCutCountingGaps(t *testing.T, setup func(*faultstore.Store)) {
	var log []participanttest.Answered
	runs, gaps := 0, 0
	faultstore.CutLoop{
		Workload: func(s *faultstore.Store) error {
			setup(s)
			return participanttest.CutWorkload(s, &log)
		},
		Check: func(t faultstore.TB, st store.DurableStore, run faultstore.CutRun) {
			runs++
			reports, err := participant.Inspect(st)
			if err != nil {
				t.Fatalf("Inspect after the crash: %v", err)
			}
			for _, r := range reports {
				if r.Repairs > 0 {
					gaps++
				}
			}
			participanttest.CheckInvariants(t, st, log)
			if run.Completed {
				participanttest.CheckCompacted(t, st)
			}
		},
	}.Run(t)
	if runs < 50 {
		t.Fatalf("the cut loop ran %d times; the workload should make far more store operations", runs)
	}
	if gaps == 0 {
		t.Fatalf("no cut of %d left a gap for reconciliation to repair", runs)
	}
	t.Logf("cut at %d operation indices; %d left a gap that the restart repaired", runs, gaps)
}
