package backoff

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"heft/shared/testutil"
)

func TestDoublesToMaxWithoutJitter(t *testing.T) {
	b := &Backoff{Min: time.Second, Max: 30 * time.Second}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
	for i, w := range want {
		if got := b.Next(); got != w*time.Second {
			t.Fatalf("wait %d = %s, want %s", i, got, w*time.Second)
		}
	}
	if b.Attempts() != len(want) {
		t.Errorf("Attempts = %d, want %d", b.Attempts(), len(want))
	}
	b.Reset()
	if got := b.Next(); got != time.Second {
		t.Errorf("after Reset: %s, want Min", got)
	}
}

func TestJitterGrowsWithinBoundsAndSpreads(t *testing.T) {
	const lo, hi = 500 * time.Millisecond, 30 * time.Second
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 12 {
		ceil := min(hi, lo<<(n+1))
		var smallest, largest time.Duration = hi + 1, 0
		seen := map[time.Duration]bool{}
		for range 2000 {
			b := &Backoff{Min: lo, Max: hi, Jitter: true, RandN: rng.Int64N}
			for range n {
				b.Next()
			}
			d := b.Next()
			if d < lo || d > ceil {
				t.Fatalf("attempt %d: %s outside [%s, %s]", n, d, lo, ceil)
			}
			smallest, largest = min(smallest, d), max(largest, d)
			seen[d] = true
		}
		// Full jitter: the draws spread over the whole range, not one value.
		if largest-smallest < (ceil-lo)*9/10 {
			t.Errorf("attempt %d: draws span %s..%s, want most of %s..%s", n, smallest, largest, lo, ceil)
		}
		if len(seen) < 1000 {
			t.Errorf("attempt %d: only %d distinct waits in 2000 draws", n, len(seen))
		}
	}
}

func TestHalfJitterStaysInTheUpperHalf(t *testing.T) {
	const lo, hi = 500 * time.Millisecond, 30 * time.Second
	rng := rand.New(rand.NewPCG(3, 4))
	for n := range 10 {
		plain := min(hi, lo<<n)
		var smallest, largest time.Duration = hi + 1, 0
		for range 2000 {
			b := &Backoff{Min: lo, Max: hi, HalfJitter: true, RandN: rng.Int64N}
			for range n {
				b.Next()
			}
			d := b.Next()
			if d < plain/2 || d > plain {
				t.Fatalf("attempt %d: %s outside [%s, %s]", n, d, plain/2, plain)
			}
			smallest, largest = min(smallest, d), max(largest, d)
		}
		if largest-smallest < plain/2*9/10 {
			t.Errorf("attempt %d: draws span %s..%s, want most of %s..%s", n, smallest, largest, plain/2, plain)
		}
	}
	// Jitter wins over HalfJitter: the full range down to Min is drawn.
	b := &Backoff{Min: lo, Max: hi, Jitter: true, HalfJitter: true, RandN: func(int64) int64 { return 0 }}
	for range 5 {
		b.Next()
	}
	if d := b.Next(); d != lo {
		t.Errorf("Jitter and HalfJitter: %s, want Min %s", d, lo)
	}
}

func TestJitterDeterministicWithSeed(t *testing.T) {
	a := &Backoff{Min: time.Second, Max: time.Minute, Jitter: true, RandN: rand.New(rand.NewPCG(7, 7)).Int64N}
	b := &Backoff{Min: time.Second, Max: time.Minute, Jitter: true, RandN: rand.New(rand.NewPCG(7, 7)).Int64N}
	for n := range 8 {
		if x, y := a.Next(), b.Next(); x != y {
			t.Fatalf("attempt %d: %s vs %s from the same seed", n, x, y)
		}
	}
}

func TestEdges(t *testing.T) {
	never := func(int64) int64 { t.Fatal("RandN called for an empty range"); return 0 }
	if d := (&Backoff{Min: time.Second, Max: time.Second, Jitter: true, RandN: never}).Next(); d != time.Second {
		t.Errorf("Min == Max: %s", d)
	}
	if d := (&Backoff{Min: 2 * time.Second, Max: time.Second, Jitter: true, RandN: never}).Next(); d != 2*time.Second {
		t.Errorf("Max < Min: %s, want Min", d)
	}
	if d := (&Backoff{Min: 2 * time.Second, Max: time.Second}).Next(); d != 2*time.Second {
		t.Errorf("Max < Min without jitter: %s, want Min", d)
	}
	top := func(n int64) int64 { return n - 1 }
	b := &Backoff{Min: time.Millisecond, Max: 30 * time.Second, Jitter: true, RandN: top}
	for range 1000 {
		b.Next()
	}
	if d := b.Next(); d != 30*time.Second {
		t.Errorf("huge attempt: %s, want the cap", d)
	}
	if d := (&Backoff{Min: time.Second, Max: time.Hour, Jitter: true, RandN: top}).Next(); d != 2*time.Second {
		t.Errorf("first retry ceiling: %s, want 2s", d)
	}
}

// fakeClock fires a wait when the test advances past it.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	waits []fakeWait
}

type fakeWait struct {
	at time.Time
	c  chan time.Time
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) After(d time.Duration) (<-chan time.Time, func() bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := make(chan time.Time, 1)
	f.waits = append(f.waits, fakeWait{at: f.now.Add(d), c: c})
	return c, func() bool { return true }
}

func (f *fakeClock) pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waits)
}

func (f *fakeClock) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	kept := f.waits[:0]
	for _, w := range f.waits {
		if w.at.After(f.now) {
			kept = append(kept, w)
			continue
		}
		w.c <- f.now
	}
	f.waits = kept
}

func TestSleepUsesTheInjectedClock(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	b := &Backoff{Min: time.Minute, Max: time.Hour, Clock: clock}
	done := make(chan bool)
	go func() { done <- b.Wait(context.Background()) }()
	testutil.Eventually(t, "the wait to start", 10*time.Second, func() bool { return clock.pending() > 0 })
	clock.advance(59 * time.Second)
	select {
	case <-done:
		t.Fatal("woke before the wait passed")
	default:
	}
	clock.advance(time.Second)
	if !<-done {
		t.Error("Wait = false, want the whole wait passed")
	}
	if !b.Now().Equal(time.Unix(1060, 0)) {
		t.Errorf("Now = %v, want the clock's", b.Now())
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		b := &Backoff{Min: time.Hour, Max: time.Hour}
		done := make(chan bool)
		start := time.Now()
		go func() { done <- b.Wait(ctx) }()
		time.Sleep(time.Minute) // fake time in the bubble: the wait is under way, a minute into its hour
		cancel()
		if <-done {
			t.Error("Wait = true after cancel")
		}
		if waited := time.Since(start); waited != time.Minute {
			t.Errorf("waited %s in the bubble, want 1m", waited)
		}
		if b.Sleep(ctx, 0) {
			t.Error("Sleep(0) on an ended context = true")
		}
	})
}

func TestWaitInSynctestBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &Backoff{Min: 50 * time.Millisecond, Max: time.Second}
		start := time.Now()
		for range 6 {
			if !b.Wait(t.Context()) {
				t.Fatal("Wait = false")
			}
		}
		// 50+100+200+400+800+1000 ms, exactly: the bubble's clock only moves
		// when every goroutine in it waits.
		if got := time.Since(start); got != 2550*time.Millisecond {
			t.Errorf("six waits took %s, want 2.55s", got)
		}
	})
}
