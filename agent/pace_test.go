package agent

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

// A pace reading is the mean inter-token time over a window and the batch
// Little's law gives, one every half window over the whole window before
// it, with its newest half alone; a window that started over gives its
// first reading at half its length; too few tokens, a missing histogram or
// a counter that went back give none.
func TestPaceReadings(t *testing.T) {
	p := &pace{window: 10 * time.Second}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	c := func(gen, sum, n float64) engine.Counters {
		return engine.Counters{Generated: gen, InterTokenSeconds: sum, InterTokens: n, InterTokenKnown: true}
	}
	if r := p.add(at(0), c(0, 0, 0), 2); r != nil {
		t.Fatalf("first sample gave %+v", r)
	}
	if r := p.add(at(3), c(3000, 24, 3000), 2); r != nil {
		t.Fatalf("3 s into the first window: %+v", r)
	}
	// The first window's first half gives a reading of its own.
	r := p.add(at(5), c(5000, 40, 5000), 2)
	if r == nil || r.WindowSeconds != 5 || math.Abs(r.SecondsPerToken-0.008) > 1e-12 || r.ThroughputTPS != 1000 || r.Recent != nil {
		t.Fatalf("half the first window gave %+v, want a 5 s reading at 8 ms per token and 1000 tok/s", r)
	}
	if r := p.add(at(7), c(7000, 56, 7000), 2); r != nil {
		t.Fatalf("7 s into the first window: %+v", r)
	}
	// 10,000 tokens in 10 s at 8 ms each: 8 decoding, 4 per rank.
	r = p.add(at(10), c(10000, 80, 10000), 2)
	if r == nil || math.Abs(r.SecondsPerToken-0.008) > 1e-12 || math.Abs(r.Batch-4) > 1e-9 || r.ThroughputTPS != 1000 || r.WindowSeconds != 10 {
		t.Fatalf("reading %+v, want 8 ms per token, batch 4 per rank, 1000 tok/s", r)
	}
	if h := r.Recent; h == nil || h.WindowSeconds != 5 || math.Abs(h.SecondsPerToken-0.008) > 1e-12 || math.Abs(h.Batch-4) > 1e-9 {
		t.Fatalf("its newest half %+v, want 5–10 s at 8 ms per token, batch 4", h)
	}
	// Half a window later, the next reading covers 5–15 s: the engine
	// slowed to 16 ms per token at 10 s, so it reads the mean of both;
	// its newest half, 10–15 s, reads the slow engine alone.
	r = p.add(at(15), c(12500, 120, 12500), 2)
	if r == nil || r.WindowSeconds != 10 || r.ThroughputTPS != 750 || math.Abs(r.SecondsPerToken-80.0/7500) > 1e-12 {
		t.Fatalf("the overlapping reading %+v, want 5–15 s: 750 tok/s, %.2f ms per token", r, 1000*80.0/7500)
	}
	if h := r.Recent; h == nil || h.WindowSeconds != 5 || math.Abs(h.SecondsPerToken-0.016) > 1e-12 || math.Abs(h.Batch-4) > 1e-9 {
		t.Fatalf("its newest half %+v, want 10–15 s at 16 ms per token, batch 4", h)
	}
	if r := p.add(at(17), c(13500, 136, 13500), 2); r != nil {
		t.Fatalf("between two readings: %+v", r)
	}
	r = p.add(at(20), c(15000, 160, 15000), 2)
	if r == nil || r.ThroughputTPS != 500 || math.Abs(r.SecondsPerToken-0.016) > 1e-12 {
		t.Fatalf("10–20 s: %+v, want 500 tok/s at 16 ms per token", r)
	}
	// Ten tokens in a window: too few to say, the last reading stays.
	q := &pace{window: 10 * time.Second}
	q.add(at(0), c(0, 0, 0), 2)
	if r := q.add(at(10), c(10, 0.1, 10), 2); r != nil || q.latest != nil || !q.start.at.IsZero() {
		t.Fatalf("a quiet window gave %+v, latest %+v", r, q.latest)
	}
	// A restart: counters back to zero start over; the new window's first
	// quarter, then its first half, give readings.
	p.add(at(25), c(100000, 800, 100000), 2)
	if r := p.add(at(40), c(10, 0.1, 10), 2); r != nil {
		t.Fatalf("counters that went back gave %+v", r)
	}
	if r := p.add(at(42), c(810, 12.9, 810), 2); r != nil {
		t.Fatalf("2 s after the restart: %+v", r)
	}
	if r := p.add(at(43), c(1210, 19.3, 1210), 2); r == nil || r.WindowSeconds != 3 || math.Abs(r.SecondsPerToken-0.016) > 1e-12 {
		t.Fatalf("a quarter window after the restart: %+v, want a 3 s reading at 16 ms per token", r)
	}
	if r := p.add(at(44), c(1610, 25.7, 1610), 2); r != nil {
		t.Fatalf("4 s after the restart: %+v", r)
	}
	if r := p.add(at(45), c(2010, 32.1, 2010), 2); r == nil || r.WindowSeconds != 5 || math.Abs(r.SecondsPerToken-0.016) > 1e-12 {
		t.Fatalf("half a window after the restart: %+v, want a 5 s reading at 16 ms per token", r)
	}
	if r := p.add(at(48), c(3510, 56.1, 3510), 2); r != nil {
		t.Fatalf("8 s after the restart: %+v", r)
	}
	// No histogram and no decode seconds (an old engine): nothing.
	if r := p.add(at(60), engine.Counters{Generated: 1e6}, 1); r != nil || !p.start.at.IsZero() {
		t.Fatalf("no histogram gave %+v", r)
	}
}

// Traffic in bursts: 12 requests decoding for 4 s, then nothing for 6 s,
// read each second. The time between tokens is the 12-request step's,
// 15 ms, yet Little's law over the whole window averages in the idle
// seconds and gives 4.8 running: a pace read at 4.8 would look far
// slower than the engine's at 4.8. TokenBatch weights each second by its
// tokens and gives the 12 they saw, wherever the bursts fall between two
// samples; a histogram that does not grow as tokens are sent (older
// SGLang, llama.cpp) gives none, and Batch stands alone.
func TestPaceTokenBatchOfBurstyTraffic(t *testing.T) {
	const step, running = 0.015, 12.0
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name  string
		phase float64 // where the first burst starts, in seconds after the first sample
		live  bool
		want  float64 // TokenBatch per rank
		slack float64
	}{
		{"bursts on the samples", 0, true, running / 2, 1e-9},
		// A burst that starts and ends mid-interval shares two intervals
		// with idle time: they read 12 × 0.5 at half the tokens each.
		{"bursts between the samples", 0.5, true, running / 2 * (3 + 0.5*0.5 + 0.5*0.5) / 4, 1e-9},
		{"not live", 0, false, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// busyUntil is the decoding seconds up to second x.
			busyUntil := func(x float64) float64 {
				cycles := math.Floor((x - tt.phase) / 10)
				in := (x - tt.phase) - 10*cycles
				return 4*cycles + min(4, max(0, in))
			}
			p := &pace{window: 10 * time.Second}
			var got *wire.Pace
			for sec := 0; sec <= 40; sec++ {
				busy := busyUntil(float64(sec)) - busyUntil(0)
				// Each decoding second: 12 requests × 1/15 ms tokens; the
				// histogram's sum grows by 12 seconds of decoding.
				tokens := busy * running / step
				c := engine.Counters{Generated: tokens, InterTokenSeconds: busy * running, InterTokens: tokens,
					InterTokenKnown: true, InterTokenLive: tt.live}
				if r := p.add(t0.Add(time.Duration(sec)*time.Second), c, 2); r != nil && r.WindowSeconds == 10 {
					got = r
				}
			}
			if got == nil {
				t.Fatal("no whole-window reading in 40 s")
			}
			if math.Abs(got.SecondsPerToken-step) > 1e-9 || math.Abs(got.Batch-running*0.4/2) > 1e-9 {
				t.Errorf("reading %+v, want %.0f ms per token and Batch %.1f (the time average)", got, 1000*step, running*0.4/2)
			}
			if math.Abs(got.TokenBatch-tt.want) > tt.slack {
				t.Errorf("TokenBatch %.3f, want %.3f", got.TokenBatch, tt.want)
			}
			if r := got.Recent; r != nil && tt.live && r.TokenBatch <= got.Batch {
				t.Errorf("newest half %+v: TokenBatch not read", r)
			}
		})
	}
}

// A slowdown between readings ends the window early: once 2 s or more
// run more than half again as slow per token as the window before them,
// the reading goes out with those seconds as its Recent, and the next
// window starts a sample after the split, giving its first reading at a
// quarter of its length. A 30 % slower spell, or a slowdown too recent to
// fill 2 s, waits for the window's own schedule.
func TestPaceSuddenSlowdown(t *testing.T) {
	p := &pace{window: 10 * time.Second}
	add := steadyEngine(p)
	for s := range 12 {
		add(s, 0.008) // readings at 5 and 10 s
	}
	// 30 % slower for 3 s: within the window's own schedule.
	for s := 12; s < 15; s++ {
		if r := add(s, 0.0104); r != nil {
			t.Fatalf("%d s, 30 %% slower: %+v", s, r)
		}
	}
	if r := add(15, 0.008); r == nil || r.Recent == nil || r.WindowSeconds != 10 {
		t.Fatalf("15 s: %+v, want the window's own 5–15 s reading", r)
	}
	// Twice as slow from 16.25 s: the second to 17 s is a quarter at the
	// old speed and three quarters at the new (12.8 ms per token), the
	// second to 18 s all new.
	add(16, 0.008)
	if r := add(17, 0.0128); r != nil {
		t.Fatalf("17 s, 0.75 s after the slowdown: %+v", r)
	}
	r := add(18, 0.016)
	if r == nil || r.WindowSeconds != 8 || r.Recent == nil || r.Recent.WindowSeconds != 2 || math.Abs(r.Recent.SecondsPerToken-16.0/1125) > 1e-12 {
		t.Fatalf("18 s, 1.75 s after the slowdown: %+v, want the 10–18 s window ending early with 16–18 s as its Recent at 14.2 ms per token", r)
	}
	if p.latest != r {
		t.Fatalf("the early reading is not the latest")
	}
	// That Recent still holds a quarter second of the old speed. The next
	// window starts at 17 s, the first sample after the split: nothing
	// until a quarter of its length, then the slow engine alone, and again
	// at half its length.
	if r := add(19, 0.016); r != nil {
		t.Fatalf("19 s: %+v", r)
	}
	if r := add(20, 0.016); r == nil || r.WindowSeconds != 3 || math.Abs(r.SecondsPerToken-0.016) > 1e-12 || r.Recent != nil {
		t.Fatalf("20 s: %+v, want the quarter reading 17–20 s at 16 ms per token", r)
	}
	if r := add(21, 0.016); r != nil {
		t.Fatalf("21 s: %+v", r)
	}
	if r := add(22, 0.016); r == nil || r.WindowSeconds != 5 || math.Abs(r.SecondsPerToken-0.016) > 1e-12 || r.Recent != nil {
		t.Fatalf("22 s: %+v, want 17–22 s at 16 ms per token", r)
	}
}

// A slowdown that lands 2 s before a regular reading is not read there
// alone (that reading's newest half still holds 3 s before it), and after
// it the window starts at its old half, 3 s of the old speed and 2 s of
// the new: a 60 %-slower engine compared over only its newest 2 s never
// looks half again as slow as that mix (1.45 at 16 s, less after), and
// would wait for the next regular reading. Split where it landed, the
// contrast is whole: the window ends early a second after the reading,
// with the change's 3 s as its Recent.
//
// A sudden reading that came too early, its newer seconds holding a part
// of a second at the old speed, passes the agent's gate but may read too
// little slower for the coordinator; the next window starts at the first
// sample after the split, so its quarter reading, the new speed alone,
// comes a second after the sudden one, not 5 s.
func TestPaceSuddenSlowdownJustBeforeAReading(t *testing.T) {
	p := &pace{window: 10 * time.Second}
	add := steadyEngine(p)
	for s := range 14 {
		add(s, 0.008) // readings at 5 and 10 s
	}
	add(14, 0.0128) // 60 % slower from 13 s
	r := add(15, 0.0128)
	if r == nil || r.WindowSeconds != 10 || r.Recent == nil || r.Recent.SecondsPerToken > 0.0105 {
		t.Fatalf("15 s: %+v, want the window's own 5–15 s reading, its newest half still mostly the old speed", r)
	}
	r = add(16, 0.0128)
	if r == nil || r.WindowSeconds != 6 || r.Recent == nil || r.Recent.WindowSeconds != 3 || math.Abs(r.Recent.SecondsPerToken-0.0128) > 1e-12 {
		t.Fatalf("16 s: %+v, want the 10–16 s window ending early with 13–16 s as its Recent at 12.8 ms per token", r)
	}
	if r := add(17, 0.0128); r == nil || r.WindowSeconds != 3 || math.Abs(r.SecondsPerToken-0.0128) > 1e-12 {
		t.Fatalf("17 s: %+v, want the quarter reading 14–17 s at 12.8 ms per token", r)
	}
}

// steadyEngine feeds p an engine with 8 running, sampled every second:
// add(s, spt) is the sample at s seconds after the second before it ran
// at spt seconds per token (1,000 tok/s at 8 ms).
func steadyEngine(p *pace) func(s int, spt float64) *wire.Pace {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var gen, sum float64
	return func(s int, spt float64) *wire.Pace {
		if s > 0 {
			gen += 0.008 / spt * 1000
			sum += 0.008 / spt * 1000 * spt
		}
		return p.add(t0.Add(time.Duration(s)*time.Second), engine.Counters{Generated: gen, InterTokenSeconds: sum, InterTokens: gen, InterTokenKnown: true}, 1)
	}
}

// A reading carries the prompt tokens the engine computed over its window
// per second, from both ends' counters; where the engine does not say at
// both ends, none; a prompt counter that went back is a restart.
func TestPacePromptRate(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	c := func(gen, prompt float64, known bool) engine.Counters {
		return engine.Counters{Generated: gen, InterTokenSeconds: gen * 0.01, InterTokens: gen, InterTokenKnown: true,
			PromptComputed: prompt, PromptKnown: known}
	}
	p := &pace{window: 10 * time.Second}
	p.add(at(0), c(0, 1000, true), 1)
	if r := p.add(at(10), c(1000, 31000, true), 1); r == nil || r.PromptTPS != 3000 {
		t.Fatalf("reading %+v, want 3000 prompt tokens per second", r)
	}
	q := &pace{window: 10 * time.Second}
	q.add(at(0), c(0, 0, false), 1)
	if r := q.add(at(10), c(1000, 5000, true), 1); r == nil || r.PromptTPS != 0 {
		t.Fatalf("a window whose start had no prompt counter: %+v, want prompt_tps 0", r)
	}
	q.add(at(20), c(2000, 100, true), 1)
	if !q.start.at.Equal(at(20)) {
		t.Fatalf("a prompt counter that went back did not start the window over: start %v", q.start.at)
	}
	// That is no restart (the decode counters went on): no quarter-window
	// reading, only the half window's.
	if r := q.add(at(23), c(2300, 400, true), 1); r != nil {
		t.Fatalf("3 s after a prompt counter went back: %+v", r)
	}
	// Prompt tokens less cache hits can dip between the window's newest
	// half and its end without going below its start: the half reads no
	// prompts, never a negative rate the coordinator would refuse.
	h := &pace{window: 10 * time.Second}
	h.add(at(0), c(0, 1000, true), 1)
	h.add(at(5), c(500, 6000, true), 1)
	r := h.add(at(10), c(1000, 5000, true), 1)
	if r == nil || r.Recent == nil {
		t.Fatalf("reading %+v, want one with its newest half", r)
	}
	if r.Recent.PromptTPS != 0 || r.PromptTPS != 400 {
		t.Fatalf("reading %+v with newest half %+v, want 400 prompt tokens per second and none in the half", r, r.Recent)
	}
	e := wire.Engine{Kind: wire.EngineVLLM, URL: "http://127.0.0.1:8000", Pace: r}
	if err := e.Validate(); err != nil {
		t.Fatalf("the coordinator would refuse the reading: %v", err)
	}
}

// llama.cpp has no inter-token histogram: its finished requests' decode
// seconds over their tokens, scraped from a real llama-server page over
// loopback, give the same reading.
func TestPaceFromLlamaCppCounters(t *testing.T) {
	var secs, toks atomic.Value
	secs.Store(0.0)
	toks.Store(0.0)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total %v
# HELP llamacpp:tokens_predicted_seconds_total Predict process time
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total %v
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
`, toks.Load(), secs.Load())
	}))
	t.Cleanup(srv.Close)
	c, err := engine.New(engine.Config{Kind: "llamacpp", URL: srv.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &pace{window: 10 * time.Second}
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	read := func(at time.Time) *wire.Pace {
		t.Helper()
		cs, err := c.Counters(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return p.add(at, cs, 1)
	}
	secs.Store(1.5)
	toks.Store(100.0)
	if r := read(t0); r != nil {
		t.Fatalf("first sample gave %+v", r)
	}
	// 800 tokens finished in 10 s, 20 ms apart in their requests: 80 tok/s
	// at 20 ms a token is 1.6 requests decoding on average.
	secs.Store(17.5)
	toks.Store(900.0)
	r := read(t0.Add(10 * time.Second))
	if r == nil || math.Abs(r.SecondsPerToken-0.02) > 1e-12 || math.Abs(r.Batch-1.6) > 1e-9 || r.ThroughputTPS != 80 {
		t.Fatalf("reading %+v, want 20 ms per token, batch 1.6, 80 tok/s", r)
	}
}

// The whole path on a real heft-sim (vLLM's chunked prefill: prompt chunks
// share the decode steps): eight requests decode while long prompts
// arrive five times a second. The steps stretch by the share of time the
// prompts take, so the raw pace reads far slower than decoding alone; the
// reading's prompt rate over the engine's prefill rate is that share, and
// taking it out gives the decode step again (the coordinator's
// prefillShare does so with the measured prefill rate).
func TestPaceReadsPromptsBesideDecoding(t *testing.T) {
	const single, batch16, prefill = 100.0, 800.0, 20000.0
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorVLLM, Model: "test/model", SingleTPS: single, Batch16TPS: batch16,
		PrefillTPS: prefill}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// t0 + k = 1/S1, t0 + 16k = 16/S16: 8 decoding take t0 + 8k a step.
	k := (16/batch16 - 1/single) / 15
	decodeStep := 1/single + 7*k

	ctx, cancel := context.WithCancel(t.Context())
	var users sync.WaitGroup
	t.Cleanup(func() { cancel(); users.Wait() })
	send := func(body string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/chat/completions", strings.NewReader(body))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s: %s", resp.Status, b)
			}
		}
	}
	for range 8 {
		users.Go(func() {
			send(`{"model":"test/model","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5000,"ignore_eos":true}`)
		})
	}
	c, err := engine.New(engine.Config{Kind: "vllm", URL: s.URL()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The prompts start once the decoders decode, so that every window
	// holds the eight of them.
	testutil.Eventually(t, "the 8 decoders to decode", time.Minute, func() bool { return allDecoding(t, s, c, 8) })
	var prompts atomic.Int64 // the prompts read
	long := strings.Repeat("word ", 1500)
	users.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			// A unique first word: the prefix cache serves none of it.
			users.Go(func() {
				send(fmt.Sprintf(`{"model":"test/model","messages":[{"role":"user","content":"u%d %s"}],"max_tokens":1}`, i, long))
				prompts.Add(1)
			})
		}
	})
	testutil.Eventually(t, "the prompts to flow", time.Minute, func() bool { return prompts.Load() > 0 })
	// Windows of seconds: each holds some fifteen prompts or more, so one
	// more or less in it (and a loaded machine's late reads) moves its
	// prompt rate by a few per cent at most.
	p := &pace{window: 6 * time.Second}
	var got []*wire.Pace
	for deadline := time.Now().Add(time.Minute); len(got) < 2 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		at, cs := sharpCounters(t, c, deadline)
		if r := p.add(at, cs, 1); r != nil {
			got = append(got, r)
		}
	}
	if len(got) < 2 {
		t.Fatalf("%d pace readings in a minute", len(got))
	}
	for _, r := range got {
		share := r.PromptTPS / prefill
		decode := r.SecondsPerToken * (1 - share)
		t.Logf("batch %.1f: %.1f ms per token, %.0f prompt tok/s (share %.2f): %.1f ms decoding, want %.1f", r.Batch, 1000*r.SecondsPerToken, r.PromptTPS, share, 1000*decode, 1000*decodeStep)
		if r.SecondsPerToken < 1.3*decodeStep {
			t.Errorf("raw pace %.1f ms is not stretched by the prompts (decode step %.1f ms)", 1000*r.SecondsPerToken, 1000*decodeStep)
		}
		if math.Abs(decode/decodeStep-1) > 0.1 {
			t.Errorf("pace less the prompts' share: %.1f ms, want the decode step %.1f ms within 10 %%", 1000*decode, 1000*decodeStep)
		}
	}
}

// The whole path on a real heft-sim, read each second as the agent does:
// 12 requests of 150 tokens arrive together, then nothing until they are
// done and 3 s more. Between its tokens the engine takes its 12-request
// step, while the window's mean running is far lower: weighed at Batch,
// the reading would look far slower than the engine is; at TokenBatch it
// reads the step for the batch its tokens saw. SGLang's flavour checks
// the tokens it counts as they are sent (its generated counter moves only
// when a request finishes).
func TestPaceOfBurstyTrafficOnASim(t *testing.T) {
	const single, batch16 = 100.0, 800.0
	k := (16/batch16 - 1/single) / 15
	step := func(b float64) float64 { return 1/single + (b-1)*k }
	for _, flavor := range []string{sim.FlavorVLLM, sim.FlavorSGLang} {
		t.Run(flavor, func(t *testing.T) {
			t.Parallel()
			s, c, ctx, users := paceSim(t, sim.Config{Flavor: flavor, SingleTPS: single, Batch16TPS: batch16})
			users.Go(func() {
				for ctx.Err() == nil {
					var burst sync.WaitGroup
					for range 12 {
						burst.Go(func() {
							chatUntilDone(ctx, s.URL(), `{"model":"test/model","messages":[{"role":"user","content":"hi"}],"max_tokens":150,"ignore_eos":true}`)
						})
					}
					burst.Wait()
					select {
					case <-ctx.Done():
					case <-time.After(3 * time.Second):
					}
				}
			})
			p := &pace{window: 6 * time.Second}
			var got []*wire.Pace
			for deadline := time.Now().Add(time.Minute); len(got) < 2 && time.Now().Before(deadline); time.Sleep(time.Second) {
				at, cs := sharpCounters(t, c, deadline)
				if r := p.add(at, cs, 1); r != nil && r.WindowSeconds >= 5.5 {
					got = append(got, r)
				}
			}
			if len(got) < 2 {
				t.Fatalf("%d whole-window readings in a minute", len(got))
			}
			worst := 0.0 // how much slower than its step at Batch a reading looked
			for _, r := range got {
				t.Logf("%.1f ms per token; batch %.1f (step %.1f ms), token batch %.1f (step %.1f ms); %.0f tok/s",
					1000*r.SecondsPerToken, r.Batch, 1000*step(r.Batch), r.TokenBatch, 1000*step(r.TokenBatch), r.ThroughputTPS)
				worst = max(worst, r.SecondsPerToken/step(r.Batch)-1)
				if r.TokenBatch < 8 || math.Abs(r.SecondsPerToken/step(r.TokenBatch)-1) > 0.15 {
					t.Errorf("token batch %.1f: %.1f ms per token, want its step %.1f ms within 15 %%", r.TokenBatch, 1000*r.SecondsPerToken, 1000*step(r.TokenBatch))
				}
			}
			if worst < 0.2 {
				t.Errorf("at the windows' mean batch the readings looked at most %.0f %% slow: the traffic was not bursty enough to test", 100*worst)
			}
		})
	}
}

// Speculative decoding: each step gives a request 3 tokens. vLLM's
// inter-token histogram holds one interval per step, so its mean is a
// step's time, three tokens'; SGLang's counts the tokens. The pace is per
// token either way (the generated counter less the requests' first
// tokens), as the probe's reference is: 8 requests decoding read the
// 8-request step per token, not three times it.
func TestPaceOfSpeculativeDecoding(t *testing.T) {
	const single, batch16 = 100.0, 800.0
	k := (16/batch16 - 1/single) / 15
	step8 := 1/single + 7*k // per token: the sim's step of 3 tokens takes 3 of these
	for _, flavor := range []string{sim.FlavorVLLM, sim.FlavorSGLang} {
		t.Run(flavor, func(t *testing.T) {
			t.Parallel()
			s, c, ctx, users := paceSim(t, sim.Config{Flavor: flavor, SingleTPS: single, Batch16TPS: batch16, SpecAccept: 3})
			for range 8 {
				users.Go(func() {
					chatUntilDone(ctx, s.URL(), `{"model":"test/model","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5000,"ignore_eos":true}`)
				})
			}
			testutil.Eventually(t, "all 8 decoding", time.Minute, func() bool { return allDecoding(t, s, c, 8) })
			// The first reading comes half a window on: 3 s, whose tokens
			// and time a loaded machine's late reads blur by a few per cent
			// at most.
			p := &pace{window: 6 * time.Second}
			var got *wire.Pace
			// Samples half a second apart: a loaded machine that stalls the
			// sim for a moment, which then catches up, rarely splits the
			// stall from its catch-up across two (TokenBatch reads each
			// interval's tokens at its own batch).
			for deadline := time.Now().Add(time.Minute); got == nil && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
				at, cs := sharpCounters(t, c, deadline)
				got = p.add(at, cs, 1)
			}
			if got == nil {
				t.Fatal("no pace reading in a minute")
			}
			t.Logf("%.2f ms per token at batch %.2f (token batch %.2f); the step per token at 8 is %.2f ms", 1000*got.SecondsPerToken, got.Batch, got.TokenBatch, 1000*step8)
			if math.Abs(got.SecondsPerToken/step8-1) > 0.1 {
				t.Errorf("%.2f ms per token, want the step per token at 8, %.2f ms, within 10 %%", 1000*got.SecondsPerToken, 1000*step8)
			}
			if math.Abs(got.Batch-8) > 0.8 || math.Abs(got.TokenBatch-8) > 0.8 {
				t.Errorf("batch %.2f, token batch %.2f; want 8 decoding", got.Batch, got.TokenBatch)
			}
		})
	}
}

// paceSim starts a heft-sim of cfg (model test/model) with an engine
// client of its kind; users run under ctx, which the test's cleanup
// cancels before waiting for them.
func paceSim(t *testing.T, cfg sim.Config) (s *sim.Server, c *engine.Client, ctx context.Context, users *sync.WaitGroup) {
	t.Helper()
	cfg.Model = "test/model"
	s, err := sim.Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	kind := map[string]string{sim.FlavorVLLM: "vllm", sim.FlavorSGLang: "sglang"}[cfg.Flavor]
	if c, err = engine.New(engine.Config{Kind: kind, URL: s.URL()}, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	users = &sync.WaitGroup{}
	t.Cleanup(func() { cancel(); users.Wait() })
	return s, c, ctx, users
}

// chatUntilDone sends one chat request to url and reads its answer to the
// end, or until ctx ends.
func chatUntilDone(ctx context.Context, url, body string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// allDecoding reports whether n requests, and no more, run on s, each past
// its first token where c's kind counts first tokens: a pace window that
// starts then holds n decoding throughout.
func allDecoding(t *testing.T, s *sim.Server, c *engine.Client, n int) bool {
	t.Helper()
	if r, w := s.InFlight(); r != n || w != 0 {
		return false
	}
	cs, err := c.Counters(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return !cs.FirstTokensKnown || cs.FirstTokens >= float64(n)
}

// sharpRead bounds how long a counter read for a pace reading may take.
const sharpRead = 100 * time.Millisecond

// sharpCounters reads c's counters for a pace tracker, stamped with the
// middle of the read. The engine answered at some moment within the read,
// which a loaded machine can stretch to a large share of a second: a read
// longer than sharpRead is made again (until deadline), so that a stamp is
// off by at most half of it, and a reading over seconds says the engine's
// rate within a few per cent however busy the machine is.
func sharpCounters(t *testing.T, c *engine.Client, deadline time.Time) (time.Time, engine.Counters) {
	t.Helper()
	for {
		before := time.Now()
		cs, err := c.Counters(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(before)
		if took <= sharpRead {
			return before.Add(took / 2), cs
		}
		if time.Now().After(deadline) {
			t.Fatalf("no counter read within %v by the deadline (the last took %v)", sharpRead, took)
		}
	}
}

// A pace window over a counter and histogram summed over ranks holds one
// engine only while the same ranks make them: a rank missing from one read
// and back at the next adds its tokens and inter-token seconds since it
// started. Before, the window that held it read them as its own (20,000
// tok/s instead of 2,000, at the returning rank's lifetime pace); now the
// window starts over, as at a restart.
func TestPaceCounterRanksChange(t *testing.T) {
	p := &pace{window: 10 * time.Second}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	// Rank 0 makes 1,000 tok/s at 8 ms per token from 0; rank 1 the same,
	// after 100,000 tokens at 16 ms before the window.
	c := func(s int, rank1 bool) engine.Counters {
		g := 1000 * float64(s)
		c := engine.Counters{Generated: g, InterTokenSeconds: 0.008 * g, InterTokens: g, InterTokenKnown: true, Ranks: map[int]float64{0: g}}
		if rank1 {
			c.Generated += 1e5 + g
			c.InterTokenSeconds += 1600 + 0.008*g
			c.InterTokens += 1e5 + g
			c.Ranks[1] = 1e5 + g
		}
		return c
	}
	for s := 0; s <= 30; s++ {
		r := p.add(t0.Add(time.Duration(s)*time.Second), c(s, s != 3), 2)
		if r != nil && (math.Abs(r.ThroughputTPS-2000) > 1e-6 || math.Abs(r.SecondsPerToken-0.008) > 1e-12) {
			t.Errorf("%d s: reading %+v, want 2,000 tok/s at 8 ms per token", s, r)
		}
	}
	if p.latest == nil {
		t.Error("no reading in 26 s of a steady engine")
	}
}
