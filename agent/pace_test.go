package agent

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/shared/wire"
)

// A pace reading is the mean inter-token time over a window and the batch
// Little's law gives, one every half window over the whole window before
// it; too few tokens, a missing histogram or a counter that went back give
// none.
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
	if r := p.add(at(5), c(5000, 40, 5000), 2); r != nil {
		t.Fatalf("half a window gave %+v", r)
	}
	// 10,000 tokens in 10 s at 8 ms each: 8 decoding, 4 per rank.
	r := p.add(at(10), c(10000, 80, 10000), 2)
	if r == nil || math.Abs(r.SecondsPerToken-0.008) > 1e-12 || math.Abs(r.Batch-4) > 1e-9 || r.ThroughputTPS != 1000 || r.WindowSeconds != 10 {
		t.Fatalf("reading %+v, want 8 ms per token, batch 4 per rank, 1000 tok/s", r)
	}
	// Half a window later, the next reading covers 5–15 s: the engine
	// slowed to 16 ms per token at 10 s, so it reads the mean of both.
	r = p.add(at(15), c(12500, 120, 12500), 2)
	if r == nil || r.WindowSeconds != 10 || r.ThroughputTPS != 750 || math.Abs(r.SecondsPerToken-80.0/7500) > 1e-12 {
		t.Fatalf("the overlapping reading %+v, want 5–15 s: 750 tok/s, %.2f ms per token", r, 1000*80.0/7500)
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
	// A restart: counters back to zero start over.
	p.add(at(25), c(100000, 800, 100000), 2)
	if r := p.add(at(40), c(10, 0.1, 10), 2); r != nil {
		t.Fatalf("counters that went back gave %+v", r)
	}
	// No histogram and no decode seconds (an old engine): nothing.
	if r := p.add(at(60), engine.Counters{Generated: 1e6}, 1); r != nil || !p.start.at.IsZero() {
		t.Fatalf("no histogram gave %+v", r)
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
