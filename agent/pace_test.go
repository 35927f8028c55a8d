package agent

import (
	"math"
	"testing"
	"time"

	"heft/agent/engine"
)

// A pace reading is the mean inter-token time over a window and the batch
// Little's law gives; too few tokens, a missing histogram or a counter
// that went back give none.
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
	// Ten tokens in the next window: too few to say, the last reading stays.
	if r := p.add(at(20), c(10010, 80.1, 10010), 2); r != nil || p.latest == nil || p.latest.ThroughputTPS != 1000 {
		t.Fatalf("a quiet window gave %+v, latest %+v", r, p.latest)
	}
	// A restart: counters back to zero start over.
	p.add(at(25), c(100000, 800, 100000), 2)
	if r := p.add(at(40), c(10, 0.1, 10), 2); r != nil {
		t.Fatalf("counters that went back gave %+v", r)
	}
	// No histogram (llama.cpp, an old engine): nothing.
	if r := p.add(at(60), engine.Counters{Generated: 1e6}, 1); r != nil || !p.start.at.IsZero() {
		t.Fatalf("no histogram gave %+v", r)
	}
}
