package agent

import (
	"time"

	"heft/agent/engine"
	"heft/shared/wire"
)

// minPaceTokens is how many inter-token intervals a window must hold to
// be a pace reading: fewer say more about the few requests than the engine.
const minPaceTokens = 200

// pace turns an engine's inter-token latency histogram and generated-tokens
// counter, read at any load, into wire.Pace readings, each over a window
// of probe.pace_window, one every half window: the windows overlap by
// half; each also says how fast prompts were read in it. Below saturation
// the tokens an engine delivers are what it was offered; the time between
// two tokens of a request at a given batch size is what it can do, so the
// coordinator can tell an engine that slowed down while it serves. The
// coordinator acts on two slow readings in a row, or on one far slower
// (tentatively); with readings half a window apart, the second comes at
// most two windows after a change, where disjoint windows could take
// nearly three (the one that straddles the change may read too little of
// it to count).
type pace struct {
	window time.Duration
	start  paceSample // the window's first sample
	half   paceSample // the first sample half a window after start: where the next window starts
	latest *wire.Pace
}

type paceSample struct {
	at                time.Time
	gen, itlSum, itlN float64
	prompt            float64 // prompt tokens computed; < 0 where the engine does not say
}

// add takes one reading of the counters; it returns the reading a window
// completed, else nil. A counter that went back (a restart) or an engine
// without the histogram starts over.
func (p *pace) add(at time.Time, c engine.Counters, ranks int) *wire.Pace {
	s := paceSample{at: at, gen: c.Generated, itlSum: c.InterTokenSeconds, itlN: c.InterTokens, prompt: -1}
	if c.PromptKnown {
		s.prompt = c.PromptComputed
	}
	if !c.InterTokenKnown {
		p.start, p.half = paceSample{}, paceSample{}
		return nil
	}
	if p.start.at.IsZero() || s.gen < p.start.gen || s.itlN < p.start.itlN || s.itlSum < p.start.itlSum ||
		(s.prompt >= 0 && s.prompt < p.start.prompt) {
		p.start, p.half = s, paceSample{}
		return nil
	}
	span := at.Sub(p.start.at)
	if p.half.at.IsZero() && span >= p.window/2 {
		p.half = s
	}
	if span < p.window {
		return nil
	}
	n, sum, gen, prompt := s.itlN-p.start.itlN, s.itlSum-p.start.itlSum, s.gen-p.start.gen, s.prompt-p.start.prompt
	if s.prompt < 0 || p.start.prompt < 0 {
		prompt = 0 // not known at both ends (a prompt counter that went back is a restart, above)
	}
	if n < minPaceTokens || sum <= 0 {
		p.start, p.half = paceSample{}, paceSample{} // too little traffic to say; the next request starts a window
		return nil
	}
	p.start, p.half = p.half, paceSample{}
	if at.Sub(p.start.at) >= p.window/2 {
		p.half = s
	}
	spt := sum / n
	tps := gen / span.Seconds()
	r := &wire.Pace{At: at.UTC(), WindowSeconds: span.Seconds(), SecondsPerToken: spt,
		Batch: tps * spt / float64(max(1, ranks)), ThroughputTPS: tps, PromptTPS: prompt / span.Seconds()}
	p.latest = r
	return r
}
