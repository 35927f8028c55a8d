package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"heft/sim"
)

// Calibration is one simulated worker: what heft-sim is told.
type Calibration struct {
	Name       string
	Flavor     string  // sim flavour, also the engine kind the probe is told
	SingleTPS  float64 // S1: one request alone, tok/s
	Batch16TPS float64 // S16: sixteen together, tok/s in total, per rank
	DP         int     // data-parallel ranks, default 1
	// MaxRunning caps the running sequences per rank (0 = the flavour's
	// default). TrueCapacity assumes it is at least the burst's share of
	// a rank.
	MaxRunning int
	KVTokens   []int64  // KV pool per rank (nil = the sim's default)
	Slow       sim.Slow // a mid-run throttle (--slow-at, --slow-factor); zero: none
	// SpecAccept, above 1, is speculative decoding (--spec-accept): each
	// decode step gives a request this many tokens in one chunk; the
	// calibration stays the tokens delivered.
	SpecAccept int
}

func (c Calibration) ranks() int { return max(c.DP, 1) }

// String describes the calibration for a table.
func (c Calibration) String() string {
	s := fmt.Sprintf("%s S1=%g S16=%g", c.Flavor, c.SingleTPS, c.Batch16TPS)
	if c.ranks() > 1 {
		s += fmt.Sprintf(" dp=%d", c.ranks())
	}
	if len(c.KVTokens) > 0 {
		s += " kv=" + joinInts(c.KVTokens, ",")
	}
	if c.MaxRunning > 0 {
		s += fmt.Sprintf(" max-running=%d", c.MaxRunning)
	}
	if c.SpecAccept > 1 {
		s += fmt.Sprintf(" spec-accept=%d", c.SpecAccept)
	}
	return s
}

// simConfig is the sim configuration of c, warm unless cold is set.
func (c Calibration) simConfig(model string, cold Cold) sim.Config {
	return sim.Config{
		Flavor: c.Flavor, Model: model, SingleTPS: c.SingleTPS, Batch16TPS: c.Batch16TPS,
		DP: c.ranks(), MaxRunning: c.MaxRunning, KVTokens: c.KVTokens, ColdFactor: cold.Factor, ColdSeconds: cold.Seconds, Seed: 1,
		SpecAccept: c.SpecAccept,
	}
}

func joinInts(xs []int64, sep string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatInt(x, 10)
	}
	return strings.Join(parts, sep)
}

// Cold is a cold start: every step Factor times slower for Seconds.
type Cold struct {
	Factor  float64
	Seconds float64
}

// stepCoefficients solves the sim's decode model: a step of b sequences
// takes t0 + k·b seconds, with t0 + k = 1/S1 and t0 + 16k = 16/S16.
func (c Calibration) stepCoefficients() (t0, k float64) {
	k = (16/c.Batch16TPS - 1/c.SingleTPS) / 15
	t0 = math.Max(1/c.SingleTPS-k, 0)
	return t0, k
}

// rankLoads deals concurrency requests round-robin over the ranks.
func (c Calibration) rankLoads(concurrency int) []int {
	loads := make([]int, c.ranks())
	for i := range concurrency {
		loads[i%len(loads)]++
	}
	return loads
}

// slowestStep is the warm decode step of the slowest rank under a burst.
func (c Calibration) slowestStep(concurrency int) float64 {
	t0, k := c.stepCoefficients()
	worst := 0.0
	for _, b := range c.rankLoads(concurrency) {
		if b > 0 {
			worst = math.Max(worst, t0+k*float64(b))
		}
	}
	return worst
}

// TrueCapacity is what a warm engine delivers to a burst of concurrency
// requests, in tok/s: each rank decodes its share b in steps of t0 + k·b,
// every sequence of the rank gaining one token a step, and the burst lasts
// as long as its slowest rank. With an even split over D ranks this is
// D·b / (t0 + k·b).
func (c Calibration) TrueCapacity(concurrency int) float64 {
	return float64(concurrency) / c.slowestStep(concurrency)
}

// FullCapacity is what the worker delivers with every rank full: the
// burst of perRank requests on each of its ranks, as the agent sends it
// (probe.concurrency per data-parallel rank). It is the "true capacity"
// every oracle of the bench uses.
func (c Calibration) FullCapacity(perRank int) float64 {
	return c.TrueCapacity(c.Burst(perRank))
}

// Burst is the requests of a probe burst of perRank per rank.
func (c Calibration) Burst(perRank int) int { return perRank * c.ranks() }

// IdealBurstSeconds is how long a warm burst of concurrency requests of
// tokens each lasts: tokens steps of the slowest rank.
func (c Calibration) IdealBurstSeconds(concurrency, tokens int) float64 {
	return float64(tokens) * c.slowestStep(concurrency)
}

// ColdBurstSeconds is how long the same burst lasts when it starts at
// startAt seconds after the engine started: steps that begin while the
// engine is cold take cold.Factor times longer.
func (c Calibration) ColdBurstSeconds(concurrency, tokens int, cold Cold, startAt float64) float64 {
	step := c.slowestStep(concurrency)
	t := startAt
	for range tokens {
		d := step
		if t < cold.Seconds {
			d *= cold.Factor
		}
		t += d
	}
	return t - startAt
}
