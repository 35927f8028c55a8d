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
