package e2e

import (
	"testing"

	"heft/shared/testutil"
)

// Every sim, agent and coordinator a test starts is stopped by the time
// the package's tests end.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
