package cli

import (
	"os"
	"testing"

	"heft/shared/testutil"
)

// simChildEnv makes the test binary a simulated engine (simChild) when
// set: the discovery test starts real processes with a heft-sim command
// line.
const simChildEnv = "HEFT_CLI_TEST_SIM"

func TestMain(m *testing.M) {
	if os.Getenv(simChildEnv) != "" {
		os.Exit(simChild(os.Args[1:]))
	}
	testutil.VerifyNoLeaks(m)
}
