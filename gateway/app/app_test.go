package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/app"
	"heft/gateway/config"
	"heft/gateway/gwtest"
	"heft/gateway/syncer"
	"heft/gateway/target"
	"heft/shared/testutil"
	"heft/shared/view"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

const model = "Qwen/Qwen3-8B"

const haproxyCfg = `global
    stats socket {{socket}} level admin
defaults
    mode http
    option http-no-delay
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend fe
    bind {{front}}
    default_backend qwen
backend qwen
    balance roundrobin
    server-template heft 1-4 127.0.0.1:9 disabled
`

const nginxHTTP = `    include {{upstream_file}};
    server {
        listen {{front}};
        location / { proxy_pass http://qwen; proxy_buffering off; }
    }`

type rig struct {
	coord   *gwtest.Coordinator
	hx      *gwtest.HAProxy
	nx      *gwtest.Nginx
	listen  string
	a, b, c *gwtest.Upstream
	cancel  context.CancelFunc
	done    chan error
	litellm string
	envoy   string // the [[envoy]] table's state_file
}

func start(t *testing.T, resync time.Duration) *rig {
	t.Helper()
	r := &rig{coord: gwtest.NewCoordinator(t)}
	r.a, r.b, r.c = gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b"), gwtest.NewUpstream(t, "c")
	r.hx = gwtest.StartHAProxy(t, haproxyCfg)
	r.nx = gwtest.StartNginx(t, gwtest.NginxConf(nginxHTTP), "upstream qwen { server "+r.c.Addr+"; }\n")
	r.listen = fmt.Sprintf("127.0.0.1:%d", gwtest.FreePort(t))
	r.litellm = filepath.Join(t.TempDir(), "models.yaml")
	r.envoy = filepath.Join(t.TempDir(), "envoy-qwen.json")
	q := func(xs []string) string {
		var out []string
		for _, x := range xs {
			out = append(out, fmt.Sprintf("%q", x))
		}
		return "[" + strings.Join(out, ", ") + "]"
	}
	toml := fmt.Sprintf(`listen = %q
resync = %q
log_level = "debug"
[coordinator]
url = %q
[[haproxy]]
model = %q
socket = %q
backend = "qwen"
[[nginx]]
model = %q
file = %q
upstream = "qwen"
check = %s
reload = %s
[[envoy]]
listen = "127.0.0.1:0"
model = %q
state_file = %q
[[litellm]]
model = %q
file = %q
`, r.listen, resync.String(), r.coord.URL(), model, r.hx.Socket, model, r.nx.Upstream, q(r.nx.Check()), q(r.nx.Reload()), model, r.envoy, model, r.litellm)
	path := filepath.Join(t.TempDir(), "heft-sync.toml")
	if err := os.WriteFile(path, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load([]string{"--config", path}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	logger := hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug})
	go func() { r.done <- app.Run(ctx, cfg, logger) }()
	t.Cleanup(func() { cancel(); <-r.done })
	gwtest.WaitHTTP(t, "http://"+r.listen+"/healthz")
	return r
}

func (r *rig) status(t *testing.T) syncer.Status {
	t.Helper()
	resp, err := http.Get("http://" + r.listen + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st syncer.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	http.DefaultClient.CloseIdleConnections()
	return st
}

func (r *rig) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + r.listen + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	http.DefaultClient.CloseIdleConnections()
	return string(data)
}

func (r *rig) split(t *testing.T, front string, n int) map[string]int {
	return gwtest.Split(t, "http://"+front+"/", n)
}

// waitSplit waits until n sequential requests through front split as ok
// says: the gateway follows the coordinator within a few seconds.
func (r *rig) waitSplit(t *testing.T, what, front string, n int, ok func(map[string]int) bool) map[string]int {
	t.Helper()
	var last map[string]int
	testutil.Eventually(t, what, 15*time.Second, func() bool {
		last = r.split(t, front, n)
		return ok(last)
	})
	return last
}

func TestHeftSyncEndToEnd(t *testing.T) {
	r := start(t, 300*time.Millisecond)
	r.coord.SetWorkers(
		gwtest.Worker(model, r.a.Addr, view.StateAdmitted, 1.37),
		gwtest.Worker(model, r.b.Addr, view.StateAdmitted, 0.63),
		gwtest.Worker(model, r.c.Addr, view.StateHeld, 0),
	)
	// Only a and b answer, in about their weights' ratio (137:63 for
	// HAProxy, 87:40 for nginx).
	weighted := func(s map[string]int) bool { return len(s) == 2 && s["a"] > 2*s["b"] && s["b"] > 0 }
	t.Logf("haproxy: %v", r.waitSplit(t, "haproxy to follow the weights", r.hx.Front, 200, weighted))
	t.Logf("nginx: %v", r.waitSplit(t, "nginx to follow the weights", r.nx.Front, 127, weighted))
	if data, err := os.ReadFile(r.litellm); err != nil || strings.Count(string(data), "api_base") != 2 {
		t.Fatalf("litellm file: %s %v", data, err)
	}

	// b is held now: no new request reaches it.
	r.coord.SetWorkers(
		gwtest.Worker(model, r.a.Addr, view.StateAdmitted, 1.0),
		gwtest.Worker(model, r.b.Addr, view.StateHeld, 0),
		gwtest.Worker(model, r.c.Addr, view.StateAdmitted, 1.0),
	)
	changed := time.Now()
	evenAC := func(s map[string]int) bool { return s["b"] == 0 && s["a"] == 10 && s["c"] == 10 }
	r.waitSplit(t, "haproxy to drain b", r.hx.Front, 20, evenAC)
	t.Logf("haproxy followed the coordinator's change within %v (including the 20 requests that show it)", time.Since(changed).Round(time.Millisecond))
	r.waitSplit(t, "nginx to mark b down", r.nx.Front, 20, evenAC)

	// The coordinator dies: nothing changes on any gateway, however long
	// it stays away, and heft-sync says so.
	nginxBefore, _ := os.ReadFile(r.nx.Upstream)
	r.coord.Stop()
	testutil.Eventually(t, "heft-sync to see the coordinator gone", 10*time.Second, func() bool { return !r.status(t).Coordinator })
	// Three resyncs run with no coordinator (counted, not slept).
	unchanged := func() float64 {
		return counter(r.metrics(t), `heft_sync_applies_total{result="unchanged",target="haproxy:qwen"}`)
	}
	base := unchanged()
	testutil.Eventually(t, "three resyncs without the coordinator", 10*time.Second, func() bool { return unchanged() >= base+3 })
	if s := r.split(t, r.hx.Front, 20); !evenAC(s) {
		t.Fatalf("haproxy changed while the coordinator was down: %v", s)
	}
	if after, _ := os.ReadFile(r.nx.Upstream); string(after) != string(nginxBefore) {
		t.Fatalf("nginx's file changed while the coordinator was down:\n%s", after)
	}
	if m := r.metrics(t); !strings.Contains(m, `heft_sync_coordinator_connected 0`) ||
		!strings.Contains(m, `heft_sync_coordinator_errors_total{reason="ended"}`) && !strings.Contains(m, `heft_sync_coordinator_errors_total{reason="unreachable"} 1`) {
		t.Fatalf("metrics while the coordinator is down:\n%s", grep(m, "heft_sync_coordinator"))
	}

	// A restarted haproxy comes back with its file's defaults (every slot
	// disabled); heft-sync puts its state back without the coordinator.
	r.hx.Restart()
	r.waitSplit(t, "haproxy to be put back in step", r.hx.Front, 20, evenAC)
	if m := r.metrics(t); !strings.Contains(m, `heft_sync_drift_repairs_total{target="haproxy:qwen"} 1`) {
		t.Fatalf("no drift repair counted:\n%s", grep(m, "drift"))
	}

	// The coordinator is back with a new state: it is read and applied.
	r.coord.SetWorkers(
		gwtest.Worker(model, r.a.Addr, view.StateOffline, 0),
		gwtest.Worker(model, r.b.Addr, view.StateAdmitted, 1.0),
		gwtest.Worker(model, r.c.Addr, view.StateAdmitted, 1.0),
	)
	r.coord.Start()
	evenBC := func(s map[string]int) bool { return s["a"] == 0 && s["b"] == 10 && s["c"] == 10 }
	r.waitSplit(t, "haproxy to follow the coordinator back", r.hx.Front, 20, evenBC)
	r.waitSplit(t, "nginx to follow the coordinator back", r.nx.Front, 20, evenBC)

	// Garbage from the coordinator changes nothing either.
	r.coord.SetGarbage(`{"workers": "no"}`)
	testutil.Eventually(t, "the garbage to be counted", 10*time.Second, func() bool {
		return strings.Contains(r.metrics(t), `heft_sync_coordinator_errors_total{reason="garbage"} 1`)
	})
	if s := r.split(t, r.hx.Front, 20); !evenBC(s) {
		t.Fatalf("haproxy changed on garbage: %v", s)
	}

	st := r.status(t)
	for _, ts := range st.Targets {
		if !ts.Healthy || !ts.Applied {
			t.Errorf("target %s: %+v", ts.Name, ts)
		}
	}
	m := r.metrics(t)
	for _, want := range []string{
		`heft_sync_applies_total{result="changed",target="nginx:qwen"}`,
		`heft_sync_last_success_timestamp_seconds{target="haproxy:qwen"}`,
		`heft_sync_rounding_error_ratio{target="nginx:qwen"}`,
		`heft_sync_serving_workers{target="envoy:` + model + `"} 2`,
		`heft_sync_serving_workers{target="litellm:` + model + `"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if data, err := os.ReadFile(r.envoy); err != nil || strings.Count(string(data), `"address"`) != 2 {
		t.Errorf("Envoy's state file: %v\n%s", err, data)
	}
}

// A backend that does not exist is a clear error and a metric at start,
// not a crash; the other targets go on.
func TestMissingBackendAtStart(t *testing.T) {
	c := gwtest.NewCoordinator(t)
	hx := gwtest.StartHAProxy(t, haproxyCfg)
	listen := fmt.Sprintf("127.0.0.1:%d", gwtest.FreePort(t))
	path := filepath.Join(t.TempDir(), "heft-sync.toml")
	os.WriteFile(path, []byte(fmt.Sprintf(`listen = %q
[coordinator]
url = %q
[[haproxy]]
model = %q
socket = %q
backend = "nope"
`, listen, c.URL(), model, hx.Socket)), 0o644)
	cfg, err := config.Load([]string{"--config", path}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	var out testutil.SyncBuffer
	if code := app.Check(context.Background(), cfg, hclog.New(&hclog.LoggerOptions{Output: &out})); code != 1 || !strings.Contains(out.String(), `no backend \"nope\"`) {
		t.Fatalf("--check: code %d\n%s", code, out.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, cfg, hclog.New(&hclog.LoggerOptions{Output: &out})) }()
	defer func() { cancel(); <-done }()
	gwtest.WaitHTTP(t, "http://"+listen+"/healthz")
	testutil.Eventually(t, "the failure to be counted", 10*time.Second, func() bool {
		resp, err := http.Get("http://" + listen + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		http.DefaultClient.CloseIdleConnections()
		return strings.Contains(string(data), `heft_sync_apply_failures_total{reason="no_backend",target="haproxy:nope"} 1`)
	})
}

func TestMainExitCodes(t *testing.T) {
	var out, errb strings.Builder
	env := func(string) string { return "" }
	if code := app.Main(context.Background(), []string{"--version"}, env, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "heft-sync ") {
		t.Fatalf("--version: %d %q", code, out.String())
	}
	if code := app.Main(context.Background(), nil, env, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--config") {
		t.Fatalf("no config: %d %q", code, errb.String())
	}
	out.Reset()
	if code := app.Main(context.Background(), []string{"-h"}, env, &out, &errb); code != 0 || !strings.Contains(out.String(), "HEFT_SYNC_COORDINATOR_URL") {
		t.Fatalf("-h: %d %q", code, out.String())
	}
	// As on every heft binary: a bad flag is 2 with the usage, a bad
	// configuration 78 (a bare-number duration, here).
	errb.Reset()
	if code := app.Main(context.Background(), []string{"--bogus"}, env, &out, &errb); code != 2 ||
		!strings.Contains(errb.String(), "unknown flag: --bogus\n\nusage: heft-sync") {
		t.Fatalf("--bogus: %d %q", code, errb.String())
	}
	bad := filepath.Join(t.TempDir(), "heft-sync.toml")
	if err := os.WriteFile(bad, []byte("[coordinator]\nurl = \"http://127.0.0.1:7070\"\n[[haproxy]]\nmodel = \"m\"\ntimeout = 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if code := app.Main(context.Background(), []string{"--config", bad}, env, &out, &errb); code != 78 ||
		!strings.Contains(errb.String(), `write timeout = "5s"`) {
		t.Fatalf("bad config: %d %q", code, errb.String())
	}
}

// counter reads one sample's value from the text format.
func counter(text, series string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return -1
}

func grep(text, word string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A table's kind and min_context_tokens make its target apply that weight
// to the workers that hold that many tokens.
func TestBuildWeightKinds(t *testing.T) {
	dir := t.TempDir()
	cfg, err := config.Parse(fmt.Sprintf(`
[coordinator]
url = "http://127.0.0.1:1"
[[litellm]]
model = %[1]q
file = %[2]q
model_name = "qwen"
[[litellm]]
model = %[1]q
file = %[2]q
model_name = "qwen-long"
kind = "prefill"
min_context_tokens = 32768
`, model, filepath.Join(dir, "models.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	built, err := app.Build(cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer built.Close()
	want := []target.Selection{{Kind: view.WeightDecode}, {Kind: view.WeightPrefill, MinContextTokens: 32768}}
	if len(built.Targets) != 2 || target.SelectionOf(built.Targets[0]) != want[0] || target.SelectionOf(built.Targets[1]) != want[1] {
		t.Errorf("targets %+v, %+v", target.SelectionOf(built.Targets[0]), target.SelectionOf(built.Targets[1]))
	}
}
