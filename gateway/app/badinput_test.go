package app_test

import (
	"context"
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
	"heft/shared/testutil"
	"heft/shared/view"
)

// syncRun is heft-sync run on one gateway table against a fake
// coordinator, with its log kept.
type syncRun struct {
	listen string
	log    *testutil.SyncBuffer
}

func runSync(t *testing.T, coordURL, table string) *syncRun {
	t.Helper()
	r := &syncRun{listen: fmt.Sprintf("127.0.0.1:%d", gwtest.FreePort(t)), log: &testutil.SyncBuffer{}}
	path := filepath.Join(t.TempDir(), "sync.toml")
	text := fmt.Sprintf("listen = %q\nresync = \"200ms\"\n[coordinator]\nurl = %q\n%s", r.listen, coordURL, table)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load([]string{"--config", path}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, cfg, hclog.New(&hclog.LoggerOptions{Output: r.log, Level: hclog.Info})) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("heft-sync's log:\n%s", r.log.String())
		}
	})
	gwtest.WaitHTTP(t, "http://"+r.listen+"/healthz")
	return r
}

func (r *syncRun) metrics(t *testing.T) string {
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

// waitFor waits until the log has every line part and each metric series
// is at least its value.
func (r *syncRun) waitFor(t *testing.T, what string, logged []string, series map[string]float64) {
	t.Helper()
	testutil.Eventually(t, what, 10*time.Second, func() bool {
		for _, l := range logged {
			if !strings.Contains(r.log.String(), l) {
				return false
			}
		}
		m := r.metrics(t)
		for s, v := range series {
			if counter(m, s) < v {
				return false
			}
		}
		return true
	})
}

// The bad inputs: each is a clear log line and a metric on
// heft-sync's /metrics, and the gateway keeps its last good state.
// (A backend that does not exist: TestMissingBackendAtStart; a coordinator
// returning garbage: TestHeftSyncEndToEnd.)
func TestBadInputIsLoggedAndCounted(t *testing.T) {
	t.Run("a gateway socket that refuses", func(t *testing.T) {
		c := gwtest.NewCoordinator(t)
		c.SetWorkers(gwtest.Worker(model, "127.0.0.1:9", view.StateAdmitted, 1))
		r := runSync(t, c.URL(), fmt.Sprintf("[[haproxy]]\nmodel = %q\nsocket = %q\nbackend = \"qwen\"\n", model, filepath.Join(t.TempDir(), "gone.sock")))
		r.waitFor(t, "the refused socket", []string{"apply failed; the gateway keeps what it had", "reason=unreachable", "gone.sock"},
			map[string]float64{`heft_sync_apply_failures_total{reason="unreachable",target="haproxy:qwen"}`: 1})
		if m := r.metrics(t); counter(m, `heft_sync_target_healthy{target="haproxy:qwen"}`) != 0 {
			t.Errorf("target healthy with its socket refused:\n%s", grep(m, "healthy"))
		}
	})

	t.Run("a gateway socket that answers errors", func(t *testing.T) {
		// A real HAProxy whose socket is at level user: it shows its state
		// but answers "Permission denied" to every change.
		a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
		hx := gwtest.StartHAProxy(t, strings.Replace(haproxyCfg, "level admin", "level user", 1))
		before := gwtest.Split(t, "http://"+hx.Front+"/", 4)
		c := gwtest.NewCoordinator(t)
		c.SetWorkers(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), gwtest.Worker(model, b.Addr, view.StateAdmitted, 2))
		r := runSync(t, c.URL(), fmt.Sprintf("[[haproxy]]\nmodel = %q\nsocket = %q\nbackend = \"qwen\"\n", model, hx.Socket))
		r.waitFor(t, "the refused commands", []string{"apply failed; the gateway keeps what it had", "reason=rejected", "Permission denied"},
			map[string]float64{`heft_sync_apply_failures_total{reason="rejected",target="haproxy:qwen"}`: 1})
		if after := gwtest.Split(t, "http://"+hx.Front+"/", 4); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("the gateway changed: %v, was %v", after, before)
		}
	})

	t.Run("an nginx -t failure, and an upstream nginx.conf does not use", func(t *testing.T) {
		u := gwtest.NewUpstream(t, "u")
		first := "upstream qwen { server " + u.Addr + "; }\n"
		nx := gwtest.StartNginx(t, gwtest.NginxConf(nginxHTTP), first)
		c := gwtest.NewCoordinator(t)
		c.SetWorkers(gwtest.Worker(model, "127.0.0.1:9", view.StateAdmitted, 1))
		q := func(xs []string) string { return strings.ReplaceAll(fmt.Sprintf("%q", xs), "\" \"", "\", \"") }
		// heft-sync writes upstream "qwenn"; nginx.conf proxies to "qwen",
		// which then names no upstream and no host: nginx -t refuses it.
		r := runSync(t, c.URL(), fmt.Sprintf("[[nginx]]\nmodel = %q\nfile = %q\nupstream = \"qwenn\"\ncheck = %s\nreload = %s\n",
			model, nx.Upstream, q(nx.Check()), q(nx.Reload())))
		r.waitFor(t, "the failed check", []string{"apply failed; the gateway keeps what it had", "reason=check_failed", "the last good file is back"},
			map[string]float64{`heft_sync_apply_failures_total{reason="check_failed",target="nginx:qwenn"}`: 1})
		// heft-sync tries again each resync, and each try writes the new file
		// for nginx -t before it puts the last good one back: a single read
		// can land inside a try. Between tries the file is the last good one.
		testutil.Eventually(t, "the last good upstream file back", 10*time.Second, func() bool {
			data, _ := os.ReadFile(nx.Upstream)
			return string(data) == first
		})
		if got := gwtest.Split(t, "http://"+nx.Front+"/", 4); got["u"] != 4 {
			t.Errorf("nginx no longer routes as before: %v", got)
		}
	})

	t.Run("a weight of 0, and a single worker", func(t *testing.T) {
		a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
		hx := gwtest.StartHAProxy(t, haproxyCfg)
		c := gwtest.NewCoordinator(t)
		zero := gwtest.Worker(model, b.Addr, view.StateAdmitted, 0)
		c.SetWorkers(gwtest.Worker(model, a.Addr, view.StateAdmitted, 0.4), zero)
		r := runSync(t, c.URL(), fmt.Sprintf("[[haproxy]]\nmodel = %q\nsocket = %q\nbackend = \"qwen\"\n", model, hx.Socket))
		r.waitFor(t, "the weightless worker drained", []string{"workers left out or drained", "is admitted with weight 0: drained", "serving=1"},
			map[string]float64{`heft_sync_workers_set_aside{target="haproxy:qwen"}`: 1, `heft_sync_serving_workers{target="haproxy:qwen"}`: 1})
		// The single serving worker takes every request, at weight 1.
		if got := gwtest.Split(t, "http://"+hx.Front+"/", 10); got["a"] != 10 {
			t.Errorf("split %v, want all to a", got)
		}
		weight := ""
		for _, row := range hx.Stat(t) {
			if row["pxname"] == "qwen" && row["addr"] == a.Addr {
				weight = row["weight"]
			}
		}
		if weight != "1" {
			t.Errorf("the single worker's HAProxy weight is %q, want 1", weight)
		}
	})
}
