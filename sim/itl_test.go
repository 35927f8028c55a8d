package sim

import (
	"math"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// The inter-token latency histogram's mean is the step time of the batch
// the tokens came in, and a throttle (--slow-at) doubles it at the same
// batch size: what the agent's pace reading compares.
func TestInterTokenLatency(t *testing.T) {
	for _, tc := range []struct{ flavor, name string }{
		{FlavorVLLM, "vllm:inter_token_latency_seconds"},
		{FlavorSGLang, "sglang:inter_token_latency_seconds"},
	} {
		t.Run(tc.flavor, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := Config{Flavor: tc.flavor, SingleTPS: 100, Batch16TPS: 800, Slow: Slow{At: time.Minute, Factor: 2}}
				s := bubbleSim(t, cfg)
				t0, k, err := calibrate(100, 800)
				if err != nil {
					t.Fatal(err)
				}
				step := t0 + 4*k // four sequences decode together
				if _, n := itlOf(t, s, tc.name); n != 0 {
					t.Fatalf("idle sim: %v observations", n)
				}
				burst(t, s.URL(), 4, 32)
				sum1, n1 := itlOf(t, s, tc.name)
				if n1 != 4*31 { // every token after a sequence's first
					t.Fatalf("observations = %v, want %d", n1, 4*31)
				}
				if mean := sum1 / n1; math.Abs(mean-step) > 1e-9 {
					t.Errorf("mean ITL at full speed %.6f s, want the step time %.6f s", mean, step)
				}
				time.Sleep(time.Minute) // past --slow-at, on the bubble's clock
				burst(t, s.URL(), 4, 32)
				sum2, n2 := itlOf(t, s, tc.name)
				if mean := (sum2 - sum1) / (n2 - n1); math.Abs(mean-2*step) > 1e-9 {
					t.Errorf("mean ITL throttled %.6f s, want %.6f s", mean, 2*step)
				}
			})
		})
	}
}

// itlOf reads a histogram's sum and count over every series.
func itlOf(t *testing.T, s *Server, name string) (sum, n float64) {
	t.Helper()
	mf := scrape(t, s.URL())[name]
	if mf == nil || mf.GetType() != dto.MetricType_HISTOGRAM {
		t.Fatalf("/metrics has no histogram %s", name)
	}
	for _, m := range mf.GetMetric() {
		sum += m.GetHistogram().GetSampleSum()
		n += float64(m.GetHistogram().GetSampleCount())
	}
	return sum, n
}

// llama-server has no inter-token histogram: when a request finishes it
// adds its tokens and the time from its first token to its last. Their
// ratio is the step time short by one interval per request, and a
// throttle doubles it; a request still running adds nothing yet.
func TestLlamaDecodeSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := bubbleSim(t, Config{Flavor: FlavorLlamaCpp, SingleTPS: 100, Batch16TPS: 800, Slow: Slow{At: time.Minute, Factor: 2}})
		t0, k, err := calibrate(100, 800)
		if err != nil {
			t.Fatal(err)
		}
		step := t0 + 4*k // four sequences decode together
		read := func() (secs, toks float64) {
			mfs := scrape(t, s.URL())
			return value(t, mfs, "llamacpp:tokens_predicted_seconds_total", nil), value(t, mfs, "llamacpp:tokens_predicted_total", nil)
		}
		burst(t, s.URL(), 4, 32)
		secs1, toks1 := read()
		if toks1 != 4*32 {
			t.Fatalf("tokens_predicted_total = %v, want %d", toks1, 4*32)
		}
		if want := 4 * 31 * step; math.Abs(secs1-want) > 1e-9 {
			t.Errorf("tokens_predicted_seconds_total = %.6f s, want 4 × 31 steps of %.6f s = %.6f s", secs1, step, want)
		}
		time.Sleep(time.Minute) // past --slow-at, on the bubble's clock
		burst(t, s.URL(), 4, 32)
		secs2, toks2 := read()
		if want := 4 * 31 * 2 * step; math.Abs(secs2-secs1-want) > 1e-9 || toks2-toks1 != 4*32 {
			t.Errorf("throttled burst added %.6f s and %v tokens, want %.6f s and %d", secs2-secs1, toks2-toks1, want, 4*32)
		}
	})
}
