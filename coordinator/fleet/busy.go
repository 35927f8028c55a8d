package fleet

import (
	"fmt"
	"time"

	"heft/shared/health"
	"heft/shared/wire"
)

// A probe request that finds the engine busy is answered deferred_busy:
// the engine never went idle within the agent's busy_wait, or the burst
// ran and the engine's own counter showed other traffic sharing it, so it
// was discarded. A worker still routed while unmeasured (heft-sync keeps
// what a restarted coordinator does not list) shares every burst, and
// asking again every BusyRetry sent a full burst onto its users each
// time. Each deferral in a row doubles the wait, up to
// BusyRetry × 2^maxBusyDoublings, until a valid measurement; the worker
// carries probe_deferred meanwhile.

// maxBusyDoublings bounds the wait: 16 × busy_retry (8 min by default).
const maxBusyDoublings = 4

// busyRetry is how long to wait after the n-th deferral in a row.
func (f *Fleet) busyRetry(n int) time.Duration {
	return f.cfg.BusyRetry << min(max(n-1, 0), maxBusyDoublings)
}

// deferredFinding says that the worker's engine was busy at its last
// probe requests, and when heft asks again; nil when it was not. It is a
// warning while the worker has no valid measurement (it cannot be
// admitted); for a measured worker whose re-measurement waits, info.
func (f *Fleet) deferredFinding(w *worker, m *wire.Measurement) *health.Finding {
	p := w.probe
	if p.busy == 0 {
		return nil
	}
	sev := wire.SeverityWarning
	if m != nil && m.Valid() {
		sev = wire.SeverityInfo
	}
	next := "at the next request"
	if !p.retryAt.IsZero() {
		next = "at " + p.retryAt.UTC().Format(time.RFC3339)
	}
	return &health.Finding{Code: wire.CodeProbeDeferred, Severity: sev, Message: fmt.Sprintf(
		"%d probe request(s) in a row found the engine busy (last: %s). heft asks again %s, waiting twice as long after each "+
			"(busy_retry, up to %s). The agent's probe_busy = \"drain\" measures it while the gateways send it nothing.",
		p.busy, wire.Clip(p.busyMsg, 300), next, f.busyRetry(maxBusyDoublings+1))}
}
