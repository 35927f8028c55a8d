package nginx_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/gwtest"
	"heft/gateway/nginx"
	"heft/gateway/target"
	"heft/shared/view"
)

// One worker whose line nginx -t refuses (here a host name that does not
// resolve, RFC 6761's .invalid) is left out, reported in Result.Dropped,
// and the other workers' weights are applied; it costs one failed check,
// not one per sync. Before, every apply failed the check and kept every
// weight of the upstream frozen.
func TestRefusedWorkerIsDroppedNotTheUpstream(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	r := start(t, "upstream qwen { server "+a.Addr+"; }\n")
	checks := filepath.Join(r.nx.Dir, "checks")
	check := "echo check >> " + checks + " && " + strings.Join(r.nx.Check(), " ")
	n, err := nginx.New(nginx.Config{Model: model, File: r.nx.Upstream, Upstream: "qwen",
		Check: []string{"sh", "-c", check}, Reload: r.nx.Reload()}, hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug}))
	if err != nil {
		t.Fatal(err)
	}
	countChecks := func() int { data, _ := os.ReadFile(checks); return strings.Count(string(data), "\n") }
	const bad = "heft-no-such-host.invalid:8000"

	apply := func(wa, wb float64) target.Result {
		t.Helper()
		res, err := n.Apply(context.Background(), desired(
			gwtest.Worker(model, a.Addr, view.StateAdmitted, wa),
			gwtest.Worker(model, b.Addr, view.StateAdmitted, wb),
			gwtest.Worker(model, bad, view.StateAdmitted, 1)))
		if err != nil {
			t.Fatalf("apply with one refused worker: %v", err)
		}
		if len(res.Dropped) != 1 || !strings.Contains(res.Dropped[0], "w-"+bad) || res.Serving != 2 {
			t.Fatalf("result %+v, want the worker at %s dropped and 2 serving", res, bad)
		}
		data, _ := os.ReadFile(r.nx.Upstream)
		if strings.Contains(string(data), bad) {
			t.Fatalf("the refused worker is in the file:\n%s", data)
		}
		return res
	}
	apply(3, 1)
	t.Logf("first apply: %d checks (one refused the worker)", countChecks())
	if c := countChecks(); c != 2 {
		t.Fatalf("%d checks, want 2: one refusing the worker, one taking the rest", c)
	}
	waitFor(t, r.nx, func(s map[string]int) bool { return s["a"] >= 6 && s["b"] >= 1 && s["a"]+s["b"] == 10 })

	// New weights for the good workers go through; the refused one stays
	// out without another failed check.
	apply(1, 3)
	if c := countChecks(); c != 3 {
		t.Fatalf("%d checks after the second apply, want 3", c)
	}
	data, _ := os.ReadFile(r.nx.Upstream)
	if !strings.Contains(string(data), "server "+a.Addr+" weight=1;") || !strings.Contains(string(data), "server "+b.Addr+" weight=3;") {
		t.Fatalf("the good workers' new weights are not in the file:\n%s", data)
	}
	waitFor(t, r.nx, func(s map[string]int) bool { return s["b"] >= 6 && s["a"]+s["b"] == 10 })
}

// A capacity key holding newlines stays a comment: before, it was written
// into the upstream file as directives nginx -t took (an extra server).
func TestHostileWorkerStringsStayComments(t *testing.T) {
	a := gwtest.NewUpstream(t, "a")
	r := start(t, "upstream qwen { server "+a.Addr+"; }\n")
	n := r.target(t)
	w := gwtest.Worker(model, a.Addr, view.StateAdmitted, 1)
	w.ID = "gpu-a/k\n    server 127.0.0.1:1 weight=100;\n    server 127.0.0.1:2"
	m := desired(w)
	// advertise_url = http://unix:80 became "server unix:80": past the
	// coordinator's checks, nginx's own side leaves it out.
	m.Backends = append(m.Backends, target.Backend{Address: "unix:80", Scheme: "http", WorkerID: "u", State: view.StateAdmitted, Serving: true, Weight: 1})
	res, err := n.Apply(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(r.nx.Upstream)
	if got := strings.Count(string(data), "\n    server "); got != 1 || strings.Contains(string(data), "server unix") || len(res.Dropped) != 1 {
		t.Fatalf("%d server lines, want 1; dropped %q:\n%s", got, res.Dropped, data)
	}
}
