package server

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

// sseReader reads server-sent events.
type sseReader struct{ sc *bufio.Scanner }

type sseEvent struct{ name, data string }

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	return &sseReader{sc: sc}
}

// next returns the next event, skipping comments.
func (r *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	for r.sc.Scan() {
		line := r.sc.Text()
		switch {
		case line == "":
			if ev.name != "" || ev.data != "" {
				return ev, nil
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data += strings.TrimPrefix(line, "data: ")
		}
	}
	if err := r.sc.Err(); err != nil {
		return ev, err
	}
	return ev, io.EOF
}

func openEvents(t *testing.T, ts *testServer, query string) (*http.Response, *sseReader) {
	t.Helper()
	req, _ := http.NewRequestWithContext(testCtx(t), "GET", ts.base+"/api/v1/events"+query, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, newSSEReader(resp.Body)
}

func workersOf(t *testing.T, ev sseEvent) view.Workers {
	t.Helper()
	if ev.name != "workers" {
		t.Fatalf("event %q, want workers", ev.name)
	}
	var ws view.Workers
	if err := json.Unmarshal([]byte(ev.data), &ws); err != nil {
		t.Fatalf("event data: %v", err)
	}
	return ws
}

// follow applies a workers or changes event to the workers a subscriber
// holds, as the dashboard and heft-sync do.
func follow(t *testing.T, cur map[string]view.Worker, ev sseEvent) map[string]view.Worker {
	t.Helper()
	switch ev.name {
	case "workers":
		next := map[string]view.Worker{}
		for _, w := range workersOf(t, ev).Workers {
			next[w.ID] = w
		}
		return next
	case "changes":
		var c Changes
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("changes event: %v", err)
		}
		if c.Workers == nil || c.Removed == nil {
			t.Fatalf("changes event without both lists: %s", ev.data)
		}
		for _, w := range c.Workers {
			cur[w.ID] = w
		}
		for _, id := range c.Removed {
			delete(cur, id)
		}
		return cur
	}
	t.Fatalf("unknown event %q", ev.name)
	return nil
}

func TestEventsDeliverUpdates(t *testing.T) {
	ts := startServer(t, testOptions(), func(s *Server) { s.lim.ssePingEvery = 50 * time.Millisecond })
	resp, events := openEvents(t, ts, "")
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	ev, err := events.next()
	if err != nil {
		t.Fatal(err)
	}
	if ws := workersOf(t, ev); ws.Workers == nil || len(ws.Workers) != 0 {
		t.Fatalf("first event: %s", ev.data)
	}
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("Qwen/Qwen3-8B", "e0")
	cur := map[string]view.Worker{}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ev, err := events.next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.name != "changes" {
			t.Fatalf("after the first event: %q, want changes", ev.name)
		}
		cur = follow(t, cur, ev)
		if w, ok := cur["gpu-a/e0"]; ok && len(cur) == 1 && w.Model == "Qwen/Qwen3-8B" {
			return
		}
	}
	t.Fatal("no event with the new worker")
}

func TestEventsPingAndCoalesce(t *testing.T) {
	ts := startServer(t, testOptions(), func(s *Server) {
		s.lim.ssePingEvery = 20 * time.Millisecond
		s.lim.sseMinGap = time.Hour // after the first event, changes wait
	})
	req, _ := http.NewRequestWithContext(testCtx(t), "GET", ts.base+"/api/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	a := connectAgent(t, ts, "gpu-a")
	var events, pings int
	for pings < 5 && sc.Scan() {
		switch line := sc.Text(); {
		case line == ": ping":
			pings++
			a.snapshot("m", "e0") // a change every ping, none may be sent yet
		case strings.HasPrefix(line, "event: "):
			events++
		}
	}
	if pings < 5 {
		t.Fatalf("got %d pings: %v", pings, sc.Err())
	}
	if events != 1 {
		t.Errorf("got %d events within the coalescing gap, want only the first", events)
	}
}

func TestModelAndWorkerRoutesWithSlashes(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("Qwen/Qwen3-8B", "e0")
	a.send(&wire.ProbeResult{Measurement: wire.Measurement{CapacityKey: "gpu-a/e0", ThroughputTPS: 992, OutputTokens: 2048}})
	testutil.Eventually(t, "the measurement", 10*time.Second, func() bool { w, _ := ts.fleet.Worker("gpu-a/e0"); return w.Throughput != nil })

	for _, path := range []string{"/api/v1/models/Qwen/Qwen3-8B/weights", "/api/v1/models/Qwen%2FQwen3-8B/weights"} {
		t.Run(path, func(t *testing.T) {
			status, body, hdr := ts.do(t, "GET", path, "", nil)
			if status != http.StatusOK || hdr.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s", status, body)
			}
			var wt view.Weights
			if err := json.Unmarshal(body, &wt); err != nil {
				t.Fatal(err)
			}
			if wt.Model != "Qwen/Qwen3-8B" || len(wt.Workers) != 1 || wt.Workers[0].ID != "gpu-a/e0" || wt.Workers[0].Weight != 1 {
				t.Fatalf("weights = %+v", wt)
			}
		})
	}
	for _, path := range []string{"/api/v1/workers/gpu-a/e0", "/api/v1/workers/gpu-a%2Fe0"} {
		status, body, _ := ts.do(t, "GET", path, "", nil)
		var w view.Worker
		if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.ID != "gpu-a/e0" {
			t.Errorf("%s: %d %s", path, status, body)
		}
	}
	status, body, _ := ts.do(t, "POST", "/api/v1/workers/gpu-a%2Fe0/hold", adminToken, nil)
	if status != http.StatusOK || !strings.Contains(string(body), `"state":"held"`) {
		t.Errorf("hold via %%2F: %d %s", status, body)
	}

	for _, tc := range []struct {
		path, want string
	}{
		{"/api/v1/models/Nope/weights", `no model "Nope"`},
		{"/api/v1/models/Qwen/Qwen3-8B", "use /api/v1/models/{model}/weights"},
		{"/api/v1/workers/gpu-a/e9", `no worker "gpu-a/e9"`},
		{"/api/v1/nothing", "no API route"},
	} {
		status, body, _ := ts.do(t, "GET", tc.path, "", nil)
		if status != http.StatusNotFound || !strings.Contains(errorMessage(t, body), tc.want) {
			t.Errorf("%s: %d %s", tc.path, status, body)
		}
	}

	status, body, _ = ts.do(t, "GET", "/api/v1/models", "", nil)
	if status != http.StatusOK || strings.TrimSpace(string(body)) != `{"models":["Qwen/Qwen3-8B"]}` {
		t.Errorf("models: %d %s", status, body)
	}
	status, body, _ = ts.do(t, "GET", "/api/v1/workers", "", nil)
	var ws view.Workers
	if status != http.StatusOK || json.Unmarshal(body, &ws) != nil || len(ws.Workers) != 1 {
		t.Errorf("workers: %d %s", status, body)
	}
}

func TestAdminActions(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0")
	testutil.Eventually(t, "the worker", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e0"); return ok })

	for _, tok := range []string{"", agentToken, "wrong"} {
		status, body, _ := ts.do(t, "POST", "/api/v1/workers/gpu-a/e0/pin", tok, strings.NewReader(`{"weight":1.5}`))
		if status != http.StatusUnauthorized || !strings.Contains(errorMessage(t, body), "admin token") {
			t.Errorf("token %q: %d %s", tok, status, body)
		}
	}
	if w, _ := ts.fleet.Worker("gpu-a/e0"); w.PinnedWeight != nil {
		t.Fatal("an unauthorised pin went through")
	}

	status, body, _ := ts.do(t, "POST", "/api/v1/workers/gpu-a/e0/pin", adminToken, strings.NewReader(`{"weight":1.5}`))
	var w view.Worker
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.PinnedWeight == nil || *w.PinnedWeight != 1.5 {
		t.Fatalf("pin: %d %s", status, body)
	}
	status, body, _ = ts.do(t, "DELETE", "/api/v1/workers/gpu-a/e0/pin", adminToken, nil)
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.PinnedWeight != nil {
		t.Fatalf("unpin: %d %s", status, body)
	}
	for action, state := range map[string]string{"admit": view.StateAdmitted, "hold": view.StateHeld} {
		status, body, _ = ts.do(t, "POST", "/api/v1/workers/gpu-a/e0/"+action, adminToken, nil)
		if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.State != state {
			t.Fatalf("%s: %d %s", action, status, body)
		}
	}
	status, body, _ = ts.do(t, "POST", "/api/v1/workers/gpu-a/e0/probe", adminToken, nil)
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.ProbeStatus != wire.ProbeRunning {
		t.Fatalf("probe: %d %s", status, body)
	}
	if env := a.read(); env.Type != wire.TypeProbeRequest || env.ProbeRequest.Reason != wire.ReasonOnDemand {
		t.Fatalf("agent got %+v", env)
	}
	if n := ts.counter(t, "heft_probe_requests_total", map[string]string{"reason": wire.ReasonOnDemand}); n != 1 {
		t.Errorf("heft_probe_requests_total{reason=on_demand} = %g, want 1", n)
	}

	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		want                     string
	}{
		{"unknown worker", "POST", "/api/v1/workers/gpu-a/e9/hold", "", 404, `no worker "gpu-a/e9"`},
		{"not JSON", "POST", "/api/v1/workers/gpu-a/e0/pin", `weight=2`, 400, `{"weight": <positive number>}`},
		{"no weight", "POST", "/api/v1/workers/gpu-a/e0/pin", `{}`, 400, "weight is missing"},
		{"negative", "POST", "/api/v1/workers/gpu-a/e0/pin", `{"weight":-1}`, 400, "got -1"},
		{"huge", "POST", "/api/v1/workers/gpu-a/e0/pin", `{"weight":1e999}`, 400, "weight"},
		{"unknown field", "POST", "/api/v1/workers/gpu-a/e0/pin", `{"weight":1,"wieght":2}`, 400, "wieght"},
		{"trailing", "POST", "/api/v1/workers/gpu-a/e0/pin", `{"weight":1} {}`, 400, "trailing data"},
		{"fleet refuses", "POST", "/api/v1/workers/gpu-a/e0/pin", `{"weight":7.5}`, 400, "the fake fleet refuses 7.5"},
		{"fleet fails", "POST", "/api/v1/workers/gpu-a/e0/pin", `{"weight":6.25}`, 500, "pin gpu-a/e0: the fake store is full"},
		{"out of range", "POST", "/api/v1/workers/gpu-a/e0/pin", `{"weight":100}`, 400, "outside [0.25, 8] (weight_min, weight_max)"},
		{"unknown action", "POST", "/api/v1/workers/gpu-a/e0/explode", "", 405, "action one of pin, probe, admit, hold"},
		{"delete hold", "DELETE", "/api/v1/workers/gpu-a/e0/hold", "", 405, "use POST"},
		{"get pin", "GET", "/api/v1/workers/gpu-a/e0/pin", "", 405, "use POST or DELETE"},
		{"query on an ID route", "POST", "/api/v1/workers/gpu-a/e0/pin?weight=2", `{"weight":1}`, 400, "pin's weight goes in the body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, hdr := ts.do(t, tc.method, tc.path, adminToken, strings.NewReader(tc.body))
			if status != tc.status || !strings.Contains(errorMessage(t, body), tc.want) {
				t.Errorf("got %d %s, want %d with %q", status, body, tc.status, tc.want)
			}
			if status == http.StatusMethodNotAllowed && hdr.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
		})
	}

	// Probing a worker whose agent is gone is a conflict, not a silent drop.
	_ = a.c.Close(websocket.StatusNormalClosure, "")
	testutil.Eventually(t, "the agent to leave", 10*time.Second, func() bool { return !ts.hub.connected("gpu-a") })
	status, body, _ = ts.do(t, "POST", "/api/v1/workers/gpu-a/e0/probe", adminToken, nil)
	if status != http.StatusConflict || !strings.Contains(errorMessage(t, body), "not connected") {
		t.Errorf("probe of a disconnected worker: %d %s", status, body)
	}
}

// A pin must lie within the range the options give (the fleet's weight
// range).
func TestPinRange(t *testing.T) {
	opts := testOptions()
	opts.PinMin, opts.PinMax = 0.5, 2
	ts := startServer(t, opts, nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0")
	testutil.Eventually(t, "the worker", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e0"); return ok })
	for body, want := range map[string]int{`{"weight":0.4}`: 400, `{"weight":3}`: 400, `{"weight":0.5}`: 200, `{"weight":2}`: 200} {
		status, resp, _ := ts.do(t, "POST", "/api/v1/workers/gpu-a/e0/pin", adminToken, strings.NewReader(body))
		if status != want || (want == 400 && !strings.Contains(errorMessage(t, resp), "outside [0.5, 2]")) {
			t.Errorf("pin %s: %d %s, want %d", body, status, resp, want)
		}
	}
}

func TestNoAdminTokenRefusesAdminActions(t *testing.T) {
	opts := testOptions()
	opts.Tokens.Admin = ""
	ts := startServer(t, opts, nil)
	status, body, _ := ts.do(t, "POST", "/api/v1/workers/x/hold", "", nil)
	if status != http.StatusUnauthorized || !strings.Contains(errorMessage(t, body), "no admin_token configured") {
		t.Errorf("%d %s", status, body)
	}
}

func TestBodyLimit(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0")
	testutil.Eventually(t, "the worker", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e0"); return ok })
	big := `{"weight":1.5,"pad":"` + strings.Repeat("x", 64<<10) + `"}`
	for _, tc := range []struct {
		name string
		body io.Reader
		path string
	}{
		{"with length", strings.NewReader(big), "/api/v1/workers/gpu-a/e0/pin"},
		{"chunked", io.MultiReader(strings.NewReader(big)), "/api/v1/workers/gpu-a/e0/pin"},
		{"bodyless action", io.MultiReader(strings.NewReader(big)), "/api/v1/workers/gpu-a/e0/hold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, _ := ts.do(t, "POST", tc.path, adminToken, tc.body)
			if status != http.StatusRequestEntityTooLarge || !strings.Contains(errorMessage(t, body), "65536") {
				t.Errorf("got %d %s", status, body)
			}
		})
	}
	if w, _ := ts.fleet.Worker("gpu-a/e0"); w.PinnedWeight != nil || w.State == view.StateHeld {
		t.Errorf("an oversized request changed the worker: %+v", w)
	}
}

func TestViewerToken(t *testing.T) {
	opts := testOptions()
	opts.Tokens.Viewer = viewerToken
	ts := startServer(t, opts, nil)
	for _, path := range []string{"/api/v1/workers", "/api/v1/models", "/metrics", "/api/v1/events"} {
		status, body, _ := ts.do(t, "GET", path, "", nil)
		if status != http.StatusUnauthorized || !strings.Contains(errorMessage(t, body), "viewer token") {
			t.Errorf("%s without a token: %d %s", path, status, body)
		}
		if status, _, _ := ts.do(t, "GET", path, agentToken, nil); status != http.StatusUnauthorized {
			t.Errorf("%s with the agent token: %d", path, status)
		}
	}
	for _, tok := range []string{viewerToken, adminToken} {
		if status, body, _ := ts.do(t, "GET", "/api/v1/workers", tok, nil); status != http.StatusOK {
			t.Errorf("with a good token: %d %s", status, body)
		}
	}
	if status, body, _ := ts.do(t, "GET", "/api/v1/workers?token="+viewerToken, "", nil); status != http.StatusOK {
		t.Errorf("?token=: %d %s", status, body)
	}
	resp, events := openEvents(t, ts, "?token="+viewerToken)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("events with ?token=: %d", resp.StatusCode)
	}
	if _, err := events.next(); err != nil {
		t.Fatal(err)
	}
	// Admin actions never take a query token or the viewer token.
	if status, _, _ := ts.do(t, "POST", "/api/v1/workers/x/hold?token="+adminToken, viewerToken, nil); status != http.StatusUnauthorized {
		t.Errorf("admin with the viewer token: %d", status)
	}
	if status, _, _ := ts.do(t, "GET", "/healthz", "", nil); status != http.StatusOK {
		t.Errorf("healthz must stay open: %d", status)
	}
	status, body, hdr := ts.do(t, "GET", "/", "", nil)
	if status != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") || !strings.Contains(string(body), "heft") {
		t.Errorf("dashboard: %d %.100s", status, body)
	}
}

func TestHealthz(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0", "e1")
	testutil.Eventually(t, "workers", 10*time.Second, func() bool { return len(ts.fleet.Workers()) == 2 })
	status, body, _ := ts.do(t, "GET", "/healthz", "", nil)
	var h healthStatus
	if status != http.StatusOK || json.Unmarshal(body, &h) != nil || h.Status != "ok" || h.AgentsConnected != 1 || h.Workers != 2 {
		t.Errorf("%d %s", status, body)
	}
}

func TestMetricsFamilies(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0", "e1")
	a.send(&wire.ProbeResult{Measurement: wire.Measurement{CapacityKey: "gpu-a/e0", ThroughputTPS: 453, OutputTokens: 2048}})
	testutil.Eventually(t, "the measurement", 10*time.Second, func() bool { w, _ := ts.fleet.Worker("gpu-a/e0"); return w.Throughput != nil })
	ts.fleet.update("gpu-a/e1", func(w *view.Worker) {
		w.Warnings = []view.Warning{{Code: wire.CodeDPPoolImbalance, Severity: wire.SeverityCritical}}
		w.State = view.StateHeld
	})
	ts.do(t, "GET", "/api/v1/workers", "", nil)

	mfs := ts.scrape(t, "")
	for _, name := range []string{"heft_worker_weight", "heft_worker_throughput_tokens_per_second", "heft_workers", "heft_warnings",
		"heft_agents_connected", "heft_agent_messages_total", "heft_probe_requests_total", "heft_agent_disconnects_total", "heft_auth_failures_total",
		"heft_build_info", "go_goroutines"} {
		if mfs[name] == nil {
			t.Errorf("family %s missing", name)
		}
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"heft_worker_throughput_tokens_per_second", map[string]string{"id": "gpu-a/e0", "model": "m", "node": "gpu-a"}, 453},
		{"heft_worker_weight", map[string]string{"id": "gpu-a/e0"}, 1},
		{"heft_workers", map[string]string{"state": "admitted"}, 1},
		{"heft_workers", map[string]string{"state": "held"}, 1},
		{"heft_workers", map[string]string{"state": "offline"}, 0},
		{"heft_warnings", map[string]string{"code": "dp_pool_imbalance"}, 1},
		{"heft_warnings", map[string]string{"code": "gpu_clock_low"}, 0},
		{"heft_agents_connected", nil, 1},
		{"heft_probe_requests_total", map[string]string{"reason": "registration"}, 0},
	}
	for _, c := range checks {
		if v, ok := metricValue(mfs, c.name, c.labels); !ok || v != c.want {
			t.Errorf("%s%v = %g (%t), want %g", c.name, c.labels, v, ok, c.want)
		}
	}
	if _, ok := metricValue(mfs, "heft_worker_weight", map[string]string{"id": "gpu-a/e1"}); ok {
		t.Error("a worker without a weight has a weight sample")
	}
}

func TestTLS(t *testing.T) {
	certFile, keyFile, pool := testutil.SelfSignedCert(t, t.TempDir(), "heft-test")
	opts := testOptions()
	opts.TLSCertFile, opts.TLSKeyFile = certFile, keyFile
	s, err := newServer(opts, newFakeFleet(), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	ts := runServer(t, s, "https")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

	resp, err := client.Get(ts.base + "/healthz")
	if err != nil {
		t.Fatalf("https: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil {
		t.Fatalf("status %d, tls %v", resp.StatusCode, resp.TLS != nil)
	}
	// Plain HTTP to a TLS port gets nowhere.
	if resp, err := http.Get(strings.Replace(ts.base, "https", "http", 1) + "/healthz"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP was served: %s", body)
		}
	}
	// Agents connect over wss.
	c, _, err := websocket.Dial(testCtx(t), strings.Replace(ts.base, "https", "wss", 1)+"/api/v1/agent", &websocket.DialOptions{
		HTTPClient: client, HTTPHeader: http.Header{"Authorization": {"Bearer " + agentToken}},
	})
	if err != nil {
		t.Fatalf("wss: %v", err)
	}
	defer c.CloseNow()
	data, _ := wire.Encode(&wire.Hello{Node: "gpu-a"})
	if err := c.Write(testCtx(t), websocket.MessageText, data); err != nil {
		t.Fatal(err)
	}
	_, data, err = c.Read(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if env, err := wire.Decode(data); err != nil || env.Type != wire.TypeWelcome {
		t.Fatalf("welcome: %v %v", env, err)
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	opts := testOptions()
	opts.Tokens.Agent = ""
	if _, err := newServer(opts, newFakeFleet(), nil); err == nil {
		t.Error("a server without an agent token")
	}
	if _, err := New(testOptions(), nil, nil); err == nil {
		t.Error("New with a nil fleet")
	}
}

func TestRunTwice(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	if status, _, _ := ts.do(t, "GET", "/healthz", "", nil); status != http.StatusOK { // the first Run is serving
		t.Fatalf("healthz: %d", status)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := ts.Run(testCtx(t), ln); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("second Run: %v", err)
	}
}

// The prefill weight has its own table (?kind=prefill) and its own pin
// ({"kind":"prefill"} or ?kind=prefill), beside the decode weight's.
func TestPrefillWeightRoutes(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0")
	a.send(&wire.ProbeResult{Measurement: wire.Measurement{CapacityKey: "gpu-a/e0", ThroughputTPS: 992, OutputTokens: 2048}})
	testutil.Eventually(t, "the measurement", 10*time.Second, func() bool { w, _ := ts.fleet.Worker("gpu-a/e0"); return w.Throughput != nil })

	var w view.Worker
	status, body, _ := ts.do(t, "POST", "/api/v1/workers/gpu-a/e0/pin", adminToken, strings.NewReader(`{"weight":2.5,"kind":"prefill"}`))
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.PinnedPrefillWeight == nil || *w.PinnedPrefillWeight != 2.5 || w.PinnedWeight != nil {
		t.Fatalf("prefill pin: %d %s", status, body)
	}
	status, body, _ = ts.do(t, "POST", "/api/v1/workers/gpu-a/e0/pin?kind=prefill", adminToken, strings.NewReader(`{"weight":3}`))
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || *w.PinnedPrefillWeight != 3 {
		t.Fatalf("prefill pin by query: %d %s", status, body)
	}
	// {"weight": ...} alone stays the decode pin (PRODUCT.md).
	status, body, _ = ts.do(t, "POST", "/api/v1/workers/gpu-a/e0/pin", adminToken, strings.NewReader(`{"weight":1.5}`))
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.PinnedWeight == nil || *w.PinnedWeight != 1.5 || *w.PinnedPrefillWeight != 3 {
		t.Fatalf("decode pin: %d %s", status, body)
	}
	for _, kind := range []string{"decode", "prefill"} {
		status, body, _ = ts.do(t, "GET", "/api/v1/models/m/weights?kind="+kind, "", nil)
		var wt view.Weights
		if status != http.StatusOK || json.Unmarshal(body, &wt) != nil || wt.Kind != kind || len(wt.Workers) != 1 {
			t.Fatalf("%s weights: %d %s", kind, status, body)
		}
		if want := map[string]float64{"decode": 1.5, "prefill": 3}[kind]; wt.Workers[0].Weight != want {
			t.Errorf("%s weight %v, want %v", kind, wt.Workers[0].Weight, want)
		}
	}
	status, body, _ = ts.do(t, "DELETE", "/api/v1/workers/gpu-a/e0/pin?kind=prefill", adminToken, nil)
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.PinnedPrefillWeight != nil || w.PinnedWeight == nil {
		t.Fatalf("prefill unpin: %d %s", status, body)
	}

	for _, tc := range []struct {
		name, method, path, body string
		want                     string
	}{
		{"unknown kind in the body", "POST", "/api/v1/workers/gpu-a/e0/pin", `{"weight":1,"kind":"speed"}`, `kind "speed" is not "decode" or "prefill"`},
		{"unknown kind in the query", "POST", "/api/v1/workers/gpu-a/e0/pin?kind=speed", `{"weight":1}`, `kind "speed"`},
		{"kinds disagree", "POST", "/api/v1/workers/gpu-a/e0/pin?kind=decode", `{"weight":1,"kind":"prefill"}`, "disagree"},
		{"unknown kind to clear", "DELETE", "/api/v1/workers/gpu-a/e0/pin?kind=speed", "", `kind "speed"`},
		{"unknown kind of weights", "GET", "/api/v1/models/m/weights?kind=speed", "", `kind "speed"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, _ := ts.do(t, tc.method, tc.path, adminToken, strings.NewReader(tc.body))
			if status != http.StatusBadRequest || !strings.Contains(errorMessage(t, body), tc.want) {
				t.Errorf("got %d %s, want 400 with %q", status, body, tc.want)
			}
		})
	}
	if w, _ := ts.fleet.Worker("gpu-a/e0"); w.PinnedWeight == nil || *w.PinnedWeight != 1.5 || w.PinnedPrefillWeight != nil {
		t.Errorf("a refused request changed the pins: %v %v", w.PinnedWeight, w.PinnedPrefillWeight)
	}
}
