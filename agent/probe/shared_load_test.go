package probe

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
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

// SGLang started without --enable-metrics (its default) serves no
// /metrics, so no token counter, but its live load at /v1/loads: users
// who arrive with the measured burst show there as more requests than the
// burst has, and the burst is stopped. Before, it was not watched at all
// and came back valid, a share of the engine, with a note. Without users
// the same probe measures, and says how it was checked.
func TestSharedBurstSeenByLoadWithoutCounters(t *testing.T) {
	t.Parallel()
	s := startSim(t, sim.Config{Flavor: sim.FlavorSGLang, SingleTPS: 100, Batch16TPS: 1000, MaxRunning: 64})
	target, err := url.Parse(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.FlushInterval = -1
	noMetrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			http.NotFound(w, r)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(noMetrics.Close)
	client, err := engine.New(engine.Config{Kind: wire.EngineSGLang, URL: noMetrics.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var users sync.WaitGroup
	stopUsers := func() { cancel(); users.Wait() }
	t.Cleanup(stopUsers)
	var once sync.Once
	cfg := Config{URL: noMetrics.URL, Kind: wire.EngineSGLang, Tokens: 256, CapacityKey: "k", Trigger: wire.ReasonOnDemand,
		Load: client.Load, Counters: client.Counters, ReadyTimeout: 10 * time.Second, BurstTimeout: 30 * time.Second, settle: 50 * time.Millisecond,
		watchPoll: 200 * time.Millisecond,
		Progress: func(p Progress) {
			if p.Phase == PhaseMeasure {
				once.Do(func() { streamUsers(ctx, &users, s.URL(), 11) }) // users arrive as the measured burst starts
			}
		}}
	m, err := Run(t.Context(), cfg)
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "(its token counters cannot be read): other traffic arrived; the measured burst was stopped") {
		t.Fatalf("err = %v; valid %v, %.0f tok/s, problems %q", err, m.Valid(), m.ThroughputTPS, m.Problems)
	}
	if m.Valid() || m.ThroughputTPS != 0 {
		t.Fatalf("a shared burst came back as %.0f tok/s", m.ThroughputTPS)
	}

	stopUsers()
	testutil.Eventually(t, "the users to leave", 10*time.Second, func() bool { r, w := s.InFlight(); return r+w == 0 })
	cfg.Progress = nil
	m = mustRun(t, cfg)
	if !m.Valid() || !hasProblem(m, "other traffic during the burst checked by the engine's load alone") {
		t.Fatalf("quiet engine: valid %v, problems %q", m.Valid(), m.Problems)
	}
}

// Without counters, the load alone stops a burst only on more requests
// than the burst has: a load written late that still shows all of the
// burst's requests when one has ended stops nothing; one request more
// than the burst's does. Where the load is not served either, the burst is measured with
// the note that it was not checked.
func TestLoadAloneWatchesTheWholeBurst(t *testing.T) {
	t.Parallel()
	noCounters := func(context.Context) (engine.Counters, error) { return engine.Counters{}, errors.New("no /metrics") }
	run := func(duringBurst int) (wire.Measurement, error) {
		// The first request ends at once; the others run until the watch
		// has read the load after the probe saw the first end, so the load
		// is read with the burst's requests fewer than it shows.
		watched := make(chan struct{})
		var once sync.Once
		var oneDone atomic.Bool
		f := newFake(t, func(f *fakeEngine) {
			f.stream = func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				if n > 1 {
					select {
					case <-watched:
					case <-r.Context().Done():
						return
					}
				}
				writeStream(w, intField(req, "max_tokens"), -1)
			}
		})
		cfg := quick(f.URL())
		cfg.watchPoll, cfg.Counters = 10*time.Millisecond, noCounters
		cfg.Progress = func(p Progress) {
			if p.Phase == PhaseWarmup && p.Done >= 1 {
				oneDone.Store(true)
			}
		}
		cfg.Load = func(context.Context) (wire.Load, error) {
			if f.chats.Load() == 0 {
				return wire.Load{Known: true}, nil // idle before the probe
			}
			if oneDone.Load() {
				defer once.Do(func() { close(watched) })
			}
			return wire.Load{Known: true, Running: duringBurst}, nil
		}
		return Run(t.Context(), cfg)
	}
	m, err := run(4) // the burst's 4, as a late load keeps showing them
	if err != nil || !m.Valid() || !hasProblem(m, "checked by the engine's load alone") {
		t.Fatalf("a load that shows the burst's own requests: err %v, valid %v, problems %q", err, m.Valid(), m.Problems)
	}
	if _, err := run(5); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "the engine had 5 running, 0 waiting during the warm-up of 4 requests") {
		t.Fatalf("one request more than the burst's: %v; want the warm-up stopped", err)
	}

	f := newFake(t, nil)
	cfg := quick(f.URL())
	cfg.Counters = noCounters
	cfg.Load = func(context.Context) (wire.Load, error) { return wire.Load{}, nil } // served by no endpoint
	if m := mustRun(t, cfg); !m.Valid() || !hasProblem(m, "other traffic during the burst not checked: no /metrics") {
		t.Fatalf("neither counters nor load: valid %v, problems %q", m.Valid(), m.Problems)
	}
}
