package reliability

import (
	"testing"

	"heft/shared/testutil"
)

// Every coordinator, agent link, sim and proxy a fault test starts is
// stopped by the end, faults included.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
