package coordinator

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"heft/coordinator/config"
	"heft/shared/testutil"
	"heft/shared/wire"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

const (
	agentToken = "agent-token-for-tests-0123456789abcdef"
	adminToken = "admin-token-for-tests-0123456789abcdef"
	testModel  = "Qwen/Qwen3-8B"
)

// testConfig is a valid configuration over a fresh state folder.
func testConfig(t *testing.T) config.Config {
	cfg := config.Default()
	cfg.Listen, cfg.StateDir = "127.0.0.1:0", t.TempDir()
	cfg.AgentToken, cfg.AdminToken = agentToken, adminToken
	// The test's agents stand for nodes elsewhere (10.0.x.y) while they
	// connect over loopback: their addresses are allowed.
	cfg.AdvertiseAllow = []string{"0.0.0.0/0", "::/0"}
	// These tests are about other rules: a worker weighs what it measured
	// from its first measurement (fleet's probation tests cover these).
	cfg.Fleet.Probation, cfg.Fleet.MaxNodeShare = 0, 0
	return cfg
}

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug})
}

// clock is a settable clock for the fleet.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// running is a coordinator serving on a loopback port.
type running struct {
	*Coordinator
	base   string             // http://127.0.0.1:port
	cancel context.CancelFunc // starts the shutdown
	stop   func() error       // shuts down and returns Run's error
}

// start builds a coordinator from cfg and runs it until the test ends
// (or stop is called, which returns Run's error).
func start(t *testing.T, cfg config.Config, opts ...Option) *running {
	t.Helper()
	return startOn(t, "127.0.0.1:0", cfg, opts...)
}

// startOn is start on addr: a restarted coordinator on the address its
// followers know (a port just closed may take a moment to free).
func startOn(t *testing.T, addr string, cfg config.Config, opts ...Option) *running {
	t.Helper()
	c, err := New(cfg, append([]Option{WithLogger(testLogger(t))}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	var ln net.Listener
	deadline := time.Now().Add(10 * time.Second)
	for ln == nil {
		if ln, err = net.Listen("tcp", addr); err != nil && time.Now().After(deadline) {
			_ = c.Close()
			t.Fatal(err)
		}
		if err != nil {
			time.Sleep(50 * time.Millisecond) // the port is still being freed
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, ln) }()
	var once sync.Once
	var runErr error
	r := &running{Coordinator: c, base: "http://" + ln.Addr().String(), cancel: cancel}
	r.stop = func() error {
		once.Do(func() {
			cancel()
			runErr = errors.Join(<-done, c.Close())
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	return r
}

// do makes one API request; token "" sends none.
func (r *running) do(t *testing.T, method, path, token, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, r.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

// exposes reports whether /metrics holds line, exactly as the text
// exposition writes it (labels sorted by name).
func (r *running) exposes(t *testing.T, line string) bool {
	t.Helper()
	status, body := r.do(t, "GET", "/metrics", "", "")
	if status != http.StatusOK {
		t.Fatalf("/metrics: %d %s", status, body)
	}
	return slices.Contains(strings.Split(string(body), "\n"), line)
}

// agent is a scripted agent on a real websocket that has said hello.
type agent struct {
	t    *testing.T
	c    *websocket.Conn
	node string
}

// connectAgent dials as node's agent and says hello, offering ms
// (wire.Hello.Measurements).
func connectAgent(t *testing.T, r *running, node string, ms ...wire.CachedMeasurement) *agent {
	t.Helper()
	a, _ := dialAgent(t, r, wire.Hello{Node: node, Measurements: ms})
	return a
}

// dialAgent dials as hello's agent, says hello (its version and host
// filled in), and returns the agent and the welcome.
func dialAgent(t *testing.T, r *running, hello wire.Hello) (*agent, *wire.Welcome) {
	t.Helper()
	node := hello.Node
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(r.base, "http")+"/api/v1/agent",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + agentToken}}})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.SetReadLimit(4 * wire.MaxMessageBytes)
	t.Cleanup(func() { _ = c.CloseNow() })
	a := &agent{t: t, c: c, node: node}
	hello.AgentVersion, hello.Host = "test", wire.Host{Hostname: node, OS: "linux", Arch: "amd64"}
	a.send(&hello)
	env := a.read()
	if env.Type != wire.TypeWelcome {
		t.Fatalf("first message is %s, want welcome", env.Type)
	}
	return a, env.Welcome
}

func (a *agent) send(payload any) {
	a.t.Helper()
	data, err := wire.Encode(payload)
	if err != nil {
		a.t.Fatalf("encode: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.c.Write(ctx, websocket.MessageText, data); err != nil {
		a.t.Fatalf("write: %v", err)
	}
}

// read returns the next message; an error (the coordinator closing, say)
// is returned as such.
func (a *agent) read() *wire.Envelope {
	a.t.Helper()
	env, err := a.next()
	if err != nil {
		a.t.Fatalf("read: %v", err)
	}
	return env
}

func (a *agent) next() (*wire.Envelope, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, data, err := a.c.Read(ctx)
	if err != nil {
		return nil, err
	}
	return wire.Decode(data)
}

// oneEngine connects node gpu-a's agent reporting one engine of
// testModel on port 8000, and returns the agent and the engine's key.
func oneEngine(t *testing.T, r *running) (*agent, string) {
	t.Helper()
	key := "gpu-a|vllm|" + testModel + "|--port=8000"
	a := connectAgent(t, r, "gpu-a")
	s := snapshot("gpu-a", time.Now(), engine(key, 8000))
	a.send(&s)
	return a, key
}

// engine is one ready vLLM engine of testModel.
func engine(key string, port int) wire.Engine {
	return wire.Engine{Kind: wire.EngineVLLM, URL: "http://127.0.0.1:" + strconv.Itoa(port), Model: testModel, Ready: true,
		CapacityKey: key, LaunchArgs: []string{"--port=" + strconv.Itoa(port)}}
}

func snapshot(node string, at time.Time, engines ...wire.Engine) wire.Snapshot {
	return wire.Snapshot{Node: node, At: at, Host: wire.Host{Hostname: node, OS: "linux", Arch: "amd64"}, Engines: engines}
}

// measured is a valid, complete burst result for key that finished at at.
func measured(key, node string, tps float64, at time.Time) wire.Measurement {
	return wire.Measurement{
		CapacityKey: key, Node: node, EngineKind: wire.EngineVLLM, EngineURL: "http://127.0.0.1:8000", Model: testModel,
		ThroughputTPS: tps, WarmupTPS: tps * 0.9, OutputTokens: 2048, ExpectedTokens: 2048, WallSeconds: 2048 / tps,
		Requests: 16, Concurrency: 16, TokensPerReq: 128, Complete: true, Trigger: wire.ReasonRegistration,
		StartedAt: at.Add(-3 * time.Second), FinishedAt: at,
	}
}

// needTool returns the path of a program a test runs; without it the test
// is skipped, or fails under CI, which installs it.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing", name)
		}
		t.Skipf("%s not installed", name)
	}
	return p
}
