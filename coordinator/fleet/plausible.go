package fleet

import (
	"fmt"
	"strings"

	"heft/shared/health"
	"heft/shared/wire"
)

// implausible returns why a valid measurement's numbers are beyond what
// the worker could produce, or "". What the agent's probe flagged (token
// timing) is kept; the fleet adds what it can judge from the numbers and
// the worker's facts: a throughput per GPU above any GPU's, or per stream
// above any engine's. These are stored with the measurement, so the
// verdict survives a restart. The comparison with the model's median,
// which moves with the fleet, is made at weighing (outlier).
func (f *Fleet) implausible(w *worker, m wire.Measurement) string {
	var why []string
	if m.Implausible != "" {
		why = append(why, "the agent's probe: "+m.Implausible)
	}
	if limit := f.cfg.MaxTPSPerGPU; limit > 0 {
		gpus := max(1, len(w.gpus))
		if m.ThroughputTPS > limit*float64(gpus) {
			why = append(why, fmt.Sprintf("%.4g tok/s on %d GPU(s) is above %.4g tok/s per GPU (plausibility.max_tps_per_gpu)",
				m.ThroughputTPS, gpus, limit))
		}
	}
	if limit := f.cfg.MaxStreamTPS; limit > 0 {
		streams := max(1, min(m.Concurrency, m.Requests))
		if per := m.ThroughputTPS / float64(streams); per > limit {
			why = append(why, fmt.Sprintf("%.4g tok/s over %d concurrent requests is %.4g tok/s per request, above %.4g (plausibility.max_stream_tps)",
				m.ThroughputTPS, streams, per, limit))
		}
		// The decode percentiles are not judged here: they time the gaps
		// between chunks as the agent read them, and an agent starved of
		// CPU reads a stream's chunks in bunches (an honest engine read
		// 21,370 tok/s "per stream" at a load of 25). One stream's speed
		// from its sending to its last token, which a delay can only make
		// slower, is judged by the agent (probe.MaxStreamTPS, Implausible).
	}
	return strings.Join(why, "; ")
}

// minPeersForMedian is how many admitted workers a model needs, the
// worker itself included, before its median says what is plausible: with
// three, one outlier cannot move the median.
const minPeersForMedian = 3

// outlierFinding returns the finding of a worker measured at more than
// ImplausibleFactor × its model's median, or nil.
func (f *Fleet) outlierFinding(w *worker, model string, med float64, n int) *health.Finding {
	if f.cfg.ImplausibleFactor <= 0 || n < minPeersForMedian || med <= 0 || w.tps <= f.cfg.ImplausibleFactor*med {
		return nil
	}
	x := health.Finding{Code: wire.CodeImplausibleMeasurement, Severity: wire.SeverityCritical, Message: fmt.Sprintf(
		"measured %.0f tok/s, %.1f× the median of %.0f tok/s over the %d measured workers of %s; more than %g× is held as implausible "+
			"(plausibility.factor). If the number is real, an admin admits the worker.", w.tps, w.tps/med, med, n, model, f.cfg.ImplausibleFactor)}
	return &x
}

// implausibleFinding describes a stored verdict.
func implausibleFinding(m wire.Measurement, admitted bool) health.Finding {
	x := health.Finding{Code: wire.CodeImplausibleMeasurement, Severity: wire.SeverityCritical, Message: fmt.Sprintf(
		"the measurement of %.4g tok/s is implausible: %s. The worker is held; if the number is real, an admin admits it.",
		m.ThroughputTPS, m.Implausible)}
	if admitted {
		x.Severity = wire.SeverityWarning
		x.Message = fmt.Sprintf("the measurement of %.4g tok/s looked implausible (%s); an admin has admitted the worker anyway.",
			m.ThroughputTPS, m.Implausible)
	}
	return x
}
