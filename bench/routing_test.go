package bench

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"heft/gateway/gwproc"
)

// TestRoutingShort is the routing benchmark's short version, the one CI
// runs: real haproxy and nginx in front of the area's heft-sim fleet with
// its agents, a coordinator and heft-sync, 10 s of Poisson arrivals at
// 60 % of the fleet's true capacity through round robin and through
// heft's weights on each gateway. It asserts only what holds on any
// machine, however loaded: the held worker gets no request, heft's split
// follows its weights in order, every request finishes, and heft's
// weights deliver at least round robin's tokens per second (round robin
// gives the slow worker a third of the load, three times what it can
// serve, so its cells last about twice as long). No timing is asserted.
func TestRoutingShort(t *testing.T) {
	ctx, bin := fleetTest(t, "starts a fleet, haproxy and nginx, and offers 10 s of load four times (about 90 s)")
	// Mostly waiting on the load's arrivals, and judged only on what load
	// cannot break (above), so it overlaps TestQuickRun.
	t.Parallel()

	var policies []policy
	for _, p := range routingPolicies {
		if p.Key == "rr" || p.Key == "lc_heft" {
			policies = append(policies, p)
		}
	}
	plan := routingPlan{Policies: policies, Loads: []float64{0.6}, Seeds: 1, Cell: 10 * time.Second,
		Drain: 3 * time.Minute, Tokens: 128}
	e := &env{opts: Options{Bin: bin, Progress: testLog{t}}, bin: bin, work: t.TempDir(), runs: 1, tokens: 128, conc: 16}
	r, err := e.routingRun(ctx, plan)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Cells) != len(policies) {
		t.Fatalf("%d cells, want %d", len(r.Cells), len(policies))
	}
	// Every request the load sent through a gateway reached a sim with
	// its gateway's mark: the header passes HAProxy and nginx, so area
	// 11's count of requests that met a probe sees every one. That count
	// is a figure here: a re-measurement that a loaded machine's slow
	// sims ask for may run while the cells wait for idle engines.
	sent := map[string]int64{}
	for _, c := range r.Cells {
		sent[c.Policy.Gateway] += int64(c.Res.Sent)
	}
	for gw, n := range sent {
		if r.LoadSeen[gw] != n {
			t.Errorf("%s: the sims counted %d requests marked as its load, the load generator sent %d", gw, r.LoadSeen[gw], n)
		}
		t.Logf("%s: %d of %d load requests met a probe's request", gw, r.MetProbe[gw], n)
	}
	tps := map[string]float64{}
	for _, c := range r.Cells {
		res := c.Res
		t.Logf("%s: sent %d, completed %d, %.0f tok/s, p95 %.2f s, split %v", c.Policy, res.Sent, res.Completed,
			res.TokensPerSecond, res.Latency.P95.Seconds(), c.Split)
		if c.Err != nil {
			t.Errorf("%s: %v", c.Policy, c.Err)
		}
		if res.Sent == 0 || res.Completed != res.Sent || res.Refused != 0 || res.Failed != 0 || res.Unfinished != 0 {
			t.Errorf("%s: not every request finished: %d arrivals, %d sent, %d completed, %d refused, %d failed %v, %d unfinished",
				c.Policy, res.Arrivals, res.Sent, res.Completed, res.Refused, res.Failed, res.Errors, res.Unfinished)
		}
		if c.Other != 0 {
			t.Errorf("%s: %d requests went to a backend that is no worker of the fleet: %v", c.Policy, c.Other, res.Backends)
		}
		if c.Split[routeHeld] != 0 {
			t.Errorf("%s: the held worker got %d requests", c.Policy, c.Split[routeHeld])
		}
		if c.Policy.Weights == weightsHeft {
			// dp2 carries twice mid's 900 tok/s with both ranks full.
			fast, mid, slow, dp := c.Split[0], c.Split[1], c.Split[2], c.Split[routeDP]
			if !(fast > mid && dp > mid && mid > slow) {
				t.Errorf("%s: split fast %d, dp2 %d, mid %d, slow %d does not follow heft's weights %v", c.Policy, fast, dp, mid, slow, r.Weights)
			}
		}
		tps[frontKey(c.Policy)] = res.TokensPerSecond
	}
	if r.HeldSeen != 0 {
		t.Errorf("the held worker's engine counted %g requests during the cells", r.HeldSeen)
	}
	for _, gw := range []string{gwHAProxy, gwNginx} {
		heft, rr := tps[gw+"/lc_heft"], tps[gw+"/rr"]
		if !(heft >= rr) {
			t.Errorf("%s: heft's weights delivered %.0f tok/s, round robin %.0f", gw, heft, rr)
		}
	}

	// The area's section renders from the same result.
	var s Section
	r.render(&s)
	if len(s.Table.Rows) != len(policies) || len(s.More) != 1 {
		t.Fatalf("section: %d result rows, %d more tables:\n%s", len(s.Table.Rows), len(s.More), s.Markdown())
	}
	md := s.Markdown()
	if !strings.Contains(md, "| the held worker gets no request | both | all 4 cells | 0 through the gateways; its engine counted 0 | 0 | pass |") {
		t.Errorf("the targets table lacks the held worker's pass:\n%s", md)
	}
	t.Logf("\n%s", md)
}

// testLog sends the bench's progress lines to the test log.
// fleetTest skips a test that starts area 9's fleet where it cannot run
// (-short, not Linux, no haproxy or nginx), and returns a context that
// ends with the test (10 min at most) and the built binaries.
func fleetTest(t *testing.T, what string) (context.Context, string) {
	t.Helper()
	if testing.Short() {
		t.Skip(what)
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("the bench reads /proc: Linux only")
	}
	gwproc.Require(t, "haproxy")
	gwproc.Require(t, "nginx")
	bin := testBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx, bin
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestNginxServers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "heft.conf")
	text := `# Written by heft-sync for model "m"; heft-sync rewrites it, so edit its [[nginx]] table instead.
upstream lc_heft {
    least_conn;
    keepalive 32;
    server 127.0.0.1:4001 weight=100;          # admitted, w1
    server 127.0.0.1:4002 weight=45;           # admitted, w2
    server 127.0.0.1:4003 down;                # held, w3
    server 127.0.0.1:4004;
}
`
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := nginxServers(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []ngServer{{"127.0.0.1:4001", 100, false}, {"127.0.0.1:4002", 45, false}, {"127.0.0.1:4003", 1, true}, {"127.0.0.1:4004", 1, false}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("server %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if err := os.WriteFile(path, []byte("upstream u {\n    server 127.0.0.1:1 weight=x;\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := nginxServers(path); err == nil {
		t.Error("a bad weight: want an error")
	}
}

func TestNotWorse(t *testing.T) {
	for _, c := range []struct {
		ratios []float64
		up     bool
		want   string
	}{
		{[]float64{0.98, 0.99}, true, "pass"},
		{[]float64{1.10}, true, "pass"}, // better than the reference
		{[]float64{0.95, 0.96}, true, "miss by 1.5 pp (2 of 2 runs outside)"},
		{[]float64{0.99, 0.96}, true, "pass (1 of 2 runs outside)"},
		{[]float64{1.02}, false, "pass"},
		{[]float64{0.80}, false, "pass"},
		{[]float64{1.05}, false, "miss by 2.0 pp"},
		{nil, true, "miss: not measured"},
	} {
		if got := notWorse(Summarize(c.ratios), 0.03, c.up); got != c.want {
			t.Errorf("notWorse(%v, up=%v) = %q, want %q", c.ratios, c.up, got, c.want)
		}
	}
}

// --routing-loads and --weight-min reach area 9's plan, its coordinator's
// config and its notes; values out of range are refused.
func TestRoutingLoadsAndWeightMin(t *testing.T) {
	p := (&env{opts: Options{RoutingLoads: []int{30, 90}, WeightMin: 0.1}}).routingPlanFor()
	if len(p.Loads) != 2 || p.Loads[0] != 0.3 || p.Loads[1] != 0.9 || p.WeightMin != 0.1 {
		t.Fatalf("plan loads %v, weight_min %v", p.Loads, p.WeightMin)
	}
	if d := (&env{}).routingPlanFor(); len(d.Loads) != 3 || d.WeightMin != 0 {
		t.Fatalf("default plan loads %v, weight_min %v", d.Loads, d.WeightMin)
	}
	for plan, want := range map[float64]string{0.1: "no weight under 0.1 (weight_min)", 0: "no weight under 0.25 (its default weight_min)"} {
		r := &routingResult{Plan: routingPlan{WeightMin: plan}}
		if notes := strings.Join(r.notes(), "\n"); !strings.Contains(notes, want) {
			t.Errorf("weight_min %v: the notes lack %q:\n%s", plan, want, notes)
		}
	}
	for _, o := range []Options{{RoutingLoads: []int{0}}, {RoutingLoads: []int{101}}, {WeightMin: -1}, {WeightMin: 2}, {WeightMin: math.NaN()}} {
		o.Areas, o.Bin = []int{AreaRouting}, t.TempDir()
		if _, err := Run(t.Context(), o); err == nil || !(strings.Contains(err.Error(), "routing load") || strings.Contains(err.Error(), "weight_min")) {
			t.Errorf("%+v: %v, want it refused", o, err)
		}
	}
}
