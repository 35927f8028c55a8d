package bench

import (
	"fmt"

	"heft/sim"
)

// PrefillCalibration is a simulated worker for the long-prompt targets
// (issue 13): a decode calibration plus how fast each rank reads prompts.
type PrefillCalibration struct {
	Calibration
	PrefillTPS float64 // P: prompt tok/s of one rank prefilling alone
	KVTokens   int64   // pool per rank; 0 = the sim's default
}

// PrefillCalibrations are five workers whose decode and prefill rankings
// disagree, after the shapes of real cards: a bandwidth-rich, compute-poor
// card decodes fast and prefills slowly (h20-like), a compute-rich one with
// less bandwidth the reverse (l40s-like), a pair of consumer cards as two
// data-parallel ranks splits a prefill burst in two (4090-dp2), and so on.
//
// True capacities (from sim's step model; decode: 16 × 128 tokens after a
// warm-up with the same 18-token prompt, prefill: 4 × 8,192 unique prompts
// and one output token each):
//
//	worker       decode tok/s   prefill tok/s   decode rank   prefill rank
//	h20-like          1,492.2         4,477.6             1              4
//	a100-like         1,246.5         6,937.6             2              3
//	l40s-like           849.6        12,711.8             3              2
//	4090-dp2            722.4        17,647.5             4              1
//	mac-studio          319.7         2,483.2             5              5
//
// TestPrefillCalibrationsDisagree checks these figures and orders.
var PrefillCalibrations = []PrefillCalibration{
	{Calibration{Name: "h20-like", Flavor: sim.FlavorVLLM, SingleTPS: 110, Batch16TPS: 1500}, 4500, 0},
	{Calibration{Name: "a100-like", Flavor: sim.FlavorVLLM, SingleTPS: 95, Batch16TPS: 1250}, 7000, 0},
	{Calibration{Name: "l40s-like", Flavor: sim.FlavorSGLang, SingleTPS: 70, Batch16TPS: 850}, 13000, 0},
	{Calibration{Name: "4090-dp2", Flavor: sim.FlavorSGLang, SingleTPS: 55, Batch16TPS: 600, DP: 2}, 9000, 0},
	// llama.cpp splits its pool over 16 slots: 9,216 tokens each hold an
	// 8,192-token prompt (the default pool's 6,250 would refuse it).
	{Calibration{Name: "mac-studio", Flavor: sim.FlavorLlamaCpp, SingleTPS: 45, Batch16TPS: 320}, 2500, 16 * 9216},
}

// String describes the calibration for a table.
func (c PrefillCalibration) String() string {
	s := fmt.Sprintf("%s P=%g", c.Calibration.String(), c.PrefillTPS)
	if c.KVTokens > 0 {
		s += fmt.Sprintf(" kv=%d", c.KVTokens)
	}
	return s
}

// SimConfig is the sim configuration of c, warm unless cold is set.
func (c PrefillCalibration) SimConfig(model string, cold Cold) sim.Config {
	cfg := c.simConfig(model, cold)
	cfg.PrefillTPS = c.PrefillTPS
	if c.KVTokens > 0 {
		cfg.KVTokens = []int64{c.KVTokens}
	}
	return cfg
}

// TrueDecodeCapacity is what a warm engine delivers to a probe's measured
// decode burst of concurrency requests of outputTokens tokens whose prompt
// is promptTokens long (as usage reports it): the warm-up burst left that
// prompt in the prefix cache, so each request computes only the part the
// cache does not serve, and those prompt tokens cost 1/P each.
func (c PrefillCalibration) TrueDecodeCapacity(concurrency, promptTokens, outputTokens int) (float64, error) {
	cfg := c.SimConfig("", Cold{})
	computed := promptTokens - cfg.CachedOnRepeat(promptTokens)
	return cfg.DecodeCapacity(concurrency, computed, outputTokens)
}

// TruePrefillCapacity is the prompt tokens per second a warm engine reads
// over a burst of prompts concurrent prompts of promptTokens tokens, each
// with a unique prefix and one output token (sim.Config.PrefillCapacity).
// A warm token-granular cache (SGLang, llama.cpp) still serves the 3 chat
// template tokens before a unique prefix: 0.04 % of an 8,192-token prompt,
// left out here.
func (c PrefillCalibration) TruePrefillCapacity(prompts, promptTokens int) (float64, error) {
	return c.SimConfig("", Cold{}).PrefillCapacity(prompts, promptTokens)
}
