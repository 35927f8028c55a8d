package coord

import (
	"math/rand/v2"
	"time"
)

// retryDelay is the wait before reconnect attempt n (0 for the first):
// lo·2ⁿ capped at hi, then a random point in its upper half, so many
// heft-syncs do not return to a restarted coordinator in step.
// (A shared/backoff package may replace it once one exists on main.)
func retryDelay(n int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 0; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
