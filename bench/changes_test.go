package bench

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"heft/bench/loadgen"
)

// TestChangesShort is area 11 in miniature on a real fleet behind real
// HAProxy and nginx: the fast worker halves its speed while serving 60 %
// load, below saturation. Its capacity against the rest of the fleet
// halves, so the odds of its weight share at both gateways, share / (1 −
// share), must end at half what they were at the slowdown, within 15 %.
// The odds, not the share itself, are judged: the share before depends on
// the registration probe, which on a loaded machine reads the fast sim up
// to about 15 % low, and the slowdown halves whatever heft had. Nothing is
// timed: the run's end is the deadline, and only the shares read at the
// gateways are judged.
//
// The shares follow the pace the agents read from the sims' wall clock,
// and a machine whose load changes during the run changes that pace too,
// so this is a wall-clock check: like the rest of make bench it runs only
// when asked (make bench-check, HEFT_WALLCLOCK=1), not in make test. The
// rescale it drives is tested on fake time in coordinator/fleet
// (TestPaceRescales) and the sims' pace in sim (TestInterTokenLatency).
func TestChangesShort(t *testing.T) {
	if os.Getenv("HEFT_WALLCLOCK") == "" {
		t.Skip("a wall-clock check of make bench area 11 (about 2 min): make bench-check runs it")
	}
	ctx, bin := fleetTest(t, "starts a fleet, haproxy and nginx, and offers load for about 100 s")
	e := &env{opts: Options{Bin: bin, Progress: testLog{t}, Quick: true}, bin: bin, work: t.TempDir(), runs: 1, tokens: 32, conc: 16}
	plan := e.changesPlanFor()
	rows, _, err := e.changesRun(ctx, plan, caseSlows, 0, routeHeft)
	if err != nil {
		t.Fatal(err)
	}
	_, want := trueShares(plan.Factor)
	for _, r := range rows {
		t.Logf("%s: share %.3f at the slowdown, %.3f at the end (true %.3f), converged after %v s; %d requests, %d failed, p95 %.2f s (%.2f s after the change), %d met a probe",
			r.Gateway, r.Before, r.Final, want, r.Converged, r.Res.Sent, r.Res.Failed+r.Res.Unfinished, r.Res.Latency.P95.Seconds(), r.AfterChange.P95.Seconds(), r.MetProbe)
		if r.Err != nil {
			t.Errorf("%s: %v", r.Gateway, r.Err)
		}
		if n := r.AfterChange.N; n == 0 || n >= r.Res.Completed {
			t.Errorf("%s: %d of %d completed requests counted as sent after the change, want some and not all", r.Gateway, n, r.Res.Completed)
		}
		if n := r.AfterSight.N; n == 0 || n >= r.AfterChange.N {
			t.Errorf("%s: %d of the %d requests sent after the change counted as sent 2 s after it, want some and not all", r.Gateway, n, r.AfterChange.N)
		}
		if r.MetProbe < 0 {
			t.Errorf("%s: the sims' count of requests that met a probe could not be read", r.Gateway)
		}
		odds := func(x float64) float64 { return x / (1 - x) }
		if got := odds(r.Final) / odds(r.Before); r.Before <= 0 || math.Abs(got*plan.Factor-1) > 0.15 {
			t.Errorf("%s: the fast worker's share went from %.3f to %.3f: its odds changed %.2f times, want 1/%v within 15 %%",
				r.Gateway, r.Before, r.Final, got, plan.Factor)
		}
	}
}

func TestSelectCases(t *testing.T) {
	all, err := selectCases(nil)
	if err != nil || !slices.Equal(all, changeCases) {
		t.Errorf("no names: %v, %v; want every case", all, err)
	}
	got, err := selectCases([]string{"joins", "throttle", "joins"})
	if err != nil || !slices.Equal(got, []string{caseThrottle, caseJoins}) {
		t.Errorf("joins, throttle, joins: %v, %v; want throttle then joins, once each", got, err)
	}
	if _, err := selectCases([]string{"slow"}); err == nil || !strings.Contains(err.Error(), `"slow"`) {
		t.Errorf("an unknown name: %v, want it named", err)
	}
	if _, err := Run(t.Context(), Options{Areas: []int{AreaChanges}, ChangeCases: []string{"nope"}, Bin: t.TempDir()}); err == nil {
		t.Error("Run took an unknown case")
	}
	if _, err := Run(t.Context(), Options{Areas: []int{AreaChanges}, ProbeBusy: "sometimes", Bin: t.TempDir()}); err == nil || !strings.Contains(err.Error(), `"sometimes"`) {
		t.Errorf("an unknown probe busy mode: %v, want it named", err)
	}
	e := &env{opts: Options{ProbeBusy: "drain"}}
	if p := e.changesPlanFor(); p.ProbeBusy != "drain" {
		t.Errorf("plan's probe busy %q, want the option's drain", p.ProbeBusy)
	}
	if p := (&env{}).changesPlanFor(); p.ProbeBusy != "wait" {
		t.Errorf("plan's probe busy %q, want the agents' default, wait", p.ProbeBusy)
	}
}

// A late oracle is a third run of each case, only when asked for, named
// apart in the table and in kept request files; a negative delay is refused.
func TestChangesLateOracle(t *testing.T) {
	if got := (&env{}).changesPlanFor().routes(); !slices.Equal(got, []changeRoute{routeHeft, routeTrue}) {
		t.Errorf("default routes %v, want heft and the true capacities", got)
	}
	p := (&env{opts: Options{LateOracle: 2 * time.Second}}).changesPlanFor()
	routes := p.routes()
	if len(routes) != 3 || routes[2] != (changeRoute{Oracle: true, Late: 2 * time.Second}) {
		t.Fatalf("routes with a 2 s late oracle: %v", routes)
	}
	if d := p.estimate() - (&env{}).changesPlanFor().estimate(); d <= 0 {
		t.Errorf("the late oracle adds %v to the estimate, want a third run's time", d)
	}
	var names, files []string
	for _, r := range routes {
		names, files = append(names, r.String()), append(files, r.file())
	}
	if want := []string{"heft", "true capacities", "true capacities, 2 s late"}; !slices.Equal(names, want) {
		t.Errorf("routing cells %q, want %q", names, want)
	}
	if want := []string{"heft", "true", "true-late2s"}; !slices.Equal(files, want) {
		t.Errorf("request file parts %q, want %q", files, want)
	}
	if got := (changeRoute{Oracle: true, Late: 1500 * time.Millisecond}).String(); got != "true capacities, 1.5 s late" {
		t.Errorf("1.5 s late: %q", got)
	}
	if _, err := Run(t.Context(), Options{Areas: []int{AreaChanges}, LateOracle: -time.Second, Bin: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "late oracle") {
		t.Errorf("a negative late oracle: %v, want it refused", err)
	}
}

// The oracle of each case routes by full-load capacities after the
// change: the fast worker at 1/factor, or the joiner added at its own.
func TestChangesTrueCaps(t *testing.T) {
	p := changesPlan{Factor: 2}
	for _, c := range changeCases {
		caps := p.trueCaps(c)
		total := 0.0
		for _, x := range caps {
			total += x
		}
		changed := caps[routeFast]
		if c == caseJoins {
			if len(caps) != len(routeServing)+1 {
				t.Fatalf("%s: %d capacities, want the joiner's appended", c, len(caps))
			}
			changed = caps[len(caps)-1]
		}
		if share := changed / total; math.Abs(share-p.trueShare(c)) > 1e-12 {
			t.Errorf("%s: the capacities give the changing worker %.4f of the fleet, its true share is %.4f", c, share, p.trueShare(c))
		}
	}
}

// writeRequests writes one line per request, its send time relative to
// the change, so a p95 can be traced to when its requests were sent.
func TestWriteRequests(t *testing.T) {
	change := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	path := filepath.Join(t.TempDir(), "r.csv")
	reqs := []loadgen.Request{
		{Backend: "127.0.0.1:1", Start: change.Add(-1500 * time.Millisecond), End: change.Add(-500 * time.Millisecond), Outcome: "completed"},
		{Backend: "127.0.0.1:2", Start: change.Add(250 * time.Millisecond), End: change.Add(3 * time.Second), Outcome: "http_502"},
	}
	if err := writeRequests(path, reqs, change); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "sent_after_change_s,latency_s,backend,outcome\n-1.500,1.000,127.0.0.1:1,completed\n0.250,2.750,127.0.0.1:2,http_502\n"
	if string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// --slow-factor sets how much slower the fast worker becomes: the plan,
// the oracle's capacities and the cases' wording follow it; a factor that
// is no slowdown is refused.
func TestChangesSlowFactor(t *testing.T) {
	if f := (&env{}).changesPlanFor().Factor; f != 2 {
		t.Errorf("default factor %v, want 2", f)
	}
	p := (&env{opts: Options{SlowFactor: 1.3}}).changesPlanFor()
	caps, full := p.trueCaps(caseSlows), routeServing[routeFast].FullCapacity(16)
	if math.Abs(caps[routeFast]-full/1.3) > 1e-9 {
		t.Errorf("fast worker's true capacity %v, want %v", caps[routeFast], full/1.3)
	}
	if _, after := trueShares(1.3); math.Abs(p.trueShare(caseSlows)-after) > 1e-12 {
		t.Errorf("true share %v, want %v", p.trueShare(caseSlows), after)
	}
	for c, want := range map[string]string{
		caseSlows:    "slows to 1/1.3 of its speed mid-run",
		caseRestart:  "restarted at 1/1.3 speed, same arguments",
		caseThrottle: "its GPU throttles to 1/1.3 speed",
		caseJoins:    caseJoins,
	} {
		if got := speedWords(c, 1.3); got != want {
			t.Errorf("%q at 1.3: %q, want %q", c, got, want)
		}
		if got := speedWords(c, 2); got != c {
			t.Errorf("%q at 2: %q", c, got)
		}
	}
	for _, f := range []float64{1, 0.5, -2, 11, math.NaN()} {
		if _, err := Run(t.Context(), Options{Areas: []int{AreaChanges}, SlowFactor: f, Bin: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "slow factor") {
			t.Errorf("slow factor %v: %v, want it refused", f, err)
		}
	}
}

// TestPastTarget checks that the count past the target agrees with the
// p95 it restates, and that one request can flip a row whose slow
// worker carries close to 5 % of the load.
func TestPastTarget(t *testing.T) {
	fast, slow := 2*time.Second, 3*time.Second
	lat := slices.Repeat([]time.Duration{fast}, 95)
	lat = append(lat, slices.Repeat([]time.Duration{slow}, 5)...)
	limit := 2200 * time.Millisecond
	if over, allowed := pastTarget(lat, limit); over != 5 || allowed != 5 {
		t.Errorf("95 fast and 5 slow: %d over (%d allowed), want 5 (5)", over, allowed)
	}
	lat = append(lat, slow)
	if over, allowed := pastTarget(lat, limit); over != 6 || allowed != 5 {
		t.Errorf("one more slow: %d over (%d allowed), want 6 (5)", over, allowed)
	}
	if over, allowed := pastTarget(nil, limit); over != 0 || allowed != 0 {
		t.Errorf("no requests: %d over (%d allowed), want 0 (0)", over, allowed)
	}

	// over ≤ allowed exactly when the nearest-rank p95 is within limit.
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		n := 1 + r.IntN(300)
		lat := make([]time.Duration, n)
		for j := range lat {
			lat[j] = time.Duration(r.IntN(40)) * 100 * time.Millisecond
		}
		limit := time.Duration(r.IntN(40)) * 100 * time.Millisecond
		s := slices.Sorted(slices.Values(lat))
		p95 := s[int(math.Ceil(0.95*float64(n)))-1]
		over, allowed := pastTarget(lat, limit)
		if (over <= allowed) != (p95 <= limit) {
			t.Fatalf("case %d: n %d, p95 %v, limit %v: %d over, %d allowed", i, n, p95, limit, over, allowed)
		}
	}
}

// TestAddPooled checks the rows that pool every seed of a case: a seed
// whose p95 hinges on one request misses alone, and the pooled row
// judges the same target on all the seeds' requests.
func TestAddPooled(t *testing.T) {
	lat := func(fast, slow int) []time.Duration {
		return append(slices.Repeat([]time.Duration{2 * time.Second}, fast), slices.Repeat([]time.Duration{3 * time.Second}, slow)...)
	}
	row := func(route changeRoute, seed int, l []time.Duration, met int64) changeRow {
		return changeRow{Case: caseSlows, Route: route, Gateway: gwHAProxy, Seed: seed, MetProbe: met,
			Res: loadgen.Result{Sent: len(l) + 10, Failed: 1}, afterLatencies: l}
	}
	rows := []changeRow{
		row(routeHeft, 0, lat(94, 6), 0), row(routeTrue, 0, lat(95, 5), -1),
		row(routeHeft, 1, lat(96, 4), 2), row(routeTrue, 1, lat(95, 5), 0),
	}
	// Seed 1 alone: heft's p95 is the slow requests' 3 s against 2 s.
	if vs, past := targetCells(routeHeft, 3*time.Second, rows[0].afterLatencies, 2*time.Second); vs != "+50 %" || past != "6 (5)" {
		t.Errorf("seed 1 alone: %s, %s; want +50 %%, 6 (5)", vs, past)
	}
	tab := Table{Columns: changesColumns}
	addPooled(&tab, rows, 2)
	if len(tab.Rows) != 2 {
		t.Fatalf("%d pooled rows, want one per routing and gateway (2)", len(tab.Rows))
	}
	cell := func(r int, col string) string { return tab.Rows[r][slices.Index(changesColumns, col)] }
	for col, want := range map[string]string{"routing": "heft", "seed": "all", "requests": "220", "failed": "2",
		"p95 after the change": "2.00 s", "vs true capacities": "+0 %", "over the target (allowed)": "10 (10)", "met a probe": "2"} {
		if got := cell(0, col); got != want {
			t.Errorf("heft's pooled %q = %q, want %q", col, got, want)
		}
	}
	if got := cell(1, "routing"); got != "true capacities" {
		t.Errorf("second pooled row is %q, want the true capacities'", got)
	}
	if got := cell(1, "met a probe"); got != "unknown" {
		t.Errorf("true capacities' pooled met a probe = %q with one seed unread, want unknown", got)
	}
	if got := cell(1, "vs true capacities"); got != "—" {
		t.Errorf("true capacities' pooled vs = %q, want —", got)
	}
}
