package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"

	"heft/agent/cli"
	coord "heft/coordinator"
	"heft/coordinator/config"
	"heft/coordinator/fleet"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
	"heft/sim"
)

const (
	agentToken = "e2e-agent-token-0123456789abcdefgh"
	adminToken = "e2e-admin-token-0123456789abcdefgh"
	model      = "Qwen/Qwen3-8B"
)

// coordinator is a real heft-coordinator on loopback, assembled as the
// binary assembles it.
type coordinator struct {
	t      *testing.T
	co     *coord.Coordinator
	addr   string
	dir    string
	cancel context.CancelFunc
	done   chan struct{}
	scheme string       // http or https
	client *http.Client // trusts the coordinator's certificate
}

func startCoordinator(t *testing.T, dir, addr string) *coordinator {
	t.Helper()
	return startCoordinatorWith(t, dir, addr, nil)
}

// startCoordinatorWith lets a test adjust the configuration (TLS, say).
func startCoordinatorWith(t *testing.T, dir, addr string, adjust func(*config.Config)) *coordinator {
	t.Helper()
	logger := hclog.New(&hclog.LoggerOptions{Name: "coordinator", Output: t.Output(), Level: hclog.Warn})
	cfg := config.Default()
	cfg.Listen, cfg.StateDir, cfg.AgentToken, cfg.AdminToken = addr, dir, agentToken, adminToken
	// The simulated engines weigh what they measured from their first
	// measurement (probation and the node share cap are the fleet's tests).
	cfg.Fleet.Probation, cfg.Fleet.MaxNodeShare = 0, 0
	if adjust != nil {
		adjust(&cfg)
	}
	co, err := coord.New(cfg, coord.WithLogger(logger))
	if err != nil {
		t.Fatalf("coordinator: %v", err)
	}
	t.Cleanup(func() { _ = co.Close() }) // Run closes it too; this is for a failed start
	// A restarted coordinator takes its old address back; the kernel may
	// need a moment to release it.
	var ln net.Listener
	defer func() {
		if ln == nil {
			t.Logf("listen: %v", err)
		}
	}()
	testutil.Eventually(t, "the address "+addr+" free", 5*time.Second, func() bool {
		ln, err = net.Listen("tcp", addr)
		return err == nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	c := &coordinator{t: t, co: co, addr: ln.Addr().String(), dir: dir, cancel: cancel, done: make(chan struct{}),
		scheme: "http", client: http.DefaultClient}
	go func() {
		defer close(c.done)
		if err := co.Run(ctx, ln); err != nil {
			t.Errorf("coordinator: %v", err)
		}
	}()
	t.Cleanup(c.stop)
	return c
}

// stop shuts the coordinator down as a signal would; Run closes its state.
func (c *coordinator) stop() {
	c.cancel()
	<-c.done
}

func (c *coordinator) url() string { return c.scheme + "://" + c.addr }

func (c *coordinator) workers(t *testing.T) []view.Worker {
	t.Helper()
	var body view.Workers
	if code := c.do(t, http.MethodGet, "/api/v1/workers", "", nil, &body); code != http.StatusOK {
		t.Fatalf("GET /api/v1/workers: HTTP %d", code)
	}
	return body.Workers
}

func (c *coordinator) do(t *testing.T, method, path, token string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, c.url()+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode < 300 {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: decode: %v", method, path, err)
		}
	}
	return resp.StatusCode
}

// waitFor follows the coordinator's event stream (the dashboard's: the
// whole fleet on connect and after every change) until ok accepts the
// workers. Polling the API instead would load the machine while the sims'
// bursts are being timed.
func (c *coordinator) waitFor(t *testing.T, what string, limit time.Duration, ok func([]view.Worker) bool) []view.Worker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url()+"/api/v1/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		t.Fatalf("event stream: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 64<<20)
	// The stream starts with the whole fleet ("workers"), then sends what
	// changed ("changes": changed workers and removed IDs).
	var ws view.Workers
	byID := map[string]view.Worker{}
	name := ""
	for sc.Scan() {
		if n, isName := strings.CutPrefix(sc.Text(), "event: "); isName {
			name = n
			continue
		}
		data, isData := strings.CutPrefix(sc.Text(), "data: ")
		if !isData {
			continue
		}
		var ev struct {
			Workers []view.Worker `json:"workers"`
			Removed []string      `json:"removed"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event stream: %v", err)
		}
		if name == "workers" {
			clear(byID)
		}
		for _, w := range ev.Workers {
			byID[w.ID] = w
		}
		for _, id := range ev.Removed {
			delete(byID, id)
		}
		ws.Workers = slices.SortedFunc(maps.Values(byID), func(a, b view.Worker) int {
			return cmp.Or(strings.Compare(a.Model, b.Model), strings.Compare(a.Node, b.Node), strings.Compare(a.URL, b.URL), strings.Compare(a.ID, b.ID))
		})
		if ok(ws.Workers) {
			return ws.Workers
		}
	}
	data, _ := json.MarshalIndent(ws.Workers, "", "  ")
	t.Fatalf("waiting for %s: the event stream ended (%v) after %s; workers:\n%s", what, sc.Err(), limit, data)
	return nil
}

// probeRequests is the number of probe requests the coordinator has made
// since it started (heft_probe_requests_total, every reason), read with
// the Prometheus text parser.
func (c *coordinator) probeRequests(t *testing.T) float64 {
	t.Helper()
	resp, err := c.client.Get(c.url() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(prommodel.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	mf := mfs["heft_probe_requests_total"]
	if mf == nil {
		t.Fatal("no heft_probe_requests_total on /metrics")
	}
	n := 0.0
	for _, m := range mf.GetMetric() {
		n += m.GetCounter().GetValue()
	}
	return n
}

// noProbeDue runs a fleet tick now, as the coordinator does every second,
// and fails the test if it asks for a probe.
func (c *coordinator) noProbeDue(t *testing.T) {
	t.Helper()
	if acts := c.co.Fleet().Tick(); len(acts) != 0 {
		t.Errorf("a fleet tick asks for %d probes: %+v", len(acts), acts[0].Message)
	}
}

// waitSeenAfter waits until the coordinator has handled a snapshot taken
// after t0 from each node's agent.
func (c *coordinator) waitSeenAfter(t *testing.T, t0 time.Time, nodes ...string) {
	t.Helper()
	c.waitFor(t, fmt.Sprintf("a snapshot from %v after %s", nodes, t0.Format(time.TimeOnly)), 60*time.Second, func(ws []view.Worker) bool {
		for _, n := range nodes {
			if w, ok := byNode(ws, n); !ok || w.LastSeen == nil || !w.LastSeen.After(t0) {
				return false
			}
		}
		return true
	})
}

// startSim starts a simulated engine on addr and stops it with the test.
// An address used before is retried while the old socket lingers.
func startSim(t *testing.T, cfg sim.Config, addr string) *sim.Server {
	t.Helper()
	var s *sim.Server
	var err error
	defer func() {
		if s == nil {
			t.Logf("sim: %v", err)
		}
	}()
	testutil.Eventually(t, "a sim on "+addr, 5*time.Second, func() bool {
		s, err = sim.Start(cfg, addr)
		return err == nil
	})
	t.Cleanup(func() { s.Close() })
	return s
}

// agent is a real heft-agent run, in process.
type agent struct {
	cancel context.CancelFunc
	done   chan int
	out    *testutil.SyncBuffer
}

func startAgent(t *testing.T, c *coordinator, node, kind, engineURL, logPath string) *agent {
	t.Helper()
	return startAgentWith(t, "ws://"+c.addr+"/api/v1/agent", "", node, kind, engineURL, logPath)
}

// startAgentWith starts an agent with its coordinator URL and extra
// [coordinator] settings (ca_file, say).
func startAgentWith(t *testing.T, coordURL, extra, node, kind, engineURL, logPath string) *agent {
	t.Helper()
	text := fmt.Sprintf("[coordinator]\nurl = %q\ntoken = %q\n%s\n[node]\nname = %q\n[[engine]]\nkind = %q\nurl = %q\nlog = %q\n",
		coordURL, agentToken, extra, node, kind, engineURL, logPath)
	return runAgentConfig(t, text)
}

// runAgentConfig runs heft-agent on a whole configuration file's text.
func runAgentConfig(t *testing.T, text string) *agent {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "agent.toml")
	if !strings.Contains(text, "state_dir") {
		// Where the agent keeps its node credential: the test's, not the host's.
		text = fmt.Sprintf("state_dir = %q\n", filepath.Join(dir, "state")) + text
	}
	if err := os.WriteFile(cfgPath, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{cancel: cancel, done: make(chan int, 1), out: &testutil.SyncBuffer{}}
	go func() {
		a.done <- cli.RunAgent(ctx, []string{"--config", cfgPath, "--log-level", "warn"}, func(string) string { return "" },
			cli.IO{In: strings.NewReader(""), Out: a.out, Err: a.out})
	}()
	t.Cleanup(func() { a.stop(t) })
	return a
}

// stop cancels the agent and waits for it to exit. The wait is a
// deadline, not a speed: under test-under-load an agent once took past
// 15 s (its link's close handshake and the server's shutdown each have
// bounded waits that a starved machine stretches); a slow stop is logged.
func (a *agent) stop(t *testing.T) {
	a.cancel()
	start := time.Now()
	select {
	case code := <-a.done:
		if code != 0 {
			t.Errorf("agent exited %d:\n%s", code, a.out.String())
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Logf("the agent took %s to stop", took.Round(time.Millisecond))
		}
		a.done <- code // stop may be called again
	case <-time.After(time.Minute):
		t.Errorf("agent did not stop within a minute:\n%s", a.out.String())
	}
}

// generated reads a sim's total generated tokens from its own metrics: the
// count of every token any burst ever asked of it.
func generated(t *testing.T, s *sim.Server) float64 {
	t.Helper()
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "vllm:generation_tokens_total") || strings.HasPrefix(line, "sglang:generation_tokens_total") {
			var v float64
			fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v)
			total += v
		}
	}
	return total
}

func byNode(ws []view.Worker, node string) (view.Worker, bool) {
	for _, w := range ws {
		if w.Node == node && w.State != view.StateOffline {
			return w, true
		}
	}
	return view.Worker{}, false
}

// measuredWithin bounds the wait for a fleet's first measurements. On a
// loaded machine one request of a burst can fail (the whole burst then
// fails, as it should), and the coordinator asks for the probe again
// fleet.FailRetry (2 min) later: the wait leaves room for that second try.
const measuredWithin = 4 * time.Minute

func settled(nodes ...string) func([]view.Worker) bool {
	return func(ws []view.Worker) bool {
		for _, n := range nodes {
			w, ok := byNode(ws, n)
			if !ok || (w.State != view.StateAdmitted && w.State != view.StateHeld) || w.Throughput == nil {
				return false
			}
		}
		return true
	}
}

func hasWarning(w view.Worker, code string) (view.Warning, bool) {
	for _, x := range w.Warnings {
		if x.Code == code {
			return x, true
		}
	}
	return view.Warning{}, false
}

// TestFleet runs the loop end to end: real sims, real agents, a real
// coordinator, all on loopback.
func TestFleet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := startCoordinator(t, filepath.Join(dir, "state"), "127.0.0.1:0")

	// Two vLLM-like workers of one model, one twice as fast as the other,
	// and an SGLang worker whose second data-parallel rank has an eighth
	// of the first's pool.
	fastLog, slowLog, unevenLog := filepath.Join(dir, "fast.log"), filepath.Join(dir, "slow.log"), filepath.Join(dir, "uneven.log")
	fast := startSim(t, sim.Config{Flavor: "vllm", Model: model, SingleTPS: 200, Batch16TPS: 1600, LogPath: fastLog}, "127.0.0.1:0")
	slow := startSim(t, sim.Config{Flavor: "vllm", Model: model, SingleTPS: 100, Batch16TPS: 800, LogPath: slowLog}, "127.0.0.1:0")
	uneven := startSim(t, sim.Config{Flavor: "sglang", Model: model, SingleTPS: 200, Batch16TPS: 1600, DP: 2,
		KVTokens: []int64{24094, 2925}, LogPath: unevenLog}, "127.0.0.1:0")
	startAgent(t, c, "gpu-fast", "vllm", fast.URL(), fastLog)
	slowAgent := startAgent(t, c, "gpu-slow", "vllm", slow.URL(), slowLog)
	startAgent(t, c, "gpu-uneven", "sglang", uneven.URL(), unevenLog)

	ws := c.waitFor(t, "all three workers measured", 90*time.Second, settled("gpu-fast", "gpu-slow", "gpu-uneven"))

	fw, _ := byNode(ws, "gpu-fast")
	sw, _ := byNode(ws, "gpu-slow")
	uw, _ := byNode(ws, "gpu-uneven")
	t.Run("weights follow measured throughput", func(t *testing.T) {
		if fw.State != view.StateAdmitted || sw.State != view.StateAdmitted {
			t.Fatalf("states: fast %s, slow %s", fw.State, sw.State)
		}
		// The product's rule, whatever the machine's load made of the
		// sims' speeds: each admitted worker's weight is its measured
		// throughput over the median of its model's admitted workers (the
		// mean of the two here), clamped. The sims' 2:1 is a wall-clock
		// figure; make bench measures it.
		def := fleet.DefaultConfig()
		median := (*fw.Throughput + *sw.Throughput) / 2
		for _, w := range []view.Worker{fw, sw} {
			want := min(max(*w.Throughput/median, def.WeightMin), def.WeightMax)
			if w.Weight == nil || math.Abs(*w.Weight/want-1) > 1e-9 {
				t.Errorf("%s: weight %v, want %.6f (throughput %.2f over the median %.2f)", w.Node, w.Weight, want, *w.Throughput, median)
			}
		}
		t.Logf("measured %.1f and %.1f tok/s (ratio %.3f; the sims are calibrated 2:1): weights %.4f and %.4f",
			*fw.Throughput, *sw.Throughput, *fw.Throughput / *sw.Throughput, *fw.Weight, *sw.Weight)
		var table view.Weights
		if code := c.do(t, http.MethodGet, "/api/v1/models/"+model+"/weights", "", nil, &table); code != http.StatusOK {
			t.Fatalf("weights: HTTP %d", code)
		}
		if len(table.Workers) != 2 {
			t.Fatalf("weight table has %d workers, want the 2 admitted: %+v", len(table.Workers), table)
		}
	})
	t.Run("uneven pools are held", func(t *testing.T) {
		if uw.State != view.StateHeld {
			t.Fatalf("uneven worker is %s, want held", uw.State)
		}
		x, ok := hasWarning(uw, wire.CodeDPPoolImbalance)
		if !ok || x.Severity != wire.SeverityCritical {
			t.Fatalf("warnings: %+v", uw.Warnings)
		}
		for _, want := range []string{"24,094", "2,925", "rank 1"} {
			if !strings.Contains(x.Message, want) {
				t.Errorf("message lacks %q: %s", want, x.Message)
			}
		}
		if len(uw.Ranks) != 2 || uw.Ranks[1].KVTokens != 2925 {
			t.Errorf("ranks: %+v", uw.Ranks)
		}
		if uw.Weight != nil {
			t.Errorf("a held worker has weight %v", *uw.Weight)
		}
	})

	t.Run("a pin needs the admin token", func(t *testing.T) {
		path := "/api/v1/workers/" + sw.ID + "/pin"
		for _, token := range []string{"", agentToken, "wrong"} {
			if code := c.do(t, http.MethodPost, path, token, map[string]float64{"weight": 1.5}, nil); code != http.StatusUnauthorized {
				t.Errorf("pin with token %q: HTTP %d, want 401", token, code)
			}
		}
		var w view.Worker
		if code := c.do(t, http.MethodPost, path, adminToken, map[string]float64{"weight": 1.5}, &w); code != http.StatusOK {
			t.Fatalf("pin with the admin token: HTTP %d", code)
		}
		if w.PinnedWeight == nil || *w.PinnedWeight != 1.5 || w.Weight == nil || *w.Weight != 1.5 {
			t.Errorf("after pin: weight %v pinned %v", w.Weight, w.PinnedWeight)
		}
	})

	// Restart the coordinator over the same state: the pin is still there
	// and nobody is measured again.
	before := map[string]float64{"fast": generated(t, fast), "slow": generated(t, slow), "uneven": generated(t, uneven)}
	addr := c.addr
	c.stop()
	restarted := time.Now()
	c = startCoordinator(t, filepath.Join(dir, "state"), addr)
	ws = c.waitFor(t, "agents back after the restart", 60*time.Second, func(ws []view.Worker) bool {
		n := 0
		for _, w := range ws {
			if w.AgentConnected && (w.State == view.StateAdmitted || w.State == view.StateHeld) {
				n++
			}
		}
		return n == 3
	})
	t.Run("a pin survives a coordinator restart", func(t *testing.T) {
		w, _ := byNode(ws, "gpu-slow")
		if w.PinnedWeight == nil || *w.PinnedWeight != 1.5 {
			t.Errorf("pinned weight after restart: %v", w.PinnedWeight)
		}
	})
	t.Run("a coordinator restart costs no burst", func(t *testing.T) {
		// The fleet decides whether to probe a worker when it handles the
		// worker's first snapshot on a connection, and counts a request
		// as it decides, so once each has been seen since the restart the
		// count is final.
		c.waitSeenAfter(t, restarted, "gpu-fast", "gpu-slow", "gpu-uneven")
		if n := c.probeRequests(t); n != 0 {
			t.Errorf("the restarted coordinator made %v probe requests", n)
		}
		c.noProbeDue(t)
		for name, s := range map[string]*sim.Server{"fast": fast, "slow": slow, "uneven": uneven} {
			if got := generated(t, s); got != before[name] {
				t.Errorf("%s generated %v tokens after the restart (before: %v): it was measured again", name, got-before[name], before[name])
			}
		}
	})

	t.Run("an engine restarted with the same arguments costs no burst", func(t *testing.T) {
		oldID := sw.ID
		port := strings.TrimPrefix(slow.URL(), "http://")
		slow.Close()
		c.waitFor(t, "the agent to report its engine down", 30*time.Second, func(ws []view.Worker) bool {
			w, ok := byNode(ws, "gpu-slow")
			return ok && w.State == view.StatePending
		})
		slow = startSim(t, sim.Config{Flavor: "vllm", Model: model, SingleTPS: 100, Batch16TPS: 800, LogPath: slowLog}, port)
		// Back to admitted: the fleet has handled the snapshot that shows
		// the engine ready again, which is when it would ask for a probe.
		back := c.waitFor(t, "the agent to report its engine back", 30*time.Second, func(ws []view.Worker) bool {
			w, ok := byNode(ws, "gpu-slow")
			return ok && w.State == view.StateAdmitted
		})
		if n := c.probeRequests(t); n != 0 {
			t.Errorf("the coordinator made %v probe requests for the restarted engine", n)
		}
		c.noProbeDue(t)
		if got := generated(t, slow); got != 0 {
			t.Errorf("the restarted engine generated %v tokens: it was measured again", got)
		}
		if w, _ := byNode(back, "gpu-slow"); w.ID != oldID {
			t.Errorf("worker after a same-args restart: id %s (was %s)", w.ID, oldID)
		}
	})

	t.Run("an engine restarted with other arguments is a new worker and is measured", func(t *testing.T) {
		oldID := sw.ID
		port := strings.TrimPrefix(slow.URL(), "http://")
		slow.Close()
		slow = startSim(t, sim.Config{Flavor: "vllm", Model: model, SingleTPS: 150, Batch16TPS: 1200, LogPath: slowLog}, port)
		ws := c.waitFor(t, "the new worker measured", 60*time.Second, func(ws []view.Worker) bool {
			for _, w := range ws {
				if w.Node == "gpu-slow" && w.ID != oldID && w.State == view.StateAdmitted && w.Throughput != nil {
					return true
				}
			}
			return false
		})
		if generated(t, slow) == 0 {
			t.Error("the new engine was never measured")
		}
		for _, w := range ws {
			if w.ID == oldID && w.State == view.StateAdmitted {
				t.Errorf("the old worker %s is still admitted", oldID)
			}
		}
	})
	_ = slowAgent
}
