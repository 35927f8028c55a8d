package sim

import (
	"math"
	"testing"
)

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*math.Abs(want) }

// The planner-driven true capacities against the closed forms a reader can
// check by hand (see capacity.go).
func TestTrueCapacityClosedForms(t *testing.T) {
	t.Parallel()
	const s1, s16, p = 100.0, 1200.0, 10000.0
	t0, k, _ := calibrate(s1, s16)
	cfg := Config{SingleTPS: s1, Batch16TPS: s16, PrefillTPS: p}

	must := func(v float64, err error) float64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name      string
		got, want float64
	}{
		// Without prefill-tps the decode model is the calibration itself.
		{"decode of 16 is S16", must(Config{SingleTPS: s1, Batch16TPS: s16}.DecodeCapacity(16, 500, 128)), s16},
		{"decode of 1 is S1", must(Config{SingleTPS: s1, Batch16TPS: s16}.DecodeCapacity(1, 500, 128)), s1},
		{"decode on two ranks runs 8 each", must(Config{SingleTPS: s1, Batch16TPS: s16, DP: 2}.DecodeCapacity(16, 20, 128)),
			16 / (t0 + 8*k)},
		// With it, the first step also prefills the 16 short prompts.
		{"decode pays the prompts once", must(cfg.DecodeCapacity(16, 20, 128)),
			16 * 128 / (128*(t0+16*k) + 16*20/p)},
		// Prompts of L ≥ the budget: n·(L/P + 1/S1) per rank.
		{"one long prompt", must(cfg.PrefillCapacity(1, 8192)), 8192 / (8192/p + 1/s1)},
		{"four long prompts on one rank", must(cfg.PrefillCapacity(4, 8192)), 4 * 8192 / (4 * (8192/p + 1/s1))},
		{"four on two ranks read twice as fast", must(Config{SingleTPS: s1, Batch16TPS: s16, PrefillTPS: p, DP: 2}.PrefillCapacity(4, 8192)),
			4 * 8192 / (2 * (8192/p + 1/s1))},
		{"five on two ranks wait for the rank with three", must(Config{SingleTPS: s1, Batch16TPS: s16, PrefillTPS: p, DP: 2}.PrefillCapacity(5, 8192)),
			5 * 8192 / (3 * (8192/p + 1/s1))},
		// Prompts shorter than the budget share steps: 4 × 1000 in steps of
		// 2048 are [1000 1000 48] and [952 1000], two sampling steps of two.
		{"short prompts share sampling steps", must(cfg.PrefillCapacity(4, 1000)), 4000 / (4000/p + 2*(t0+2*k))},
		// A small budget splits a prompt into more chunks, which costs nothing more.
		{"the budget does not change a lone prompt", must(Config{SingleTPS: s1, Batch16TPS: s16, PrefillTPS: p, MaxBatchedTokens: 300}.PrefillCapacity(1, 8192)),
			8192 / (8192/p + 1/s1)},
	} {
		if !near(tc.got, tc.want, 1e-9) {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}

	// A pool that holds one prompt at a time queues the others; prefill
	// steps cost only their tokens, so the total is the same.
	small := cfg
	small.KVTokens = []int64{9000}
	if got, want := must(small.PrefillCapacity(4, 8192)), must(cfg.PrefillCapacity(4, 8192)); !near(got, want, 1e-9) {
		t.Errorf("queued prompts %v, want %v as when they all fit", got, want)
	}
	// SGLang keeps prompt steps apart from decoding; with one output token
	// there is no decoding to keep apart, so the capacity is the same.
	sg := cfg
	sg.Flavor = FlavorSGLang
	if got, want := must(sg.PrefillCapacity(4, 8192)), must(cfg.PrefillCapacity(4, 8192)); !near(got, want, 1e-9) {
		t.Errorf("sglang %v, want %v", got, want)
	}

	if _, err := (Config{SingleTPS: s1, Batch16TPS: s16}).PrefillCapacity(4, 8192); err == nil {
		t.Error("a config without prefill-tps has no prefill capacity, want an error")
	}
	if _, err := cfg.PrefillCapacity(1, 200000); err == nil {
		t.Error("a prompt larger than the pool never runs, want an error")
	}
	// llama.cpp's default 16 slots of a 100,000 pool hold 6,250 tokens each.
	if _, err := (Config{Flavor: FlavorLlamaCpp, SingleTPS: s1, Batch16TPS: s16, PrefillTPS: p}).PrefillCapacity(1, 8192); err == nil {
		t.Error("a prompt longer than a llama.cpp slot is refused, want an error")
	}
	if _, err := cfg.IdealBurstSeconds(0, 10, 10); err == nil {
		t.Error("an empty burst, want an error")
	}
}

func TestCachedOnRepeat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		l    int
		want int
	}{
		{Config{}, 17, 16}, {Config{}, 16, 0}, {Config{}, 1000, 992},
		{Config{Flavor: FlavorSGLang}, 17, 16}, {Config{Flavor: FlavorSGLang}, 1000, 999},
		{Config{Flavor: FlavorSGLang, NoPrefixCache: true}, 1000, 0},
	} {
		if got := tc.cfg.CachedOnRepeat(tc.l); got != tc.want {
			t.Errorf("%q %d tokens: %d, want %d", tc.cfg.Flavor, tc.l, got, tc.want)
		}
	}
}
