package nginx_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/coord"
	"heft/gateway/gwtest"
	"heft/gateway/nginx"
	"heft/gateway/scale"
	"heft/gateway/target"
	"heft/shared/testutil"
	"heft/shared/view"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

const model = "Qwen/Qwen3-8B"

// The nginx configuration the tests (and the README) use: heft-sync's file
// is included in the http block and holds the whole upstream.
const conf = `    include {{upstream_file}};
    server {
        listen {{front}};
        location / {
            proxy_pass http://qwen;
            proxy_buffering off;
        }
    }`

func desired(ws ...coord.Worker) target.Model {
	m, _ := target.ForModel(model, ws)
	return m
}

type rig struct {
	nx      *gwtest.Nginx
	reloads string // a file the reload command appends a line to
}

func (r rig) reloadCount(t *testing.T) int {
	data, err := os.ReadFile(r.reloads)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

func start(t *testing.T, first string) rig {
	nx := gwtest.StartNginx(t, gwtest.NginxConf(conf), first)
	return rig{nx: nx, reloads: filepath.Join(nx.Dir, "reloads")}
}

func (r rig) target(t *testing.T, directives ...string) *nginx.Nginx {
	t.Helper()
	// Each reload notes when it began, a line each.
	reload := "date +%s.%N >> " + r.reloads + " && " + strings.Join(r.nx.Reload(), " ")
	n, err := nginx.New(nginx.Config{Model: model, File: r.nx.Upstream, Upstream: "qwen", Directives: directives,
		Check: r.nx.Check(), Reload: []string{"sh", "-c", reload}}, hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug}))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls the frontend until requests go where ok says, since a
// reload hands over to new workers a moment later, and then until no
// worker of the file before is left: one of them may still take a
// connection after the new workers answered.
func waitFor(t *testing.T, nx *gwtest.Nginx, ok func(map[string]int) bool) {
	t.Helper()
	testutil.Eventually(t, "nginx to route by the new file", 10*time.Second, func() bool { return ok(gwtest.Split(t, "http://"+nx.Front+"/", 10)) })
	nx.WaitOneGeneration()
}

func TestWeightsSplitRealRequests(t *testing.T) {
	a, b, c := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b"), gwtest.NewUpstream(t, "c")
	r := start(t, "upstream qwen { server "+c.Addr+"; }\n")
	n := r.target(t)
	m := desired(
		gwtest.Worker(model, a.Addr, view.StateAdmitted, 1.37),
		gwtest.Worker(model, b.Addr, view.StateAdmitted, 0.63),
		gwtest.Worker(model, c.Addr, view.StateHeld, 0),
	)
	res, err := n.Apply(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	ints, rounding := scale.Ints([]float64{1.37, 0.63}, nginx.MaxWeight)
	if res.RoundingError != rounding || res.Serving != 2 || r.reloadCount(t) != 1 {
		t.Fatalf("result %+v, reloads %d", res, r.reloadCount(t))
	}
	data, _ := os.ReadFile(r.nx.Upstream)
	for _, line := range []string{"server " + a.Addr + " weight=" + strconv.Itoa(ints[0]) + ";", "server " + c.Addr + " down;"} {
		if !strings.Contains(string(data), line) {
			t.Fatalf("the file lacks %q:\n%s", line, data)
		}
	}
	if strings.Contains(string(data), "max_conns") {
		t.Fatal("max_conns written though not asked for")
	}
	waitFor(t, r.nx, func(s map[string]int) bool { return s["c"] == 0 })

	// nginx's weighted round robin is exact over a whole cycle.
	cycle := ints[0] + ints[1]
	split := gwtest.Split(t, "http://"+r.nx.Front+"/", 2*cycle)
	t.Logf("split over %d requests at weights %d/%d (rounding error %.2f%%): %v", 2*cycle, ints[0], ints[1], rounding*100, split)
	for name, want := range map[string]int{"a": 2 * ints[0], "b": 2 * ints[1]} {
		if got := split[name]; got < want-2 || got > want+2 {
			t.Errorf("%s got %d requests, want %d", name, got, want)
		}
	}
	if split["c"] != 0 {
		t.Errorf("the held worker got %d requests", split["c"])
	}

	// The same state again: no write, no reload.
	if res, err := n.Apply(context.Background(), m); err != nil || len(res.Changes) != 0 || r.reloadCount(t) != 1 {
		t.Fatalf("a second apply: %+v %v, reloads %d", res, err, r.reloadCount(t))
	}

	// Someone rewrote the file: the next apply puts heft's back.
	if err := os.WriteFile(r.nx.Upstream, []byte("upstream qwen { server "+c.Addr+"; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, err := n.Apply(context.Background(), m); err != nil || len(res.Changes) == 0 || r.reloadCount(t) != 2 {
		t.Fatalf("after drift: %+v %v, reloads %d", res, err, r.reloadCount(t))
	}
}

// A file nginx -t refuses is taken back: the last good file stays, nginx
// is not reloaded, and it keeps routing as before.
func TestCheckFailureKeepsLastGoodFile(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	r := start(t, "upstream qwen { server "+a.Addr+"; }\n")
	good := r.target(t, "least_conn")
	m := desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), gwtest.Worker(model, b.Addr, view.StateHeld, 0))
	if _, err := good.Apply(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(r.nx.Upstream)
	reloads := r.reloadCount(t)

	bad := r.target(t, "no_such_directive 1")
	m2 := desired(gwtest.Worker(model, a.Addr, view.StateHeld, 0), gwtest.Worker(model, b.Addr, view.StateAdmitted, 1))
	_, err := bad.Apply(context.Background(), m2)
	if target.Reason(err) != target.ReasonCheck || !strings.Contains(err.Error(), "no_such_directive") {
		t.Fatalf("apply of a bad file: %v (reason %s)", err, target.Reason(err))
	}
	after, _ := os.ReadFile(r.nx.Upstream)
	if string(after) != string(before) || r.reloadCount(t) != reloads {
		t.Fatalf("the last good file was not kept or nginx was reloaded:\n%s", after)
	}
	if split := gwtest.Split(t, "http://"+r.nx.Front+"/", 10); split["a"] != 10 {
		t.Fatalf("nginx stopped routing by the last good file: %v", split)
	}
	entries, _ := os.ReadDir(filepath.Dir(r.nx.Upstream))
	for _, e := range entries {
		if strings.Contains(e.Name(), ".heft-") {
			t.Fatalf("a temporary file was left: %s", e.Name())
		}
	}
}

// Every worker held: every server is down, which nginx accepts (and
// answers 502); no worker at all: the file is kept.
func TestAllHeldAndNoWorkers(t *testing.T) {
	a := gwtest.NewUpstream(t, "a")
	r := start(t, "upstream qwen { server "+a.Addr+"; }\n")
	n := r.target(t)
	res, err := n.Apply(context.Background(), desired(gwtest.Worker(model, a.Addr, view.StateHeld, 0)))
	if err != nil || res.Serving != 0 {
		t.Fatalf("all held: %+v %v", res, err)
	}
	waitFor(t, r.nx, func(s map[string]int) bool { return s["status 502"] == 10 })
	before, _ := os.ReadFile(r.nx.Upstream)
	_, err = n.Apply(context.Background(), desired())
	if target.Reason(err) != target.ReasonNoServers {
		t.Fatalf("no worker: %v", err)
	}
	if after, _ := os.ReadFile(r.nx.Upstream); string(after) != string(before) {
		t.Fatal("the file changed with no worker to write")
	}
}

// A reload that fails puts the last good file back, so the file says what
// nginx runs: the next apply writes and reloads again, whether by the same
// heft-sync or by one restarted, which remembers nothing of the failure.
// Every failure of a streak does: when only the first did, a heft-sync
// restarted after the second found the new file, never reloaded, and
// nginx kept the old state.
func TestReloadFailureIsRetried(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	r := start(t, "upstream qwen { server "+a.Addr+"; }\n")
	flag := filepath.Join(r.nx.Dir, "fail-reload")
	failing := func() *nginx.Nginx {
		t.Helper()
		n, err := nginx.New(nginx.Config{Model: model, File: r.nx.Upstream, Upstream: "qwen", Check: r.nx.Check(),
			Reload: []string{"sh", "-c", "test ! -e " + flag + " && " + strings.Join(r.nx.Reload(), " ")}}, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	m := desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1))
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restarted %t", restart), func(t *testing.T) {
			n := failing()
			if _, err := n.Apply(context.Background(), m); err != nil {
				t.Fatalf("the apply before: %v", err)
			}
			before, _ := os.ReadFile(r.nx.Upstream)
			if err := os.WriteFile(flag, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			// Both workers: a new state the reload fails to load.
			m = desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), gwtest.Worker(model, b.Addr, view.StateAdmitted, 1))
			for i := range 2 { // a streak of failures
				if _, err := n.Apply(context.Background(), m); target.Reason(err) != target.ReasonReload {
					t.Fatalf("apply %d, whose reload fails: %v", i, err)
				}
				if after, _ := os.ReadFile(r.nx.Upstream); !bytes.Equal(after, before) {
					t.Errorf("after failed reload %d the file is %q, want the last good one %q", i, after, before)
				}
			}
			os.Remove(flag)
			if restart {
				n = failing()
			}
			res, err := n.Apply(context.Background(), m)
			if err != nil || !slices.Contains(res.Changes, "reloaded nginx") {
				t.Fatalf("the retry: %+v %v", res, err)
			}
			testutil.Eventually(t, "nginx to send to both workers", 10*time.Second, func() bool {
				got := gwtest.Split(t, "http://"+r.nx.Front+"/", 20)
				return got["a"] > 0 && got["b"] > 0
			})
			m = desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1))
		})
	}
}

// A reload that keeps failing is tried at every sync, and after each
// failure the file is the last good one, what nginx runs.
func TestReloadThatKeepsFailingKeepsTheLastGoodFile(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	r := start(t, "upstream qwen { server "+a.Addr+"; }\n")
	tries := filepath.Join(r.nx.Dir, "tries")
	n, err := nginx.New(nginx.Config{Model: model, File: r.nx.Upstream, Upstream: "qwen", Check: r.nx.Check(),
		Reload: []string{"sh", "-c", "echo >> " + tries + "; false"}}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(r.nx.Upstream)
	m := desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), gwtest.Worker(model, b.Addr, view.StateAdmitted, 1))
	for i := range 4 {
		if _, err := n.Apply(context.Background(), m); target.Reason(err) != target.ReasonReload {
			t.Fatalf("apply %d: %v", i, err)
		}
		if data, _ := os.ReadFile(r.nx.Upstream); !bytes.Equal(data, before) {
			t.Fatalf("after failed reload %d the file is\n%s\nwant the last good one\n%s", i, data, before)
		}
	}
	if data, _ := os.ReadFile(tries); strings.Count(string(data), "\n") != 4 {
		t.Fatalf("%d reloads tried in 4 applies, want 4", strings.Count(string(data), "\n"))
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []nginx.Config{
		{Model: model, File: "relative.conf", Upstream: "qwen"},
		{Model: model, File: filepath.Join(dir, "missing", "x.conf"), Upstream: "qwen"},
		{Model: model, File: filepath.Join(dir, "x.conf"), Upstream: "qw en"},
		{Model: model, File: filepath.Join(dir, "x.conf"), Upstream: "qwen", Directives: []string{"least_conn; server evil"}},
		{File: filepath.Join(dir, "x.conf"), Upstream: "qwen"},
	} {
		if _, err := nginx.New(c, hclog.NewNullLogger()); err == nil {
			t.Errorf("New(%+v) took it", c)
		}
	}
}

func TestRenderMaxConns(t *testing.T) {
	w := gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1)
	mc := 32
	w.MaxConcurrency = &mc
	data, _, _ := nginx.Render(nginx.Config{Upstream: "qwen", MaxConns: true}, desired(w))
	if !strings.Contains(string(data), "server 10.0.0.1:8000 weight=1 max_conns=32;") {
		t.Fatalf("%s", data)
	}
}
