package link

import "time"

// backoff returns the wait before reconnect attempt n (0 for the first
// retry): uniformly random between lo and lo·2^(n+1), capped at hi. The
// jitter keeps a fleet of agents from reconnecting in step after a
// coordinator restart. randN(k) must return a number in [0, k).
func backoff(n int, lo, hi time.Duration, randN func(int64) int64) time.Duration {
	if hi < lo {
		hi = lo
	}
	ceil := lo
	for i := 0; i <= n && ceil < hi; i++ {
		ceil *= 2
	}
	ceil = min(ceil, hi)
	if ceil <= lo {
		return lo
	}
	return lo + time.Duration(randN(int64(ceil-lo)+1))
}
