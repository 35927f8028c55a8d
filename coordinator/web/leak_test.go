package web_test

import (
	"testing"

	"heft/shared/testutil"
)

// The coordinators, scripted agents and browsers the tests start are all
// stopped by the end.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
