package nginx_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/gwtest"
	"heft/gateway/nginx"
	"heft/gateway/target"
	"heft/shared/testutil"
	"heft/shared/view"
)

// A DNS outage on the nginx host, in a fleet with one worker by IP and
// one by name: nginx -t cannot resolve the name, but nginx serves that
// worker from its last load. heft-sync keeps the last good file and does
// not reload, so nginx goes on serving both with no failed request, and
// the coordinator's new weights wait for the name to resolve again.
// Before, the one-bad-worker rule left the named worker out and reloaded
// nginx without it: heft-sync itself took a healthy worker out.
func TestDNSOutageKeepsServedNamedWorker(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	_, port, _ := strings.Cut(b.Addr, ":")
	named := "heft-engine-b.test:" + port
	const hosts = "127.0.0.1 heft-engine-b.test\n"
	nx := gwtest.StartNginxHosts(t, gwtest.NginxConf(confRetry), "upstream qwen { server "+a.Addr+"; server "+named+"; }\n", hosts)
	r := rig{nx: nx, reloads: filepath.Join(nx.Dir, "reloads")}
	n := r.target(t)
	apply := func(wa, wb float64) (target.Result, error) {
		return n.Apply(context.Background(), desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, wa),
			gwtest.Worker(model, named, view.StateAdmitted, wb)))
	}
	if _, err := apply(1, 1); err != nil {
		t.Fatal(err)
	}
	load := gwtest.StartLoad(t, "http://"+nx.Front+"/", 4)
	testutil.Eventually(t, "both engines to answer", 10*time.Second, func() bool {
		c := load.Counts()
		return c["a"] > 20 && c["b"] > 20
	})

	nx.SetHosts("")
	before, _ := os.ReadFile(nx.Upstream)
	reloads := r.reloadCount(t)
	for i := range 2 { // nothing is remembered: each sync checks again
		res, err := apply(3, 1)
		if target.Reason(err) != target.ReasonResolve || len(res.Dropped) != 0 {
			t.Fatalf("apply %d in the outage: %+v %v (reason %s), want the last good file kept (resolve)", i, res, err, target.Reason(err))
		}
		if after, _ := os.ReadFile(nx.Upstream); string(after) != string(before) || r.reloadCount(t) != reloads {
			t.Fatalf("apply %d in the outage changed the file or reloaded nginx (%d reloads, %d before):\n%s", i, r.reloadCount(t), reloads, after)
		}
	}
	mid := load.Counts()
	testutil.Eventually(t, "both engines to answer in the outage", 10*time.Second, func() bool {
		c := load.Counts()
		return c["a"] > mid["a"]+20 && c["b"] > mid["b"]+20
	})

	nx.SetHosts(hosts)
	res, err := apply(3, 1)
	if err != nil || r.reloadCount(t) != reloads+1 {
		t.Fatalf("apply after the outage: %+v %v, %d reloads (want %d)", res, err, r.reloadCount(t), reloads+1)
	}
	waitFor(t, nx, func(s map[string]int) bool { return s["a"] >= 6 && s["b"] >= 1 && s["a"]+s["b"] == 10 })
	load.Stop()
	if n, errs := load.Failed(); n != 0 {
		t.Fatalf("%d requests failed: %v %v", n, load.Counts(), errs)
	}
	t.Logf("answers: %v", load.Counts())
}

// The check may be the operator's own command, whose message names no
// file: a served worker's name that nginx cannot resolve keeps the last
// good file all the same, while a new worker's is left out as before.
func TestUnresolvedServedWorkerWithoutFileInMessage(t *testing.T) {
	dir := t.TempDir()
	file, reloads := filepath.Join(dir, "qwen.conf"), filepath.Join(dir, "reloads")
	first := "upstream qwen {\n    server 10.0.0.1:8000;\n    server b.test:8000;\n}\n"
	if err := os.WriteFile(file, []byte(first), 0o644); err != nil {
		t.Fatal(err)
	}
	// The check refuses whichever of the names is in the file.
	check := filepath.Join(dir, "check.sh")
	script := `for h in b.test:8000 c.test:8000; do if grep -q "server $h" ` + file + `; then echo "nginx: [emerg] host not found in upstream \"$h\"" >&2; exit 1; fi; done`
	if err := os.WriteFile(check, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := nginx.New(nginx.Config{Model: model, File: file, Upstream: "qwen",
		Check: []string{"sh", check}, Reload: []string{"sh", "-c", "echo >> " + reloads}}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	a, bw := gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 3), gwtest.Worker(model, "b.test:8000", view.StateAdmitted, 1)
	_, err = n.Apply(context.Background(), desired(a, bw))
	if data, _ := os.ReadFile(file); target.Reason(err) != target.ReasonResolve || string(data) != first {
		t.Fatalf("served b unresolved: %v, file\n%s", err, data)
	}
	if _, err := os.Stat(reloads); err == nil {
		t.Fatal("nginx was reloaded")
	}

	// A new worker whose name does not resolve: left out, the rest applied.
	if err := os.WriteFile(file, []byte("upstream qwen {\n    server 10.0.0.1:8000;\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := n.Apply(context.Background(), desired(a, gwtest.Worker(model, "c.test:8000", view.StateAdmitted, 1)))
	if err != nil || len(res.Dropped) != 1 || !strings.Contains(res.Dropped[0], "c.test") {
		t.Fatalf("new c unresolved: %+v %v", res, err)
	}
}

// A served worker's name that stays unresolvable (a retired host's
// deleted record, while the coordinator still lists it stale) keeps the
// last good file only for a while: then it is left out like any refused
// worker and the rest is applied, so it cannot hold every later change of
// this upstream, or of another model's on the same nginx, for hours.
func TestUnresolvedServedWorkerIsLeftOutAfterAWhile(t *testing.T) {
	dir := t.TempDir()
	file, reloads := filepath.Join(dir, "qwen.conf"), filepath.Join(dir, "reloads")
	first := "upstream qwen {\n    server 10.0.0.1:8000;\n    server b.test:8000;\n}\n"
	if err := os.WriteFile(file, []byte(first), 0o644); err != nil {
		t.Fatal(err)
	}
	check := filepath.Join(dir, "check.sh")
	script := `if grep -q "server b.test:8000" ` + file + `; then echo "nginx: [emerg] host not found in upstream \"b.test:8000\"" >&2; exit 1; fi`
	if err := os.WriteFile(check, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := nginx.New(nginx.Config{Model: model, File: file, Upstream: "qwen",
		Check: []string{"sh", check}, Reload: []string{"sh", "-c", "echo >> " + reloads}}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 6, 7, 0, 0, 0, time.UTC)
	n.SetClock(func() time.Time { return now })
	stale, weight := gwtest.Worker(model, "b.test:8000", view.StateStale, 0), 1.0
	stale.Weight = &weight // a stale worker serves at its last weight
	m := desired(gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 3), stale)
	start := now
	for _, after := range []time.Duration{0, time.Minute, 4*time.Minute + 59*time.Second} {
		now = start.Add(after)
		if _, err := n.Apply(context.Background(), m); target.Reason(err) != target.ReasonResolve {
			t.Fatalf("%v into the failure: %v, want the last good file kept (resolve)", after, err)
		}
	}
	now = start.Add(5 * time.Minute) // since the name first failed
	res, err := n.Apply(context.Background(), m)
	data, _ := os.ReadFile(file)
	if err != nil || len(res.Dropped) != 1 || strings.Contains(string(data), "b.test") || !strings.Contains(string(data), "10.0.0.1:8000") {
		t.Fatalf("5 minutes on: %+v %v, file\n%s\nwant b left out and the rest applied", res, err, data)
	}
	if _, err := os.Stat(reloads); err != nil {
		t.Fatal("nginx was not reloaded with the rest")
	}
}
