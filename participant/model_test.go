package participant_test

import (
	"flag"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/participantd/participantd/faultstore"
	"github.com/participantd/participantd/participant/participanttest"
)

var (
	modelIters = flag.Int("model.iters", 200, "sequences TestModel runs")
	modelOps   = flag.Int("model.ops", 60, "operations per TestModel sequence")
	modelSeed  = flag.Uint64("model.seed", 0, "first seed of TestModel; 0 picks one from the clock")
)

// TestModel feeds the same random operations to the service and to
// participanttest's reference model, with crash-restarts and in_doubt
// faults, and compares every answer, every participant's deliveries and
// the connections' wakes. Package cluster runs the same model over etcd.
func TestModel(t *testing.T) {
	seed := *modelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	iters := *modelIters
	if testing.Short() {
		iters = min(iters, 20)
	}
	participanttest.Model{Backend: faultstore.MemoryBackend(nil), Iters: iters, Ops: *modelOps, Seed: seed, Rerun: "go test ./participant -run TestModel"}.Run(t)
}

// TestModel_Starved is TestModel on one processor shared with a goroutine
// that never yields of its own accord: the scheduling-delay fault model.
// Every goroutine of the service (the batch leader, background reloads,
// the checkpointer's turn) then runs only when the Go scheduler preempts
// the hog, about every 10 ms, so interleavings that a lightly loaded
// machine never produces (a reload overtaken by the next operation, a
// wake delivered long after its commit) are the common case, as they are
// on a machine at load 20. The model's clock is its own, so the delays
// change no answer the model predicts: any difference is an ordering
// assumption of the service.
func TestModel_Starved(t *testing.T) {
	if testing.Short() {
		t.Skip("starved model: slow on one processor")
	}
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	stop := make(chan struct{})
	var hog sync.WaitGroup
	hog.Add(1)
	go func() {
		defer hog.Done()
		for n := 0; ; n++ {
			if n%(1<<20) == 0 {
				select {
				case <-stop:
					return
				default:
				}
			}
		}
	}()
	defer func() {
		close(stop)
		hog.Wait()
	}()
	seed := *modelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	participanttest.Model{Backend: faultstore.MemoryBackend(nil), Iters: *modelIters, Ops: *modelOps, Seed: seed,
		Rerun: "go test ./participant -run TestModel_Starved"}.Run(t)
}
