package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"heft/shared/testutil"
	"heft/shared/wire"
)

const (
	agentToken  = "agent-token-for-tests-0123456789abcdef"
	adminToken  = "admin-token-for-tests-0123456789abcdef"
	viewerToken = "viewer-token-for-tests-0123456789abcdef"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func testOptions() Options {
	return Options{Tokens: Tokens{Agent: agentToken, Admin: adminToken}}
}

// testServer is a running server on a loopback port.
type testServer struct {
	*Server
	base   string // http://127.0.0.1:port
	fleet  *fakeFleet
	stop   context.CancelFunc
	runErr chan error
}

// startServer runs a server over a fake fleet; tweak may adjust it before
// it starts. The server stops when the test ends.
func startServer(t *testing.T, opts Options, tweak func(*Server)) *testServer {
	t.Helper()
	if opts.PingInterval == 0 {
		// Test agents read only when a test asks them to, so they answer
		// no ping in between; at the default 10 s a test that a loaded
		// machine stretches past 15 s loses its agents to ping_timeout.
		// The tests of pings set their own interval.
		opts.PingInterval = time.Hour
	}
	ff := newFakeFleet()
	s, err := newServer(opts, ff, hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug}))
	if err != nil {
		t.Fatalf("newServer: %v", err)
	}
	if tweak != nil {
		tweak(s)
	}
	ts := runServer(t, s, "http")
	ts.fleet = ff
	return ts
}

func runServer(t *testing.T, s *Server, scheme string) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: s, base: scheme + "://" + ln.Addr().String(), stop: cancel, runErr: make(chan error, 1)}
	go func() { ts.runErr <- s.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-ts.runErr:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return ts
}

func (ts *testServer) wsURL() string {
	return strings.Replace(ts.base, "http", "ws", 1) + "/api/v1/agent"
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// dial connects as an agent with token.
func dial(t *testing.T, ts *testServer, token string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	c, resp, err := websocket.Dial(testCtx(t), ts.wsURL(), &websocket.DialOptions{HTTPHeader: h})
	if c != nil {
		c.SetReadLimit(4 * wire.MaxMessageBytes)
		t.Cleanup(func() { _ = c.CloseNow() })
	}
	return c, resp, err
}

// agent is a test agent that has said hello and read its welcome.
type agent struct {
	t    *testing.T
	c    *websocket.Conn
	node string
}

func connectAgent(t *testing.T, ts *testServer, node string) *agent {
	t.Helper()
	c, _, err := dial(t, ts, agentToken)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	a := &agent{t: t, c: c, node: node}
	before := ts.fleet.connects(node)
	a.send(&wire.Hello{Node: node, AgentVersion: "test", Host: wire.Host{Hostname: node, OS: "linux", Arch: "amd64"}})
	if env := a.read(); env.Type != wire.TypeWelcome {
		t.Fatalf("first message from the coordinator is %s, want welcome", env.Type)
	}
	// The welcome is queued before the hub registers the connection and
	// tells the fleet; a test that acts on the connection next must not
	// race that.
	testutil.Eventually(t, "the fleet told of "+node+"'s connection", 10*time.Second, func() bool {
		return ts.fleet.connects(node) > before
	})
	return a
}

func (a *agent) send(payload any) {
	a.t.Helper()
	data, err := wire.Encode(payload)
	if err != nil {
		a.t.Fatalf("encode: %v", err)
	}
	a.sendRaw(data)
}

func (a *agent) sendRaw(data []byte) {
	a.t.Helper()
	if err := a.c.Write(testCtx(a.t), websocket.MessageText, data); err != nil {
		a.t.Fatalf("write: %v", err)
	}
}

func (a *agent) read() *wire.Envelope {
	a.t.Helper()
	_, data, err := a.c.Read(testCtx(a.t))
	if err != nil {
		a.t.Fatalf("read: %v", err)
	}
	env, err := wire.Decode(data)
	if err != nil {
		a.t.Fatalf("decode: %v", err)
	}
	return env
}

// keepReading reads and drops whatever the coordinator sends from now on,
// so the agent answers its pings as a real one does: a test agent that
// stops reading after its welcome is dropped for ping_timeout once the
// test outlasts it, which a loaded machine makes happen. Call read no more.
func (a *agent) keepReading() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, _, err := a.c.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	a.t.Cleanup(func() {
		_ = a.c.CloseNow()
		<-done
	})
}

// snapshot reports engines whose capacity keys are node/<name>.
func (a *agent) snapshot(model string, names ...string) {
	a.t.Helper()
	s := &wire.Snapshot{Node: a.node, At: time.Now(), Host: wire.Host{Hostname: a.node}}
	for i, n := range names {
		s.Engines = append(s.Engines, wire.Engine{Kind: wire.EngineVLLM, URL: fmt.Sprintf("http://127.0.0.1:%d", 8000+i),
			Model: model, Ready: true, CapacityKey: a.node + "/" + n})
	}
	a.send(s)
}

// closeOf reads until the connection ends and returns the close frame.
func closeOf(t *testing.T, c *websocket.Conn) websocket.CloseError {
	t.Helper()
	ctx := testCtx(t)
	for {
		_, _, err := c.Read(ctx)
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("connection ended without a close frame: %v", err)
		}
		return ce
	}
}

// do makes one API request; token "" sends none.
func (ts *testServer) do(t *testing.T, method, path, token string, body io.Reader) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), method, ts.base+path, body)
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
	return resp.StatusCode, data, resp.Header
}

// errorMessage decodes a view.Error body, failing the test if it is not one.
func errorMessage(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		Error *string `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || *e.Error == "" {
		t.Fatalf("body is not a JSON error with a message: %s", body)
	}
	return *e.Error
}

// scrape fetches and parses /metrics with the Prometheus text parser.
func (ts *testServer) scrape(t *testing.T, token string) map[string]*dto.MetricFamily {
	t.Helper()
	status, body, _ := ts.do(t, "GET", "/metrics", token, nil)
	if status != http.StatusOK {
		t.Fatalf("/metrics: %d %s", status, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// metricValue is the value of the family's sample whose labels include
// all of want; ok is false if there is none.
func metricValue(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	mf := mfs[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

func (ts *testServer) counter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := metricValue(ts.scrape(t, ""), name, labels)
	if !ok {
		t.Fatalf("no sample %s%v", name, labels)
	}
	return v
}
