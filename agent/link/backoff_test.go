package link

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/shared/wire"
)

func TestBackoffGrowsWithinBoundsAndJitters(t *testing.T) {
	const lo, hi = 500 * time.Millisecond, 30 * time.Second
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 12 {
		ceil := min(hi, lo<<(n+1))
		var smallest, largest time.Duration = hi + 1, 0
		seen := map[time.Duration]bool{}
		for range 2000 {
			d := backoff(n, lo, hi, rng.Int64N)
			if d < lo || d > ceil {
				t.Fatalf("attempt %d: %s outside [%s, %s]", n, d, lo, ceil)
			}
			smallest, largest = min(smallest, d), max(largest, d)
			seen[d] = true
		}
		// Full jitter: the draws spread over the whole range, not one value.
		span := ceil - lo
		if largest-smallest < span*9/10 {
			t.Errorf("attempt %d: draws span %s..%s, want most of %s..%s", n, smallest, largest, lo, ceil)
		}
		if len(seen) < 1000 {
			t.Errorf("attempt %d: only %d distinct waits in 2000 draws", n, len(seen))
		}
	}
}

func TestBackoffDeterministicWithSeed(t *testing.T) {
	a, b := rand.New(rand.NewPCG(7, 7)), rand.New(rand.NewPCG(7, 7))
	for n := range 8 {
		if x, y := backoff(n, time.Second, time.Minute, a.Int64N), backoff(n, time.Second, time.Minute, b.Int64N); x != y {
			t.Fatalf("attempt %d: %s vs %s from the same seed", n, x, y)
		}
	}
}

func TestBackoffEdges(t *testing.T) {
	never := func(int64) int64 { t.Fatal("randN called for an empty range"); return 0 }
	if d := backoff(3, time.Second, time.Second, never); d != time.Second {
		t.Errorf("lo == hi: %s", d)
	}
	if d := backoff(0, 2*time.Second, time.Second, never); d != 2*time.Second {
		t.Errorf("hi < lo: %s, want lo", d)
	}
	top := func(n int64) int64 { return n - 1 }
	if d := backoff(1000, time.Millisecond, 30*time.Second, top); d != 30*time.Second {
		t.Errorf("huge attempt: %s, want the cap", d)
	}
	if d := backoff(0, time.Second, time.Hour, top); d != 2*time.Second {
		t.Errorf("first retry ceiling: %s, want 2s", d)
	}
}

func TestOutboxBoundedKeepsAnswers(t *testing.T) {
	l := &link{wake: make(chan struct{}, 1), log: hclog.NewNullLogger(), probing: map[string]bool{}}
	l.send(&wire.ProbeStatus{CapacityKey: "k", State: wire.ProbeRunning}, false)
	for i := range maxOutbox {
		l.send(&wire.ProbeResult{RequestID: fmt.Sprint(i), Measurement: measurement("k")}, true)
	}
	if len(l.outbox) != maxOutbox {
		t.Fatalf("outbox holds %d, want %d", len(l.outbox), maxOutbox)
	}
	for _, m := range l.outbox {
		if !m.durable {
			t.Fatal("the transient note was kept over a result")
		}
	}
	// Full of answers: the oldest answer goes.
	l.send(&wire.ProbeResult{RequestID: "last", Measurement: measurement("k")}, true)
	first := l.outbox[0].payload.(*wire.ProbeResult).RequestID
	last := l.outbox[len(l.outbox)-1].payload.(*wire.ProbeResult).RequestID
	if len(l.outbox) != maxOutbox || first != "1" || last != "last" {
		t.Errorf("outbox %d long, %s..%s; want %d, 1..last", len(l.outbox), first, last, maxOutbox)
	}
	// A transient note finding the box full of answers is the one dropped.
	l.send(&wire.ProbeStatus{CapacityKey: "k", State: wire.ProbeRunning}, false)
	if len(l.outbox) != maxOutbox || !l.outbox[len(l.outbox)-1].durable {
		t.Errorf("a note displaced an answer")
	}

	// A lost connection keeps answers only, and no snapshot.
	l = &link{wake: make(chan struct{}, 1), log: hclog.NewNullLogger()}
	l.send(&wire.ProbeResult{RequestID: "a", Measurement: measurement("k")}, true)
	l.send(&wire.ProbeStatus{CapacityKey: "k", State: wire.ProbeRunning}, false)
	l.send(&wire.ProbeStatus{CapacityKey: "k", State: wire.ProbeFailed}, true)
	l.offer(wire.Snapshot{Node: "n"})
	l.dropTransient()
	if len(l.outbox) != 2 || !l.outbox[0].durable || !l.outbox[1].durable || l.slot != nil {
		t.Errorf("after dropTransient: %+v, slot %v", l.outbox, l.slot)
	}
}
