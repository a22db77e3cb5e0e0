package participant_test

import (
	"flag"
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
