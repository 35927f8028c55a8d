package sim

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// These tests check the fidelity of the timing model (tokens / time of a
// burst against the calibration). They run in testing/synctest bubbles
// over in-memory connections (bubbleSim), so the sim's steps and the
// test's clock are the bubble's: the figures are the model's, however
// busy the machine. The wall-clock fidelity is measured by make bench.

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
			synctest.Test(t, func(t *testing.T) {
				s := bubbleSim(t, Config{SingleTPS: s1, Batch16TPS: s16})
				n, wall := burst(t, s.URL(), tc.concurrency, tokens)
				got := float64(n) / wall.Seconds()
				t.Logf("%.2f tok/s in %v", got, wall)
				if !exact(got, tc.want) {
					t.Errorf("throughput %v tok/s, want %v", got, tc.want)
				}
			})
		})
	}
}

func TestDPRanksAddUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Two ranks each carry 8 of 16 requests: per-rank throughput at b=8
		// is 8/(t0+8k); the engine total is twice that.
		const s1, s16, tokens = 200.0, 1600.0, 96
		s := bubbleSim(t, Config{SingleTPS: s1, Batch16TPS: s16, DP: 2})
		t0, k, _ := calibrate(s1, s16)
		want := 2 * 8 / (t0 + 8*k)
		n, wall := burst(t, s.URL(), 16, tokens)
		if got := float64(n) / wall.Seconds(); !exact(got, want) {
			t.Errorf("throughput %v tok/s, want %v", got, want)
		}
	})
}

func TestColdStartIsSlower(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const factor, coldFor = 4.0, 600 * time.Millisecond
		s := bubbleSim(t, Config{SingleTPS: 200, Batch16TPS: 1600, ColdFactor: factor, ColdSeconds: coldFor.Seconds()})
		// 20 cold tokens take 20 × 5 ms × 4 = 0.4 s, inside the cold window.
		n, cold := burst(t, s.URL(), 1, 20)
		coldTPS := float64(n) / cold.Seconds()
		// The cold window runs on the bubble's clock: waiting it out
		// takes no real time.
		time.Sleep(time.Until(s.start.Add(coldFor)))
		n, warm := burst(t, s.URL(), 1, 40)
		warmTPS := float64(n) / warm.Seconds()
		if coldTPS != 200/factor || warmTPS != 200 {
			t.Errorf("cold %v tok/s, warm %v tok/s; want %v and 200", coldTPS, warmTPS, 200/factor)
		}
	})
}

// A rank whose pool is small queues what does not fit and finishes later.
// The queue is read while the requests are in flight, at an instant of the
// bubble's clock, when nothing moves.
func TestSmallPoolQueuesAndFinishesLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Rank 1's pool fits 3 sequences of 50 + 128 tokens; rank 0 fits all.
		const tokens, prompt = 128, 50
		s := bubbleSim(t, Config{SingleTPS: 400, Batch16TPS: 3200, DP: 2, KVTokens: []int64{100000, 600}, PromptTokens: prompt})
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
			synctest.Wait()
			if got := dealt(s); got != int64(i+1) {
				t.Fatalf("%d requests dealt after sending %d", got, i+1)
			}
		}

		// Every request is in; the clock has not moved since the first step
		// began, so the queues are as the sixteen arrivals left them.
		running, waiting := s.InFlight()
		mfs := scrape(t, s.URL())
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
		wg.Wait()
		var last [2]time.Duration
		for i, d := range ends {
			last[i%2] = max(last[i%2], d)
		}
		t.Logf("rank 0 done after %v, rank 1 after %v", last[0], last[1])
		// Rank 1 runs three waves (3, 3, 2) of 128 steps, rank 0 one wave
		// of 8: 128·(t0+8k) and 128·(2·(t0+3k) + t0+2k).
		t0, k, _ := calibrate(400, 3200)
		want0, want1 := 128*(t0+8*k), 128*(3*t0+8*k)
		if !exact(last[0].Seconds(), want0) || !exact(last[1].Seconds(), want1) {
			t.Errorf("ranks done after %v and %v, want %.6fs and %.6fs", last[0], last[1], want0, want1)
		}
	})
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

// A rank whose loop first runs after some of a burst is already in (a busy
// machine starts goroutines late) still starts the burst in one step: the
// first step of a run always waits for arrivals at its instant.
func TestRankStartsLateWithTheWholeBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := Config{SingleTPS: 200, Batch16TPS: 1600}.normalize()
		if err != nil {
			t.Fatal(err)
		}
		r := newRank(0, cfg.KVTokens[0], cfg.rankSetup(time.Now()))
		const n, tokens = 8, 10
		seqs := make([]*seq, n)
		for i := range seqs {
			seqs[i] = &seq{id: uint64(i), prompt: 10, reserve: 10 + tokens, target: tokens, finish: "length",
				wake: make(chan struct{}, 1), done: make(chan struct{})}
		}
		for _, s := range seqs[:n/2] {
			r.submit(s)
		}
		ctx, cancel := context.WithCancel(t.Context())
		stopped := make(chan struct{})
		go func() { r.loop(ctx); close(stopped) }()
		synctest.Wait() // the loop has seen the first half
		for _, s := range seqs[n/2:] {
			r.submit(s)
		}
		for _, s := range seqs {
			<-s.done
		}
		cancel()
		<-stopped
		if v := r.view(); v.stats.steps != tokens || v.stats.busySlots != n*tokens {
			t.Errorf("%d steps carrying %d sequence-steps; want %d steps of all %d", v.stats.steps, v.stats.busySlots, tokens, n)
		}
	})
}
