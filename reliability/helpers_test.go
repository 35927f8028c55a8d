package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/coordinator"
	"heft/coordinator/config"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

const (
	agentToken = "reliability-agent-token-0123456789"
	adminToken = "reliability-admin-token-0123456789"
	testModel  = "Qwen/Qwen3-8B"
)

// quietLogger logs warnings and errors into the test's output only; the
// tests here run hundreds of connections and info lines would drown them.
func quietLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Warn})
}

// coord is an in-process coordinator, assembled as heft-coordinator
// assembles it, on a loopback listener.
type coord struct {
	t    *testing.T
	addr string // host:port it listens on
	*coordinator.Coordinator

	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
}

// startCoord starts a coordinator over state dir on addr ("127.0.0.1:0"
// for any port; an address used before is retried while the old socket
// lingers). tweak may adjust the configuration. It stops when the test ends.
func startCoord(t *testing.T, dir, addr string, logger hclog.Logger, tweak func(*config.Config)) *coord {
	t.Helper()
	cfg := config.Default()
	cfg.Listen, cfg.StateDir = addr, dir
	cfg.AgentToken, cfg.AdminToken = agentToken, adminToken
	// A worker weighs what it measured from its first measurement; a test
	// of probation or the node share cap turns them on in tweak.
	cfg.Fleet.Probation, cfg.Fleet.MaxNodeShare = 0, 0
	// Every test agent connects from loopback: hundreds of new names a
	// minute from one address are the tests' shape, not an attack.
	cfg.Nodes.NewPerToken, cfg.Nodes.NewPerAddress = 0, 0
	if tweak != nil {
		tweak(&cfg)
	}
	co, err := coordinator.New(cfg, coordinator.WithLogger(logger))
	if err != nil {
		t.Fatalf("coordinator: %v", err)
	}
	t.Cleanup(func() { _ = co.Close() }) // Run closes it too; this is for a failed start
	var ln net.Listener
	testutil.Eventually(t, "the address "+addr+" free", 10*time.Second, func() bool {
		ln, err = net.Listen("tcp", addr)
		return err == nil
	})
	c := &coord{t: t, addr: ln.Addr().String(), Coordinator: co, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() { c.done <- co.Run(ctx, ln) }()
	t.Cleanup(c.stop)
	return c
}

// stop shuts the coordinator down as a signal would; Run closes its state.
func (c *coord) stop() {
	c.stopOnce.Do(func() {
		c.cancel()
		select {
		case err := <-c.done:
			if err != nil {
				c.t.Errorf("coordinator Run: %v", err)
			}
		case <-time.After(60 * time.Second):
			c.t.Error("coordinator did not stop within 60s")
		}
		if err := c.Close(); err != nil { // Run closed it; this is its error
			c.t.Errorf("close state: %v", err)
		}
	})
}

func (c *coord) api() api { return newAPI("http://" + c.addr) }

func (c *coord) agentURL() string { return "ws://" + c.addr + "/api/v1/agent" }

// api is a client of the coordinator's JSON API. Its methods return
// errors rather than failing the test: they run in goroutines too.
type api struct {
	base   string
	client *http.Client
}

func newAPI(base string) api {
	return api{base: base, client: &http.Client{Timeout: 10 * time.Second}}
}

func (a api) do(ctx context.Context, method, path, token, body string) (int, []byte, error) {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, r)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// workers is GET /api/v1/workers, keyed by worker ID.
func (a api) workers(ctx context.Context) (map[string]view.Worker, error) {
	status, body, err := a.do(ctx, http.MethodGet, "/api/v1/workers", "", "")
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET /api/v1/workers: %d %s", status, body)
	}
	var ws view.Workers
	if err := json.Unmarshal(body, &ws); err != nil {
		return nil, fmt.Errorf("GET /api/v1/workers: %w", err)
	}
	out := make(map[string]view.Worker, len(ws.Workers))
	for _, w := range ws.Workers {
		out[w.ID] = w
	}
	return out, nil
}

// pin is POST /api/v1/workers/{id}/pin; a nil error means 200, acknowledged.
func (a api) pin(ctx context.Context, id string, weight float64) error {
	status, body, err := a.do(ctx, http.MethodPost, "/api/v1/workers/"+id+"/pin", adminToken,
		fmt.Sprintf(`{"weight":%v}`, weight))
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("pin %s: %d %s", id, status, body)
	}
	return nil
}

// mustWorkers fetches the workers or fails the test.
func mustWorkers(t *testing.T, a api) map[string]view.Worker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := a.workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

// measurement is a valid, complete burst result.
func measurement(key, node string, tps float64, finished time.Time) wire.Measurement {
	return wire.Measurement{
		CapacityKey: key, Node: node, EngineKind: wire.EngineVLLM, EngineURL: "http://127.0.0.1:8000", Model: testModel,
		ThroughputTPS: tps, WarmupTPS: tps * 0.9, OutputTokens: 2048, ExpectedTokens: 2048, WallSeconds: 2048 / tps,
		Requests: 16, Concurrency: 16, TokensPerReq: 128, Complete: true, Trigger: wire.ReasonRegistration,
		StartedAt: finished.Add(-time.Duration(2048 / tps * float64(time.Second))), FinishedAt: finished,
	}
}

// fixedAgent is a light link.Handler: a fixed snapshot of one ready engine
// with its own capacity key, a Probe that counts its calls and returns a
// valid measurement, and a count of cached measurements received. With a
// long PollEvery, Snapshot is called once per session, as the session
// starts, so its calls time the (re)connections.
type fixedAgent struct {
	node, key, model string
	tps              float64
	url              string

	probes atomic.Int64
	cached atomic.Int64

	mu       sync.Mutex
	sessions []time.Time
}

func newFixedAgent(node string, port int, tps float64) *fixedAgent {
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	return &fixedAgent{node: node, key: node + "|vllm|" + testModel + "|port=" + fmt.Sprint(port), model: testModel, tps: tps, url: url}
}

// withModel makes the agent's engine serve model instead of testModel.
func (a *fixedAgent) withModel(model string) *fixedAgent {
	a.model = model
	a.key = strings.Replace(a.key, "|"+testModel+"|", "|"+model+"|", 1)
	return a
}

func (a *fixedAgent) Snapshot(ctx context.Context) wire.Snapshot {
	a.mu.Lock()
	a.sessions = append(a.sessions, time.Now())
	a.mu.Unlock()
	return wire.Snapshot{Node: a.node, At: time.Now().UTC(), Host: wire.Host{Hostname: a.node, OS: "linux", Arch: "amd64"},
		GPUs: []wire.GPU{}, Engines: []wire.Engine{{Kind: wire.EngineVLLM, URL: a.url, Model: a.model, Ready: true,
			CapacityKey: a.key, LaunchArgs: []string{"port=" + a.url[strings.LastIndexByte(a.url, ':')+1:]},
			Load: wire.Load{Known: true}}}}
}

func (a *fixedAgent) Probe(ctx context.Context, req wire.ProbeRequest) (wire.Measurement, error) {
	a.probes.Add(1)
	if req.CapacityKey != a.key {
		return wire.Measurement{}, errors.New("unknown capacity key " + req.CapacityKey)
	}
	m := measurement(a.key, a.node, a.tps, time.Now().UTC())
	m.EngineURL, m.Model, m.Trigger = a.url, a.model, req.Reason
	return m, nil
}

func (a *fixedAgent) Cached(m wire.CachedMeasurement) { a.cached.Add(1) }

func (a *fixedAgent) Held() []wire.CachedMeasurement { return nil }

// sessionsSince returns the session starts at or after t0.
func (a *fixedAgent) sessionsSince(t0 time.Time) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return timesSince(a.sessions, t0)
}

// timesSince returns the times at or after t0.
func timesSince(times []time.Time, t0 time.Time) []time.Time {
	var out []time.Time
	for _, t := range times {
		if !t.Before(t0) {
			out = append(out, t)
		}
	}
	return out
}
