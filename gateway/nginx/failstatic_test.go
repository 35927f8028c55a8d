package nginx_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/coord"
	"heft/gateway/gwtest"
	"heft/gateway/syncer"
	"heft/gateway/target"
	"heft/shared/testutil"
	"heft/shared/view"
)

// The location of heft's examples (docs/gateways.md): a request whose
// connection to an engine fails before any answer (refused, reset, a
// timeout) goes to the next server, never one whose answer started (nginx
// passes nothing on once it sent a byte to the client), and a server that
// failed is left alone for fail_timeout.
const confRetry = `    include {{upstream_file}};
    server {
        listen {{front}};
        location / {
            proxy_pass http://qwen;
            proxy_buffering off;
            proxy_connect_timeout 2s;
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
            proxy_next_upstream_tries 3;
            proxy_next_upstream_timeout 10s;
        }
    }`

// An engine that dies gets no more requests from nginx's passive check
// (max_fails=1 fail_timeout=10s, nginx's defaults), with no failed
// request, while the coordinator still says it is admitted.
func TestDeadEngineFailsNoRequest(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	nx := gwtest.StartNginx(t, gwtest.NginxConf(confRetry), "upstream qwen { server "+b.Addr+"; }\n")
	r := rig{nx: nx, reloads: nx.Dir + "/reloads"}
	n := r.target(t)
	if _, err := n.Apply(context.Background(), desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, b.Addr, view.StateAdmitted, 1))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, nx, func(s map[string]int) bool { return s["a"] > 0 && s["b"] > 0 })
	load := gwtest.StartLoad(t, "http://"+nx.Front+"/", 4)
	testutil.Eventually(t, "both engines to answer", 10*time.Second, func() bool {
		c := load.Counts()
		return c["a"] > 20 && c["b"] > 20
	})
	a.Stop()
	before := load.Counts()
	testutil.Eventually(t, "requests to go on to b", 10*time.Second, func() bool { return load.Counts()["b"] > before["b"]+100 })
	load.Stop()
	after := load.Counts()
	if n, errs := load.Failed(); n != 0 {
		t.Fatalf("%d requests failed while an engine died: %v %v", n, after, errs)
	}
	t.Logf("answers while a died: %v (a answered %d after it was stopped)", after, after["a"]-before["a"])
}

// heft-sync starts beside a live nginx while the coordinator lists every
// worker as not measured yet (a first install, or a coordinator restarted
// on an empty state): nginx keeps serving the servers it started with, as
// the operator weighted them, and the measured weights take over one by
// one, with no failed request. Before, the first apply wrote every server
// down and nginx answered 502 until a worker was measured.
func TestFirstSyncKeepsServingWhileMeasuring(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	nx := gwtest.StartNginx(t, gwtest.NginxConf(confRetry), "upstream qwen { server "+a.Addr+" weight=3; server "+b.Addr+"; }\n")
	r := rig{nx: nx, reloads: nx.Dir + "/reloads"}
	n := r.target(t)
	load := gwtest.StartLoad(t, "http://"+nx.Front+"/", 4)
	testutil.Eventually(t, "both engines to answer", 10*time.Second, func() bool {
		c := load.Counts()
		return c["a"] > 20 && c["b"] > 20
	})

	s := syncer.New([]target.Target{n}, syncer.NewMetrics([]string{n.Name()}), time.Hour, hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	step := func(what string, ws ...coord.Worker) map[string]int {
		t.Helper()
		was, _ := os.ReadFile(nx.Upstream)
		s.Update(coord.Snapshot{Workers: ws, At: time.Now()})
		testutil.Eventually(t, what, 10*time.Second, func() bool {
			now, _ := os.ReadFile(nx.Upstream)
			return string(now) != string(was)
		})
		before := load.Counts()
		testutil.Eventually(t, "requests after "+what, 10*time.Second, func() bool {
			c := load.Counts()
			return c["a"]+c["b"] > before["a"]+before["b"]+200
		})
		after := load.Counts()
		return map[string]int{"a": after["a"] - before["a"], "b": after["b"] - before["b"]}
	}
	split := step("the first apply", gwtest.Worker(model, a.Addr, view.StateMeasuring, 0), gwtest.Worker(model, b.Addr, view.StateMeasuring, 0))
	if split["b"] == 0 || split["a"] < 2*split["b"] {
		t.Errorf("while both are measured: %v, want both served about 3:1 as nginx had them", split)
	}
	data, _ := os.ReadFile(nx.Upstream)
	if strings.Contains(string(data), " down;") {
		t.Errorf("a server was written down while measured:\n%s", data)
	}
	// a is measured at 1.0: b, still measuring, counts as the gateway's
	// 1 against a's 3, i.e. 0.33.
	split = step("a's measurement", gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), gwtest.Worker(model, b.Addr, view.StateMeasuring, 0))
	if split["b"] == 0 || split["a"] < 2*split["b"] {
		t.Errorf("a measured, b measuring: %v, want about 3:1", split)
	}
	s.Update(coord.Snapshot{Workers: []coord.Worker{gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), gwtest.Worker(model, b.Addr, view.StateAdmitted, 1)}, At: time.Now()})
	waitFor(t, nx, func(s map[string]int) bool { return s["a"] >= 4 && s["b"] >= 4 })
	load.Stop()
	if n, errs := load.Failed(); n != 0 {
		t.Fatalf("%d requests failed: %v %v", n, load.Counts(), errs)
	}
	t.Logf("answers: %v", load.Counts())
}
