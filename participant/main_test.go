package participant

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: a service
// owns its background reloads, and Close must wait for them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
