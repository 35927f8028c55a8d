package engine

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// countingMetrics is a fake vLLM whose /metrics counts its reads, its
// generated-tokens counter the read's number.
func countingMetrics(t *testing.T) (*Client, *atomic.Int64) {
	t.Helper()
	var reads atomic.Int64
	srv := startFake(t, "vllm", map[string]http.HandlerFunc{"/metrics": func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "vllm:generation_tokens_total %d\n", reads.Add(1))
	}})
	c, err := New(Config{Kind: "vllm", URL: srv.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, &reads
}

// Within ShareReads a client's /metrics is read once, and the answer says
// when it came; outside, and under FreshReads, every read asks the engine.
func TestShareReadsReadsOnceAndSaysWhen(t *testing.T) {
	c, reads := countingMetrics(t)
	if at := MetricsReadAt(t.Context(), c); !at.IsZero() {
		t.Errorf("a context that shares nothing says /metrics was read at %v", at)
	}
	ctx := ShareReads(t.Context())
	if at := MetricsReadAt(ctx, c); !at.IsZero() {
		t.Errorf("/metrics not yet read, yet read at %v", at)
	}
	before := time.Now()
	first, err := c.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	at := MetricsReadAt(ctx, c)
	if at.Before(before) || at.After(after) {
		t.Errorf("read at %v, not within the read (%v to %v)", at, before, after)
	}
	second, err := c.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n != 1 || second.Generated != first.Generated {
		t.Errorf("%d reads, counters %v then %v; want one read, shared", n, first.Generated, second.Generated)
	}
	if again := MetricsReadAt(ctx, c); !again.Equal(at) {
		t.Errorf("the shared answer's time moved from %v to %v", at, again)
	}

	fresh, err := c.Counters(FreshReads(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if reads.Load() != 2 || fresh.Generated != 2 {
		t.Errorf("a fresh read gave counter %v after %d reads; want the engine's second answer", fresh.Generated, reads.Load())
	}
	if _, err := c.Counters(t.Context()); err != nil || reads.Load() != 3 {
		t.Errorf("a read outside ShareReads: %v, %d reads; want a read of its own", err, reads.Load())
	}
	// Another snapshot's context shares nothing with this one's.
	other := ShareReads(t.Context())
	if cs, err := c.Counters(other); err != nil || cs.Generated != 4 {
		t.Errorf("another shared context read counter %v (%v); want a read of its own, the 4th", cs.Generated, err)
	}
}

// A reader whose own context ended before the answer came does not leave
// its failure to the next reader, whose time has not run out.
func TestShareReadsDoesNotShareAReadersDeadline(t *testing.T) {
	c, reads := countingMetrics(t)
	ctx := ShareReads(t.Context())
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Counters(ended); err == nil {
		t.Fatal("a read under an ended context succeeded")
	}
	cs, err := c.Counters(ctx)
	if err != nil || cs.Generated != float64(reads.Load()) || reads.Load() != 1 {
		t.Errorf("the next reader: %v, counter %v after %d reads; want the engine's answer", err, cs.Generated, reads.Load())
	}
}
