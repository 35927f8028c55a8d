package fleet

import (
	"fmt"
	"math"
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
//
// One reading slower by more than PaceStrong rescales at once, tentatively:
// decode-only 10 s windows on real engines stray at most 14 % from their
// neighbours, 5 s windows 27 % (docs/measuring.md), so a reading 30 %
// slower is a change, and every second at the old weight sends the slowed
// worker more than it can carry. A reading whose window is not far slower
// as a whole but whose newest half (wire.Pace's Recent) is counts as that
// half: a change late in a window shows there first. The weight is all a
// tentative rescale touches: the next slow reading confirms it (and asks
// for the re-measurement), the next one that agrees ends it at once. A
// window far slower as a whole counts its newest half too where that is
// slower than its older half by more than PaceTolerance: the window
// straddles the change, and its whole would leave the weight between the
// old speed and the new for another reading. A span shorter than 5 s (a
// short pace window, or the newer 2 s or more of a window the agent ended
// early on a sudden slowdown) must be slower in proportion (strongFor).
//
// Prompts read while requests decode stretch the time between their tokens
// (vLLM puts prompt chunks in the decode steps, SGLang runs prompt batches
// between them) by the share of the engine's time the prompts take: the
// prompt tokens it computed per second over the window (wire.Pace's
// PromptTPS) over its measured prefill rate. A reading counts its decode
// part, seconds per token times one less that share; one whose prompts
// took more than MaxPrefillShare says too little of decoding and counts
// for nothing.
const (
	PaceTolerance   = 0.15
	PaceStrong      = 0.30
	PaceReadings    = 2
	PaceLearn       = 6
	MaxPrefillShare = 0.5
	// strongSpan is the shortest span PaceStrong holds for: real engines'
	// 5 s spans strayed up to 27 % from their neighbours.
	strongSpan = 5.0
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
	measured  time.Time   // FinishedAt of the measurement the reference belongs to
	points    []pacePoint // by batch
	learned   int         // readings taken into points
	last      time.Time   // At of the last reading counted (notePace)
	slow      int         // readings in a row slower than the reference
	fine      int         // readings in a row that agree, while rescaled
	factor    float64     // capacity divisor while rescaled; 0 = not rescaled
	tentative bool        // factor rests on one strong reading (PaceStrong)
	ratio     float64     // the newest reading's ratio to the reference
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
	// 1/x of a finite x can still be +Inf (x = 5e-324): no point then.
	if spt := 1 / m.DecodeTPSP50; m.DecodeTPSP50 > 0 && finite(spt) && m.Concurrency > 0 {
		s.points = []pacePoint{{batch: float64(m.Concurrency) / float64(max(1, m.Ranks)), spt: spt}}
	}
}

// paceAheadGrace is how far past the coordinator's clock the last counted
// pace reading may be dated and still order the next ones.
const paceAheadGrace = time.Minute

// notePace counts a new pace reading against w's valid measurement and
// names a re-measurement's cause when it starts a rescale. Readings are
// ordered by their At, the agent's clock: the agent sends its newest
// reading with every snapshot, and a late snapshot's older reading must
// not count twice. A last reading dated past the coordinator's clock (a
// clock that ran ahead, then was set right) stops ordering them, or every
// later reading would look older and freeze the worker's pace until the
// coordinator's clock caught up.
func (f *Fleet) notePace(w *worker, p *wire.Pace) string {
	s := &w.pace
	if p == nil || p.SecondsPerToken <= 0 || p.Batch <= 0 {
		return ""
	}
	ahead := s.last.After(f.now().Add(paceAheadGrace))
	if !p.At.After(s.last) && (!ahead || p.At.Equal(s.last)) {
		return ""
	}
	s.last = p.At
	m := f.newest(w.id)
	if m == nil || !m.Valid() || !paceStart(p).After(m.FinishedAt) {
		return "" // a window that holds the measured burst reads the probe's own traffic
	}
	if !s.measured.Equal(m.FinishedAt) {
		s.reset(m)
	}
	share := prefillShare(p.PromptTPS, m)
	if share > MaxPrefillShare {
		f.log.Debug("pace reading skipped: prompts took most of the engine's time in its window", "worker", w.id, "prefill_share", share)
		return ""
	}
	spt, batch := p.SecondsPerToken*(1-share), tokenBatch(p.Batch, p.TokenBatch)
	ref, ok := s.reference(batch)
	if !ok {
		if s.learned < PaceLearn {
			s.learn(pacePoint{batch, spt})
		}
		return ""
	}
	if !finite(spt / ref) {
		return "" // no engine reads so far from its reference; nor may a stored ratio be +Inf
	}
	s.ratio = spt / ref
	// The window's newest half, far slower alone, is a change the whole
	// window still averages with the time before it: where the window is
	// not far slower as a whole, or where its halves disagree by more than
	// PaceTolerance (the newest slower), the newest half is what the
	// engine does now.
	strong := strongFor(p.WindowSeconds)
	if rspt, rref, rshare, ok := s.recent(p, m); ok && rspt/rref > 1+strongFor(p.Recent.WindowSeconds) &&
		(s.ratio <= 1+strong || s.straddles(p, m, rspt/rref)) {
		f.log.Debug("pace reading's newest span is far slower than the whole window", "worker", w.id, "window_ratio", s.ratio, "recent_ratio", rspt/rref,
			"recent_seconds", p.Recent.WindowSeconds)
		s.ratio, spt, ref, share, strong = rspt/rref, rspt, rref, rshare, strongFor(p.Recent.WindowSeconds)
	}
	// Throttled spells are timed on the coordinator's clock, so is the
	// reading: the agent sends it as its window ends (throttle.go).
	now := f.now()
	w.pacedAt = now
	throttled := !w.throttledSince.IsZero()
	if throttled && !now.Add(-time.Duration(p.WindowSeconds*float64(time.Second))).Before(w.throttledSince) {
		w.throttleReadings++ // read wholly in the throttled spell
	}
	if s.ratio <= 1+PaceTolerance {
		s.slow = 0
		if s.tentative {
			s.factor, s.tentative = 0, false
			f.log.Info("engine's pace agrees with its measurement again after one slow reading; its weight comes from the measurement", "worker", w.id)
			return ""
		}
		if s.factor > 0 {
			if s.fine++; s.fine >= PaceReadings {
				s.factor, s.fine = 0, 0
				f.log.Info("engine's pace agrees with its measurement again; its weight comes from the measurement", "worker", w.id)
			}
			return ""
		}
		if s.learned < PaceLearn {
			s.learn(pacePoint{batch, spt})
		}
		return ""
	}
	s.fine = 0
	if s.slow++; s.slow < PaceReadings {
		if s.factor == 0 && s.ratio > 1+strong {
			s.factor, s.tentative = s.ratio, true
			f.log.Info("engine's pace is far slower than measured; its capacity is rescaled until the next reading confirms it or not",
				"worker", w.id, "seconds_per_token", spt, "reference", ref, "batch", batch, "factor", s.ratio, "prefill_share", share)
		}
		return ""
	}
	started := s.factor == 0 || s.tentative
	s.factor, s.tentative = s.ratio, false
	if !started {
		return ""
	}
	if throttled {
		// The GPUs say why: the pace follows the throttle, and a probe
		// would take the worker out while the fleet is short.
		f.log.Info("throttled engine runs slower than measured; its capacity is rescaled by its pace",
			"worker", w.id, "seconds_per_token", spt, "reference", ref, "batch", batch, "factor", s.ratio, "prefill_share", share)
		return ""
	}
	f.log.Info("engine runs slower than measured while it serves; its capacity is rescaled until it is measured again",
		"worker", w.id, "seconds_per_token", spt, "reference", ref, "batch", batch, "factor", s.ratio, "prefill_share", share)
	return fmt.Sprintf("%s: %.1f ms per token at %.1f running per rank, %.1f ms when measured; capacity rescaled to %.0f tok/s",
		CausePaceSlower, 1000*spt, batch, 1000*ref, m.ThroughputTPS/s.factor)
}

// recent is p's newest half against the reference: its seconds per token
// with prompts discounted as for the whole window, the reference at its
// batch, and the prompts' share; not ok where p has no such half or its
// prompts took too much of it to say.
func (s *paceState) recent(p *wire.Pace, m *wire.Measurement) (spt, ref, share float64, ok bool) {
	r := p.Recent
	if r == nil || r.SecondsPerToken <= 0 || r.Batch <= 0 {
		return 0, 0, 0, false
	}
	share = prefillShare(r.PromptTPS, m)
	if share > MaxPrefillShare {
		return 0, 0, 0, false
	}
	if ref, ok = s.reference(tokenBatch(r.Batch, r.TokenBatch)); !ok {
		return 0, 0, 0, false
	}
	return r.SecondsPerToken * (1 - share), ref, share, true
}

// straddles says whether p's older half (the window less its newest
// half, whose ratio to the reference is recent) was faster than the
// newest half by more than PaceTolerance, prompts discounted as for the
// whole window; not where the older half held too few tokens or too many
// prompts to say. Each span's tokens are its batch per rank times its
// seconds over its seconds per token, and the time between them, summed,
// its batch times its seconds (the ranks cancel), so the older half's
// are the window's less the newest half's; so is its TokenBatch, where
// both carry one, each weighted by its tokens. recent has checked p.Recent.
func (s *paceState) straddles(p *wire.Pace, m *wire.Measurement, recent float64) bool {
	r := p.Recent
	secs := p.WindowSeconds - r.WindowSeconds
	sum := p.Batch*p.WindowSeconds - r.Batch*r.WindowSeconds
	all := p.Batch * p.WindowSeconds / p.SecondsPerToken
	tokens := all - r.Batch*r.WindowSeconds/r.SecondsPerToken
	if secs <= 0 || sum <= 0 || tokens < all/4 {
		return false
	}
	share := prefillShare((p.PromptTPS*p.WindowSeconds-r.PromptTPS*r.WindowSeconds)/secs, m)
	if share > MaxPrefillShare {
		return false
	}
	batch := sum / secs
	if p.TokenBatch > 0 && r.TokenBatch > 0 {
		// Each span's TokenBatch is a mean over its tokens.
		if b := (p.TokenBatch*all - r.TokenBatch*(all-tokens)) / tokens; b > 0 {
			batch = b
		}
	}
	ref, ok := s.reference(batch)
	return ok && recent > sum/tokens*(1-share)/ref*(1+PaceTolerance)
}

// tokenBatch is the batch a reading's seconds per token belongs to: its
// TokenBatch where the agent could weigh it by tokens (wire.Pace), else
// its mean over the window.
func tokenBatch(batch, byTokens float64) float64 {
	if byTokens > 0 {
		return byTokens
	}
	return batch
}

// paceStart is when a pace reading's window began, on the agent's clock
// (as a measurement's FinishedAt is).
func paceStart(p *wire.Pace) time.Time {
	return p.At.Add(-time.Duration(p.WindowSeconds * float64(time.Second)))
}

// strongFor is how much slower than the reference a span of secs seconds
// must read to count as a change on its own: PaceStrong at strongSpan or
// longer, and in proportion to 1/secs below it, as the real engines' spans
// strayed (14 % at 10 s, 27 % at 5 s): a 2 s span (the agent's shortest
// sudden reading) must be 75 % slower.
func strongFor(secs float64) float64 {
	if secs <= 0 {
		return math.Inf(1)
	}
	return PaceStrong * max(1, strongSpan/secs)
}

// prefillShare is the share of the engine's time over a pace window that
// the prompts it computed there (promptTPS, per second) took, at m's
// measured prefill rate; 0 where either is unknown.
func prefillShare(promptTPS float64, m *wire.Measurement) float64 {
	if promptTPS <= 0 || !m.PrefillValid() || m.Prefill.ThroughputTPS <= 0 {
		return 0
	}
	return promptTPS / m.Prefill.ThroughputTPS
}

// capacity is what w's weight counts of its measurement m: its throughput
// over the clock factor while its GPUs throttle and the pace has not yet
// read the spell (throttle.go: a reading that straddles the throttle's
// start reads too little of it), else over the pace factor while
// rescaled; and which of the three it is.
func (w *worker) capacity(m *wire.Measurement) (float64, string) {
	if c := w.clockFactor(m); c > 0 {
		return m.ThroughputTPS / c, SourceClock
	}
	if w.pace.factor > 0 && w.pace.measured.Equal(m.FinishedAt) {
		return m.ThroughputTPS / w.pace.factor, SourceRescaled
	}
	return m.ThroughputTPS, SourceMeasured
}

// PaceRecord is a worker's pace reference and rescale as its worker record
// keeps them: a restarted coordinator that forgot a rescale would route by
// the stale measurement until two more slow readings, and learn the
// reference again.
type PaceRecord struct {
	Measured time.Time    `json:"measured"`         // FinishedAt of the measurement it belongs to
	Points   [][2]float64 `json:"points,omitempty"` // running requests per rank, seconds per token; by batch
	Learned  int          `json:"learned,omitempty"`
	Last     time.Time    `json:"last"` // At of the last reading counted
	Slow     int          `json:"slow,omitempty"`
	Fine     int          `json:"fine,omitempty"`
	Factor   float64      `json:"factor,omitempty"` // capacity divisor while rescaled
	// Tentative: Factor rests on one strong reading, not yet confirmed.
	Tentative bool `json:"tentative,omitempty"`
}

// record is s as a worker record keeps it; nil before any measurement.
func (s *paceState) record() *PaceRecord {
	if s.measured.IsZero() {
		return nil
	}
	r := &PaceRecord{Measured: s.measured, Learned: s.learned, Last: s.last, Slow: s.slow, Fine: s.fine, Factor: s.factor, Tentative: s.tentative}
	for _, p := range s.points {
		r.Points = append(r.Points, [2]float64{p.batch, p.spt})
	}
	return r
}

// check says what makes r no pace state: numbers that are not finite or
// not positive, points out of batch order, counts out of range, a factor
// that is not a slowdown.
func (r *PaceRecord) check() error {
	fine := func(v float64) bool { return v > 0 && !math.IsInf(v, 0) }
	for i, p := range r.Points {
		if !fine(p[0]) || !fine(p[1]) {
			return fmt.Errorf("point %d is %v", i, p)
		}
		if i > 0 && p[0] <= r.Points[i-1][0] {
			return fmt.Errorf("point %d is not above point %d in batch", i, i-1)
		}
	}
	if len(r.Points) > PaceLearn+1 || r.Learned < 0 || r.Learned > PaceLearn || r.Slow < 0 || r.Fine < 0 {
		return fmt.Errorf("%d points, %d learned, %d slow, %d fine", len(r.Points), r.Learned, r.Slow, r.Fine)
	}
	if r.Factor != 0 && (r.Factor <= 1 || math.IsInf(r.Factor, 0) || math.IsNaN(r.Factor)) {
		return fmt.Errorf("factor %v", r.Factor)
	}
	if r.Tentative && (r.Factor == 0 || r.Slow != 1) {
		return fmt.Errorf("tentative with factor %v after %d slow readings", r.Factor, r.Slow)
	}
	return nil
}

// state is the pace state r keeps, once check passed.
func (r *PaceRecord) state() paceState {
	s := paceState{measured: r.Measured, learned: r.Learned, last: r.Last, slow: r.Slow, fine: r.Fine, factor: r.Factor, tentative: r.Tentative}
	for _, p := range r.Points {
		s.points = append(s.points, pacePoint{batch: p[0], spt: p[1]})
	}
	return s
}

// samePace says whether two records keep the same reference and rescale;
// the newest reading's time alone changes nothing worth a write.
func samePace(a, b *PaceRecord) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Measured.Equal(b.Measured) && slices.Equal(a.Points, b.Points) && a.Learned == b.Learned &&
		a.Slow == b.Slow && a.Fine == b.Fine && a.Factor == b.Factor && a.Tentative == b.Tentative
}
