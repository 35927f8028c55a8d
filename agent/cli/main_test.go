package cli

import (
	"testing"

	"heft/shared/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
