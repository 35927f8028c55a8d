package nginx_test

import (
	"context"
	"testing"
	"time"

	"heft/gateway/gwtest"
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
	waitFor(t, nx.Front, func(s map[string]int) bool { return s["a"] > 0 && s["b"] > 0 })
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
