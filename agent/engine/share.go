package engine

import (
	"context"
	"sync"
	"time"
)

// ShareReads returns ctx under which each client reads its /metrics and
// its live load (SGLang's /v1/loads, /get_load) once: a second read of one
// of them within ctx is the first one's answer. One snapshot reads an
// engine's facts and its counters; both are then one reading of the
// engine, not two a moment apart, and the engine is asked once.
//
// A read whose own ctx ended before the answer came (a caller's deadline,
// not the engine's) is not shared: the next reader asks again. A reader
// that must have an answer of its own, newer than one shared, reads
// under FreshReads(ctx). The answers live as long as ctx: one snapshot's
// are never another's.
func ShareReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, sharedKey{}, &shared{answers: map[sharedRead]*sharedAnswer{}})
}

// FreshReads returns ctx without the reads ShareReads shares: each read
// under it asks the engine.
func FreshReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, sharedKey{}, (*shared)(nil))
}

// MetricsReadAt is when the /metrics answer that c's reads share within
// ctx came: what counters read from it (Counters) stand for, which may be
// well before the call where the engine's facts read it first. Zero where
// ctx shares no reads, or c's /metrics was not read in it.
func MetricsReadAt(ctx context.Context, c *Client) time.Time {
	s := sharedIn(ctx)
	if s == nil {
		return time.Time{}
	}
	s.mu.Lock()
	a := s.answers[sharedRead{c, "/metrics"}]
	s.mu.Unlock()
	if a == nil {
		return time.Time{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.at
}

// sharedPaths are the reads ShareReads shares: those both an engine's
// facts and its counters make.
var sharedPaths = map[string]bool{"/metrics": true, sglangLoadsPath: true, "/get_load": true}

type sharedKey struct{}

type sharedRead struct {
	c    *Client
	path string
}

type sharedAnswer struct {
	mu     sync.Mutex // held while the engine is asked: a second reader waits for the answer
	done   bool
	body   []byte
	status int
	err    error
	at     time.Time // when the answer came
}

type shared struct {
	mu      sync.Mutex
	answers map[sharedRead]*sharedAnswer
}

// sharedIn is ctx's shared reads, or nil.
func sharedIn(ctx context.Context) *shared {
	s, _ := ctx.Value(sharedKey{}).(*shared)
	return s
}

// get reads path from c once within the shared context.
func (s *shared) get(ctx context.Context, c *Client, path, accept string) ([]byte, int, error) {
	s.mu.Lock()
	a := s.answers[sharedRead{c, path}]
	if a == nil {
		a = &sharedAnswer{}
		s.answers[sharedRead{c, path}] = a
	}
	s.mu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.done {
		body, status, err := c.fetch(ctx, path, accept)
		if err != nil && ctx.Err() != nil {
			// This reader's time ran out, which says nothing of the
			// engine: a reader with time left asks again.
			return body, status, err
		}
		a.body, a.status, a.err, a.at, a.done = body, status, err, time.Now(), true
	}
	return a.body, a.status, a.err
}
