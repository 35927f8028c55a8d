package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"sync/atomic"
	"testing"
	"time"

	"heft/agent/collect"
	"heft/agent/config"
	"heft/agent/engine"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

// A snapshot of a busy SGLang reads its facts (its load among them) and
// its counters for the passive and pace readings (with the live load
// again): both come from one read of /v1/loads and one of /metrics.
// Before, each was read twice in every snapshot that read the engine in
// full.
func TestSnapshotReadsTheLoadOnce(t *testing.T) {
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorSGLang, Model: "test/model", SingleTPS: 200, Batch16TPS: 1600}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var loads, scrapes atomic.Int64
	proxy := httputil.NewSingleHostReverseProxy(mustURL(t, s.URL()))
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/loads":
			loads.Add(1)
		case "/metrics":
			scrapes.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(counting.Close)
	cfg := config.Default()
	cfg.Node.Name = "gpu-test"
	cfg.Engines = []config.Engine{{Kind: wire.EngineSGLang, URL: counting.URL}}
	col, err := collect.New(collect.Config{Node: cfg.Node.Name, Engines: Engines(cfg)}, oneGPU{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandler(cfg, col, oneGPU{}, nil, nil)
	users(t, s, 2)
	testutil.Eventually(t, "the users' requests to run", 10*time.Second, func() bool { r, _ := s.InFlight(); return r == 2 })

	e := h.Snapshot(t.Context()).Engines[0] // the first: a full read
	if e.Load.Running != 2 {
		t.Fatalf("load %+v; want the users' 2 running", e.Load)
	}
	if l, m := loads.Load(), scrapes.Load(); l != 1 || m != 1 {
		t.Errorf("one snapshot read /v1/loads %d times and /metrics %d times; want once each", l, m)
	}
	h.passiveMu.Lock()
	read := h.paces[e.CapacityKey].prev.gen > 0
	h.passiveMu.Unlock()
	if !read {
		t.Error("the busy engine's counters were not read for its pace")
	}
}

// The passive and pace trackers time a snapshot's counters when the
// engine answered, which within a snapshot may be its facts' read, well
// before the counters are taken; and two snapshots taken together may
// read an engine in one order and come to its counters in the other: an
// answer older than the last the trackers took is read afresh, never
// taken, as counters that went back would read as an engine restarted.
func TestSnapshotCountersNeverGoBack(t *testing.T) {
	var reads atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "vllm:generation_tokens_total %d\n", reads.Add(1))
	}))
	t.Cleanup(srv.Close)
	client, err := engine.New(engine.Config{Kind: wire.EngineVLLM, URL: srv.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	older, newer := engine.ShareReads(t.Context()), engine.ShareReads(t.Context())
	for _, ctx := range []context.Context{older, newer} { // each snapshot's facts
		if _, err := client.Counters(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c, at, err := readCounters(newer, client, time.Time{})
	if err != nil || c.Generated != 2 || !at.Equal(engine.MetricsReadAt(newer, client)) || reads.Load() != 2 {
		t.Fatalf("the newer snapshot's counters: %v at %v (%v), after %d reads; want its facts' answer, 2, at its time", c.Generated, at, err, reads.Load())
	}
	c, next, err := readCounters(older, client, at)
	if err != nil || c.Generated != 3 || !next.After(at) {
		t.Fatalf("the older snapshot's counters after the newer's: %v at %v (%v); want a fresh read, 3, after %v", c.Generated, next, err, at)
	}
}

// A snapshot that reads the engine idle adds an idle point to the
// trackers, timed when it is added; a snapshot taken together with it,
// whose /metrics answer came before that point (the engine busy then),
// must not add that answer after it: the window would then start before
// the idle moment, and time would run backwards in the trackers. The
// older answer is read afresh. Before, the idle point left the trackers'
// last read time where it was, and the older answer was taken.
func TestSnapshotCountersNotBeforeAnIdlePoint(t *testing.T) {
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorVLLM, Model: "test/model", SingleTPS: 200, Batch16TPS: 1600, MaxRunning: 1}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	cfg := config.Default()
	cfg.Node.Name = "gpu-test"
	cfg.Probe.Concurrency = 1 // one running, one waiting: saturated
	cfg.Engines = []config.Engine{{Kind: wire.EngineVLLM, URL: s.URL()}}
	col, err := collect.New(collect.Config{Node: cfg.Node.Name, Engines: Engines(cfg)}, oneGPU{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandler(cfg, col, oneGPU{}, nil, nil)
	key := col.Snapshot(t.Context()).Engines[0].CapacityKey // the collector's alone: no tracker yet
	client, ok := col.Engine(key)
	if key == "" || !ok {
		t.Fatalf("no engine under capacity key %q", key)
	}
	users(t, s, 2)
	testutil.Eventually(t, "one request running, one waiting", 10*time.Second, func() bool {
		r, w := s.InFlight()
		return r == 1 && w == 1
	})

	// Snapshot A reads the busy engine's /metrics for its facts ...
	older := engine.ShareReads(t.Context())
	busy, err := client.Counters(older)
	if err != nil {
		t.Fatal(err)
	}
	answered := engine.MetricsReadAt(older, client)
	// ... snapshot B, with a load that reads idle, comes to the trackers first ...
	idleAt := time.Now()
	h.passiveReadings(engine.ShareReads(t.Context()), &wire.Snapshot{Engines: []wire.Engine{{CapacityKey: key, Load: wire.Load{Known: true}}}})
	// ... then A, with the load its answer read.
	a := &wire.Snapshot{Engines: []wire.Engine{{CapacityKey: key, Load: busy.Load}}}
	h.passiveReadings(older, a)

	h.passiveMu.Lock()
	defer h.passiveMu.Unlock()
	p, pc := h.passive[key], h.paces[key]
	if !answered.Before(idleAt) {
		t.Fatalf("A's answer came at %v, not before the idle point at %v", answered, idleAt)
	}
	if p.start.at.IsZero() || p.start.at.Before(idleAt) || p.last.at.Before(idleAt) {
		t.Errorf("passive window from %v to %v, the idle point at %v: want one that starts after it", p.start.at, p.last.at, idleAt)
	}
	if pc.start.at.IsZero() || pc.start.at.Before(idleAt) || pc.prev.at.Before(idleAt) {
		t.Errorf("pace window from %v (last sample %v), the idle point at %v: want one that starts after it", pc.start.at, pc.prev.at, idleAt)
	}
	if p.readAt.Before(idleAt) {
		t.Errorf("the trackers last read at %v, before the idle point at %v", p.readAt, idleAt)
	}
}

// A snapshot that could not read the engine's counters (a failed /metrics
// read, or the engine unreachable, so no capacity key) leaves a hole in
// the passive window, in which the engine may have stalled or idled. One
// such hole (a read's timeout and the poll) is spanned: a busy engine's
// /metrics fails now and then, and a window that started over at every
// failure never completed on a saturated engine whose /metrics failed once
// per window (b28fca3, found in review: 0 readings against 4 with one read
// in 8 failing). A hole longer than passiveMaxGap starts the window over.
// The pace window, which counts the time between tokens, runs on either way.
func TestPassiveWindowSpansOneUnreadSnapshot(t *testing.T) {
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorVLLM, Model: "test/model", SingleTPS: 200, Batch16TPS: 1600, MaxRunning: 1}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var failing atomic.Bool
	proxy := httputil.NewSingleHostReverseProxy(mustURL(t, s.URL()))
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() && r.URL.Path == "/metrics" {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	cfg := config.Default()
	cfg.Node.Name = "gpu-test"
	cfg.Probe.Concurrency = 1 // one running, one waiting: saturated
	cfg.Engines = []config.Engine{{Kind: wire.EngineVLLM, URL: front.URL}}
	col, err := collect.New(collect.Config{Node: cfg.Node.Name, Engines: Engines(cfg)}, oneGPU{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandler(cfg, col, oneGPU{}, nil, nil)
	key := col.Snapshot(t.Context()).Engines[0].CapacityKey
	if key == "" {
		t.Fatal("no capacity key")
	}
	users(t, s, 2)
	testutil.Eventually(t, "one request running, one waiting", 10*time.Second, func() bool {
		r, w := s.InFlight()
		return r == 1 && w == 1
	})
	busy := func() *wire.Snapshot {
		return &wire.Snapshot{Engines: []wire.Engine{{CapacityKey: key, Load: wire.Load{Known: true, Running: 1, Waiting: 1}}}}
	}
	window := func() (passiveSample, paceSample) {
		h.passiveMu.Lock()
		defer h.passiveMu.Unlock()
		return h.passive[key].start, h.paces[key].start
	}
	setGap := func(d time.Duration) {
		h.passiveMu.Lock()
		defer h.passiveMu.Unlock()
		h.passive[key].maxGap = d
	}
	for _, gap := range []struct {
		name string
		take func()
	}{
		{"a failed read", func() {
			failing.Store(true)
			defer failing.Store(false)
			h.passiveReadings(engine.ShareReads(t.Context()), busy())
		}},
		{"the engine unreachable", func() { h.passiveReadings(engine.ShareReads(t.Context()), passiveSnapshot("")) }},
	} {
		for _, long := range []bool{false, true} {
			h.passiveReadings(engine.ShareReads(t.Context()), busy())
			before, paceBefore := window()
			if before.at.IsZero() || paceBefore.at.IsZero() {
				t.Fatalf("%s: no window on the saturated engine (passive from %v, pace from %v)", gap.name, before.at, paceBefore.at)
			}
			setGap(time.Hour) // the hole is shorter than this
			if long {
				setGap(time.Nanosecond) // and longer than this
			}
			gapAt := time.Now()
			gap.take()
			h.passiveReadings(engine.ShareReads(t.Context()), busy())
			after, paceAfter := window()
			setGap(0)
			switch {
			case long && !after.at.After(gapAt):
				t.Errorf("after %s longer than the passive window's gap: it starts at %v, before the hole (%v)", gap.name, after.at, gapAt)
			case !long && after != before:
				t.Errorf("after %s: the passive window starts at %v, want it to run on from %v", gap.name, after.at, before.at)
			}
			if paceAfter != paceBefore {
				t.Errorf("after %s: the pace window starts at %v, want it to run on from %v", gap.name, paceAfter.at, paceBefore.at)
			}
		}
	}
}
