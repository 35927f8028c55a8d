// Package backoff spaces out the retries of a loop that reconnects or
// polls: the agent's link to the coordinator, its engine-log followers and
// the probe's readiness wait (and heft-sync's reconnects). Waits double
// from Min up to Max; with Jitter each wait is drawn at random below its
// ceiling, so a fleet that lost its coordinator together does not return
// in step.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Clock is the time a Backoff waits by. Real is package time's; tests
// inject their own, or run under testing/synctest, whose bubble fakes
// package time.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed, and a
	// function that stops the wait early.
	After(d time.Duration) (<-chan time.Time, func() bool)
}

// Real is the Clock of package time.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) After(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// Backoff counts failed attempts and says how long to wait before the
// next. The zero value is not usable: set Min and Max. It is not safe for
// concurrent use; each loop owns one.
type Backoff struct {
	Min, Max time.Duration
	// Jitter draws attempt n's wait uniformly from [Min, min(Max,
	// Min·2^(n+1))]; without it the wait is min(Max, Min·2^n) exactly.
	Jitter bool
	// HalfJitter draws attempt n's wait uniformly from the upper half of
	// the plain wait w = min(Max, Min·2^n), [w/2, w]: spread out, yet never
	// less than half of what the doubling asks (heft-sync's reconnects).
	// Jitter wins when both are set.
	HalfJitter bool
	// Clock defaults to Real.
	Clock Clock
	// RandN(k) returns a number in [0, k); math/rand/v2's Int64N when nil.
	RandN func(int64) int64

	n int // attempts since the last Reset
}

// Next returns the wait before the next attempt and counts the attempt.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, max(b.Max, b.Min)
	n := b.n
	b.n++
	if b.Jitter {
		n++
	}
	ceil := lo
	for i := 0; i < n && ceil < hi; i++ {
		ceil *= 2
	}
	ceil = min(ceil, hi)
	switch {
	case b.Jitter && ceil > lo:
		return lo + time.Duration(b.randN(int64(ceil-lo)+1))
	case b.HalfJitter && !b.Jitter && ceil > 1:
		return ceil/2 + time.Duration(b.randN(int64(ceil/2)+1))
	default:
		return ceil
	}
}

func (b *Backoff) randN(k int64) int64 {
	if b.RandN == nil {
		return rand.Int64N(k)
	}
	return b.RandN(k)
}

// Reset starts the waits again from Min, after an attempt that worked.
func (b *Backoff) Reset() { b.n = 0 }

// Attempts returns how many waits Next has handed out since the last Reset.
func (b *Backoff) Attempts() int { return b.n }

// Now returns the Clock's time.
func (b *Backoff) Now() time.Time { return b.clock().Now() }

// Sleep waits d on the Clock, or until ctx ends, and reports whether the
// whole wait passed.
func (b *Backoff) Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	c, stop := b.clock().After(d)
	defer stop()
	select {
	case <-ctx.Done():
		return false
	case <-c:
		return true
	}
}

// Wait sleeps for Next(), or until ctx ends, and reports whether the
// whole wait passed.
func (b *Backoff) Wait(ctx context.Context) bool { return b.Sleep(ctx, b.Next()) }

func (b *Backoff) clock() Clock {
	if b.Clock == nil {
		return Real
	}
	return b.Clock
}
