//go:build race

package cluster_test

// raceEnabled slows everything several times; time bounds widen with it.
const raceEnabled = true
