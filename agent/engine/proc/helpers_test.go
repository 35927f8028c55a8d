package proc

import (
	"os"
	"testing"

	"heft/agent/internal/testchild"
	"heft/shared/testutil"
)

// childEnv chooses what the test binary does as a child process
// (testchild): "listen" listens and reports its port; "parent" starts a
// "listen" child under a bare process title and waits for it.
const childEnv = "HEFT_PROC_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		testutil.VerifyNoLeaks(m)
	case "listen":
		os.Exit(testchild.Serve(nil))
	case "parent":
		os.Exit(testchild.Parent("VLLM::APIServer", childEnv+"=listen"))
	default:
		os.Exit(2)
	}
}

// startChild runs the test binary as a child in mode with argv as its
// command line.
func startChild(t *testing.T, mode string, argv []string) *testchild.Child {
	t.Helper()
	return testchild.Start(t, argv, childEnv+"="+mode)
}
