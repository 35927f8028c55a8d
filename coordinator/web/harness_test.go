package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	coord "heft/coordinator"
	"heft/coordinator/config"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

const (
	agentToken = "agent-s3cret-for-the-dashboard-tests"
	adminToken = "adm1n-t0ken-for-the-dashboard-tests"
)

// coordinator is a real heft coordinator, assembled as the binary
// assembles it, on a loopback port.
type coordinator struct {
	base string // http://127.0.0.1:port
	stop func() // shuts the server down and waits for it
}

func startCoordinator(t *testing.T) *coordinator { return startCoordinatorWith(t, nil) }

// startCoordinatorWith starts one whose configuration tweak adjusts.
func startCoordinatorWith(t *testing.T, tweak func(*config.Config)) *coordinator {
	t.Helper()
	logger := hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Warn})
	cfg := config.Default()
	cfg.Listen, cfg.StateDir = "127.0.0.1:0", t.TempDir()
	cfg.AgentToken, cfg.AdminToken = agentToken, adminToken
	// The test's agents stand for nodes elsewhere (10.0.x.y) while they
	// connect over loopback: their addresses are allowed.
	cfg.AdvertiseAllow = []string{"0.0.0.0/0", "::/0"}
	// A worker weighs what it measured from its first measurement
	// (probation and the node share cap are the fleet's tests).
	cfg.Fleet.Probation, cfg.Fleet.MaxNodeShare = 0, 0
	if tweak != nil {
		tweak(&cfg)
	}
	co, err := coord.New(cfg, coord.WithLogger(logger))
	if err != nil {
		t.Fatalf("coordinator: %v", err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		_ = co.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- co.Run(ctx, ln) }()
	var once sync.Once
	c := &coordinator{base: "http://" + ln.Addr().String()}
	c.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("coordinator: %v", err)
			}
		})
	}
	t.Cleanup(c.stop)
	return c
}

// workers reads GET /api/v1/workers.
func (c *coordinator) workers(t *testing.T) []view.Worker {
	t.Helper()
	resp, err := http.Get(c.base + "/api/v1/workers")
	if err != nil {
		t.Fatalf("get workers: %v", err)
	}
	defer resp.Body.Close()
	var body view.Workers
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("get workers: status %d, %v", resp.StatusCode, err)
	}
	return body.Workers
}

// probe asks, as an admin, for an on-demand measurement of a worker.
func (c *coordinator) probe(t *testing.T, id string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.base+"/api/v1/workers/"+id+"/probe", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("probe %s: %v", id, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("probe %s: %s", id, resp.Status)
	}
}

// waitWorkers polls the API until ok accepts the fleet.
func (c *coordinator) waitWorkers(t *testing.T, what string, ok func([]view.Worker) bool) []view.Worker {
	t.Helper()
	var ws []view.Worker
	done := false
	defer func() {
		if !done {
			t.Logf("have %d workers: %s", len(ws), states(ws))
		}
	}()
	testutil.Eventually(t, what, 60*time.Second, func() bool {
		ws = c.workers(t)
		return ok(ws)
	})
	done = true
	return ws
}

func states(ws []view.Worker) string {
	var b strings.Builder
	for _, w := range ws {
		fmt.Fprintf(&b, "\n  %s: %s", w.ID, w.State)
	}
	return b.String()
}

// agent is a scripted heft-agent: a real websocket to /api/v1/agent that
// says hello, sends the snapshots the test gives it and answers every probe
// request for a capacity key it has an answer for.
type agent struct {
	node string
	conn *websocket.Conn
	done chan struct{}

	mu      sync.Mutex
	answers map[string]wire.Measurement   // by capacity key
	earlier map[string][]wire.Measurement // answered first, one request each, as they are
}

// replies is how many probe results may wait for the writer: more than
// one agent's engines (wire.MaxEngines), each asked once or twice.
const replies = 4 * wire.MaxEngines

func dialAgent(t *testing.T, c *coordinator, node string) *agent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(c.base, "http") + "/api/v1/agent"
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + agentToken}},
	})
	if err != nil {
		t.Fatalf("agent %s: dial: %v", node, err)
	}
	conn.SetReadLimit(wire.MaxMessageBytes)
	a := &agent{node: node, conn: conn, done: make(chan struct{}), answers: map[string]wire.Measurement{},
		earlier: map[string][]wire.Measurement{}}
	t.Cleanup(func() {
		_ = conn.CloseNow()
		<-a.done
	})
	a.send(t, &wire.Hello{Node: node, AgentVersion: "test", Host: testHost(node)})
	_, data, err := conn.Read(ctx)
	if err != nil {
		t.Fatalf("agent %s: read welcome: %v", node, err)
	}
	if env, err := wire.Decode(data); err != nil || env.Type != wire.TypeWelcome {
		t.Fatalf("agent %s: first message %s, want welcome", node, data)
	}
	go a.readLoop()
	return a
}

func testHost(node string) wire.Host {
	return wire.Host{Hostname: node, OS: "linux", Arch: "amd64", CPUCores: 32, MemoryTotal: 256 << 30, MemoryAvailable: 200 << 30}
}

func (a *agent) write(payload any) error {
	data, err := wire.Encode(payload)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return a.conn.Write(ctx, websocket.MessageText, data)
}

func (a *agent) send(t *testing.T, payload any) {
	t.Helper()
	if err := a.write(payload); err != nil {
		t.Fatalf("agent %s: send %T: %v", a.node, payload, err)
	}
}

// answer sets what the agent reports when asked to measure m.CapacityKey.
func (a *agent) answer(m wire.Measurement) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answers[m.CapacityKey] = m
}

// before sets measurements, already time-stamped, that the agent reports,
// one per probe request, ahead of its answer for their capacity key: a
// worker's history (the coordinator takes a result only for a request).
func (a *agent) before(key string, ms []wire.Measurement) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.earlier[key] = ms
}

// readLoop keeps reading, as a real agent does, and answers probe requests
// with a fresh measurement. It ends when the connection does.
func (a *agent) readLoop() {
	defer close(a.done)
	// Results go out from a writer of their own, in order, so that this
	// loop keeps reading: a real agent answers the coordinator's pings
	// while it sends, and one that stops reading for the 5 s ping timeout
	// (32 results, each waiting on a coordinator busy with 500 workers at
	// a load of 25) is dropped.
	out := make(chan *wire.ProbeResult, replies)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for r := range out {
			if err := a.write(r); err != nil {
				_ = a.conn.CloseNow()
				return
			}
		}
	}()
	defer func() { close(out); <-wrote }()
	for {
		_, data, err := a.conn.Read(context.Background())
		if err != nil {
			return
		}
		env, err := wire.Decode(data)
		if err != nil || env.Type != wire.TypeProbeRequest {
			continue
		}
		req := env.ProbeRequest
		a.mu.Lock()
		m, ok := a.answers[req.CapacityKey]
		var old *wire.Measurement
		if q := a.earlier[req.CapacityKey]; len(q) > 0 {
			old, a.earlier[req.CapacityKey] = &q[0], q[1:]
		}
		a.mu.Unlock()
		switch {
		case old != nil:
			out <- &wire.ProbeResult{RequestID: req.RequestID, Measurement: *old}
		case ok:
			now := time.Now()
			m.Trigger, m.StartedAt, m.FinishedAt = req.Reason, now.Add(-time.Duration(m.WallSeconds*float64(time.Second))), now
			out <- &wire.ProbeResult{RequestID: req.RequestID, Measurement: m}
		}
	}
}

// measurement is a complete, valid burst result: 16 requests of 128 tokens.
func measurement(node string, e wire.Engine, tps, warmup float64) wire.Measurement {
	const tokens = 16 * 128
	return wire.Measurement{
		CapacityKey: e.CapacityKey, Node: node, EngineKind: e.Kind, EngineURL: e.URL, Model: e.Model,
		ThroughputTPS: tps, WarmupTPS: warmup, OutputTokens: tokens, ExpectedTokens: tokens,
		WallSeconds: tokens / tps, Requests: 16, Concurrency: 16, TokensPerReq: 128, Complete: true,
	}
}

// engine is a ready engine listed by an agent, keyed like the real agent keys it.
func engine(node, kind, model, version string, port int, args ...string) wire.Engine {
	octet := 10
	for _, c := range node {
		octet = (octet*31 + int(c)) % 240
	}
	url := fmt.Sprintf("http://10.0.1.%d:%d", octet+10, port)
	return wire.Engine{
		Kind: kind, URL: url, Model: model, Version: version, Ready: true,
		CapacityKey: strings.Join(append([]string{node, kind, model}, args...), "|"),
		LaunchArgs:  args, Load: wire.Load{Known: true},
	}
}

func gpu(index int, name, uuid string, totalGiB, freeGiB float64, sm, smMax uint32) wire.GPU {
	total, free := uint64(totalGiB*(1<<30)), uint64(freeGiB*(1<<30))
	return wire.GPU{
		Index: index, UUID: uuid, Name: name, MemoryTotal: total, MemoryFree: free, MemoryUsed: total - free,
		SMClockMHz: sm, SMClockMaxMHz: smMax, TemperatureC: 61, PowerDrawW: 240, PowerLimitW: 350, UtilizationPercent: 87,
	}
}

// browser starts Debian's chromium, headless, in a fresh profile. Without
// chromium the test is skipped, except in CI (CI set), where it fails.
// Every uncaught exception and console.error of the page is collected in
// the returned slice, read under its mutex.
// unlockAdmin enters the admin token in the page and waits for the admin
// actions to show.
func unlockAdmin(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS("#admin-token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
	); err != nil {
		t.Fatalf("enter the admin token: %v", err)
	}
	waitJS(t, ctx, "admin unlocked", `document.body.classList.contains('admin')`)
}

func browser(t *testing.T, width, height int) (context.Context, *pageErrors) {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("chromium is not installed (.ci/run installs Debian's chromium): %v", err)
		}
		t.Skipf("chromium is not installed, skipping the browser test (apt-get install chromium): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // tests run as root in CI containers
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
	)
	// The whole browser session has a deadline, so a hung page fails the
	// test instead of stalling it.
	root, cancelRoot := context.WithTimeout(context.Background(), 90*time.Second)
	actx, cancelAlloc := chromedp.NewExecAllocator(root, opts...)
	errs := &pageErrors{}
	ctx, cancelCtx := chromedp.NewContext(actx, chromedp.WithListener(errs.listen))
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
		cancelRoot()
	})
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(int64(width), int64(height))); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx, errs
}

// pageErrors collects what went wrong inside the page.
type pageErrors struct {
	mu   sync.Mutex
	list []string
}

func (p *pageErrors) listen(ev any) {
	var msg string
	switch e := ev.(type) {
	case *runtime.EventExceptionThrown:
		msg = "exception: " + e.ExceptionDetails.Text
		if e.ExceptionDetails.Exception != nil {
			msg += " " + e.ExceptionDetails.Exception.Description
		}
	case *runtime.EventConsoleAPICalled:
		if e.Type != runtime.ConsoleAPICalledTypeError {
			return
		}
		msg = "console.error:"
		for _, a := range e.Args {
			msg += " " + string(a.Value) + a.Description
		}
	default:
		return
	}
	p.mu.Lock()
	p.list = append(p.list, msg)
	p.mu.Unlock()
}

func (p *pageErrors) check(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.list {
		t.Errorf("page: %s", m)
	}
}

// eval runs JavaScript in the page and decodes its result.
func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// waitJS polls a JavaScript predicate in the page until it is truthy.
func waitJS(t *testing.T, ctx context.Context, what, js string) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](js,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timeout") {
			t.Fatalf("timed out waiting for %s (%s)", what, js)
		}
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// jsString quotes s for JavaScript source.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// card is a CSS selector for a worker's card.
func card(id string) string {
	return "article[data-worker-id=" + jsStringCSS(id) + "]"
}

// jsStringCSS quotes s as a CSS string; capacity keys hold no quotes or
// backslashes, but escape them anyway.
func jsStringCSS(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
