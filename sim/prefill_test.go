package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Fidelity of the prefill model. Like model_test.go's, these tests run in
// testing/synctest bubbles (bubbleSim): HTTP and JSON of long prompts take
// no time on the sim's clock, so the figures are the model's.

// exact says whether a figure timed in a bubble is the model's, to the
// nanoseconds of the clock.
func exact(got, want float64) bool { return math.Abs(got-want) <= 1e-6*math.Abs(want) }

// postBody sends an already marshalled chat request.
func postBody(t *testing.T, url string, body []byte) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return clientFor(url).Do(req)
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// timedChat sends a non-streamed chat and returns its prompt usage and
// time.
func timedChat(t *testing.T, url string, body map[string]any) (int64, time.Duration) {
	t.Helper()
	b := marshal(t, body)
	start := time.Now()
	resp, err := postBody(t, url, b)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out nonStream
	if err := jsonDecode(resp, &out); err != nil {
		t.Fatal(err)
	}
	return out.Usage.PromptTokens, time.Since(start)
}

// promptBurst sends n concurrent prompts of tokens tokens (unique
// prefixes) with one output token, and returns prompt tokens / time.
func promptBurst(t *testing.T, url string, n, tokens int, tag string) float64 {
	t.Helper()
	bodies := make([][]byte, n)
	for i := range n {
		bodies[i] = marshal(t, longChat(tokens, fmt.Sprintf("%s%d", tag, i), 1))
	}
	var wg sync.WaitGroup
	prompts := make([]int64, n)
	errs := make([]string, n)
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			resp, err := postBody(t, url, bodies[i])
			if err != nil {
				errs[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			var out nonStream
			if err := jsonDecode(resp, &out); err != nil {
				errs[i] = err.Error()
				return
			}
			prompts[i] = out.Usage.PromptTokens
		})
	}
	wg.Wait()
	wall := time.Since(start)
	var total int64
	for i, p := range prompts {
		if errs[i] != "" || p != int64(tokens) {
			t.Fatalf("prompt %d: %d tokens, error %q", i, p, errs[i])
		}
		total += p
	}
	return float64(total) / wall.Seconds()
}

func TestLonePromptReadsAtPrefillTPS(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const tokens, p = 8000, 10000.0
		cfg := Config{SingleTPS: 1000, Batch16TPS: 8000, PrefillTPS: p}
		want, err := cfg.PrefillCapacity(1, tokens)
		if err != nil {
			t.Fatal(err)
		}
		// L/(L/P + 1/S1): the one sampling step is 1 ms of 0.8 s.
		if !near(want, p, 0.01) {
			t.Fatalf("the model's lone-prompt rate %.0f is not within 1 %% of P = %.0f", want, p)
		}
		s := bubbleSim(t, cfg)
		n, wall := timedChat(t, s.URL(), longChat(tokens, "lone", 1))
		if got := float64(n) / wall.Seconds(); !exact(got, want) {
			t.Errorf("a lone prompt read at %v tok/s, want %v", got, want)
		}
	})
}

func TestConcurrentPromptsGiveTruePrefillCapacity(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       Config
		n, tokens int
	}{
		// Two ranks take two prompts each: 2·(L/P + 1/S1) = 1.204 s.
		{"sglang on two ranks", Config{Flavor: FlavorSGLang, SingleTPS: 500, Batch16TPS: 4000, PrefillTPS: 10000, DP: 2}, 4, 6000},
		// One rank takes all four: 4·(L/P + 1/S1) = 1.204 s.
		{"vllm on one rank", Config{SingleTPS: 1000, Batch16TPS: 8000, PrefillTPS: 10000}, 4, 3000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				want, err := tc.cfg.PrefillCapacity(tc.n, tc.tokens)
				if err != nil {
					t.Fatal(err)
				}
				s := bubbleSim(t, tc.cfg)
				if got := promptBurst(t, s.URL(), tc.n, tc.tokens, "r-"); !exact(got, want) {
					t.Errorf("%d prompts of %d read at %v tok/s, want %v", tc.n, tc.tokens, got, want)
				}
			})
		})
	}
}

// decodeWhilePrefilling streams one long decode and, once it has 5 tokens,
// sends a prompt of prompt tokens with one output token. It returns when
// the stream began and when each of its tokens came.
func decodeWhilePrefilling(t *testing.T, url string, decodeTokens, prompt int) (start time.Time, tokens []time.Time) {
	t.Helper()
	var mu sync.Mutex
	fifth := make(chan struct{})
	done := make(chan streamResult, 1)
	start = time.Now()
	go func() {
		body := chatBody(decodeTokens, map[string]any{"ignore_eos": true, "stream": true})
		resp, err := post(t.Context(), url, body)
		if err != nil {
			done <- streamResult{readErr: err}
			return
		}
		done <- readStream(resp, func(n int) {
			mu.Lock()
			tokens = append(tokens, time.Now())
			mu.Unlock()
			if n == 5 {
				close(fifth)
			}
		})
	}()
	select {
	case <-fifth:
	case r := <-done:
		t.Fatalf("decode stream ended early: %+v", r)
	}
	if code, _, raw := chat(t, url, longChat(prompt, "", 1)); code != 200 {
		t.Fatalf("prompt: %d %s", code, raw)
	}
	if r := <-done; r.tokens != decodeTokens || !r.done {
		t.Fatalf("decode stream: %+v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	return start, tokens
}

// gaps are the seconds between consecutive tokens.
func gaps(ts []time.Time) []float64 {
	out := make([]float64, 0, len(ts))
	for i := 1; i < len(ts); i++ {
		out = append(out, ts[i].Sub(ts[i-1]).Seconds())
	}
	return out
}

func countIn(xs []float64, lo, hi float64) int {
	n := 0
	for _, x := range xs {
		if x >= lo && x <= hi {
			n++
		}
	}
	return n
}

func TestChunkedPrefillSlowsDecoding(t *testing.T) {
	// A budget of 512: a decoding sequence takes 1 token of each step, so a
	// prompt of 10 × 511 tokens is read in 10 steps of t0 + k + 511/P =
	// 56 ms (vLLM), each giving the decode one token, between steps of
	// t0 + k = 5 ms. SGLang runs the chunks in steps of their own and the
	// decode waits for all of them: one gap of about 10 × 51 ms.
	const prompt, decodeTokens = 5110, 200
	base := Config{SingleTPS: 200, Batch16TPS: 1600, PrefillTPS: 10000, MaxBatchedTokens: 512, MaxRunning: 64, NoPrefixCache: true}
	t0, k, _ := calibrate(base.SingleTPS, base.Batch16TPS)
	chunkStep := t0 + k + 511/base.PrefillTPS

	// shape runs the decode beside the prompt in a bubble and judges the
	// gaps between its tokens.
	shape := func(t *testing.T, cfg Config, ok func(g []float64) (bool, string)) {
		t.Helper()
		synctest.Test(t, func(t *testing.T) {
			s := bubbleSim(t, cfg)
			_, tokens := decodeWhilePrefilling(t, s.URL(), 100, prompt)
			good, why := ok(gaps(tokens))
			t.Log(why)
			if !good {
				t.Error(why)
			}
		})
	}
	t.Run("vllm decodes a token per prefill step", func(t *testing.T) {
		shape(t, base, func(g []float64) (bool, string) {
			slow, longest := countIn(g, 0.8*chunkStep, 1.5*chunkStep), slices.Max(g)
			return slow >= 9 && slow <= 11 && longest < 3*chunkStep, fmt.Sprintf(
				"%d decode gaps of a chunk step (%.0f ms), longest %.0f ms; want 10, and no pause", slow, 1000*chunkStep, 1000*longest)
		})
	})
	t.Run("sglang pauses decoding for prompt steps", func(t *testing.T) {
		cfg := base
		cfg.Flavor = FlavorSGLang
		pause := prompt/cfg.PrefillTPS + t0 + k // every chunk, then the step that samples the prompt's token
		shape(t, cfg, func(g []float64) (bool, string) {
			slow, longest := countIn(g, 0.8*chunkStep, 1.5*chunkStep), slices.Max(g)
			return longest >= 0.9*pause && longest <= 1.5*pause && slow <= 1, fmt.Sprintf(
				"longest decode gap %.0f ms, %d chunk-step gaps; want one pause of about %.0f ms", 1000*longest, slow, 1000*pause)
		})
	})
	t.Run("vllm decode time grows by L/P", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := bubbleSim(t, base)
			// 200 steps of t0 + k, 10 of which also carry a 511-token chunk,
			// and one of which also samples the prompt's first token (+k);
			// the prompt arrives during a step and waits for the next.
			want := decodeTokens*(t0+k) + prompt/base.PrefillTPS + k
			start, tokens := decodeWhilePrefilling(t, s.URL(), decodeTokens, prompt)
			if got := tokens[len(tokens)-1].Sub(start).Seconds(); got < want || got > want+t0+k {
				t.Errorf("decode of %d tokens beside a %d-token prompt took %v s, want %v to a step more", decodeTokens, prompt, got, want)
			}
		})
	})
}

func TestDecodeBurstPaysItsPrompts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// 16 prompts of 10 tokens (chatBody) at P = 1000 cost 0.16 s on top
		// of 128 decode steps of 16/S16: the burst reads about 9 % below
		// S16, as DecodeCapacity says.
		cfg := Config{SingleTPS: 100, Batch16TPS: 1200, PrefillTPS: 1000}
		want, err := cfg.DecodeCapacity(16, 10, 128)
		if err != nil {
			t.Fatal(err)
		}
		if want > 0.92*cfg.Batch16TPS {
			t.Fatalf("prediction %.0f is too close to S16 for the test to tell", want)
		}
		s := bubbleSim(t, cfg)
		n, wall := burst(t, s.URL(), 16, 128)
		if got := float64(n) / wall.Seconds(); !exact(got, want) {
			t.Errorf("burst %v tok/s, want %v (S16 = %.0f)", got, want, cfg.Batch16TPS)
		}
	})
}

func TestColdFactorAppliesToPrefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Cold, a 4000-token prompt is two steps of ~0.1 s, each 3× longer;
		// both start inside the 0.9 s cold window.
		const factor, coldFor, tokens = 3.0, 900 * time.Millisecond, 4000
		s := bubbleSim(t, Config{SingleTPS: 1000, Batch16TPS: 8000, PrefillTPS: 20000, ColdFactor: factor, ColdSeconds: coldFor.Seconds()})
		_, cold := timedChat(t, s.URL(), longChat(tokens, "cold", 1))
		// The cold window runs on the bubble's clock: waiting it out takes
		// no real time.
		time.Sleep(time.Until(s.start.Add(coldFor)))
		_, warm := timedChat(t, s.URL(), longChat(tokens, "warm", 1))
		if ratio := cold.Seconds() / warm.Seconds(); !exact(ratio, factor) {
			t.Errorf("cold/warm prefill time = %v (%v / %v), want %v", ratio, cold, warm, factor)
		}
	})
}

func TestLongPromptsHoldThePool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A pool of 10,000: two prompts of 4,000 + 100 max tokens fit, the
		// third waits until one finishes. While both run, the pool holds
		// both prompts; it never holds more than its size.
		const pool, prompt, maxTokens = 10000, 4000, 100
		s := bubbleSim(t, Config{SingleTPS: 400, Batch16TPS: 3200, PrefillTPS: 40000, KVTokens: []int64{pool}})
		ends := make([]time.Time, 3)
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() {
				body := longChat(prompt, fmt.Sprintf("kv%d", i), maxTokens)
				body["ignore_eos"] = true
				if code, resp, raw := chat(t, s.URL(), body); code != 200 || resp.Usage.PromptTokens != prompt {
					t.Errorf("request %d: %d %s", i, code, raw)
				}
				ends[i] = time.Now()
			})
			synctest.Wait() // dealt in order
		}
		// The prompts are read by 0.2 s; the first answers come at 0.2 s
		// plus 100 decode steps. In between, two are held and one waits.
		time.Sleep(300 * time.Millisecond) // on the bubble's clock
		mfs := scrape(t, s.URL())
		usage := value(t, mfs, "vllm:kv_cache_usage_perc", nil)
		waiting := value(t, mfs, "vllm:num_requests_waiting", nil)
		if usage < 2*prompt/float64(pool) || usage > 1 || waiting != 1 {
			t.Errorf("kv usage %v, %v waiting; want both prompts held (at least %v) within the pool, one waiting", usage, waiting, 2*prompt/float64(pool))
		}
		wg.Wait()
		if last := ends[2]; !last.After(ends[0]) || !last.After(ends[1]) {
			t.Errorf("the queued request finished at %v, not after the two that ran first (%v, %v)", last, ends[0], ends[1])
		}
		if u := value(t, scrape(t, s.URL()), "vllm:kv_cache_usage_perc", nil); u != 0 {
			t.Errorf("kv usage %v after every request finished", u)
		}
	})
}

func TestFreePrefillKeepsTheDecodeModel(t *testing.T) {
	t.Parallel()
	// Without prefill-tps the planner gives every running sequence a token
	// each step and prompts cost nothing: DecodeCapacity is the old model.
	for _, c := range []Config{{SingleTPS: 80, Batch16TPS: 900}, {Flavor: FlavorSGLang, SingleTPS: 80, Batch16TPS: 900, DP: 2}} {
		t0, k, _ := calibrate(c.SingleTPS, c.Batch16TPS)
		d := max(c.DP, 1)
		for _, n := range []int{1, 4, 16, 17} {
			got, err := c.DecodeCapacity(n, 500, 128)
			if err != nil {
				t.Fatal(err)
			}
			fullest := math.Ceil(float64(n) / float64(d))
			if want := float64(n) / (t0 + k*fullest); !near(got, want, 1e-9) {
				t.Errorf("%+v n=%d: %v, want %v", c, n, got, want)
			}
		}
	}
}
