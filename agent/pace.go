package agent

import (
	"slices"
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
// it to count). Each reading also carries its newest half alone (Recent),
// which the far-slower rule reads too: a change in a window's second half
// is far slower there before the whole window says so.
//
// Between readings, every sample also compares the window's newer seconds
// with its older ones, split at each sample that leaves suddenSpan on both
// sides: where the newer ran more than suddenGate slower per token, the
// window ends early, with the starkest split's newer seconds as its
// Recent, and the next starts a sample after that split, with a first
// reading at a quarter window. A worker that halved its speed is then
// named within a few seconds of the change, not at the next half window;
// the coordinator asks more of so short a span.
type pace struct {
	window time.Duration
	start  paceSample // the window's first sample
	half   paceSample // the first sample half a window after start: where the next window starts
	// early: the window started over (the first sample, a restart, a quiet
	// spell) and has given no reading yet; at half a window it gives one
	// over that half (a restarted or suddenly slower engine also one at a
	// quarter: quarter).
	early bool
	// quarter: the window started over because the engine restarted (its
	// counters went back) or ran suddenly slower, and gives one more early
	// reading, at a quarter window: a restarted engine may be another
	// engine, and every second it is weighed as the old one sends it
	// traffic it may not carry. A sudden reading may have caught the change
	// too early: its newer seconds, split at the last sample before the
	// change, still hold a part of a second at the old speed, so they can
	// pass the agent's gate and read too little slower for the
	// coordinator's rule for a short span; the quarter reading, the new
	// speed alone from the first sample after the split, comes a quarter
	// window after that sample (1–2 s after the sudden one), not 5 s.
	quarter bool
	latest  *wire.Pace
	// since are the samples from start on, oldest first: where a sudden
	// slowdown's span may start.
	since []paceSample
	prev  paceSample // the sample before, whatever the window: busy's last interval
}

// suddenSpan is the shortest newer span that may end a window early,
// and the shortest older part of the window it is compared with;
// suddenGate is how much slower per token the newer span must be.
// The gate is the agent's only: it decides when a reading goes out, and
// the coordinator weighs the span against its reference as any other.
const (
	suddenSpan = 2 * time.Second
	suddenGate = 0.5
)

type paceSample struct {
	at                time.Time
	gen, itlSum, itlN float64
	prompt            float64 // prompt tokens computed; < 0 where the engine does not say
	first             float64 // requests' first tokens (engine.Counters.FirstTokens); < 0 where not known
	// busy sums, over the intervals between the tracker's samples since
	// it began, each interval's tokens times the requests decoding in it
	// (its rise in the histogram's sum over its length, Little's law):
	// over a span, its rise over the span's tokens is the batch the
	// tokens saw (wire.Pace's TokenBatch). Only where live.
	busy float64
	live bool // the histogram grows as tokens are sent (engine.Counters.InterTokenLive)
	// ranks are the ranks the counters were summed over (counterRanks):
	// where they change, the window starts over, as at a restart.
	ranks string
}

// add takes one reading of the counters; it returns the reading a window
// (or, after a start-over, its first half; after a restart or a sudden
// reading, its first quarter too) completed, else nil. A counter that went
// back or is summed over other ranks (a restart) or an engine without the
// histogram starts over.
func (p *pace) add(at time.Time, c engine.Counters, ranks int) *wire.Pace {
	s := paceSample{at: at, gen: c.Generated, itlSum: c.InterTokenSeconds, itlN: c.InterTokens, prompt: -1, first: -1, live: c.InterTokenLive,
		ranks: counterRanks(c.Ranks)}
	if c.PromptKnown {
		s.prompt = c.PromptComputed
	}
	if c.FirstTokensKnown {
		s.first = c.FirstTokens
	}
	if !c.InterTokenKnown {
		p.start, p.half, p.since, p.prev = paceSample{}, paceSample{}, p.since[:0], paceSample{}
		return nil
	}
	s.busy = p.prev.busy
	if q := p.prev; q.live && s.live && s.at.After(q.at) && s.itlN >= q.itlN && s.itlSum >= q.itlSum && s.ranks == q.ranks {
		s.busy += decoded(q, s) * (s.itlSum - q.itlSum) / s.at.Sub(q.at).Seconds()
	}
	p.prev = s
	restarted := !p.start.at.IsZero() && (s.gen < p.start.gen || s.itlN < p.start.itlN || s.itlSum < p.start.itlSum || s.ranks != p.start.ranks)
	if p.start.at.IsZero() || restarted || (s.prompt >= 0 && s.prompt < p.start.prompt) {
		p.start, p.half, p.early, p.quarter = s, paceSample{}, true, restarted
		p.since = append(p.since[:0], s)
		return nil
	}
	r := p.next(s, ranks)
	if r == nil && p.start.at.IsZero() {
		p.since = p.since[:0]
		return nil
	}
	p.since = append(slices.DeleteFunc(p.since, func(x paceSample) bool { return x.at.Before(p.start.at) }), s)
	if r == nil {
		r = p.sudden(s, ranks)
	}
	if r != nil {
		p.latest = r
	}
	return r
}

// next is the reading sample s completes on the window's own schedule.
func (p *pace) next(s paceSample, ranks int) *wire.Pace {
	at := s.at
	span := at.Sub(p.start.at)
	if p.quarter && span >= p.window/2 {
		p.quarter = false
	}
	if p.quarter && span >= p.window/4 {
		if r := between(p.start, s, ranks); r != nil {
			p.quarter = false
			return r
		}
	}
	if p.half.at.IsZero() && span >= p.window/2 {
		p.half = s
		if p.early && span < p.window {
			p.early = false
			if r := between(p.start, s, ranks); r != nil {
				return r
			}
		}
	}
	if span < p.window {
		return nil
	}
	r := between(p.start, s, ranks)
	if r == nil {
		p.start, p.half = paceSample{}, paceSample{} // too little traffic to say; the next request starts a window
		return nil
	}
	// The newest half, read alone, shows a change that the whole window
	// averages with the time before it (the coordinator's PaceStrong).
	if h := between(p.half, s, ranks); h != nil {
		r.Recent = asSpan(h)
	}
	p.early = false
	p.start, p.half = p.half, paceSample{}
	if at.Sub(p.start.at) >= p.window/2 {
		p.half = s
	}
	return r
}

// sudden is the reading that ends the window at s early, where its newer
// seconds ran more than suddenGate slower per token than the window before
// them, split at any sample that leaves at least suddenSpan on each side;
// of the splits that pass, the one with the starkest contrast, likely
// where the change landed, gives the reading's Recent. A fixed newest
// span would miss a change that landed just before a regular reading: the
// window then starts at the old half, and the rest of it already holds the
// change's first seconds, which dilute the contrast until the next
// regular reading. The next window starts at the first sample after the
// split, not at the split, whose next second may hold the change's
// landing, nor at s: its first reading, at a quarter of its length, reads
// the new speed alone, and the seconds since the split already count
// toward it. Not in a window that started over and has not yet given its
// first reading.
func (p *pace) sudden(s paceSample, ranks int) *wire.Pace {
	if p.early {
		return nil
	}
	var newest *wire.Pace
	starkest := 1 + suddenGate
	next := 0 // in since: the first sample after the starkest split
	for i, x := range p.since {
		if x.at.Sub(p.start.at) < suddenSpan {
			continue
		}
		if s.at.Sub(x.at) < suddenSpan {
			break
		}
		after, before := between(x, s, ranks), between(p.start, x, ranks)
		if after == nil || before == nil {
			continue
		}
		if ratio := after.SecondsPerToken / before.SecondsPerToken; ratio > starkest {
			newest, starkest, next = after, ratio, i+1
		}
	}
	if newest == nil {
		return nil
	}
	r := between(p.start, s, ranks)
	if r == nil {
		return nil
	}
	r.Recent = asSpan(newest)
	p.since = append(p.since[:0], p.since[next:]...)
	p.start, p.half, p.early, p.quarter = p.since[0], paceSample{}, true, true
	return r
}

// asSpan is part of a window's reading, as a reading's Recent.
func asSpan(r *wire.Pace) *wire.PaceSpan {
	return &wire.PaceSpan{WindowSeconds: r.WindowSeconds, SecondsPerToken: r.SecondsPerToken, Batch: r.Batch,
		TokenBatch: r.TokenBatch, PromptTPS: r.PromptTPS}
}

// between is the reading from sample a to sample b, or nil where it holds
// too few tokens to say.
func between(a, b paceSample, ranks int) *wire.Pace {
	n, sum, gen, prompt := b.itlN-a.itlN, b.itlSum-a.itlSum, b.gen-a.gen, b.prompt-a.prompt
	if b.prompt < 0 || a.prompt < 0 || prompt < 0 {
		// Not known at both ends; or, within a window (add starts over
		// where it goes back from the window's start), read less the prefix
		// cache's hits, two counters that need not move together.
		prompt = 0
	}
	span := b.at.Sub(a.at).Seconds()
	if n < minPaceTokens || sum <= 0 || gen < 0 || span <= 0 {
		return nil
	}
	tokens := decoded(a, b)
	spt := sum / tokens
	tps := gen / span
	r := &wire.Pace{At: b.at.UTC(), WindowSeconds: span, SecondsPerToken: spt,
		Batch: tps * spt / float64(max(1, ranks)), ThroughputTPS: tps, PromptTPS: prompt / span}
	if a.live && b.live && b.busy > a.busy {
		r.TokenBatch = (b.busy - a.busy) / tokens / float64(max(1, ranks))
	}
	return r
}

// decoded is the tokens made from a to b after requests' first: the
// inter-token histogram's count, or, where the histogram is live, the
// first tokens known and more were generated, the generated less the
// first. vLLM observes one interval per step a request got tokens in,
// which with speculative decoding gives it several: its histogram's mean
// is then a step's time, not a token's, and the probe's reference is a
// token's.
func decoded(a, b paceSample) float64 {
	n := b.itlN - a.itlN
	if a.live && b.live && a.first >= 0 && b.first >= 0 {
		n = max(n, (b.gen-a.gen)-(b.first-a.first))
	}
	return n
}
