package fence_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when any test leaves a goroutine behind, such
// as a completion still parked on a lease that was never settled.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
