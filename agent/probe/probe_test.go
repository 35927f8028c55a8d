package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/shared/testutil"
	"heft/shared/wire"
)

// quick is a small burst so each fake test takes milliseconds.
func quick(url string) Config {
	return Config{URL: url, Kind: wire.EngineVLLM, Concurrency: 4, Tokens: 8, CapacityKey: "node/vllm/fake",
		ReadyTimeout: 5 * time.Second, BurstTimeout: 10 * time.Second, settle: 30 * time.Millisecond}
}

func mustRun(t *testing.T, cfg Config) wire.Measurement {
	t.Helper()
	m, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("measurement does not pass wire validation: %v", err)
	}
	if m.FinishedAt.Before(m.StartedAt) || m.StartedAt.IsZero() {
		t.Errorf("times %v..%v", m.StartedAt, m.FinishedAt)
	}
	return m
}

func hasProblem(m wire.Measurement, substr string) bool {
	return slices.ContainsFunc(m.Problems, func(p string) bool { return strings.Contains(p, substr) })
}

func TestRunHealthyEngine(t *testing.T) {
	f := newFake(t, nil)
	m := mustRun(t, quick(f.URL()))
	if !m.Valid() || !m.Complete || m.Failure != "" {
		t.Fatalf("want a valid complete measurement, got failure %q problems %q", m.Failure, m.Problems)
	}
	if m.OutputTokens != 32 || m.ExpectedTokens != 32 || m.Requests != 4 || m.Concurrency != 4 || m.TokensPerReq != 8 {
		t.Errorf("counts: tokens %d/%d requests %d concurrency %d per-req %d", m.OutputTokens, m.ExpectedTokens, m.Requests, m.Concurrency, m.TokensPerReq)
	}
	if m.ThroughputTPS <= 0 || m.WarmupTPS <= 0 || m.WallSeconds <= 0 {
		t.Errorf("throughput %v warm-up %v wall %v", m.ThroughputTPS, m.WarmupTPS, m.WallSeconds)
	}
	if got := float64(m.OutputTokens) / m.WallSeconds; got != m.ThroughputTPS {
		t.Errorf("throughput %v is not tokens/wall %v", m.ThroughputTPS, got)
	}
	if m.TTFTP50 <= 0 || m.TTFTP95 < m.TTFTP50 || m.DecodeTPSP50 <= 0 || m.DecodeTPSP95 < m.DecodeTPSP50 {
		t.Errorf("ttft %v/%v decode %v/%v", m.TTFTP50, m.TTFTP95, m.DecodeTPSP50, m.DecodeTPSP95)
	}
	if m.Model != "fake/model-7b" || m.EngineURL != f.URL() || m.EngineKind != wire.EngineVLLM || m.CapacityKey != "node/vllm/fake" {
		t.Errorf("identity: model %q url %q kind %q key %q", m.Model, m.EngineURL, m.EngineKind, m.CapacityKey)
	}
	// Cost: two bursts and not one request more.
	if n := f.chats.Load(); n != 8 {
		t.Errorf("engine got %d chat requests, want 2 bursts of 4", n)
	}
}

func TestRequestBodyPerKind(t *testing.T) {
	tests := []struct {
		kind    string
		want    map[string]any
		without []string
	}{
		{wire.EngineVLLM, map[string]any{"max_tokens": 8.0, "min_tokens": 8.0, "ignore_eos": true}, []string{"n_predict"}},
		{wire.EngineSGLang, map[string]any{"max_tokens": 8.0, "min_tokens": 8.0, "ignore_eos": true}, []string{"n_predict"}},
		{wire.EngineLlamaCpp, map[string]any{"n_predict": 8.0, "ignore_eos": true}, []string{"min_tokens"}},
		{wire.EngineMLX, map[string]any{"max_tokens": 8.0}, []string{"min_tokens", "ignore_eos", "n_predict"}},
		{wire.EngineOllama, map[string]any{"max_tokens": 8.0}, []string{"min_tokens", "ignore_eos", "n_predict"}},
		{"", map[string]any{"max_tokens": 8.0, "min_tokens": 8.0, "n_predict": 8.0, "ignore_eos": true}, nil},
	}
	for _, tt := range tests {
		t.Run("kind="+tt.kind, func(t *testing.T) {
			f := newFake(t, nil)
			cfg := quick(f.URL())
			cfg.Kind, cfg.Prompt = tt.kind, "say hi"
			mustRun(t, cfg)
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.bodies) != 8 {
				t.Fatalf("%d bodies", len(f.bodies))
			}
			b := f.bodies[0]
			for k, v := range tt.want {
				if b[k] != v {
					t.Errorf("%s = %v, want %v", k, b[k], v)
				}
			}
			for _, k := range tt.without {
				if _, ok := b[k]; ok {
					t.Errorf("%s sent to a %q engine", k, tt.kind)
				}
			}
			opts, _ := b["stream_options"].(map[string]any)
			if b["stream"] != true || opts["include_usage"] != true || b["model"] != "fake/model-7b" {
				t.Errorf("stream %v options %v model %v", b["stream"], opts, b["model"])
			}
			msgs, _ := b["messages"].([]any)
			if len(msgs) != 1 || msgs[0].(map[string]any)["content"] != "say hi" {
				t.Errorf("messages %v", msgs)
			}
		})
	}
}

func TestRunBadEngines(t *testing.T) {
	tests := []struct {
		name    string
		kind    string
		stream  func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any)
		failure string
		problem string
	}{
		{
			name: "some requests error",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				if n%3 == 0 {
					http.Error(w, `{"error":{"message":"CUDA out of memory"}}`, http.StatusInternalServerError)
					return
				}
				writeStream(w, intField(req, "max_tokens"), -1)
			},
			failure: wire.CodeProbeFailed, problem: "CUDA out of memory",
		},
		{
			name: "streams dropped mid-way",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				startStream(w)
				writeChunk(w, "a")
				writeChunk(w, "b")
				panic(http.ErrAbortHandler) // the connection is cut, as by a crashed engine
			},
			failure: wire.CodeProbeFailed, problem: "before [DONE]",
		},
		{
			name: "stream ends cleanly but without done",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				startStream(w)
				writeChunk(w, "a")
			},
			failure: wire.CodeProbeFailed, problem: "before [DONE]",
		},
		{
			name: "malformed sse line",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				startStream(w)
				writeChunk(w, "a")
				w.Write([]byte("this is not sse\n\n"))
				writeEvent(w, "[DONE]")
			},
			failure: wire.CodeProbeFailed, problem: "malformed event stream",
		},
		{
			name: "malformed chunk json",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				startStream(w)
				writeEvent(w, `{"choices":[{"delta":`)
				writeEvent(w, "[DONE]")
			},
			failure: wire.CodeProbeFailed, problem: "not a chat completion chunk",
		},
		{
			name: "answers json not a stream",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(`{"choices":[{"message":{"content":"hi"}}]}`))
			},
			failure: wire.CodeProbeFailed, problem: "not an event stream",
		},
		{
			// More tokens by usage than chunks can be speculative decoding
			// (a step's accepted tokens in one chunk); usage still counts,
			// and it says more than asked.
			name: "usage over-reports",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				k := intField(req, "max_tokens")
				writeStream(w, k, k+3)
			},
			failure: wire.CodeProbeIncompleteOutput, problem: "11 tokens, asked for exactly 8",
		},
		{
			// Fewer tokens than chunks of text: every chunk carries one.
			name: "usage under-reports",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				k := intField(req, "max_tokens")
				writeStream(w, k, k-3)
			},
			failure: wire.CodeProbeIncompleteOutput, problem: "usage says 5 tokens but the stream carried 8 chunks of text",
		},
		{
			name: "fewer tokens than asked",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				writeStream(w, intField(req, "max_tokens")/2, -1)
			},
			failure: wire.CodeProbeIncompleteOutput, problem: "4 tokens, asked for 8",
		},
		{
			name: "more tokens than asked",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				writeStream(w, intField(req, "max_tokens")+2, -1)
			},
			failure: wire.CodeProbeIncompleteOutput, problem: "10 tokens, asked for exactly 8",
		},
		{
			name: "no usage reported",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				startStream(w)
				for range intField(req, "max_tokens") {
					writeChunk(w, "x")
				}
				writeEvent(w, "[DONE]")
			},
			failure: wire.CodeProbeIncompleteOutput, problem: "no usage",
		},
		{
			name: "one request short is enough",
			stream: func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
				k := intField(req, "max_tokens")
				if n == 7 {
					k--
				}
				writeStream(w, k, -1)
			},
			failure: wire.CodeProbeIncompleteOutput, problem: "7 tokens, asked for 8",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(t, func(f *fakeEngine) { f.stream = tt.stream })
			cfg := quick(f.URL())
			if tt.kind != "" {
				cfg.Kind = tt.kind
			}
			m := mustRun(t, cfg)
			if m.Failure != tt.failure {
				t.Fatalf("failure = %q, want %q; problems %q", m.Failure, tt.failure, m.Problems)
			}
			if m.Valid() || m.ThroughputTPS != 0 || m.Complete {
				t.Errorf("a failed burst must not carry a throughput: valid %v tps %v complete %v", m.Valid(), m.ThroughputTPS, m.Complete)
			}
			if !hasProblem(m, tt.problem) {
				t.Errorf("problems %q do not mention %q", m.Problems, tt.problem)
			}
			if len(m.Problems) == 0 || !strings.Contains(m.Problems[0], "tok/s") && !strings.Contains(m.Problems[0], "failed") {
				t.Errorf("first problem should say why the measurement is not used: %q", m.Problems)
			}
		})
	}
}

func TestRunInexactKinds(t *testing.T) {
	for _, kind := range []string{wire.EngineMLX, wire.EngineOllama} {
		t.Run(kind, func(t *testing.T) {
			f := newFake(t, func(f *fakeEngine) {
				f.stream = func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
					writeStream(w, 5, -1) // the model stopped early, as it may
				}
			})
			cfg := quick(f.URL())
			cfg.Kind = kind
			m := mustRun(t, cfg)
			if !m.Valid() || m.Failure != "" || m.Complete {
				t.Fatalf("want valid but incomplete: valid %v failure %q complete %v", m.Valid(), m.Failure, m.Complete)
			}
			if m.OutputTokens != 20 || m.ExpectedTokens != 32 {
				t.Errorf("tokens %d of %d, want 20 of 32", m.OutputTokens, m.ExpectedTokens)
			}
			if !hasProblem(m, "cannot be told an exact output length") {
				t.Errorf("problems %q", m.Problems)
			}
		})
	}
}

func TestRunInexactKindStillFailsOnErrors(t *testing.T) {
	f := newFake(t, func(f *fakeEngine) {
		f.stream = func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
			if n > 4 {
				http.Error(w, "boom", http.StatusBadGateway)
				return
			}
			writeStream(w, 8, -1)
		}
	})
	cfg := quick(f.URL())
	cfg.Kind = wire.EngineMLX
	m := mustRun(t, cfg)
	if m.Failure != wire.CodeProbeFailed || m.ThroughputTPS != 0 {
		t.Fatalf("failure %q tps %v", m.Failure, m.ThroughputTPS)
	}
	if !hasProblem(m, "4 of 4 requests like request 1: engine answered 502 Bad Gateway: boom") {
		t.Errorf("errors should be grouped with a count: %q", m.Problems)
	}
}

func TestRunNeverReady(t *testing.T) {
	f := newFake(t, func(f *fakeEngine) { f.health = func() int { return http.StatusServiceUnavailable } })
	cfg := quick(f.URL())
	cfg.ReadyTimeout = 300 * time.Millisecond
	var phases []string
	cfg.Progress = func(p Progress) { phases = append(phases, p.Phase) }
	m := mustRun(t, cfg)
	if m.Failure != wire.CodeEngineUnreachable || !hasProblem(m, "did not become ready within 300ms") || !hasProblem(m, "503") {
		t.Fatalf("failure %q problems %q", m.Failure, m.Problems)
	}
	if f.chats.Load() != 0 {
		t.Errorf("sent %d chat requests to an engine that never became ready", f.chats.Load())
	}
	if len(phases) < 2 || phases[len(phases)-1] != PhaseDone ||
		slices.ContainsFunc(phases[:len(phases)-1], func(p string) bool { return p != PhaseWaitingReady }) {
		t.Errorf("phases %v", phases)
	}
}

func TestRunBecomesReady(t *testing.T) {
	var healthChecks atomic.Int64
	f := newFake(t, func(f *fakeEngine) {
		f.health = func() int {
			if healthChecks.Add(1) < 4 {
				return http.StatusServiceUnavailable
			}
			return http.StatusOK
		}
	})
	m := mustRun(t, quick(f.URL()))
	if !m.Valid() || healthChecks.Load() < 4 {
		t.Fatalf("valid %v after %d health checks; problems %q", m.Valid(), healthChecks.Load(), m.Problems)
	}
}

func TestRunUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	cfg := quick("http://" + addr)
	cfg.ReadyTimeout = 200 * time.Millisecond
	m := mustRun(t, cfg)
	if m.Failure != wire.CodeEngineUnreachable || !hasProblem(m, "connect") {
		t.Fatalf("failure %q problems %q", m.Failure, m.Problems)
	}
}

func TestRunLongURLKeepsProblemsBounded(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := quick("http://" + addr + "/" + strings.Repeat("p", 3000))
	cfg.ReadyTimeout = 100 * time.Millisecond
	m := mustRun(t, cfg) // mustRun checks wire validation, which bounds every string
	if m.Failure != wire.CodeEngineUnreachable {
		t.Fatalf("failure %q", m.Failure)
	}
	for _, p := range m.Problems {
		if len(p) > maxProblemBytes+3 {
			t.Errorf("problem of %d bytes", len(p))
		}
	}
}

func TestRunStuckEngineIsBounded(t *testing.T) {
	f := newFake(t, func(f *fakeEngine) {
		f.stream = func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
			startStream(w)
			writeChunk(w, "a")
			<-r.Context().Done() // never finishes
		}
	})
	cfg := quick(f.URL())
	cfg.BurstTimeout = 200 * time.Millisecond
	m := mustRun(t, cfg)
	if m.Failure != wire.CodeProbeFailed || !hasProblem(m, "did not finish within 200ms") {
		t.Fatalf("failure %q problems %q", m.Failure, m.Problems)
	}
	// Every warm-up request failed, so the measured burst was not sent.
	if n := f.chats.Load(); n != 4 {
		t.Errorf("%d chat requests, want only the 4 of the warm-up", n)
	}
}

func TestRunWarmupProblemsAreNotes(t *testing.T) {
	f := newFake(t, func(f *fakeEngine) {
		f.stream = func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
			if n == 1 {
				http.Error(w, "still compiling", http.StatusServiceUnavailable)
				return
			}
			writeStream(w, intField(req, "max_tokens"), -1)
		}
	})
	m := mustRun(t, quick(f.URL()))
	if !m.Valid() || !m.Complete {
		t.Fatalf("a clean measured burst is valid whatever the warm-up did: failure %q", m.Failure)
	}
	if !hasProblem(m, "warm-up: request ") || !hasProblem(m, "engine answered 503 Service Unavailable: still compiling") {
		t.Errorf("problems %q", m.Problems)
	}
}

func TestRunIdle(t *testing.T) {
	busy := func(ctx context.Context) (wire.Load, error) {
		return wire.Load{Known: true, Running: 2, Waiting: 1}, nil
	}
	t.Run("scheduled probe on a busy engine is deferred", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		cfg.RequireIdle, cfg.Load, cfg.Trigger = true, busy, wire.ReasonScheduled
		_, err := Run(t.Context(), cfg)
		if !errors.Is(err, ErrBusy) {
			t.Fatalf("err = %v, want ErrBusy", err)
		}
		if f.chats.Load() != 0 {
			t.Errorf("a deferred probe sent %d requests", f.chats.Load())
		}
	})
	t.Run("on-demand probe waits, and never measures an engine that stays busy", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		cfg.Load, cfg.Trigger, cfg.BusyWait, cfg.busyPoll = busy, wire.ReasonOnDemand, 50*time.Millisecond, 5*time.Millisecond
		m, err := Run(t.Context(), cfg)
		if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "still busy (2 running, 1 waiting) after waiting") {
			t.Fatalf("err = %v, want ErrBusy after the wait", err)
		}
		if f.chats.Load() != 0 || m.Valid() || m.BusyWaitSeconds <= 0 {
			t.Fatalf("a busy engine got %d requests; valid %v waited %v", f.chats.Load(), m.Valid(), m.BusyWaitSeconds)
		}
	})
	t.Run("idle engine is probed", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		cfg.RequireIdle = true
		cfg.Load = func(ctx context.Context) (wire.Load, error) { return wire.Load{Known: true}, nil }
		m := mustRun(t, cfg)
		if !m.Valid() || m.Busy || !m.LoadBefore.Known {
			t.Fatalf("valid %v busy %v load %+v", m.Valid(), m.Busy, m.LoadBefore)
		}
	})
	t.Run("an engine that serves no load is probed with a note", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		cfg.RequireIdle = true
		cfg.Load = func(ctx context.Context) (wire.Load, error) {
			return wire.Load{}, fmt.Errorf("mlx: %w", engine.ErrNoMetrics)
		}
		m := mustRun(t, cfg)
		if !m.Valid() || !hasProblem(m, "no /metrics") {
			t.Fatalf("valid %v problems %q", m.Valid(), m.Problems)
		}
	})
	t.Run("a load that cannot be read now is no proof of idle", func(t *testing.T) {
		f := newFake(t, nil)
		cfg := quick(f.URL())
		cfg.RequireIdle = true
		cfg.Load = func(ctx context.Context) (wire.Load, error) {
			return wire.Load{}, errors.New("GET /metrics answered 500")
		}
		_, err := Run(t.Context(), cfg)
		if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "could not be read: GET /metrics answered 500") || f.chats.Load() != 0 {
			t.Fatalf("Run: %v, %d chat requests; want deferred, none", err, f.chats.Load())
		}
	})
}

// newFakeHeldOpen is a fake engine whose measured burst (the requests after
// the warm-up's first few) stays open until sampled is closed.
func newFakeHeldOpen(t *testing.T, sampled <-chan struct{}) *fakeEngine {
	return newFake(t, func(f *fakeEngine) {
		f.stream = func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
			if n > 4 {
				select {
				case <-sampled:
				case <-r.Context().Done():
					return
				}
			}
			writeStream(w, intField(req, "max_tokens"), -1)
		}
	})
}

func TestRunGPUSampling(t *testing.T) {
	// The measured burst stays open until the sampler has read three times.
	sampled := make(chan struct{})
	f := newFakeHeldOpen(t, sampled)
	clocks := []uint32{1500, 1980, 1800, 1980, 1950}
	var reads atomic.Int64
	cfg := quick(f.URL())
	cfg.GPUUUIDs = []string{"GPU-a", "GPU-b"}
	cfg.GPUs = func(ctx context.Context) ([]wire.GPU, error) {
		n := reads.Add(1)
		if n == 3 {
			close(sampled)
		}
		i := int(n-1) % len(clocks)
		return []wire.GPU{
			{UUID: "GPU-a", SMClockMHz: clocks[i], SMClockMaxMHz: 1980, ClockEventReasons: []string{"sw_power_cap"}},
			{UUID: "GPU-b", SMClockMHz: clocks[i], SMClockMaxMHz: 2100},
			{UUID: "GPU-other", SMClockMHz: 100, SMClockMaxMHz: 3000, ClockEventReasons: []string{"hw_slowdown"}},
		}, nil
	}
	m := mustRun(t, cfg)
	if reads.Load() < 3 {
		t.Fatalf("only %d GPU samples", reads.Load())
	}
	if m.SMClockMinMHz < 1500 || m.SMClockMedianMHz < m.SMClockMinMHz || m.SMClockMedianMHz > 1980 {
		t.Errorf("min %v median %v: another engine's GPU leaked in", m.SMClockMinMHz, m.SMClockMedianMHz)
	}
	if m.SMClockMinMHz != 1500 {
		t.Errorf("min %v, want the first sample's 1500", m.SMClockMinMHz)
	}
	if m.SMClockMaxMHz != 2100 || !slices.Equal(m.ClockEventReasons, []string{"sw_power_cap"}) {
		t.Errorf("max %v reasons %v", m.SMClockMaxMHz, m.ClockEventReasons)
	}
}

// What the engine's processes hold on each GPU during the measured burst
// is recorded at its most: its tree's processes only (read as the burst
// starts, so a process the warm-up started counts), on every GPU they
// hold memory on, whether or not the engine's GPUs were known before.
func TestRunRecordsTheEnginesGPUMemory(t *testing.T) {
	sampled := make(chan struct{})
	f := newFakeHeldOpen(t, sampled)
	const gib = 1 << 30
	held := []uint64{6 * gib, 9 * gib, 7 * gib} // the engine's runner on GPU-a, sample by sample
	var reads, trees atomic.Int64
	cfg := quick(f.URL())
	cfg.EngineTree = func(context.Context) []int {
		trees.Add(1)
		return []int{100, 101, 102} // the server, and two runners the warm-up started
	}
	cfg.GPUs = func(ctx context.Context) ([]wire.GPU, error) {
		n := reads.Add(1)
		if n == 3 {
			close(sampled)
		}
		i := min(int(n-1), len(held)-1)
		return []wire.GPU{
			{UUID: "GPU-a", Processes: []wire.GPUProcess{{PID: 101, UsedMemory: held[i]}, {PID: 102, UsedMemory: gib}, {PID: 900, UsedMemory: 20 * gib}}},
			{UUID: "GPU-b", Processes: []wire.GPUProcess{{PID: 102, UsedMemory: 2 * gib}}},
			{UUID: "GPU-c", Processes: []wire.GPUProcess{{PID: 900, UsedMemory: 30 * gib}}},
			{UUID: "GPU-d", Error: "unknown error", Processes: []wire.GPUProcess{{PID: 101, UsedMemory: 50 * gib}}},
		}, nil
	}
	m := mustRun(t, cfg)
	want := []wire.GPUMemory{{UUID: "GPU-a", UsedBytes: 10 * gib}, {UUID: "GPU-b", UsedBytes: 2 * gib}}
	if !slices.Equal(m.GPUMemory, want) {
		t.Errorf("gpu memory %+v, want %+v (the tree's most on each GPU; another process's, and an unreadable GPU, left out)", m.GPUMemory, want)
	}
	if trees.Load() != 1 {
		t.Errorf("the tree was read %d times, want once, as the measured burst starts", trees.Load())
	}
	if err := m.Validate(); err != nil {
		t.Errorf("the measurement does not pass the wire's checks: %v", err)
	}

	// No tree (a remote engine, or its process not found): no memory.
	cfg.EngineTree = func(context.Context) []int { return nil }
	reads.Store(3)
	if m := mustRun(t, cfg); len(m.GPUMemory) != 0 {
		t.Errorf("without a tree: %+v", m.GPUMemory)
	}
}

func TestRunGPUReadErrorIsANote(t *testing.T) {
	f := newFake(t, nil)
	cfg := quick(f.URL())
	cfg.GPUs = func(ctx context.Context) ([]wire.GPU, error) { return nil, errors.New("nvml: driver not loaded") }
	m := mustRun(t, cfg)
	if !m.Valid() || !hasProblem(m, "driver not loaded") || m.SMClockMedianMHz != 0 {
		t.Fatalf("valid %v problems %q median %v", m.Valid(), m.Problems, m.SMClockMedianMHz)
	}
}

func TestRunProgress(t *testing.T) {
	f := newFake(t, nil)
	cfg := quick(f.URL())
	var (
		mu  sync.Mutex
		all []Progress
	)
	cfg.Progress = func(p Progress) { mu.Lock(); all = append(all, p); mu.Unlock() }
	m := mustRun(t, cfg)
	var phases []string
	for _, p := range all {
		if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
			phases = append(phases, p.Phase)
		}
		if p.Done > p.Total || p.Tokens < 0 {
			t.Errorf("bad progress %+v", p)
		}
	}
	want := []string{PhaseWaitingReady, PhaseWarmup, PhaseMeasure, PhaseDone}
	if !slices.Equal(phases, want) {
		t.Fatalf("phases %v, want %v", phases, want)
	}
	last := all[len(all)-1]
	if last.Done != 4 || last.Total != 4 || last.Tokens != m.OutputTokens || last.TPS != m.ThroughputTPS {
		t.Errorf("final progress %+v vs measurement %v tokens %v tok/s", last, m.OutputTokens, m.ThroughputTPS)
	}
}

func TestRunContextCancelled(t *testing.T) {
	f := newFake(t, func(f *fakeEngine) {
		f.stream = func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
			startStream(w)
			<-r.Context().Done()
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	cfg := quick(f.URL())
	cfg.Progress = func(p Progress) {
		if p.Phase == PhaseWarmup && p.Done == 0 && p.Elapsed > 0 {
			cancel()
		}
	}
	_, err := Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no url", Config{}},
		{"not http", Config{URL: "ftp://x"}},
		{"no host", Config{URL: "http://"}},
		{"unknown kind", Config{URL: "http://127.0.0.1:1", Kind: "no-such-engine"}},
		{"negative concurrency", Config{URL: "http://127.0.0.1:1", Concurrency: -1}},
		{"too many requests", Config{URL: "http://127.0.0.1:1", Concurrency: MaxConcurrency + 1}},
		{"negative tokens", Config{URL: "http://127.0.0.1:1", Tokens: -5}},
		{"huge prompt", Config{URL: "http://127.0.0.1:1", Prompt: strings.Repeat("x", wire.MaxStringBytes+1)}},
		{"negative timeout", Config{URL: "http://127.0.0.1:1", BurstTimeout: -time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Run(t.Context(), tt.cfg); err == nil {
				t.Fatal("want a config error")
			}
		})
	}
}

func TestConfigDefaultsAndBaseURL(t *testing.T) {
	c := Config{URL: "http://127.0.0.1:8000/v1/"}
	if err := c.normalize(); err != nil {
		t.Fatal(err)
	}
	if c.URL != "http://127.0.0.1:8000" || c.Concurrency != 16 || c.Tokens != 128 || c.Prompt != DefaultPrompt ||
		c.ReadyTimeout != DefaultReadyTimeout || c.BurstTimeout != DefaultBurstTimeout {
		t.Fatalf("%+v", c)
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, tt := range []struct{ p, want float64 }{{0.5, 5}, {0.95, 10}, {0.1, 1}, {1, 10}} {
		if got := percentile(xs, tt.p); got != tt.want {
			t.Errorf("p%v = %v, want %v", tt.p, got, tt.want)
		}
	}
	if percentile(nil, 0.5) != 0 {
		t.Error("empty")
	}
	if median([]float64{1, 3, 2, 4}) != 2.5 || median([]float64{7}) != 7 {
		t.Error("median")
	}
}

func TestIdleGPUClocksAreLeftOut(t *testing.T) {
	read := func(idle bool) func(context.Context) ([]wire.GPU, error) {
		return func(context.Context) ([]wire.GPU, error) {
			gpus := []wire.GPU{{UUID: "GPU-idle", SMClockMHz: 345, SMClockMaxMHz: 1980, ClockEventReasons: []string{"gpu_idle"}}}
			if !idle {
				gpus = append(gpus, wire.GPU{UUID: "GPU-busy", SMClockMHz: 1950, SMClockMaxMHz: 1980})
			}
			return gpus, nil
		}
	}
	// Engine GPUs unknown: the idle one must not drag the median down.
	waitSamples := func(s *gpuSampler) {
		testutil.Eventually(t, "a sample", 10*time.Second, func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.reads+s.idle > 0
		})
	}
	s := startGPUSampler(t.Context(), read(false), nil, nil)
	waitSamples(s)
	sum := s.stop()
	if sum.MedianMHz != 1950 || sum.MinMHz != 1950 || sum.Idle == 0 || slices.Contains(sum.Reasons, "gpu_idle") {
		t.Errorf("summary %+v: the idle GPU's clock leaked in", sum)
	}
	// Every GPU idle: no clock figures at all, so no gpu_clock_low.
	s = startGPUSampler(t.Context(), read(true), nil, nil)
	waitSamples(s)
	sum = s.stop()
	if sum.Samples != 0 || sum.MedianMHz != 0 || sum.Idle == 0 {
		t.Errorf("all idle: %+v", sum)
	}
}

// The link tells a deferred probe by the error's Busy method, without
// importing probe.
func TestErrBusySaysBusy(t *testing.T) {
	err := fmt.Errorf("scheduled probe: %w", ErrBusy)
	var b interface{ Busy() bool }
	if !errors.As(err, &b) || !b.Busy() {
		t.Error("a wrapped ErrBusy has no Busy method that says true")
	}
	if !errors.Is(err, ErrBusy) {
		t.Error("errors.Is does not find ErrBusy")
	}
	if errors.As(errors.New("engine down"), &b) {
		t.Error("any error says busy")
	}
}
