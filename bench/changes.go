package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"heft/agent/config"
	"heft/agent/probe"
	"heft/bench/loadgen"
	"heft/gateway/gwproc"
	"heft/sim"
)

// Area 11: a worker's capacity changes while the fleet serves area 9's
// fleet under Poisson load of 60 % of its full-load capacity, half through
// HAProxy and half through nginx, both routing by heft's weights
// (leastconn). Four cases: the fast worker halves its speed mid-run
// (heft-sim --slow-at, same arguments, no restart); it is restarted at half
// speed with the same arguments and port (HEFT_SIM_SLOW_FACTOR, which its
// command line does not show); it halves its speed as its GPU reports
// thermal throttling (a stand-in libnvidia-ml that its agent loads,
// standin.go); a new worker joins. The bench reads the
// worker's weight share at each gateway every half second and times how
// long after the change it first comes within 5 % of its true share.

// Cases of area 11.
const (
	caseSlows    = "halves its speed mid-run"
	caseRestart  = "restarted at half speed, same arguments"
	caseThrottle = "its GPU throttles to half speed"
	caseJoins    = "a new worker joins"
)

var changeCases = []string{caseSlows, caseRestart, caseThrottle, caseJoins}

// changeCaseNames are the cases' short names, for Options.ChangeCases.
var changeCaseNames = map[string]string{"slows": caseSlows, "restart": caseRestart, "throttle": caseThrottle, "joins": caseJoins}

// selectCases maps short names to cases, in changeCases' order; none =
// all.
func selectCases(names []string) ([]string, error) {
	if len(names) == 0 {
		return changeCases, nil
	}
	for _, n := range names {
		if _, ok := changeCaseNames[n]; !ok {
			return nil, fmt.Errorf("bench: unknown area 11 case %q (cases: slows, restart, throttle, joins)", n)
		}
	}
	var out []string
	for _, c := range changeCases {
		for _, n := range names {
			if changeCaseNames[n] == c && !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// joiner is the worker that joins in caseJoins: a second mid.
var joiner = Calibration{Name: "joiner", Flavor: sim.FlavorSGLang, SingleTPS: 80, Batch16TPS: 900, MaxRunning: 16}

// changesPlan is what one run of the area does.
type changesPlan struct {
	SlowAt  time.Duration // when the change happens, after the sims start; the fleet must be up by then
	Factor  float64
	After   time.Duration // load and polling after the change
	Window  time.Duration // the agents' passive window (probe.passive_window)
	Pace    time.Duration // the agents' pace window (probe.pace_window)
	Seeds   int
	Load    float64
	Tokens  int
	Tolered float64 // relative distance from the true share that counts as converged
	Cases   []string
	// ProbeBusy is the agents' probe.busy: wait, drain or passive-only.
	ProbeBusy string
	// Late, when above 0, routes each case and seed a third time by the
	// true capacities set this long after the change: the best any
	// routing can do that must first see the change.
	Late time.Duration
}

// changeRoute is what one run of a case routes by: heft's weights, or the
// true capacities set Late after the change (0: at the change itself).
type changeRoute struct {
	Oracle bool
	Late   time.Duration
}

var routeHeft, routeTrue = changeRoute{}, changeRoute{Oracle: true}

// routes are the runs of each case and seed: heft's, the true capacities',
// and the late true capacities' when the plan asks for them.
func (p changesPlan) routes() []changeRoute {
	out := []changeRoute{routeHeft, routeTrue}
	if p.Late > 0 {
		out = append(out, changeRoute{Oracle: true, Late: p.Late})
	}
	return out
}

// String is the table's "routing" cell.
func (r changeRoute) String() string {
	switch {
	case !r.Oracle:
		return "heft"
	case r.Late > 0:
		return "true capacities, " + durText(r.Late) + " late"
	}
	return "true capacities"
}

// file is the routing's part of a kept request file's name.
func (r changeRoute) file() string {
	switch {
	case !r.Oracle:
		return "heft"
	case r.Late > 0:
		return "true-late" + strings.ReplaceAll(durText(r.Late), " ", "")
	}
	return "true"
}

// maxSlowFactor bounds --slow-factor: the stand-in GPU's clock falls to
// 1980/factor MHz, and a worker 10 times slower is all but gone.
const maxSlowFactor = 10

// speedWords rewrites the cases' "half speed" wording for another factor:
// "halves its speed" becomes "slows to 1/1.3 of its speed".
func speedWords(text string, factor float64) string {
	if factor == 2 {
		return text
	}
	f := "1/" + ftoa(factor)
	return strings.NewReplacer("halves its speed", "slows to "+f+" of its speed", "half speed", f+" speed").Replace(text)
}

// durText writes d as seconds: "2 s", "1.5 s".
func durText(d time.Duration) string { return ftoa(d.Seconds()) + " s" }

func (e *env) changesPlanFor() changesPlan {
	p := changesPlan{SlowAt: 4 * time.Minute, Factor: cmp.Or(e.opts.SlowFactor, 2), After: 2 * time.Minute, Window: config.DefaultPassiveWindow,
		Pace: config.DefaultPaceWindow, Seeds: 3, Load: 0.6, Tokens: 128, Tolered: 0.05, Cases: changeCases, ProbeBusy: cmp.Or(e.opts.ProbeBusy, probe.BusyWait),
		Late: e.opts.LateOracle}
	if e.opts.Quick {
		p.SlowAt, p.After, p.Window, p.Pace, p.Seeds, p.Tokens = 60*time.Second, 40*time.Second, 5*time.Second, 5*time.Second, 1, e.tokens
	}
	if e.opts.ChangeWindow > 0 {
		p.Window, p.Pace = e.opts.ChangeWindow, e.opts.ChangeWindow
	}
	if e.opts.PaceWindow > 0 {
		p.Pace = e.opts.PaceWindow
	}
	if cases, err := selectCases(e.opts.ChangeCases); err == nil {
		p.Cases = cases // Run has refused unknown names
	}
	return p
}

// estimate counts each case once per routing: heft's weights, the true
// capacities, and the late true capacities when asked for.
func (p changesPlan) estimate() time.Duration {
	return time.Duration(p.Seeds*len(p.routes())*len(p.Cases)) * (p.SlowAt + p.After + 20*time.Second)
}

// changesPolicies are leastconn with heft's weights and with the true
// capacities, on each gateway; a run loads one kind.
func changesPolicies(key string) []policy {
	var out []policy
	for _, p := range routingPolicies {
		if p.Key == key {
			out = append(out, p)
		}
	}
	return out
}

// changeRow is one gateway's outcome in one case and seed.
type changeRow struct {
	Case      string
	Route     changeRoute
	Gateway   string
	Seed      int
	Before    float64 // the worker's share at the change
	Converged float64 // seconds after the change; NaN: never within the run
	Final     float64 // its share at the end
	True      float64 // its true share after the change
	Res       loadgen.Result
	// AfterChange is the latency of the requests sent from the change to
	// the end: the p95 the change is judged by, without the steady minutes
	// before it, which heft and the true capacities route alike.
	AfterChange loadgen.Summary
	// afterLatencies are the latencies behind AfterChange, for counting
	// the requests past the target (pastTarget).
	afterLatencies []time.Duration
	// AfterSight is the latency of the requests sent from sightDelay after
	// the change to the end: what is left once a reading could have seen it.
	AfterSight loadgen.Summary
	// MetProbe counts this gateway's requests that an engine served while
	// it also served a request of heft's probes, as the sims counted them
	// (sim.MeetingsPath); −1: not read.
	MetProbe int64
	Err      error
}

// sightDelay is the shortest span after a change that any pace reading
// can have read it from (the agent's sudden span): the true capacities
// switch at the change itself, and the requests sent before it show what
// no measurement can spare, so the table also compares the requests
// sent after it. The target stays on all requests after the change.
const sightDelay = 2 * time.Second

// p95Tolerance is the target on "p95 after the change": at most this
// much above the same case and seed routed by the true capacities.
const p95Tolerance = 0.10

// pastTarget counts the latencies over limit, and the most of them a
// nearest-rank p95 at or under limit allows: p95 ≤ limit exactly when
// over ≤ allowed. A p95 ratio says how far the tail moved; these counts
// say how many requests moved it. Where one slow worker carries close
// to 5 % of the load, a handful of requests moves the p95 from the fast
// workers' latencies to the slow one's.
func pastTarget(latencies []time.Duration, limit time.Duration) (over, allowed int) {
	for _, d := range latencies {
		if d > limit {
			over++
		}
	}
	n := len(latencies)
	return over, n - int(math.Ceil(0.95*float64(n)))
}

// trueShares are the fast worker's share of the serving fleet's
// full-load capacity before and after the slowdown.
func trueShares(factor float64) (before, after float64) {
	total := routingCapacity()
	fast := routeServing[routeFast].FullCapacity(16)
	return fast / total, (fast / factor) / (total - fast + fast/factor)
}

// trueCaps are the full-load capacities the oracle routes by after the
// change in case c: the serving workers', the fast one slower, or the
// joiner's appended.
func (p changesPlan) trueCaps(c string) []float64 {
	caps := make([]float64, len(routeServing))
	for i, w := range routeServing {
		caps[i] = w.FullCapacity(16)
	}
	if c == caseJoins {
		return append(caps, joiner.FullCapacity(16))
	}
	caps[routeFast] /= p.Factor
	return caps
}

// trueShare is the share the changing worker should end at in case c.
func (p changesPlan) trueShare(c string) float64 {
	if c == caseJoins {
		j := joiner.FullCapacity(16)
		return j / (routingCapacity() + j)
	}
	_, after := trueShares(p.Factor)
	return after
}

// changesColumns are area 11's table columns.
var changesColumns = []string{"case", "routing", "gateway", "seed", "share at change", "converged", "share at end", "true share",
	"requests", "failed", "p95", "p95 after the change", "vs true capacities", "over the target (allowed)", "vs true, sent 2 s on", "met a probe"}

func (e *env) areaChanges(ctx context.Context) *Section {
	plan := e.changesPlanFor()
	before, after := trueShares(plan.Factor)
	s := &Section{Title: "Capacity changes under load",
		Intro: speedWords(fmt.Sprintf("Area 9's fleet (%s) behind real HAProxy and nginx, heft-sync applying heft's weights (leastconn), "+
			"the coordinator's probation off. Poisson load of %s of the fleet's full-load capacity, half through each gateway, "+
			"%d output tokens, from when the fleet is up until %s after the change at %s after the sims start; agents' passive "+
			"window %s (probe.passive_window), pace window %s (probe.pace_window), probe.busy = %s. Cases: the fast worker's heft-sim halves its speed "+
			"(--slow-at, --slow-factor %s: same arguments, no restart), its true share of the fleet's full-load capacity going "+
			"from %s to %s; the fast worker is stopped and started again on the same port with the same arguments at half speed "+
			"(HEFT_SIM_SLOW_FACTOR, not on its command line), the same true shares; the fast worker halves its speed as its GPU, "+
			"read by its agent through a stand-in libnvidia-ml (bench/nvml/standin.c, loaded by the agent's own NVML binding), "+
			"reports hw_thermal_slowdown and its SM clock falls from 1980 to %d MHz, the same true shares; a new worker (%s) and its agent join, true "+
			"share %s. \"converged\": seconds from the change until the worker's weight share at the gateway (HAProxy `show stat` "+
			"weights, nginx's upstream file) is first within %s %% of its true share. The oracle is each worker's full-load "+
			"capacity (Calibration.FullCapacity), not what a probe sees. \"met a probe\": the gateway's requests that an engine "+
			"served while it also served a request of heft's probes, counted by the sims themselves (each load request "+
			"carries the X-Heft-Load header, a probe's does not). \"p95\" is of the whole load; \"p95 after the change\" of the requests "+
			"sent from the change to the end, and \"vs true capacities\" compares that with the same case and seed routed by the true capacities "+
			"(the target: at most +"+num(100*p95Tolerance, 0)+" %%); \"over the target (allowed)\" counts the requests sent after the change whose latency exceeds "+
			ftoa(1+p95Tolerance)+" × that p95 "+
			"of the true capacities' run, and in brackets the most of them the p95 allows (5 %% of the requests): the row meets the target "+
			"exactly when the count is at most the allowance, and the true capacities' own row shows how close to the allowance they run; rows with seed \"all\" pool "+
			"the requests sent after the change in every seed of a case and judge the same target on all of them; "+
			"\"vs true, sent 2 s on\" compares the requests sent from 2 s after the change on, the shortest span a pace reading "+
			"can see a change in: the true capacities switch at the change itself, which no measurement can.",
			describeFleet(), shareText(plan.Load), plan.Tokens, plan.After, plan.SlowAt, plan.Window, plan.Pace, plan.ProbeBusy, ftoa(plan.Factor),
			shareText(before), shareText(after), int(standinMaxSM/plan.Factor), joiner.Name+" "+joiner.String(), shareText(plan.trueShare(caseJoins)), num(100*plan.Tolered, 0)), plan.Factor),
		Table: Table{Columns: changesColumns},
	}
	for _, c := range plan.Cases {
		var caseRows []changeRow // every seed's, for the pooled rows
		for seed := range plan.Seeds {
			var rows []changeRow
			var notes []string
			var err error
			for _, route := range plan.routes() {
				rr, nn, rerr := e.changesRun(ctx, plan, c, seed, route)
				rows = append(rows, rr...)
				if route == routeHeft {
					notes = nn // the other runs store what heft's stores beside them
				}
				if err = rerr; err != nil {
					break
				}
			}
			p95, p95Sight := map[string]time.Duration{}, map[string]float64{}
			for _, r := range rows {
				if r.Route == routeTrue {
					p95[r.Gateway], p95Sight[r.Gateway] = r.AfterChange.P95, r.AfterSight.P95.Seconds()
				}
			}
			for _, r := range rows {
				conv, vs, past, vsSight := "not within the run", "—", "—", "—"
				if !math.IsNaN(r.Converged) {
					conv = num(r.Converged, 1) + " s"
				}
				if r.Route.Oracle {
					conv = "—"
				}
				if o := p95[r.Gateway]; o > 0 {
					vs, past = targetCells(r.Route, r.AfterChange.P95, r.afterLatencies, o)
				}
				if o := p95Sight[r.Gateway]; r.Route != routeTrue && o > 0 {
					vsSight = fmt.Sprintf("%+.0f %%", 100*(r.AfterSight.P95.Seconds()/o-1))
				}
				s.Table.Add(speedWords(r.Case, plan.Factor), r.Route.String(), r.Gateway, fmt.Sprint(r.Seed+1), shareText(r.Before), conv, shareText(r.Final), shareText(r.True),
					fmt.Sprint(r.Res.Sent), fmt.Sprint(r.Res.Failed+r.Res.Unfinished)+errSuffix(r.Res.Errors), num(r.Res.Latency.P95.Seconds(), 2)+" s",
					num(r.AfterChange.P95.Seconds(), 2)+" s", vs, past, vsSight, metText(r.MetProbe))
				if r.Err != nil {
					s.Notes = append(s.Notes, fmt.Sprintf("%s, %s seed %d: %v", speedWords(r.Case, plan.Factor), r.Gateway, r.Seed+1, r.Err))
				}
			}
			s.Notes = append(s.Notes, notes...)
			if err != nil {
				s.Err = err
				return s
			}
			caseRows = append(caseRows, rows...)
		}
		if plan.Seeds > 1 {
			addPooled(&s.Table, caseRows, plan.Factor)
		}
	}
	s.Notes = append(s.Notes, "\"true capacities\" rows: the same case and seed loaded through leastconn with the workers' true "+
		"capacities as weights, set anew at the change (HAProxy `set weight`, nginx reloaded); their share columns are heft's, "+
		"which still runs beside them; in the joining case the joiner's server waits disabled in HAProxy's true-capacity backend "+
		"and is enabled with its weight when it joins, and nginx's true-capacity upstream gains it by a reload.")
	if plan.Late > 0 {
		s.Notes = append(s.Notes, fmt.Sprintf("\"true capacities, %s late\" rows: the same again, the true capacities set %s after the change "+
			"instead of at it (--late-oracle): what routing by the exact new capacities does when it must first see the change, "+
			"as heft must. Their \"vs\" columns compare them with the true capacities set at the change.", durText(plan.Late), durText(plan.Late)))
	}
	return s
}

// targetCells are a row's "vs true capacities" and "over the target
// (allowed)" cells, against truth, the p95 of the true capacities' run.
func targetCells(route changeRoute, p95 time.Duration, latencies []time.Duration, truth time.Duration) (vs, past string) {
	vs = "—"
	if route != routeTrue {
		vs = fmt.Sprintf("%+.0f %%", 100*(p95.Seconds()/truth.Seconds()-1))
	}
	over, allowed := pastTarget(latencies, time.Duration(float64(truth)*(1+p95Tolerance)))
	return vs, fmt.Sprintf("%d (%d)", over, allowed)
}

// addPooled adds one row per routing and gateway that pools the requests
// sent after the change in every seed of a case: the p95 of all of them
// against the true capacities' p95 of all of theirs. One seed's p95 can
// hinge on a handful of requests (pastTarget); the pooled p95 is the
// same target judged on three times as many.
func addPooled(t *Table, rows []changeRow, factor float64) {
	type key struct {
		route   changeRoute
		gateway string
	}
	var order []key
	pooled := map[key]*changeRow{}
	for _, r := range rows {
		k := key{r.Route, r.Gateway}
		p, ok := pooled[k]
		if !ok {
			p = &changeRow{Case: r.Case, Route: r.Route, Gateway: r.Gateway}
			pooled[k] = p
			order = append(order, k)
		}
		p.Res.Sent += r.Res.Sent
		p.Res.Failed += r.Res.Failed + r.Res.Unfinished
		p.afterLatencies = append(p.afterLatencies, r.afterLatencies...)
		if p.MetProbe < 0 || r.MetProbe < 0 {
			p.MetProbe = -1 // one seed's count unknown: the sum is too
		} else {
			p.MetProbe += r.MetProbe
		}
	}
	for _, k := range order {
		p := pooled[k]
		p95 := loadgen.Summarize(p.afterLatencies).P95
		vs, past := "—", "—"
		if truth, ok := pooled[key{routeTrue, k.gateway}]; ok && len(truth.afterLatencies) > 0 {
			vs, past = targetCells(k.route, p95, p.afterLatencies, loadgen.Summarize(truth.afterLatencies).P95)
		}
		t.Add(speedWords(p.Case, factor), k.route.String(), k.gateway, "all", "—", "—", "—", "—",
			fmt.Sprint(p.Res.Sent), fmt.Sprint(p.Res.Failed), "—", num(p95.Seconds(), 2)+" s", vs, past, "—", metText(p.MetProbe))
	}
}

func shareText(x float64) string { return num(100*x, 1) + " %" }

// metText is the "met a probe" cell: a count, or "unknown" when the sims
// could not be read.
func metText(n int64) string {
	if n < 0 {
		return "unknown"
	}
	return fmt.Sprint(n)
}

// changesRun starts the fleet set up for case c, loads it, makes the
// change at SlowAt and follows the changing worker's share at both
// gateways. Its notes list the measurements stored while the load ran.
func (e *env) changesRun(ctx context.Context, plan changesPlan, c string, seed int, route changeRoute) ([]changeRow, []string, error) {
	e.passiveWindow, e.paceWindow, e.probeBusy = plan.Window, plan.Pace, plan.ProbeBusy
	switch c {
	case caseSlows:
		e.slowFast = sim.Slow{At: plan.SlowAt, Factor: plan.Factor}
	case caseThrottle:
		e.slowFast = sim.Slow{At: plan.SlowAt, Factor: plan.Factor}
		// A folder of its own each run: the last run's throttled state
		// file must not greet the next fleet's agent.
		dir, err := os.MkdirTemp(e.work, "nvml-")
		if err != nil {
			return nil, nil, err
		}
		nv, err := buildStandinNVML(ctx, dir, "GPU-b0a7d1e5-0000-4000-8000-00000000fa57")
		if err != nil {
			return nil, nil, err
		}
		e.fastNVML = nv
	case caseRestart:
		port, err := freePort()
		if err != nil {
			return nil, nil, err
		}
		e.fastListen = "127.0.0.1:" + strconv.Itoa(port)
	case caseJoins:
		port, err := freePort()
		if err != nil {
			return nil, nil, err
		}
		e.joinListen = "127.0.0.1:" + strconv.Itoa(port)
	}
	defer func() {
		e.slowFast, e.passiveWindow, e.paceWindow, e.fastListen, e.joinListen, e.fastNVML, e.probeBusy = sim.Slow{}, 0, 0, "", "", nil, ""
	}()
	pols, load := changesPolicies("lc_heft"), changesPolicies("lc_heft")
	if route.Oracle {
		load = changesPolicies("lc_oracle")
	}
	started := time.Now() // the sims start within a second of this
	f, err := e.startRoutingFleet(ctx, routingPlan{Policies: append(slices.Clone(pols), changesPolicies("lc_oracle")...)})
	if err != nil {
		return nil, nil, err
	}
	defer f.stop()
	slowAt := started.Add(plan.SlowAt)
	if time.Now().After(slowAt) {
		return nil, nil, fmt.Errorf("the fleet took %s to come up, past the change at %s: raise SlowAt", time.Since(started).Round(time.Second), plan.SlowAt)
	}
	loadStart, end := time.Now(), slowAt.Add(plan.After)
	rows := make([]changeRow, len(pols))
	var wg sync.WaitGroup
	for i, p := range pols {
		rows[i] = changeRow{Case: c, Route: route, Gateway: p.Gateway, Seed: seed, Converged: math.NaN(), True: plan.trueShare(c)}
		cfg := loadgen.Config{URL: f.frontURL(load[i]), Model: benchModel, Tokens: plan.Tokens, Drain: 20 * time.Second,
			MaxInFlight: 1024, Seed: uint64(seed) + 1, Client: f.client, Label: p.Gateway, KeepRequests: true,
			Rate: plan.Load / float64(len(pols)) * routingCapacity() / float64(plan.Tokens), Duration: time.Until(end)}
		wg.Go(func() { rows[i].Res, rows[i].Err = loadgen.Run(ctx, cfg) })
	}
	e.logf("changes: %s, seed %d: load on, change in %s", speedWords(c, plan.Factor), seed+1, time.Until(slowAt).Round(time.Second))
	// The worker followed: the fast one, or the joiner once it has started.
	var mu sync.Mutex
	addr := ""
	if c != caseJoins {
		addr = f.simAddr(routeFast)
	}
	changed := make(chan error, 1)
	go func() {
		select {
		case <-ctx.Done():
			changed <- ctx.Err()
			return
		case <-time.After(time.Until(slowAt)):
		}
		if route.Oracle {
			defer func() {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(slowAt.Add(route.Late))):
				}
				f.setTrueCaps(ctx, plan.trueCaps(c))
			}()
		}
		switch c {
		case caseRestart:
			changed <- f.restartFast(plan.Factor)
		case caseThrottle:
			changed <- f.e.fastNVML.set(gpuState{pids: []int{f.sims[routeFast].Pid()}, reasons: nvmlReasonHWThermalSlowdown,
				smMHz: int(standinMaxSM / plan.Factor), tempC: 91})
		case caseJoins:
			sp, err := f.join(joiner)
			if err == nil {
				mu.Lock()
				addr = strings.TrimPrefix(sp.url, "http://")
				mu.Unlock()
			}
			changed <- err
		default:
			changed <- nil
		}
	}()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var lastPace time.Time
	for now := time.Now(); now.Before(end) && ctx.Err() == nil; now = <-tick.C {
		mu.Lock()
		a := addr
		mu.Unlock()
		lastPace = f.logPace(ctx, a, lastPace)
		for i, p := range pols {
			share, err := f.shareOf(ctx, p, a)
			if err != nil {
				continue // a reload in progress; the next tick reads it
			}
			rows[i].Final = share
			if now.Before(slowAt) {
				rows[i].Before = share
			} else if math.IsNaN(rows[i].Converged) && math.Abs(share-rows[i].True) <= plan.Tolered*rows[i].True {
				rows[i].Converged = now.Sub(slowAt).Seconds()
			}
		}
	}
	changeErr := <-changed
	wg.Wait()
	for i := range rows {
		rows[i].AfterChange = rows[i].Res.LatencySince(slowAt)
		rows[i].afterLatencies = rows[i].Res.LatenciesSince(slowAt)
		rows[i].AfterSight = rows[i].Res.LatencySince(slowAt.Add(sightDelay))
		if e.opts.Keep {
			// Each request, for reading where a tail came from.
			name := fmt.Sprintf("requests-%s-seed%d-%s-%s.csv", caseShortName(c), seed+1, route.file(), rows[i].Gateway)
			if err := writeRequests(filepath.Join(e.work, name), rows[i].Res.Requests, slowAt); err != nil {
				e.logf("changes: %v", err)
			}
		}
		rows[i].Res.Requests = nil // thousands of records, read once
	}
	name := speedWords(c, plan.Factor)
	notes := []string{fmt.Sprintf("%s, seed %d: %s", name, seed+1, f.measuredDuring(ctx, loadStart))}
	if counts, err := f.loadCounts(ctx); err != nil {
		notes = append(notes, fmt.Sprintf("%s, seed %d: requests that met a probe: unknown (%v)", name, seed+1, err))
		for i := range rows {
			rows[i].MetProbe = -1
		}
	} else {
		for i, p := range pols {
			rows[i].MetProbe = counts.Met[p.Gateway]
		}
		notes = append(notes, fmt.Sprintf("%s, seed %d: the sims served %d requests of heft's probes (load requests carry %s; %s counts the rest)",
			name, seed+1, counts.Other, sim.LoadHeader, sim.MeetingsPath))
	}
	if changeErr != nil {
		return rows, notes, changeErr
	}
	return rows, notes, ctx.Err()
}

// setTrueCaps sets the oracle's weights at both gateways to caps: the
// serving workers' true capacities, and the joiner's after them once it
// has joined, whose HAProxy server is then enabled.
func (f *routingFleet) setTrueCaps(ctx context.Context, caps []float64) {
	f.trueCaps = caps
	for i, w := range f.oracleWeights(haproxyWeights) {
		name := joiner.Name
		if i < len(routeServing) {
			name = routeServing[i].Name
		}
		if err := haproxyCommand(ctx, f.socket, fmt.Sprintf("set weight lc_oracle/%s %d", name, w)); err != nil {
			f.e.logf("changes: HAProxy set weight: %v", err)
		}
		if i >= len(routeServing) {
			if err := haproxyCommand(ctx, f.socket, "enable server lc_oracle/"+name); err != nil {
				f.e.logf("changes: HAProxy enable server: %v", err)
			}
		}
	}
	conf := filepath.Join(f.nginxDir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(gwproc.NginxConf(f.nginxDir, f.nginxHTTP(f.nginxPolicies, f.nginxPorts))), 0o600); err != nil {
		f.e.logf("changes: nginx.conf: %v", err)
		return
	}
	reload := gwproc.NginxReload(f.nginxBin, f.nginxDir, conf)
	if out, err := exec.CommandContext(ctx, reload[0], reload[1:]...).CombinedOutput(); err != nil {
		f.e.logf("changes: nginx reload: %v: %s", err, out)
	}
	f.e.logf("changes: true-capacity weights set: %v tok/s", caps)
}

// haproxyCommand sends one command to HAProxy's admin socket; an answer
// other than empty is an error.
func haproxyCommand(ctx context.Context, socket, cmd string) error {
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(c, cmd); err != nil {
		return err
	}
	out, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if msg := strings.TrimSpace(string(out)); msg != "" {
		return fmt.Errorf("%s: %s", cmd, msg)
	}
	return nil
}

// restartFast stops the fast worker's sim and starts it again with the
// same arguments and port, factor times slower by its environment. The
// agent keeps running and sees the engine go and come back.
func (f *routingFleet) restartFast(factor float64) error {
	old := f.sims[routeFast]
	if m, err := simMeetings(context.Background(), old.url); err == nil {
		f.stoppedMeetings = append(f.stoppedMeetings, m)
	} else {
		f.e.logf("changes: the fast worker's meetings before its restart: %v", err)
	}
	old.child.Stop(10 * time.Second)
	c := routingWorkers[routeFast]
	sp, err := f.e.startSimProcAt(f.dir, c.Name, c, 0, f.e.fastListen, []string{"HEFT_SIM_SLOW_FACTOR=" + ftoa(factor)})
	if err != nil {
		return fmt.Errorf("restart the fast worker: %w", err)
	}
	f.e.logf("changes: fast worker restarted at 1/%s speed, same arguments, %s", ftoa(factor), sp.url)
	f.late = append(f.late, sp.child)
	f.lateSims = append(f.lateSims, sp)
	return nil
}

// join starts a new sim and its agent beside the running fleet.
func (f *routingFleet) join(c Calibration) (*simProc, error) {
	listen := f.e.joinListen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	sp, err := f.e.startSimProcAt(f.dir, c.Name, c, 0, listen, nil)
	if err != nil {
		return nil, err
	}
	f.late = append(f.late, sp.child)
	f.lateSims = append(f.lateSims, sp)
	ag, err := f.e.startAgent(f.dir, "route-"+c.Name, f.co, c.Flavor, sp, false)
	if err != nil {
		return nil, err
	}
	f.late = append(f.late, ag)
	f.e.logf("changes: %s joined at %s", c.Name, sp.url)
	return sp, nil
}

// measuredDuring lists the measurements the coordinator stored since
// from: each would have met requests had its worker been serving.
func (f *routingFleet) measuredDuring(ctx context.Context, from time.Time) string {
	list, err := f.co.workers(ctx)
	if err != nil {
		return "measurements during the load: unknown (" + err.Error() + ")"
	}
	var parts []string
	for _, w := range list {
		for _, h := range w.History {
			if h.At.After(from) {
				why := h.Trigger
				if h.Cause != "" {
					why += " (" + h.Cause + ")"
				}
				parts = append(parts, fmt.Sprintf("%s %s, %.0f tok/s, valid %v", w.URL, why, h.ThroughputTPS, h.Valid))
			}
		}
	}
	if len(parts) == 0 {
		return "no measurement stored while the load ran"
	}
	return "measurements stored while the load ran: " + strings.Join(parts, "; ")
}

// shareOf is the weight of the server at addr (host:port; "" or absent:
// 0) over the serving workers' sum at one gateway.
func (f *routingFleet) shareOf(ctx context.Context, p policy, fast string) (float64, error) {
	var w, total float64
	switch p.Gateway {
	case gwHAProxy:
		servers, err := haproxyStat(ctx, f.socket, p.Key)
		if err != nil {
			return 0, err
		}
		for _, s := range servers {
			if !s.serving() {
				continue
			}
			total += float64(s.Weight)
			if s.Addr == fast {
				w = float64(s.Weight)
			}
		}
	default:
		servers, err := nginxServers(f.heftFile)
		if err != nil {
			return 0, err
		}
		for _, s := range servers {
			if s.Down {
				continue
			}
			total += float64(s.Weight)
			if s.Addr == fast {
				w = float64(s.Weight)
			}
		}
	}
	if total == 0 {
		return 0, fmt.Errorf("%s: no serving weight", p)
	}
	return w / total, nil
}

// logPace logs the followed worker's newest pace reading and weight
// source once per reading, so a run shows what moved its weight.
func (f *routingFleet) logPace(ctx context.Context, addr string, last time.Time) time.Time {
	if addr == "" {
		return last
	}
	list, err := f.co.workers(ctx)
	if err != nil {
		return last
	}
	for _, w := range list {
		if !samePort(w.URL, "http://"+addr) || w.Pace == nil || !w.Pace.At.After(last) {
			continue
		}
		p := w.Pace
		weights := ""
		if wt, err := f.co.weights(ctx, benchModel); err == nil {
			for _, x := range wt.Workers {
				weights += fmt.Sprintf(" %s=%.3f", x.URL, x.Weight)
			}
		}
		f.e.logf("changes: worker pace %.2f ms per token at %.1f running per rank, %.0f tok/s; weight source %s, factor %.2f; weights%s",
			1000*p.SecondsPerToken, p.Batch, p.ThroughputTPS, w.WeightSource, max(w.PaceFactor, w.ClockFactor), weights)
		return p.At
	}
	return last
}

// caseShortName is c's name for --cases.
func caseShortName(c string) string {
	for short, long := range changeCaseNames {
		if long == c {
			return short
		}
	}
	return "case"
}

// writeRequests writes reqs as CSV to path: each request's send time
// relative to the change, its latency (both in seconds), backend and
// outcome.
func writeRequests(path string, reqs []loadgen.Request, change time.Time) error {
	var b strings.Builder
	b.WriteString("sent_after_change_s,latency_s,backend,outcome\n")
	for _, q := range reqs {
		fmt.Fprintf(&b, "%.3f,%.3f,%s,%s\n", q.Start.Sub(change).Seconds(), q.End.Sub(q.Start).Seconds(), q.Backend, q.Outcome)
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}
