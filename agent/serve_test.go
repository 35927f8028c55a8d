package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"heft/agent/config"
	"heft/agent/internal/fakecoord"
	"heft/agent/status"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

// deadURL is an http URL where nothing listens.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "http://" + ln.Addr().String()
}

// runningAgent is agent.Run in the background with its log.
type runningAgent struct {
	log  *testutil.SyncBuffer
	done chan error
	base string // http://ADDR of /metrics and /healthz
}

var servingRE = regexp.MustCompile(`serving /metrics and /healthz: addr=(\S+)`)

func runAgent(t *testing.T, cfg config.Config) *runningAgent {
	t.Helper()
	if cfg.StateDir == config.DefaultStateDir {
		cfg.StateDir = t.TempDir() // the node credential: the test's, not the host's
	}
	r := &runningAgent{log: &testutil.SyncBuffer{}, done: make(chan error, 1)}
	logger := hclog.New(&hclog.LoggerOptions{Name: "heft-agent", Output: r.log, Level: hclog.Debug})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { r.done <- Run(ctx, cfg, logger, WithGPUs(oneGPU{})) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after cancel")
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", r.log.String())
		}
	})
	if cfg.Listen != "" {
		testutil.Eventually(t, "the agent serving", 15*time.Second, func() bool { return servingRE.MatchString(r.log.String()) })
		r.base = "http://" + servingRE.FindStringSubmatch(r.log.String())[1]
	}
	return r
}

func (r *runningAgent) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(r.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func (r *runningAgent) health(t *testing.T) (int, Health) {
	t.Helper()
	code, body := r.get(t, "/healthz")
	var h Health
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatalf("/healthz is not JSON: %v\n%s", err, body)
	}
	return code, h
}

// metric reads one series' value from /metrics, through Prometheus' own
// text parser; ok is false when the series is not there.
func (r *runningAgent) metric(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	_, body := r.get(t, "/metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics: %v\n%s", err, body)
	}
	for _, m := range families[name].GetMetric() {
		match := 0
		for _, l := range m.GetLabel() {
			if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
				match++
			}
		}
		if match == len(labels) {
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

func (r *runningAgent) count(s string) int { return strings.Count(r.log.String(), s) }

// A worker with one engine up and one down whose log is missing: the
// journal has one line for each failure, /healthz says degraded with
// what fails (200: the agent itself is fine), /metrics says which engine
// is up, that the coordinator welcomed the agent, the GPU, and the probe.
func TestAgentSpeaksUp(t *testing.T) {
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorVLLM, Model: "test/model", SingleTPS: 400, Batch16TPS: 3200}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	coord := fakecoord.Start(t, token)
	dead := deadURL(t)
	missingLog := filepath.Join(t.TempDir(), "vllm.log")

	cfg := config.Default()
	cfg.Coordinator.URL, cfg.Coordinator.Token = coord.URL, token
	cfg.Node.Name = "gpu-test"
	cfg.Engines = []config.Engine{{Kind: "vllm", URL: s.URL()}, {Kind: "vllm", URL: dead, Log: missingLog}}
	cfg.Probe.Concurrency, cfg.Probe.Tokens = 4, 16
	cfg.SnapshotInterval, cfg.PollInterval = 50*time.Millisecond, 100*time.Millisecond
	cfg.Listen = "127.0.0.1:0"
	r := runAgent(t, cfg)

	fc := <-coord.Conns
	var snap *wire.Snapshot
	for snap == nil || snap.Engines[0].CapacityKey == "" {
		snap = fc.Next(t, wire.TypeSnapshot).Snapshot
	}
	if v, _ := r.metric(t, "heft_agent_coordinator_connected", nil); v != 0 {
		t.Error("connected before the welcome")
	}
	fc.Send(t, &wire.Welcome{CoordinatorVersion: "test"})
	testutil.Eventually(t, "connected", 15*time.Second, func() bool {
		v, _ := r.metric(t, "heft_agent_coordinator_connected", map[string]string{"node": "gpu-test"})
		return v == 1
	})
	key := snap.Engines[0].CapacityKey
	fc.Send(t, &wire.ProbeRequest{RequestID: "r1", CapacityKey: key, Reason: wire.ReasonOnDemand})
	if res := fc.Next(t, wire.TypeProbeResult).ProbeResult; !res.Measurement.Valid() {
		t.Fatalf("probe %+v", res)
	}

	// Many polls later, still one line per failure.
	polls := 0
	for range 5 {
		fc.Next(t, wire.TypeSnapshot)
		polls++
	}
	for _, line := range []string{
		"[WARN]  heft-agent.collect: engine unreachable: url=" + dead + " reason=unreachable",
		"[WARN]  heft-agent.collect: engine log missing; it is read once it appears: log=" + missingLog + " reason=missing",
	} {
		if n := r.count(line); n != 1 {
			t.Errorf("%d lines %q after %d snapshots, want 1", n, line, polls)
		}
	}

	code, h := r.health(t)
	if code != http.StatusOK || h.Status != "degraded" || !h.Connected || h.Node != "gpu-test" || h.LastSnapshotAt.IsZero() {
		t.Errorf("/healthz %d %+v", code, h)
	}
	failing := map[string]string{}
	for _, it := range h.Failing {
		failing[it.Area+" "+it.Name] = it.Reason
	}
	if len(failing) != 2 || failing["engine "+dead] != "unreachable" || failing["log "+missingLog] != "missing" {
		t.Errorf("failing %v, want the dead engine and its log", failing)
	}

	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"heft_agent_engine_up", map[string]string{"url": s.URL(), "kind": "vllm", "node": "gpu-test"}, 1},
		{"heft_agent_engine_up", map[string]string{"url": dead}, 0},
		{"heft_agent_probes_total", map[string]string{"url": s.URL(), "outcome": "measured"}, 1},
		{"heft_agent_probes_total", map[string]string{"url": dead, "outcome": "measured"}, 0},
		{"heft_agent_engine_log_lines_total", map[string]string{"url": dead, "log": missingLog}, 0},
		{"heft_gpu_memory_total_bytes", map[string]string{"gpu": "0", "uuid": "GPU-test", "node": "gpu-test"}, 23 << 30},
		{"heft_agent_build_info", map[string]string{"node": "gpu-test"}, 1},
	} {
		if v, ok := r.metric(t, tc.name, tc.labels); !ok || v != tc.want {
			t.Errorf("%s%v = %v (found %v), want %v", tc.name, tc.labels, v, ok, tc.want)
		}
	}
	if code, body := r.get(t, "/nothing"); code != http.StatusNotFound {
		t.Errorf("/nothing: %d %s", code, body)
	}
}

// With the coordinator away nobody polls through the link, yet engines
// are still read, their failures logged and /healthz current.
func TestAgentWatchesWithoutCoordinator(t *testing.T) {
	dead := deadURL(t)
	cfg := config.Default()
	cfg.Coordinator.URL, cfg.Coordinator.Token = "ws"+strings.TrimPrefix(deadURL(t), "http"), token
	cfg.Node.Name = "gpu-test"
	cfg.Engines = []config.Engine{{Kind: "sglang", URL: dead}}
	cfg.PollInterval = 100 * time.Millisecond
	cfg.Listen = "127.0.0.1:0"
	r := runAgent(t, cfg)
	testutil.Eventually(t, "the engine's failure logged", 15*time.Second, func() bool {
		return r.count("engine unreachable: url="+dead) == 1
	})
	code, h := r.health(t)
	if code != http.StatusOK || h.Connected || h.Coordinator != cfg.Coordinator.URL+"/api/v1/agent" {
		t.Errorf("/healthz %d %+v", code, h)
	}
	reasons := map[string]string{}
	for _, it := range h.Failing {
		reasons[it.Area] = it.Reason
	}
	if reasons[status.AreaCoordinator] != "unreachable" || reasons[status.AreaEngine] != "unreachable" {
		t.Errorf("failing %+v", h.Failing)
	}
	first := h.LastSnapshotAt
	testutil.Eventually(t, "a newer snapshot", 15*time.Second, func() bool {
		_, h := r.health(t)
		return h.LastSnapshotAt.After(first)
	})
	if n := r.count("coordinator unreachable; retrying"); n != 1 {
		t.Errorf("%d lines about the coordinator, want 1", n)
	}
}

// Only an agent that stopped taking snapshots is unhealthy (503).
func TestHealthStuck(t *testing.T) {
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	w := &watcher{node: "n", coordURL: "ws://c/api/v1/agent", h: &Handler{}, board: status.New(), started: start, stuckAfter: 2 * time.Minute}
	if hl, code := w.health(start.Add(time.Minute)); code != http.StatusOK || hl.Status != "ok" {
		t.Errorf("starting: %d %+v", code, hl)
	}
	if hl, code := w.health(start.Add(3 * time.Minute)); code != http.StatusServiceUnavailable || hl.Status != "stuck" {
		t.Errorf("no snapshot in 3 minutes: %d %+v", code, hl)
	}
	w.h.lastAt = start.Add(150 * time.Second)
	if _, code := w.health(start.Add(4 * time.Minute)); code != http.StatusOK {
		t.Errorf("a snapshot 90 s ago: %d", code)
	}
}

// Whoever can reach the agent's listen address cannot hold its file
// descriptors: a kept-alive client that stops asking is let go after
// serveIdle, and only serveMaxConns are served at once (the rest wait to
// be accepted). Before, 300 idle clients were held for good.
func TestServerLetsIdleClientsGo(t *testing.T) {
	oldIdle, oldMax := serveIdle, serveMaxConns
	// Idle long enough that no stall of a loaded host lets the two go
	// before the third has been shown to wait.
	serveIdle, serveMaxConns = 2*time.Second, 2
	t.Cleanup(func() { serveIdle, serveMaxConns = oldIdle, oldMax })
	w := &watcher{node: "n", coordURL: "ws://c/api/v1/agent", h: &Handler{}, board: status.New(), started: time.Now(), stuckAfter: time.Hour}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { w.serve(ctx, ln, hclog.NewNullLogger()); close(served) }()
	t.Cleanup(func() { cancel(); <-served })

	ask := func(c net.Conn) error {
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return err
	}
	var conns []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	for _, c := range conns[:2] {
		if err := ask(c); err != nil {
			t.Fatalf("a client within the cap: %v", err)
		}
	}
	// The third waits to be accepted while two are held...
	_ = conns[2].SetDeadline(time.Now().Add(100 * time.Millisecond))
	if err := ask(conns[2]); err == nil {
		t.Fatal("a third client was served with two held")
	}
	// ...and the two idle ones are let go, after which it is served.
	for _, c := range conns[:2] {
		_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("an idle client after %s: read %d, %v; want the connection closed", serveIdle, n, err)
		}
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	if err := ask(c); err != nil {
		t.Fatalf("a client once the idle ones were let go: %v", err)
	}
}

// A listen address that is taken stops the start, before any dial.
func TestListenTakenRefusesToStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	coord := fakecoord.Start(t, token)
	cfg := config.Default()
	cfg.Coordinator.URL, cfg.Coordinator.Token, cfg.Node.Name = coord.URL, token, "n"
	cfg.Listen, cfg.StateDir = ln.Addr().String(), t.TempDir()
	err = Run(context.Background(), cfg, nil, WithGPUs(oneGPU{}))
	if err == nil || !strings.Contains(err.Error(), "cannot serve /metrics and /healthz") {
		t.Errorf("Run = %v", err)
	}
	select {
	case <-coord.Conns:
		t.Error("the agent dialled the coordinator")
	default:
	}
}

// A probe the coordinator asks for, of an engine that has just gone
// down, says in the log that it waits, why, and how long it still will.
func TestServiceProbeSaysItWaits(t *testing.T) {
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorVLLM, Model: "test/model", SingleTPS: 400, Batch16TPS: 3200}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	coord := fakecoord.Start(t, token)
	cfg := config.Default()
	cfg.Coordinator.URL, cfg.Coordinator.Token, cfg.Node.Name = coord.URL, token, "gpu-test"
	cfg.Engines = []config.Engine{{Kind: "vllm", URL: s.URL()}}
	cfg.SnapshotInterval, cfg.PollInterval = 50*time.Millisecond, 100*time.Millisecond
	r := runAgent(t, cfg)
	fc := <-coord.Conns
	var snap *wire.Snapshot
	for snap == nil || snap.Engines[0].CapacityKey == "" {
		snap = fc.Next(t, wire.TypeSnapshot).Snapshot
	}
	s.Close()
	fc.Send(t, &wire.ProbeRequest{RequestID: "r1", CapacityKey: snap.Engines[0].CapacityKey, Reason: wire.ReasonOnDemand})
	want := regexp.MustCompile(`\[INFO\]  heft-agent\.probe: engine not ready; the probe waits: url=` + regexp.QuoteMeta(s.URL()) +
		` reason="connection refused" waited=\d+s waits_up_to="(2m0s|1m5\ds) more"`)
	testutil.Eventually(t, "the wait in the log", 15*time.Second, func() bool { return want.MatchString(r.log.String()) })
}
