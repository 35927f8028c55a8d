package probe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/shared/wire"
)

// busyFor reports the engine busy for its first n reads, then idle.
func busyFor(n int32) (func(context.Context) (wire.Load, error), *atomic.Int32) {
	var reads atomic.Int32
	return func(context.Context) (wire.Load, error) {
		if reads.Add(1) <= n {
			return wire.Load{Known: true, Running: 11}, nil
		}
		return wire.Load{Known: true}, nil
	}, &reads
}

func TestRunBusyModes(t *testing.T) {
	t.Run("wait: the probe runs once the engine is idle, and says how long it waited", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		load, reads := busyFor(3)
		cfg.Load, cfg.Trigger, cfg.busyPoll = load, wire.ReasonOnDemand, 5*time.Millisecond
		m := mustRun(t, cfg)
		// Three busy reads, the idle one, and the settle's reads after it.
		if !m.Valid() || m.BusyWaitSeconds <= 0 || m.LoadBefore.Running != 0 || reads.Load() <= 4 || m.Drained {
			t.Fatalf("valid %v waited %v load %+v reads %d drained %v", m.Valid(), m.BusyWaitSeconds, m.LoadBefore, reads.Load(), m.Drained)
		}
	})
	t.Run("passive-only: a busy engine is never probed", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		load, _ := busyFor(1000)
		cfg.Load, cfg.Trigger, cfg.Busy = load, wire.ReasonRegistration, BusyPassiveOnly
		_, err := Run(t.Context(), cfg)
		if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "passive-only") || f.chats.Load() != 0 {
			t.Fatalf("err = %v, %d requests sent", err, f.chats.Load())
		}
	})
	t.Run("drain: the gateways are asked first, then the probe waits for the requests in flight", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		load, reads := busyFor(2)
		var drained atomic.Int32
		cfg.Load, cfg.Busy, cfg.busyPoll = load, BusyDrain, 5*time.Millisecond
		cfg.Drain = func(context.Context) error {
			if reads.Load() != 1 || f.chats.Load() != 0 {
				t.Errorf("drain asked after %d load reads and %d requests", reads.Load(), f.chats.Load())
			}
			drained.Add(1)
			return nil
		}
		cfg.RequireIdle, cfg.Trigger = true, wire.ReasonScheduled // drain measures scheduled probes too
		m := mustRun(t, cfg)
		if !m.Valid() || !m.Drained || drained.Load() != 1 {
			t.Fatalf("valid %v drained %v (%d calls)", m.Valid(), m.Drained, drained.Load())
		}
	})
	t.Run("drain: an engine read idle still settles, as the drain may not be in effect", func(t *testing.T) {
		// Busy, then idle between two of a gateway's requests: the
		// coordinator kept the worker (its model's only one serving) or
		// the gateway has not synced yet.
		f := newFake(t, nil)
		cfg := quick(f.URL())
		var reads atomic.Int32
		var sentBeforeNext atomic.Int64
		cfg.Load = func(context.Context) (wire.Load, error) {
			switch reads.Add(1) {
			case 1:
				return wire.Load{Known: true, Running: 2}, nil
			case 3:
				sentBeforeNext.Store(f.chats.Load())
				return wire.Load{Known: true, Running: 1}, nil
			}
			return wire.Load{Known: true}, nil
		}
		cfg.Busy, cfg.busyPoll, cfg.settle = BusyDrain, 5*time.Millisecond, 100*time.Millisecond
		cfg.Drain = func(context.Context) error { return nil }
		m := mustRun(t, cfg)
		if !m.Valid() || !m.Drained || reads.Load() <= 3 || sentBeforeNext.Load() != 0 {
			t.Fatalf("valid %v drained %v; %d load reads, %d requests sent before the gateway's next one", m.Valid(), m.Drained, reads.Load(), sentBeforeNext.Load())
		}
	})
	t.Run("idle-only: a busy engine is deferred at once, never drained, whatever probe_busy says", func(t *testing.T) {
		for _, mode := range BusyModes {
			f := newFake(t, nil)
			cfg := quick(f.URL())
			load, reads := busyFor(1)
			cfg.Load, cfg.Busy, cfg.busyPoll, cfg.Trigger, cfg.IdleOnly = load, mode, 5*time.Millisecond, wire.ReasonOnDemand, true
			cfg.Drain = func(context.Context) error {
				t.Errorf("%s: drain asked for an idle-only probe", mode)
				return nil
			}
			_, err := Run(t.Context(), cfg)
			if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "only while idle") || f.chats.Load() != 0 || reads.Load() != 1 {
				t.Fatalf("%s: err = %v, %d requests sent, %d load reads", mode, err, f.chats.Load(), reads.Load())
			}
			// Idle, it is measured as any probe.
			cfg.Load, _ = busyFor(0)
			if m := mustRun(t, cfg); !m.Valid() || m.Drained {
				t.Fatalf("%s, idle: valid %v drained %v", mode, m.Valid(), m.Drained)
			}
		}
	})
	t.Run("drain that fails is noted and the probe still waits", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		load, _ := busyFor(1)
		cfg.Load, cfg.Busy, cfg.busyPoll = load, BusyDrain, 5*time.Millisecond
		cfg.Drain = func(context.Context) error { return errors.New("coordinator link down") }
		m := mustRun(t, cfg)
		if !m.Valid() || m.Drained || !hasProblem(m, "drain not confirmed: coordinator link down") {
			t.Fatalf("valid %v drained %v problems %q", m.Valid(), m.Drained, m.Problems)
		}
	})
	t.Run("an unknown mode is refused", func(t *testing.T) {
		cfg := quick("http://127.0.0.1:1")
		cfg.Busy = "sometimes"
		if _, err := Run(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "wait, drain, passive-only") {
			t.Fatalf("err = %v", err)
		}
	})
}

// idleThenBusy reports the engine idle at the first read, busy for the
// next n, then idle.
func idleThenBusy(n int32) (func(context.Context) (wire.Load, error), *atomic.Int32) {
	var reads atomic.Int32
	return func(context.Context) (wire.Load, error) {
		if r := reads.Add(1); r > 1 && r <= 1+n {
			return wire.Load{Known: true, Running: 3}, nil
		}
		return wire.Load{Known: true}, nil
	}, &reads
}

// An engine idle at one instant may be between a gateway's requests, or
// restarted a moment before the gateway's next: a probe waits for it to
// stay idle, its counter still, for the settle time.
func TestRunIdleSettle(t *testing.T) {
	t.Run("idle at the first read, busy a moment later: each mode treats it as busy", func(t *testing.T) {
		for _, c := range []struct {
			mode, trigger string
			idleOnly      bool
			want          string // "" = measured
		}{
			{BusyWait, wire.ReasonScheduled, false, "scheduled probe deferred"},
			{BusyWait, wire.ReasonOnDemand, true, "only while idle"},
			{BusyPassiveOnly, wire.ReasonRegistration, false, "passive-only"},
			{BusyWait, wire.ReasonOnDemand, false, ""},
			{BusyDrain, wire.ReasonOnDemand, false, ""},
		} {
			f := newFake(t, nil)
			cfg := quick(f.URL())
			load, reads := idleThenBusy(5)
			var drains atomic.Int32
			cfg.Load, cfg.Busy, cfg.busyPoll, cfg.Trigger, cfg.IdleOnly = load, c.mode, 5*time.Millisecond, c.trigger, c.idleOnly
			cfg.RequireIdle = c.trigger == wire.ReasonScheduled
			cfg.Drain = func(context.Context) error { drains.Add(1); return nil }
			m, err := Run(t.Context(), cfg)
			if c.want != "" {
				if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "3 running") || f.chats.Load() != 0 {
					t.Fatalf("%s/%s: err = %v, %d requests sent", c.mode, c.trigger, err, f.chats.Load())
				}
				continue
			}
			if err != nil || !m.Valid() || m.BusyWaitSeconds <= 0 || reads.Load() < 7 {
				t.Fatalf("%s/%s: err %v valid %v waited %v after %d load reads", c.mode, c.trigger, err, m.Valid(), m.BusyWaitSeconds, reads.Load())
			}
			if drained := c.mode == BusyDrain; m.Drained != drained || drains.Load() != map[bool]int32{true: 1}[drained] {
				t.Fatalf("%s: drained %v after %d drain calls", c.mode, m.Drained, drains.Load())
			}
			// The idle read, the settle's busy one, five busy while it
			// waits (drained or not), the idle one, and a settle again.
			if reads.Load() <= 7 {
				t.Fatalf("%s: %d load reads: probed without a settle after the wait", c.mode, reads.Load())
			}
		}
	})
	t.Run("a counter that moves while the engine reports no requests is traffic", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		var counted atomic.Int32
		cfg.Load, _ = busyFor(0)
		cfg.Counters = func(context.Context) (engine.Counters, error) {
			return engine.Counters{Generated: float64(100 * counted.Add(1))}, nil
		}
		cfg.RequireIdle, cfg.Trigger = true, wire.ReasonScheduled
		_, err := Run(t.Context(), cfg)
		if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "generated 100 tokens") || !strings.Contains(err.Error(), "reported no requests") || f.chats.Load() != 0 {
			t.Fatalf("err = %v, %d requests sent", err, f.chats.Load())
		}
	})
	t.Run("an engine that stays idle is probed once the settle time has passed", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		cfg.Load, _ = busyFor(0)
		cfg.settle = 300 * time.Millisecond
		var firstChat time.Time // Progress is called from one goroutine at a time
		start := time.Now()
		cfg.Progress = func(p Progress) {
			if p.Phase == PhaseWarmup && firstChat.IsZero() {
				firstChat = time.Now()
			}
		}
		m := mustRun(t, cfg)
		if !m.Valid() || m.BusyWaitSeconds != 0 || firstChat.Sub(start) < cfg.settle {
			t.Fatalf("valid %v waited %v; warm-up began %v after the start", m.Valid(), m.BusyWaitSeconds, firstChat.Sub(start))
		}
	})
}

// A burst that saw other traffic (the engine's own counter grew by more
// than the burst received) measured a share: it is never a measurement.
func TestRunSharedBurstDiscarded(t *testing.T) {
	// The engine's counter before the warm-up, after it (its 32 tokens,
	// and warmExtra of someone else's), and after the measured burst.
	counter := func(warmExtra, extra float64) (func(context.Context) (engine.Counters, error), *atomic.Int32) {
		var reads atomic.Int32
		return func(context.Context) (engine.Counters, error) {
			switch reads.Add(1) {
			case 1:
				return engine.Counters{Generated: 1000}, nil
			case 2:
				return engine.Counters{Generated: 1000 + 4*8 + warmExtra}, nil
			}
			return engine.Counters{Generated: 1000 + 2*4*8 + warmExtra + extra}, nil
		}, &reads
	}
	t.Run("other traffic: discarded", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		var reads *atomic.Int32
		cfg.Counters, reads = counter(0, 900)
		m, err := Run(t.Context(), cfg)
		if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "generated 932 tokens during the measured burst, which received 32") {
			t.Fatalf("err = %v (valid %v, %.1f tok/s)", err, m.Valid(), m.ThroughputTPS)
		}
		if reads.Load() != 3 || m.ThroughputTPS != 0 {
			t.Errorf("%d counter reads, throughput %v", reads.Load(), m.ThroughputTPS)
		}
	})
	t.Run("other traffic in the warm-up: the measured burst is not sent", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		var reads *atomic.Int32
		cfg.Counters, reads = counter(900, 0)
		m, err := Run(t.Context(), cfg)
		if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "generated 932 tokens during the warm-up, which received 32") {
			t.Fatalf("err = %v (valid %v, %.1f tok/s)", err, m.Valid(), m.ThroughputTPS)
		}
		if reads.Load() != 2 || f.chats.Load() != 4 {
			t.Errorf("%d counter reads, %d requests; want 2 and the warm-up's 4", reads.Load(), f.chats.Load())
		}
	})
	t.Run("only the burst: measured, with the engine's count", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		cfg.Counters, _ = counter(0, 3) // within the slack for a late-recorded warm-up step
		m := mustRun(t, cfg)
		if !m.Valid() || m.EngineGeneratedTokens != 35 {
			t.Fatalf("valid %v engine tokens %d problems %q", m.Valid(), m.EngineGeneratedTokens, m.Problems)
		}
	})
	t.Run("counter unreadable: measured, with a note", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		cfg.Counters = func(context.Context) (engine.Counters, error) { return engine.Counters{}, errors.New("no /metrics") }
		m := mustRun(t, cfg)
		if !m.Valid() || !hasProblem(m, "other traffic during the burst not checked: no /metrics") {
			t.Fatalf("valid %v problems %q", m.Valid(), m.Problems)
		}
	})
}

// An engine serving users whose load the agent cannot read through its
// real client: /metrics past the client's timeout (a busy event loop),
// answering 500, or with load series none of whose samples can be used
// (a rank label that is no number). Told passive-only and idle_only, the
// scheduled probe sends nothing: none of these is proof of idle. Before,
// each was probed, and the result stored as valid.
func TestUnreadableLoadIsNotIdle(t *testing.T) {
	for _, tc := range []struct{ name, why string }{
		{"slow", "no answer within"},
		{"500", "answered 500"},
		{"unusable", "no sample of them can be used"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeEngine{}
			mux := http.NewServeMux()
			mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
				switch tc.name {
				case "500":
					http.Error(w, "Internal Server Error", http.StatusInternalServerError)
					return
				case "slow":
					select {
					case <-time.After(2 * time.Second):
					case <-r.Context().Done():
						return
					}
				}
				fmt.Fprint(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"core-0\"} 12\n"+
					"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"core-0\"} 7\n")
			})
			mux.Handle("/", f.handler())
			srv := httptest.NewServer(mux)
			defer srv.Close()
			c, err := engine.New(engine.Config{Kind: wire.EngineVLLM, URL: srv.URL, Timeout: 200 * time.Millisecond}, nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg := quick(srv.URL)
			cfg.Load, cfg.Stir = c.Load, c.Stir
			cfg.Busy, cfg.RequireIdle, cfg.IdleOnly, cfg.Trigger = BusyPassiveOnly, true, true, wire.ReasonScheduled
			_, err = Run(t.Context(), cfg)
			if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), tc.why) || f.chats.Load() != 0 {
				t.Fatalf("Run: %v, %d chat requests; want deferred (%q), none sent", err, f.chats.Load(), tc.why)
			}
		})
	}
}
