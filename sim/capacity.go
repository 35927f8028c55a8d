package sim

import (
	"fmt"
	"time"
)

// True capacity: what a warm engine of this configuration delivers to a
// burst that a probe sends, computed by running each rank's own step
// planner (plan and apply, as the live loop does) over the burst with every
// request already queued and the clock taken from the step model instead of
// the wall. Requests are dealt round-robin; the burst lasts as long as its
// slowest rank. A probe's measurement can only come out a little lower
// (requests arrive over a few milliseconds, HTTP costs something).
//
// By hand, for one rank given n requests at once, each of L prompt tokens
// and G output tokens, with budget B ≥ n:
//
//   - prefill, G = 1 and L ≥ B: no step holds two prompts' last chunks, so
//     every prompt costs L/P for its chunks plus one sampling step t0 + k:
//     T = n·(L/P + 1/S1), and prefill capacity = n·L / T = 1 / (1/P + 1/(L·S1)).
//     With D ranks, n_r = ⌈n/D⌉ on the fullest: capacity = n·L / (n_r·(L/P + 1/S1)).
//   - decode, L·n ≤ B: the first step prefills all n prompts and samples
//     their first tokens, then G − 1 decode steps follow: T = G·(t0 + k·n) + n·L/P,
//     so decode capacity = n·G / T, which is S16's n·G / (G·(t0+k·n)) when
//     P = 0 (prefill free) or L/P is small.
//
// Prompts with L < B, or bursts that do not fit the pool at once, are
// handled by the same planner; no closed form is needed.

// PrefillCapacity is the true prefill capacity of an engine configured as
// c: prompt tokens per second over a warm burst of prompts concurrent
// requests of promptTokens tokens (no prefix-cache hits) and one output
// token each. It is an error when c has no --prefill-tps.
func (c Config) PrefillCapacity(prompts, promptTokens int) (float64, error) {
	if c.PrefillTPS == 0 {
		return 0, fmt.Errorf("prefill capacity: the config has no prefill-tps (prefill is free)")
	}
	sec, err := c.IdealBurstSeconds(prompts, promptTokens, 1)
	if err != nil {
		return 0, err
	}
	return float64(prompts) * float64(promptTokens) / sec, nil
}

// DecodeCapacity is the true decode capacity of an engine configured as c:
// output tokens per second over a warm burst of concurrency requests of
// promptTokens prompt tokens (no prefix-cache hits) and outputTokens output
// tokens each. Without --prefill-tps it does not depend on promptTokens.
func (c Config) DecodeCapacity(concurrency, promptTokens, outputTokens int) (float64, error) {
	sec, err := c.IdealBurstSeconds(concurrency, promptTokens, outputTokens)
	if err != nil {
		return 0, err
	}
	return float64(concurrency) * float64(outputTokens) / sec, nil
}

// IdealBurstSeconds is how long a warm burst of n requests of promptTokens
// and outputTokens each lasts on an engine configured as c, all of them
// queued at once.
func (c Config) IdealBurstSeconds(n, promptTokens, outputTokens int) (float64, error) {
	c, err := c.normalize()
	if err != nil {
		return 0, err
	}
	if n < 1 || promptTokens < 1 || outputTokens < 1 {
		return 0, fmt.Errorf("ideal burst: requests, prompt and output tokens must be at least 1, got %d, %d, %d",
			n, promptTokens, outputTokens)
	}
	rs := c.rankSetup(time.Time{})
	rs.cacheBlock = 0 // every prompt is unique
	worst := 0.0
	for i, pool := range c.KVTokens {
		r := newRank(i, pool, rs)
		for j := i; j < n; j += len(c.KVTokens) {
			s := &seq{
				prompt: int64(promptTokens), reserve: int64(promptTokens + outputTokens),
				target: outputTokens, finish: "length",
				wake: make(chan struct{}, 1), done: make(chan struct{}),
			}
			if limit := min(pool, c.seqLimit(pool)); s.reserve > limit {
				return 0, fmt.Errorf("ideal burst: a request of %d tokens does not fit rank %d's context of %d", s.reserve, i, limit)
			}
			r.enqueue(s)
		}
		t := 0.0
		var st step
		for len(r.running) > 0 {
			r.plan(&st)
			if st.empty() {
				return 0, fmt.Errorf("ideal burst: rank %d has running sequences but nothing to do", i)
			}
			decode, prefill := r.stepSeconds(&st)
			t += decode + prefill
			r.apply(&st, prefill)
		}
		worst = max(worst, t)
	}
	return worst, nil
}

// CachedOnRepeat is how many tokens of a prompt of promptTokens tokens a
// warm prefix cache serves when the same prompt comes again: whole blocks
// within all but its last token, 0 with the cache off. A probe's measured
// burst repeats its warm-up burst's prompts, so it computes only the rest:
// pass promptTokens − CachedOnRepeat(promptTokens) to DecodeCapacity.
func (c Config) CachedOnRepeat(promptTokens int) int {
	if c.NoPrefixCache || promptTokens < 1 {
		return 0
	}
	flavor := c.Flavor
	if flavor == "" {
		flavor = FlavorVLLM
	}
	b := prefixBlock(flavor)
	return (promptTokens - 1) / b * b
}
