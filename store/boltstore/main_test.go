package boltstore_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine running, such as
// a committer of a store nobody closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
