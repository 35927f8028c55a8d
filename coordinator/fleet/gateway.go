package fleet

import (
	"math"

	"heft/shared/address"
	"heft/shared/wire"
)

// Address is the host:port a gateway dials for an engine: its advertise
// URL when the agent sent one, else the URL the agent dials (an older
// agent, or one that found nothing better; shared/health warns when that
// is a loopback address). "" when neither names a host.
func Address(e wire.Engine) string {
	for _, raw := range []string{e.AdvertiseURL, e.URL} {
		if raw == "" {
			continue
		}
		if hp, err := address.HostPort(raw); err == nil {
			return hp
		}
	}
	return ""
}

// MaxConcurrency is how many requests a gateway should have open on a
// worker at once (see "Concurrency caps" in doc.go): what the engine runs
// at once, grown with the worker's weight, never below it. nil when the
// engine's own limit is unknown.
func MaxConcurrency(maxRunning int, weight *float64) *int {
	if maxRunning <= 0 {
		return nil
	}
	n := maxRunning
	if weight != nil && *weight > 1 && !math.IsInf(*weight, 0) {
		n = int(min(math.Ceil(float64(maxRunning)**weight), wire.MaxRunning))
		n = max(n, maxRunning)
	}
	return &n
}
