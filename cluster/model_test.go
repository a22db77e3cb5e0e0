package cluster_test

import (
	"flag"
	"testing"
	"time"

	"github.com/participantd/participantd/participant/participanttest"
)

var (
	modelIters = flag.Int("model.iters", 60, "sequences TestModelOverEtcd runs")
	modelSeed  = flag.Uint64("model.seed", 0, "first seed of TestModelOverEtcd; 0 picks one from the clock")
)

// TestModelOverEtcd runs participant's randomized model test over the etcd
// store laid out as cluster mode lays it out, a crash-restart closing the
// store without flushing and reopening it on the same prefix: every answer,
// delivery and wake must match the reference model, as over the memory
// store. Etcd transactions fsync, so it plays fewer sequences than
// participant's TestModel; each run starts from a new seed.
func TestModelOverEtcd(t *testing.T) {
	seed := *modelSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	iters := *modelIters
	if testing.Short() {
		iters = min(iters, 10)
	}
	participanttest.Model{
		Backend: etcdBackend(t, seed, 0),
		Iters:   iters,
		Ops:     60,
		Seed:    seed,
		Rerun:   "go test ./cluster -run TestModelOverEtcd",
	}.Run(t)
}
