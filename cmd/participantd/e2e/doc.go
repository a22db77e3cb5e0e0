// Package e2e holds the end-to-end tests of participantd: they build the
// real binary, run it as a subprocess on a temporary data directory, load
// it with a raw wire client, SIGKILL it and restart it, and check that every
// answered request survived. The tests are skipped under -short.
//
// TestSoak_AnsweredSurviveKills is the release soak (make soak): by default
// 5 rounds; with -soak-rounds 1000 -soak-rows 100000 -soak-sample 1000 the
// run docs/operations.md ("Release soak") records before each release.
//
// TestSIGTERM_HungStoreExitsWithinBound builds the binary with the
// faulthook build tag, whose test hook (cmd/participantd/faulthook.go, in
// no release build) makes every store flush hang from a SIGUSR1 on.
package e2e
