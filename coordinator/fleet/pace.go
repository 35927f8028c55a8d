package fleet

import (
	"fmt"
	"slices"
	"time"

	"heft/shared/wire"
)

// Below saturation an engine delivers what it is offered, whatever its
// speed, so a worker that slowed down while it serves looks the same in
// tokens per second. Its pace does not: the time between two tokens of a
// request at a given batch size (wire.Pace) stretches by the same factor
// as its capacity shrinks. The fleet keeps, per worker and measurement, a
// reference of seconds per token against batch size: the measurement's
// own burst (one request's decode rate with the probe's per-rank load
// running), and the first PaceLearn pace readings after it that agree with
// it. A reading slower than the reference at its batch size by more than
// PaceTolerance, PaceReadings times in a row, rescales the worker's
// capacity by the ratio (weight source "rescaled") and asks for a
// re-measurement, which the agent's probe.busy governs; readings that agree
// again, or a new measurement, end the rescale.
const (
	PaceTolerance = 0.15
	PaceReadings  = 2
	PaceLearn     = 6
	// CausePaceSlower names a re-measurement a slower pace asked for.
	CausePaceSlower = "pace_slower"
)

// Weight sources shown in the worker view.
const (
	SourceMeasured = "measured" // the newest valid measurement's throughput
	SourceRescaled = "rescaled" // that throughput over the pace factor
)

// pacePoint is seconds per token at a batch size per rank.
type pacePoint struct{ batch, spt float64 }

// paceState is one worker's pace reference and what its readings said.
type paceState struct {
	measured time.Time   // FinishedAt of the measurement the reference belongs to
	points   []pacePoint // by batch
	learned  int         // readings taken into points
	last     time.Time   // At of the newest reading counted
	slow     int         // readings in a row slower than the reference
	fine     int         // readings in a row that agree, while rescaled
	factor   float64     // capacity divisor while rescaled; 0 = not rescaled
	ratio    float64     // the newest reading's ratio to the reference
}

// reference is seconds per token at batch b per the points: piecewise
// linear between them; below the lowest its value (a step with fewer
// requests takes no longer), above the highest proportional to the batch
// (no longer than that). Both ends err on the side of a faster reference,
// so a slowdown is never invented.
func (s *paceState) reference(b float64) (float64, bool) {
	p := s.points
	switch {
	case len(p) == 0:
		return 0, false
	case b <= p[0].batch:
		return p[0].spt, true
	case b >= p[len(p)-1].batch:
		hi := p[len(p)-1]
		return hi.spt * b / hi.batch, true
	}
	i, _ := slices.BinarySearchFunc(p, b, func(x pacePoint, b float64) int {
		switch {
		case x.batch < b:
			return -1
		case x.batch > b:
			return 1
		}
		return 0
	})
	lo, hi := p[i-1], p[i]
	return lo.spt + (hi.spt-lo.spt)*(b-lo.batch)/(hi.batch-lo.batch), true
}

// learn adds a point, averaging it into one at nearly the same batch.
func (s *paceState) learn(pt pacePoint) {
	s.learned++
	for i, x := range s.points {
		if d := x.batch - pt.batch; d > -0.5 && d < 0.5 {
			s.points[i].spt = (x.spt + pt.spt) / 2
			return
		}
	}
	s.points = append(s.points, pt)
	slices.SortFunc(s.points, func(a, b pacePoint) int {
		switch {
		case a.batch < b.batch:
			return -1
		case a.batch > b.batch:
			return 1
		}
		return 0
	})
}

// reset starts a reference for measurement m: its burst's point, when it
// says how fast one request decoded.
func (s *paceState) reset(m *wire.Measurement) {
	*s = paceState{measured: m.FinishedAt, last: s.last}
	if m.DecodeTPSP50 > 0 && m.Concurrency > 0 {
		s.points = []pacePoint{{batch: float64(m.Concurrency) / float64(max(1, m.Ranks)), spt: 1 / m.DecodeTPSP50}}
	}
}

// notePace counts a new pace reading against w's valid measurement and
// names a re-measurement's cause when it starts a rescale.
func (f *Fleet) notePace(w *worker, p *wire.Pace) string {
	s := &w.pace
	if p == nil || !p.At.After(s.last) || p.SecondsPerToken <= 0 || p.Batch <= 0 {
		return ""
	}
	s.last = p.At
	m := f.newest(w.id)
	if m == nil || !m.Valid() || !p.At.After(m.FinishedAt) {
		return ""
	}
	if !s.measured.Equal(m.FinishedAt) {
		s.reset(m)
	}
	ref, ok := s.reference(p.Batch)
	if !ok {
		if s.learned < PaceLearn {
			s.learn(pacePoint{p.Batch, p.SecondsPerToken})
		}
		return ""
	}
	s.ratio = p.SecondsPerToken / ref
	if s.ratio <= 1+PaceTolerance {
		s.slow = 0
		if s.factor > 0 {
			if s.fine++; s.fine >= PaceReadings {
				s.factor, s.fine = 0, 0
				f.log.Info("engine's pace agrees with its measurement again; its weight comes from the measurement", "worker", w.id)
			}
			return ""
		}
		if s.learned < PaceLearn {
			s.learn(pacePoint{p.Batch, p.SecondsPerToken})
		}
		return ""
	}
	s.fine = 0
	if s.slow++; s.slow < PaceReadings {
		return ""
	}
	started := s.factor == 0
	s.factor = s.ratio
	if !started {
		return ""
	}
	f.log.Info("engine runs slower than measured while it serves; its capacity is rescaled until it is measured again",
		"worker", w.id, "seconds_per_token", p.SecondsPerToken, "reference", ref, "batch", p.Batch, "factor", s.ratio)
	return fmt.Sprintf("%s: %.1f ms per token at %.1f running per rank, %.1f ms when measured; capacity rescaled to %.0f tok/s",
		CausePaceSlower, 1000*p.SecondsPerToken, p.Batch, 1000*ref, m.ThroughputTPS/s.factor)
}

// capacity is what w's weight counts of its measurement m: its throughput,
// over the pace factor while rescaled; and which of the two it is.
func (w *worker) capacity(m *wire.Measurement) (float64, string) {
	if w.pace.factor > 0 && w.pace.measured.Equal(m.FinishedAt) {
		return m.ThroughputTPS / w.pace.factor, SourceRescaled
	}
	return m.ThroughputTPS, SourceMeasured
}
