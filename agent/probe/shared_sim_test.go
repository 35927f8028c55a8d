package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
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

// The 902 tok/s case: an admin's "measure again" on an engine that an
// idle check saw empty, and that a gateway fills while the burst runs.
// The engine's own counters (read as the agent reads them) show tokens
// beyond the burst's: the probe stops the burst as soon as it reads them,
// and no throughput comes back. Without other traffic the same probe
// measures, and the counters agree with the burst. On SGLang, whose
// generated counter moves only when a request finishes, the users' long
// requests show only in the tokens its tokenizer has sent.
func TestSimSharedBurstDiscarded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind   string
		accept int // speculative decoding: tokens per step, streamed as one chunk
	}{{wire.EngineVLLM, 0}, {wire.EngineSGLang, 0}, {wire.EngineVLLM, 3}, {wire.EngineSGLang, 3}} {
		t.Run(fmt.Sprintf("%s/spec-accept=%d", tc.kind, tc.accept), func(t *testing.T) {
			t.Parallel()
			sharedBurstDiscarded(t, tc.kind, tc.accept)
		})
	}
}

func sharedBurstDiscarded(t *testing.T, kind string, accept int) {
	const tokens = 256 // each request's, but for the watched burst
	for _, watched := range []bool{true, false} {
		s, client, counters, traffic, stopUsers := sharedSim(t, kind, accept)
		var once sync.Once
		var received atomic.Int64
		var arrived atomic.Int64 // when the users arrived (UnixNano)
		cfg := Config{URL: s.URL(), Kind: kind, Tokens: tokens, CapacityKey: "k", Trigger: wire.ReasonOnDemand,
			// A deadline, not a speed: the watched burst's warm-up runs whole
			// (about 16 s, longer on a starved machine).
			Load: client.Load, Counters: counters, ReadyTimeout: 10 * time.Second, BurstTimeout: 2 * time.Minute,
			settle: 50 * time.Millisecond,
			Progress: func(p Progress) {
				if p.Phase == PhaseMeasure {
					once.Do(func() { arrived.Store(time.Now().UnixNano()); traffic() }) // users arrive as the measured burst starts
					received.Store(int64(p.Tokens))
				}
			}}
		// Watched every 200 ms, the burst stops long before its half, even
		// on a starved machine. How soon is a matter of time, not tokens:
		// under test-under-load one watch's reads of the engine's counter
		// and load took about 4 s, and a burst of 256 tokens (about 4 s on
		// this sim, which keeps its pace) was past its half by then. The
		// watched burst is four times as long, 1024 tokens (about 16 s),
		// so that its half is well beyond those seconds.
		want := "stopped at once"
		if watched {
			cfg.Tokens = 4 * tokens
		}
		expected := int64(DefaultConcurrency * cfg.Tokens)
		cfg.watchPoll = 200 * time.Millisecond
		if !watched {
			// Unwatched (a counter read each hour), the check after the
			// burst is the backstop.
			cfg.watchPoll, want = time.Hour, "other traffic shared the engine"
		}
		m, err := Run(t.Context(), cfg)
		if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), want) {
			t.Fatalf("watched %v: err = %v; valid %v, %.0f tok/s, engine counted %d for %d", watched, err, m.Valid(), m.ThroughputTPS, m.EngineGeneratedTokens, m.OutputTokens)
		}
		if m.Valid() || m.ThroughputTPS != 0 {
			t.Fatalf("watched %v: a shared burst came back as %.0f tok/s", watched, m.ThroughputTPS)
		}
		if got := received.Load(); watched && got >= expected/2 {
			t.Errorf("the burst went on to %d of its %d tokens after the users arrived (stopped %v after they did): %v",
				got, expected, time.Since(time.Unix(0, arrived.Load())).Round(time.Millisecond), err)
		}

		stopUsers()
		testutil.Eventually(t, "the users to leave", 10*time.Second, func() bool { r, w := s.InFlight(); return r+w == 0 })
		cfg.Progress, cfg.Tokens = nil, tokens
		m = mustRun(t, cfg)
		if !m.Valid() || m.EngineGeneratedTokens < int64(m.OutputTokens) || m.EngineGeneratedTokens > int64(m.OutputTokens)+32 {
			t.Fatalf("watched %v, quiet engine: valid %v, engine counted %d for a burst of %d; problems %q", watched, m.Valid(), m.EngineGeneratedTokens, m.OutputTokens, m.Problems)
		}
	}
}

// Users who arrive with the warm-up would share the measured burst too:
// the probe stops after the warm-up, and the measured burst is never
// sent onto them.
func TestSimSharedWarmupStopsEarly(t *testing.T) {
	t.Parallel()
	s, client, counters, traffic, _ := sharedSim(t, wire.EngineVLLM, 0)
	var once sync.Once
	var measured atomic.Bool
	cfg := Config{URL: s.URL(), Kind: wire.EngineVLLM, Tokens: 64, CapacityKey: "k", Trigger: wire.ReasonRegistration,
		Load: client.Load, Counters: counters, ReadyTimeout: 10 * time.Second, BurstTimeout: 30 * time.Second,
		Progress: func(p Progress) {
			switch p.Phase {
			case PhaseWarmup:
				once.Do(traffic) // users arrive as the warm-up starts
			case PhaseMeasure:
				measured.Store(true)
			}
		}}
	m, err := Run(t.Context(), cfg)
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "during the warm-up") || !strings.Contains(err.Error(), "measured burst was not sent") {
		t.Fatalf("err = %v; valid %v", err, m.Valid())
	}
	if measured.Load() {
		t.Error("the measured burst was sent onto the users")
	}
}

// sharedSim is a heft-sim of the engine kind (vLLM or SGLang; accept as
// sim.Config.SpecAccept) with room for users beside a burst (as vLLM's
// default of 256), its engine client, the agent's counter reader, traffic
// that sends it 11 long-running users, and stopUsers, which ends them (the
// test's cleanup does too).
func sharedSim(t *testing.T, kind string, accept int) (s *sim.Server, client *engine.Client, counters func(context.Context) (engine.Counters, error), traffic, stopUsers func()) {
	flavor := map[string]string{wire.EngineVLLM: sim.FlavorVLLM, wire.EngineSGLang: sim.FlavorSGLang}[kind]
	s = startSim(t, sim.Config{Flavor: flavor, SingleTPS: 100, Batch16TPS: 1000, MaxRunning: 64, SpecAccept: accept})
	client, err := engine.New(engine.Config{Kind: kind, URL: s.URL()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	counters = client.Counters
	ctx, cancel := context.WithCancel(t.Context())
	var users sync.WaitGroup
	stopUsers = func() { cancel(); users.Wait() }
	t.Cleanup(stopUsers)
	traffic = func() { streamUsers(ctx, &users, s.URL(), 11) }
	return s, client, counters, traffic, stopUsers
}

// streamUsers starts n users, each streaming one long request to the
// engine at url until ctx ends.
func streamUsers(ctx context.Context, users *sync.WaitGroup, url string, n int) {
	body := []byte(`{"model":"` + sim.DefaultModel + `","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5000,"ignore_eos":true}`)
	for range n {
		users.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body) // until ctx ends
				resp.Body.Close()
			}
		})
	}
}
