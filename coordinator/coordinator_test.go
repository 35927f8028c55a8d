package coordinator

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/coordinator/config"
	"heft/coordinator/server"
	"heft/coordinator/store"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

// The server gets the tokens (token files read), TLS files, ping timings
// and the configured weight range as its pin range.
func TestServerOptions(t *testing.T) {
	viewerFile := filepath.Join(t.TempDir(), "viewer.token")
	if err := os.WriteFile(viewerFile, []byte("viewer-from-file-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.ViewerTokenFile = viewerFile
	cfg.Server.TLSCertFile, cfg.Server.TLSKeyFile = "/etc/heft/cert.pem", "/etc/heft/key.pem"
	cfg.Server.PingInterval, cfg.Server.PingTimeout = 20*time.Second, 7*time.Second
	cfg.Fleet.WeightMin, cfg.Fleet.WeightMax = 0.5, 4
	cfg.TrustedProxies = []string{"10.0.0.0/8", "192.0.2.7"}
	cfg.AdvertiseAllow = []string{"gpu-a=10.1.0.0/16"}
	got, err := serverOptions(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := server.Options{
		Tokens:      server.Tokens{Agent: agentToken, Admin: adminToken, Viewer: "viewer-from-file-0123456789abcdef"},
		TLSCertFile: "/etc/heft/cert.pem", TLSKeyFile: "/etc/heft/key.pem",
		PingInterval: 20 * time.Second, PingTimeout: 7 * time.Second, PinMin: 0.5, PinMax: 4,
		TrustedProxies:      []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")},
		AdvertiseAllow:      []server.AllowRule{{Node: "gpu-a", Prefix: netip.MustParsePrefix("10.1.0.0/16")}},
		MaxAgentConnections: server.DefaultMaxAgentConnections, MaxEventStreams: server.DefaultMaxEventStreams,
		MaxAPIRequests: server.DefaultMaxAPIRequests,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("serverOptions =\n%+v\nwant\n%+v", got, want)
	}
}

// A harness's setting reaches the fleet it runs: before there was one
// assembly, the end-to-end, dashboard and server harnesses built their
// fleets from fleet.DefaultConfig() and silently ignored offline_grace and
// the weight range (review D-A).
func TestConfigReachesFleet(t *testing.T) {
	clk := newClock()
	cfg := testConfig(t)
	cfg.Fleet.OfflineGrace = 2 * time.Minute // the default is 30 s
	cfg.Fleet.StaleWeightTTL = time.Hour     // the default is cache_ttl, 6 h
	cfg.Fleet.WeightMin, cfg.Fleet.WeightMax = 0.5, 4
	cfg.Fleet.ImplausibleFactor = 20 // the default 4 would hold the fast one
	c, err := New(cfg, WithLogger(testLogger(t)), WithClock(clk.now))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := c.Fleet()

	// Three workers of one model at 100, 1,000 and 10,000 tok/s: weights
	// 0.1 and 10 before the clamp, which the configured range sets.
	f.Connect("gpu-a", 1, wire.Hello{Node: "gpu-a"})
	engines := []wire.Engine{engine("slow", 8000), engine("mid", 8001), engine("fast", 8002)}
	for _, a := range f.Snapshot("gpu-a", snapshot("gpu-a", clk.now(), engines...)) {
		req := a.Message.(*wire.ProbeRequest)
		tps := map[string]float64{"slow": 100, "mid": 1000, "fast": 10000}[req.CapacityKey]
		m := measured(req.CapacityKey, "gpu-a", tps, clk.now())
		if _, err := f.ProbeResult("gpu-a", wire.ProbeResult{RequestID: req.RequestID, Measurement: m}); err != nil {
			t.Fatal(err)
		}
	}
	wt, _ := f.Weights(testModel)
	got := map[string]float64{}
	for _, e := range wt.Workers {
		got[e.ID] = e.Weight
	}
	if got["slow"] != 0.5 || got["mid"] != 1 || got["fast"] != 4 {
		t.Errorf("weights %v, want slow 0.5, mid 1, fast 4 (weight_min, weight_max)", got)
	}

	f.Disconnect("gpu-a", 1)
	clk.add(time.Minute) // past the default grace, within the configured one
	f.Tick()
	if w, _ := f.Worker("mid"); w.State != view.StateAdmitted {
		t.Errorf("a minute after its agent left, within offline_grace, the worker is %s", w.State)
	}
	clk.add(time.Minute)
	f.Tick()
	if w, _ := f.Worker("mid"); w.State != view.StateStale {
		t.Errorf("at offline_grace the worker is %s, want stale", w.State)
	}
	clk.add(time.Hour - 2*time.Minute)
	f.Tick()
	if w, _ := f.Worker("mid"); w.State != view.StateOffline {
		t.Errorf("at stale_weight_ttl the worker is %s, want offline", w.State)
	}
}

// Run closes the state when it returns, so the next coordinator (or a
// restarted one) can open it at once.
func TestRunClosesState(t *testing.T) {
	cfg := testConfig(t)
	r := start(t, cfg)
	if status, body := r.do(t, "GET", "/healthz", "", ""); status != http.StatusOK {
		t.Fatalf("healthz: %d %s", status, body)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st, err := store.Open(cfg.StateDir, nil)
	if err != nil {
		t.Fatalf("the state is still held after Run returned: %v", err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("Close after Run: %v", err)
	}
}

// agent_check_listen starts HAProxy's agent-check responder beside the
// API, and Run stops it.
func TestRunAnswersAgentChecks(t *testing.T) {
	cfg := testConfig(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.AgentCheckListen = ln.Addr().String()
	ln.Close()
	r := start(t, cfg)
	var c net.Conn
	testutil.Eventually(t, "the agent-check port", 5*time.Second, func() bool {
		c, err = net.Dial("tcp", cfg.AgentCheckListen)
		return err == nil
	})
	defer c.Close()
	if _, err := io.WriteString(c, "Qwen/Qwen3-8B 10.0.0.5:8000\n"); err != nil {
		t.Fatal(err)
	}
	// No such worker: a line HAProxy reads as no change, saying why.
	if ans, err := io.ReadAll(c); err != nil || string(ans) != "#heft lists no worker at this address under this model\n" {
		t.Errorf("answer %q, %v", ans, err)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if c, err := net.Dial("tcp", cfg.AgentCheckListen); err == nil {
		c.Close()
		t.Error("the agent-check port still answers after Run returned")
	}
}

func TestNewRefuses(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "agent.token")
	if err := os.WriteFile(tokenFile, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tokenFile, 0o644); err != nil {
		t.Fatal(err)
	}
	corrupt := t.TempDir()
	garbage := bytes.Repeat([]byte("not a database "), 1000)
	if err := os.WriteFile(filepath.Join(corrupt, store.FileName), garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		adjust func(c *config.Config)
		want   string
	}{
		{"no agent token", func(c *config.Config) { c.AgentToken = "" }, "agent_token"},
		{"token file others can read", func(c *config.Config) { c.AgentToken, c.AgentTokenFile = "", tokenFile }, "chmod 600"},
		{"weights without the median", func(c *config.Config) { c.Fleet.WeightMax = 0.9 }, "weight_max"},
		{"corrupt state", func(c *config.Config) { c.StateDir = corrupt }, "corrupt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			tc.adjust(&cfg)
			c, err := New(cfg)
			if err == nil {
				_ = c.Close()
				t.Fatal("New accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
			// Nothing stays open: the state can be opened again.
			if cfg.StateDir != corrupt {
				st, err := store.Open(cfg.StateDir, nil)
				if err != nil {
					t.Fatalf("state after a failed New: %v", err)
				}
				_ = st.Close()
			}
		})
	}
	if after, _ := os.ReadFile(filepath.Join(corrupt, store.FileName)); !bytes.Equal(after, garbage) {
		t.Error("the refused state file was changed")
	}
}

// The whole path through the assembled coordinator: an agent registers an
// engine, is asked for a probe, answers, and the weight appears in the API
// and on /metrics; a pin survives a restart over the same state.
func TestAgentToWeightAndRestart(t *testing.T) {
	cfg := testConfig(t)
	r := start(t, cfg)
	a, key := oneEngine(t, r)
	var req *wire.ProbeRequest
	for req == nil {
		if env := a.read(); env.Type == wire.TypeProbeRequest {
			req = env.ProbeRequest
		}
	}
	if req.CapacityKey != key || req.Reason != wire.ReasonRegistration {
		t.Fatalf("probe request %+v", req)
	}
	a.send(&wire.ProbeResult{RequestID: req.RequestID, Measurement: measured(key, "gpu-a", 992, time.Now())})

	path := "/api/v1/models/" + strings.ReplaceAll(testModel, "/", "%2F") + "/weights"
	var wt view.Weights
	testutil.Eventually(t, "the worker in the weight table", 10*time.Second, func() bool {
		status, body := r.do(t, "GET", path, "", "")
		return status == http.StatusOK && json.Unmarshal(body, &wt) == nil && len(wt.Workers) == 1
	})
	if e := wt.Workers[0]; e.ID != key || e.Weight != 1 || e.Throughput == nil || *e.Throughput != 992 {
		t.Fatalf("weights %+v", wt)
	}
	if _, body := r.do(t, "GET", path, "", ""); !strings.Contains(string(body), `"state":"admitted"`) {
		t.Errorf("the weights entry of an admitted worker does not say so: %s", body)
	}

	status, body := r.do(t, "POST", "/api/v1/workers/"+key+"/pin", adminToken, `{"weight":1.5}`)
	var w view.Worker
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.PinnedWeight == nil || *w.PinnedWeight != 1.5 {
		t.Fatalf("pin: %d %s", status, body)
	}
	// The pin range is the configured weight range.
	if status, body := r.do(t, "POST", "/api/v1/workers/"+key+"/pin", adminToken, `{"weight":1000}`); status != http.StatusBadRequest ||
		!strings.Contains(string(body), "outside [0.25, 8]") {
		t.Errorf("pin out of range: %d %s", status, body)
	}
	for _, line := range []string{
		`heft_worker_weight{id="` + key + `",model="` + testModel + `",node="gpu-a"} 1.5`,
		`heft_workers{state="admitted"} 1`,
	} {
		if !r.exposes(t, line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}

	// Restart on the same state: the agent is told the coordinator
	// restarts, and the pin is still there.
	r.cancel()
	for {
		if _, err := a.next(); err != nil {
			if code := websocket.CloseStatus(err); code != websocket.StatusServiceRestart {
				t.Errorf("agent connection ended with %v, want 1012 (service restart)", err)
			}
			break
		}
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	r2 := start(t, cfg)
	status, body = r2.do(t, "GET", "/api/v1/workers/"+key, "", "")
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.PinnedWeight == nil || *w.PinnedWeight != 1.5 {
		t.Fatalf("after restart: %d %s", status, body)
	}
}

// A token file rotated to a token too short to be safe is refused at the
// reload as at the start: the tokens in force stay.
func TestReloadRefusesShortTokens(t *testing.T) {
	cfg := testConfig(t)
	file := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(file, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.AdminToken, cfg.AdminTokenFile = "", file
	c, err := New(cfg, WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := os.WriteFile(file, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Reload(); err == nil || !strings.Contains(err.Error(), "gen-token") {
		t.Errorf("a reload to a 5-byte admin token: %v", err)
	}
}

// The trust settings bind into the packages' own configs; the caps reach
// the server with what New adds, and a coordinator starts on them.
func TestTrustSettingsReachTheirPackages(t *testing.T) {
	cfg := testConfig(t)
	cfg.Fleet.ImplausibleFactor, cfg.Fleet.MaxTPSPerGPU, cfg.Fleet.MaxStreamTPS, cfg.Fleet.MaxKeysPerNode = 6, 2e5, 9000, 100
	cfg.Nodes.ApproveNew, cfg.Nodes.RequireCredential, cfg.Nodes.MaxNodes, cfg.Nodes.MaxPending = true, true, 10, 5
	cfg.Server.MaxAgentConnections, cfg.Server.MaxEventStreams, cfg.Server.MaxAPIRequests = 7, 8, 9
	cfg.Fleet.Probation, cfg.Fleet.MaxNodeShare = 3*time.Hour, 0.4
	so, err := serverOptions(cfg)
	if err != nil || so.MaxAgentConnections != 7 || so.MaxEventStreams != 8 || so.MaxAPIRequests != 9 {
		t.Errorf("server options %+v (%v)", so, err)
	}
	c, err := New(cfg, WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
