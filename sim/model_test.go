package sim

import (
	"sync"
	"testing"
	"time"
)

// These tests check the fidelity of the timing model (tokens / wall time
// of a burst against the calibration), with a tolerance for a noisy
// machine. They are not speed assertions of our code, and they do not run
// in parallel with each other or with the rest of the package.
//
// Pacing by absolute deadlines means noise can only make a run slower than
// the model, never faster, so each check takes the best of a few attempts:
// a model that is off fails them all.
const attempts = 3

// bestOf runs measure until it lands within tol of want, at most attempts
// times, and returns the value closest to want.
func bestOf(t *testing.T, want, tol float64, measure func() float64) float64 {
	t.Helper()
	best := 0.0
	for i := range attempts {
		got := measure()
		t.Logf("attempt %d: %.2f, want %.2f", i+1, got, want)
		if i == 0 || abs(got-want) < abs(best-want) {
			best = got
		}
		if within(got, want, tol) {
			break
		}
	}
	return best
}

func abs(x float64) float64 { return max(x, -x) }

func TestThroughputMatchesCalibration(t *testing.T) {
	const s1, s16, tokens = 200.0, 1600.0, 128
	for _, tc := range []struct {
		name        string
		concurrency int
		want        float64
	}{
		{"single", 1, s1},
		{"sixteen", 16, s16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startSim(t, Config{SingleTPS: s1, Batch16TPS: s16})
			got := bestOf(t, tc.want, 0.05, func() float64 {
				n, wall := burst(t, s.URL(), tc.concurrency, tokens)
				return float64(n) / wall.Seconds()
			})
			if !within(got, tc.want, 0.05) {
				t.Errorf("throughput %.1f tok/s, want %.0f ± 5%%", got, tc.want)
			}
		})
	}
}

func TestDPRanksAddUp(t *testing.T) {
	// Two ranks each carry 8 of 16 requests: per-rank throughput at b=8
	// is 8/(t0+8k); the engine total is twice that.
	const s1, s16, tokens = 200.0, 1600.0, 96
	s := startSim(t, Config{SingleTPS: s1, Batch16TPS: s16, DP: 2})
	t0, k, _ := calibrate(s1, s16)
	want := 2 * 8 / (t0 + 8*k)
	got := bestOf(t, want, 0.05, func() float64 {
		n, wall := burst(t, s.URL(), 16, tokens)
		return float64(n) / wall.Seconds()
	})
	if !within(got, want, 0.05) {
		t.Errorf("throughput %.1f tok/s, want %.0f ± 5%%", got, want)
	}
}

func TestColdStartIsSlower(t *testing.T) {
	const factor, coldFor = 4.0, 600 * time.Millisecond
	ratio := bestOf(t, factor, 0.12, func() float64 {
		s := startSim(t, Config{SingleTPS: 200, Batch16TPS: 1600, ColdFactor: factor, ColdSeconds: coldFor.Seconds()})
		defer s.Close()
		// 20 cold tokens take 20 × 5 ms × 4 = 0.4 s, inside the cold window.
		n, cold := burst(t, s.URL(), 1, 20)
		coldTPS := float64(n) / cold.Seconds()
		if time.Since(s.start) > coldFor {
			return 0 // the machine stalled past the cold window: measure again
		}
		// The model's cold window is wall-clock time; wait it out.
		time.Sleep(time.Until(s.start.Add(coldFor)))
		n, warm := burst(t, s.URL(), 1, 40)
		return float64(n) / warm.Seconds() / coldTPS
	})
	if !within(ratio, factor, 0.12) {
		t.Errorf("warm/cold throughput = %.2f, want %.1f ± 12%%", ratio, factor)
	}
}

func TestSmallPoolQueuesAndFinishesLater(t *testing.T) {
	// Rank 1's pool fits 3 sequences of 50 + 128 tokens; rank 0 fits all.
	const tokens, prompt = 128, 50
	s := startSim(t, Config{SingleTPS: 400, Batch16TPS: 3200, DP: 2, KVTokens: []int64{100000, 600}, PromptTokens: prompt})
	if got := s.Ranks(); got[0] != 100000 || got[1] != 600 {
		t.Fatalf("Ranks() = %v", got)
	}
	start := time.Now()
	ends := make([]time.Duration, 16)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			body := chatBody(tokens, map[string]any{"ignore_eos": true, "stream": true})
			resp, err := post(t.Context(), s.URL(), body)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			if r := readStream(resp, nil); r.tokens != tokens || !r.done {
				t.Errorf("request %d: %+v", i, r)
			}
			ends[i] = time.Since(start)
		})
		// Send in order so that request i lands on rank i%2.
		waitFor(t, "request dealt", func() bool { return dealt(s) == int64(i+1) })
	}

	running, waiting := s.InFlight()
	mfs := scrape(t, s.URL())
	wg.Wait()
	if running != 11 || waiting != 5 {
		t.Errorf("InFlight = %d running, %d waiting; want 11, 5", running, waiting)
	}
	for _, c := range []struct {
		name, engine string
		want         float64
	}{
		{"vllm:num_requests_running", "0", 8}, {"vllm:num_requests_waiting", "0", 0},
		{"vllm:num_requests_running", "1", 3}, {"vllm:num_requests_waiting", "1", 5},
	} {
		if got := value(t, mfs, c.name, map[string]string{"engine": c.engine}); got != c.want {
			t.Errorf("%s{engine=%s} = %v, want %v", c.name, c.engine, got, c.want)
		}
	}
	var last [2]time.Duration
	for i, d := range ends {
		last[i%2] = max(last[i%2], d)
	}
	t.Logf("rank 0 done after %v, rank 1 after %v", last[0], last[1])
	// Rank 1 runs three waves (3, 3, 2) of 128 steps; rank 0 one wave of 8.
	if last[1] < last[0]*3/2 {
		t.Errorf("small rank finished after %v, not clearly later than the big one (%v)", last[1], last[0])
	}
}

func TestRoundRobinDealing(t *testing.T) {
	t.Parallel()
	s := startSim(t, Config{SingleTPS: 20000, Batch16TPS: 160000, DP: 3})
	for range 7 {
		if code, _, raw := chat(t, s.URL(), chatBody(4, map[string]any{"min_tokens": 4})); code != 200 {
			t.Fatalf("chat: %d %s", code, raw)
		}
	}
	mfs := scrape(t, s.URL())
	for engine, want := range map[string]float64{"0": 3, "1": 2, "2": 2} {
		if got := value(t, mfs, "vllm:request_success_total", map[string]string{"engine": engine, "finished_reason": "length"}); got != want {
			t.Errorf("engine %s served %v requests, want %v", engine, got, want)
		}
		if got := value(t, mfs, "vllm:generation_tokens_total", map[string]string{"engine": engine}); got != want*4 {
			t.Errorf("engine %s generated %v tokens, want %v", engine, got, want*4)
		}
	}
}
