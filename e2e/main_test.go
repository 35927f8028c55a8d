package e2e

import (
	"testing"

	"heft/shared/testutil"
)

// Every sim, agent and coordinator a test starts is stopped by the time
// the package's tests end.
//
// Every test here is t.Parallel (go test runs GOMAXPROCS of them at
// once): each starts its own coordinator, agents and sims on ports of
// its own, spends most of its time waiting on them, and judges rules
// (weights are throughput over the median, held workers get nothing),
// not speeds, so sharing the machine cannot change a verdict.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
