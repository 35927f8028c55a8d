package link

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/shared/testutil"
	"heft/shared/wire"
)

func TestHelloThenSnapshotWithToken(t *testing.T) {
	f := newFakeCoord(t)
	start(t, testConfig(f), newFakeHandler())
	fc := f.accept(t)

	hello := fc.next(t)
	if hello.Type != wire.TypeHello {
		t.Fatalf("first message %q, want hello", hello.Type)
	}
	if hello.Hello.Node != "gpu-a" || hello.Hello.AgentVersion != "test" || hello.Hello.Host != testHost {
		t.Errorf("hello = %+v", hello.Hello)
	}
	snap := fc.next(t)
	if snap.Type != wire.TypeSnapshot || snap.Snapshot.Node != "gpu-a" || len(snap.Snapshot.Engines) != 1 {
		t.Fatalf("second message = %+v, want the snapshot", snap)
	}
	f.mu.Lock()
	auth := f.headers[0].Get("Authorization")
	f.mu.Unlock()
	if auth != "Bearer "+testToken {
		t.Errorf("Authorization = %q", auth)
	}
}

// Each hello offers what the handler holds, so a coordinator that lost
// its state can take it instead of measuring again.
func TestHelloOffersHeldMeasurements(t *testing.T) {
	f := newFakeCoord(t)
	h := newFakeHandler()
	m := wire.Measurement{CapacityKey: "k", ThroughputTPS: 900, OutputTokens: 128, FinishedAt: time.Now()}
	h.held = []wire.CachedMeasurement{{Measurement: m, ExpiresAt: time.Now().Add(time.Hour)}}
	start(t, testConfig(f), h)
	hello := f.accept(t).next(t)
	if hello.Type != wire.TypeHello || len(hello.Hello.Measurements) != 1 || hello.Hello.Measurements[0].Measurement.ThroughputTPS != 900 {
		t.Fatalf("hello = %+v, want it to offer the held measurement", hello)
	}
}

func TestSnapshotOnSignificantChange(t *testing.T) {
	f := newFakeCoord(t)
	h := newFakeHandler()
	cfg := testConfig(f)
	cfg.Significant = func(prev, next wire.Snapshot) bool { return prev.GPUError != next.GPUError }
	start(t, cfg, h)
	fc := f.accept(t)
	fc.nextOf(t, wire.TypeSnapshot)

	// Many polls of unchanged facts send nothing: the next message the
	// coordinator sees must be the change.
	polled := h.polls.Load()
	testutil.Eventually(t, "ten more polls", 15*time.Second, func() bool { return h.polls.Load() >= polled+10 })
	h.setSnap(func(s *wire.Snapshot) { s.GPUError = "nvml: driver not loaded" })
	got := fc.next(t)
	if got.Type != wire.TypeSnapshot || got.Snapshot.GPUError != "nvml: driver not loaded" {
		t.Fatalf("after a change got %+v, want the changed snapshot", got)
	}
}

func TestReconnectAfterCloseResendsHelloAndSnapshot(t *testing.T) {
	f := newFakeCoord(t)
	r := start(t, testConfig(f), newFakeHandler())
	fc := f.accept(t)
	fc.nextOf(t, wire.TypeSnapshot)
	fc.c.Close(websocket.StatusServiceRestart, "coordinator restarting")

	fc2 := f.accept(t)
	if m := fc2.next(t); m.Type != wire.TypeHello {
		t.Fatalf("first message after reconnect %q, want hello", m.Type)
	}
	if m := fc2.next(t); m.Type != wire.TypeSnapshot {
		t.Fatalf("second message after reconnect %q, want snapshot", m.Type)
	}
	r.log.waitLog(t, "coordinator restarting")
}

func TestUnauthorizedKeepsRetrying(t *testing.T) {
	f := newFakeCoord(t)
	f.set(func(f *fakeCoord) { f.refuse = http.StatusUnauthorized })
	r := start(t, testConfig(f), newFakeHandler())
	r.log.waitLog(t, "coordinator rejected the agent token")
	testutil.Eventually(t, "several refused dials", 15*time.Second, func() bool { return f.refused.Load() >= 3 })
	f.set(func(f *fakeCoord) { f.refuse = 0 })
	fc := f.accept(t)
	if m := fc.next(t); m.Type != wire.TypeHello {
		t.Fatalf("got %q, want hello once the token is accepted", m.Type)
	}
}

func TestWrongTokenIsRejected(t *testing.T) {
	f := newFakeCoord(t)
	cfg := testConfig(f)
	cfg.Token = "wrong"
	r := start(t, cfg, newFakeHandler())
	r.log.waitLog(t, "coordinator rejected the agent token")
}

func TestProbeRunningThenResult(t *testing.T) {
	f := newFakeCoord(t)
	start(t, testConfig(f), newFakeHandler())
	fc := f.accept(t)
	fc.nextOf(t, wire.TypeSnapshot)
	fc.send(t, &wire.ProbeRequest{RequestID: "r1", CapacityKey: "k1", Reason: wire.ReasonOnDemand})

	st := fc.nextOf(t, wire.TypeProbeStatus).ProbeStatus
	if st.State != wire.ProbeRunning || st.RequestID != "r1" || st.CapacityKey != "k1" {
		t.Fatalf("status = %+v, want running r1", st)
	}
	res := fc.nextOf(t, wire.TypeProbeResult).ProbeResult
	if res.RequestID != "r1" || res.Measurement.CapacityKey != "k1" || res.Measurement.ThroughputTPS != 992 {
		t.Fatalf("result = %+v", res)
	}
}

func TestProbeOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		probe   func(ctx context.Context, req wire.ProbeRequest) (wire.Measurement, error)
		state   string
		message string
	}{
		{"busy", func(context.Context, wire.ProbeRequest) (wire.Measurement, error) {
			return wire.Measurement{}, fmt.Errorf("engine has 3 running: %w", busyError{})
		}, wire.ProbeDeferredBusy, "3 running"},
		{"failed", func(context.Context, wire.ProbeRequest) (wire.Measurement, error) {
			return wire.Measurement{}, errors.New("no engine with capacity key k1")
		}, wire.ProbeFailed, "no engine"},
		{"invalid measurement", func(_ context.Context, req wire.ProbeRequest) (wire.Measurement, error) {
			m := measurement(req.CapacityKey)
			m.ThroughputTPS = -1
			return m, nil
		}, wire.ProbeFailed, "invalid measurement"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCoord(t)
			h := newFakeHandler()
			h.probe = tc.probe
			start(t, testConfig(f), h)
			fc := f.accept(t)
			fc.nextOf(t, wire.TypeSnapshot)
			fc.send(t, &wire.ProbeRequest{RequestID: "r1", CapacityKey: "k1", Reason: wire.ReasonScheduled})
			if st := fc.nextOf(t, wire.TypeProbeStatus).ProbeStatus; st.State != wire.ProbeRunning {
				t.Fatalf("first status %q, want running", st.State)
			}
			st := fc.nextOf(t, wire.TypeProbeStatus).ProbeStatus
			if st.State != tc.state || st.RequestID != "r1" || !strings.Contains(st.Message, tc.message) {
				t.Fatalf("status = %+v, want %s mentioning %q", st, tc.state, tc.message)
			}
		})
	}
}

func TestOneProbePerKey(t *testing.T) {
	f := newFakeCoord(t)
	h := newFakeHandler()
	release := make(chan struct{})
	h.probe = func(ctx context.Context, req wire.ProbeRequest) (wire.Measurement, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return wire.Measurement{}, ctx.Err()
		}
		return measurement(req.CapacityKey), nil
	}
	start(t, testConfig(f), h)
	fc := f.accept(t)
	fc.nextOf(t, wire.TypeSnapshot)

	fc.send(t, &wire.ProbeRequest{RequestID: "r1", CapacityKey: "k1", Reason: wire.ReasonOnDemand})
	if st := fc.nextOf(t, wire.TypeProbeStatus).ProbeStatus; st.RequestID != "r1" || st.State != wire.ProbeRunning {
		t.Fatalf("status = %+v", st)
	}
	fc.send(t, &wire.ProbeRequest{RequestID: "r2", CapacityKey: "k1", Reason: wire.ReasonOnDemand})
	if st := fc.nextOf(t, wire.TypeProbeStatus).ProbeStatus; st.RequestID != "r2" || st.State != wire.ProbeRunning {
		t.Fatalf("status = %+v, want r2 answered running", st)
	}
	// Another key is not held up by k1.
	fc.send(t, &wire.ProbeRequest{RequestID: "r3", CapacityKey: "k2", Reason: wire.ReasonOnDemand})
	if st := fc.nextOf(t, wire.TypeProbeStatus).ProbeStatus; st.RequestID != "r3" {
		t.Fatalf("status = %+v, want r3 running", st)
	}
	testutil.Eventually(t, "two probes started", 15*time.Second, func() bool { return h.probeCalls.Load() == 2 })
	close(release)

	results := map[string]string{}
	for range 2 {
		res := fc.nextOf(t, wire.TypeProbeResult).ProbeResult
		results[res.RequestID] = res.Measurement.CapacityKey
	}
	if results["r1"] != "k1" || results["r3"] != "k2" || len(results) != 2 {
		t.Errorf("results = %v, want r1→k1 and r3→k2 only", results)
	}
	if n := h.probeCalls.Load(); n != 2 {
		t.Errorf("%d probes ran, want 2", n)
	}

	// Once k1 is done it may be probed again.
	fc.send(t, &wire.ProbeRequest{RequestID: "r4", CapacityKey: "k1", Reason: wire.ReasonOnDemand})
	if res := fc.nextOf(t, wire.TypeProbeResult).ProbeResult; res.RequestID != "r4" {
		t.Fatalf("result = %+v, want r4", res)
	}
}

func TestResultOutboxSurvivesReconnect(t *testing.T) {
	f := newFakeCoord(t)
	h := newFakeHandler()
	release, finished := make(chan struct{}), make(chan struct{})
	h.probe = func(ctx context.Context, req wire.ProbeRequest) (wire.Measurement, error) {
		defer close(finished)
		<-release
		return measurement(req.CapacityKey), nil
	}
	start(t, testConfig(f), h)
	fc := f.accept(t)
	fc.nextOf(t, wire.TypeSnapshot)
	fc.send(t, &wire.ProbeRequest{RequestID: "r1", CapacityKey: "k1", Reason: wire.ReasonRegistration})
	fc.nextOf(t, wire.TypeProbeStatus)

	// Drop the link and keep it down while the probe finishes.
	f.set(func(f *fakeCoord) { f.refuse = http.StatusServiceUnavailable })
	fc.c.CloseNow()
	testutil.Eventually(t, "a refused reconnect", 15*time.Second, func() bool { return f.refused.Load() >= 1 })
	close(release)
	<-finished
	f.set(func(f *fakeCoord) { f.refuse = 0 })

	fc2 := f.accept(t)
	if m := fc2.next(t); m.Type != wire.TypeHello {
		t.Fatalf("got %q, want hello", m.Type)
	}
	res := fc2.nextOf(t, wire.TypeProbeResult).ProbeResult
	if res.RequestID != "r1" || res.Measurement.CapacityKey != "k1" {
		t.Fatalf("result after reconnect = %+v", res)
	}
}

func TestCachedMeasurementReachesHandler(t *testing.T) {
	f := newFakeCoord(t)
	h := newFakeHandler()
	start(t, testConfig(f), h)
	fc := f.accept(t)
	fc.nextOf(t, wire.TypeSnapshot)
	exp := time.Now().Add(6 * time.Hour).UTC().Truncate(time.Second)
	fc.send(t, &wire.CachedMeasurement{Measurement: measurement("k1"), ExpiresAt: exp})
	select {
	case m := <-h.cached:
		if m.Measurement.CapacityKey != "k1" || !m.ExpiresAt.Equal(exp) {
			t.Errorf("cached = %+v", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Cached not called")
	}
}

func TestBadMessageRestartsSession(t *testing.T) {
	for _, tc := range []struct{ name, data string }{
		{"not json", "{nope"},
		{"newer protocol", `{"type":"welcome","v":99,"welcome":{}}`},
		{"agent-side type", `{"type":"hello","v":1,"hello":{"node":"x","agent_version":"1","host":{"hostname":"h","os":"linux","arch":"x","cpu_cores":1,"memory_total_bytes":0,"memory_available_bytes":0}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCoord(t)
			r := start(t, testConfig(f), newFakeHandler())
			fc := f.accept(t)
			fc.nextOf(t, wire.TypeSnapshot)
			fc.sendRaw(t, []byte(tc.data))
			if code := fc.closeStatus(t); code != websocket.StatusPolicyViolation {
				t.Errorf("close code %v, want policy violation (%v)", code, fc.err)
			}
			r.log.waitLog(t, "bad message from coordinator")
			if m := f.accept(t).next(t); m.Type != wire.TypeHello {
				t.Fatalf("after a bad message got %q, want a new session's hello", m.Type)
			}
		})
	}
}

func TestStalledCoordinatorDoesNotBlockPolling(t *testing.T) {
	f := newFakeCoord(t)
	f.set(func(f *fakeCoord) { f.stall = true })
	h := newFakeHandler()
	// After the first, every snapshot is nearly 1 MB, so a coordinator that
	// stops reading fills the socket buffers within a few writes.
	big := h.snap
	big.Engines = []wire.Engine{{Kind: "vllm", URL: "http://127.0.0.1:8000", LaunchArgs: make([]string, 230)}}
	for i := range big.Engines[0].LaunchArgs {
		big.Engines[0].LaunchArgs[i] = strings.Repeat("x", 4000)
	}
	h.snapFn = func(n int64) wire.Snapshot {
		if n == 1 {
			return h.snap
		}
		return big
	}
	cfg := testConfig(f)
	cfg.Significant = func(prev, next wire.Snapshot) bool { return true }
	cfg.WriteTimeout = time.Minute
	r := start(t, cfg, h)
	f.accept(t)
	// 100 polls offer ~90 MB, far beyond what the sockets can hold: the
	// writer is stuck, and polling must go on regardless.
	testutil.Eventually(t, "100 polls", 15*time.Second, func() bool { return h.polls.Load() >= 100 })
	if err := r.stop(t); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

func TestCancelClosesGoingAway(t *testing.T) {
	f := newFakeCoord(t)
	r := start(t, testConfig(f), newFakeHandler())
	fc := f.accept(t)
	fc.nextOf(t, wire.TypeSnapshot)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v, want nil on cancel", err)
	}
	if code := fc.closeStatus(t); code != websocket.StatusGoingAway {
		t.Errorf("close code %v, want going away", code)
	}
}

func TestCancelWhileDisconnected(t *testing.T) {
	f := newFakeCoord(t)
	f.set(func(f *fakeCoord) { f.refuse = http.StatusBadGateway })
	cfg := testConfig(f)
	cfg.MinBackoff, cfg.MaxBackoff = time.Hour, time.Hour
	r := start(t, cfg, newFakeHandler())
	testutil.Eventually(t, "a refused dial", 15*time.Second, func() bool { return f.refused.Load() >= 1 })
	if err := r.stop(t); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

func TestRunRejectsUnusableConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no node", Config{URL: "ws://127.0.0.1:1/api/v1/agent", Host: testHost}},
		{"bad scheme", Config{URL: "ftp://127.0.0.1:1/", Node: "n", Host: testHost}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Run(context.Background(), tc.cfg, newFakeHandler(), nil); err == nil {
				t.Fatal("Run accepted the config")
			}
		})
	}
}

func TestUnsendableSnapshotSkipped(t *testing.T) {
	huge := make([]string, wire.MaxListItems)
	for i := range huge {
		huge[i] = strings.Repeat("x", wire.MaxStringBytes)
	}
	for _, tc := range []struct {
		name string
		bad  func(s *wire.Snapshot)
		log  string
	}{
		{"invalid", func(s *wire.Snapshot) { s.Engines[0].Kind = "No such engine" }, "invalid message"},
		{"too big", func(s *wire.Snapshot) { s.Engines[0].LaunchArgs = huge }, "byte limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCoord(t)
			h := newFakeHandler()
			h.snapFn = func(n int64) wire.Snapshot {
				s := wire.Snapshot{Node: "gpu-a", Host: testHost, Engines: []wire.Engine{{Kind: "vllm", URL: "http://127.0.0.1:8000"}}}
				switch {
				case n >= 2 && n <= 4:
					tc.bad(&s)
				case n > 4:
					s.GPUError = "later"
				}
				return s
			}
			cfg := testConfig(f)
			cfg.Significant = func(prev, next wire.Snapshot) bool { return true }
			r := start(t, cfg, h)
			fc := f.accept(t)
			fc.nextOf(t, wire.TypeSnapshot)
			// The bad ones are dropped; the session carries on with the next good one.
			if s := fc.next(t); s.Type != wire.TypeSnapshot || s.Snapshot.GPUError != "later" {
				t.Fatalf("got %+v, want the snapshot after the bad ones", s)
			}
			r.log.waitLog(t, "snapshot not sent")
			if !strings.Contains(r.log.String(), tc.log) {
				t.Errorf("log does not say why (%q):\n%s", tc.log, r.log.String())
			}
		})
	}
}

// busyError is what the agent's probe returns for a busy engine: the
// link knows it by its Busy method alone.
type busyError struct{}

func (busyError) Error() string { return "engine is busy; probe deferred" }
func (busyError) Busy() bool    { return true }
