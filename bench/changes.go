package bench

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"heft/bench/loadgen"
	"heft/sim"
)

// Area 11: a worker's capacity changes while the fleet serves. The fast
// worker of area 9's fleet halves its speed mid-run (heft-sim --slow-at,
// same arguments, no restart) under Poisson load of 60 % of the fleet's
// full-load capacity, half through HAProxy and half through nginx, both
// routing by heft's weights (leastconn). The bench reads the fast
// worker's weight share at each gateway every half second and times how
// long after the slowdown it first comes within 5 % of its true share.

// changesPlan is what one run of the area does.
type changesPlan struct {
	SlowAt  time.Duration // after the sims start; the fleet must be up by then
	Factor  float64
	After   time.Duration // load and polling after the slowdown
	Window  time.Duration // the agents' passive window
	Seeds   int
	Load    float64
	Tokens  int
	Tolered float64 // relative distance from the true share that counts as converged
}

func (e *env) changesPlanFor() changesPlan {
	p := changesPlan{SlowAt: 4 * time.Minute, Factor: 2, After: 2 * time.Minute, Window: 30 * time.Second,
		Seeds: 3, Load: 0.6, Tokens: 128, Tolered: 0.05}
	if e.opts.Quick {
		p.SlowAt, p.After, p.Window, p.Seeds, p.Tokens = 60*time.Second, 40*time.Second, 5*time.Second, 1, e.tokens
	}
	return p
}

func (p changesPlan) estimate() time.Duration {
	return time.Duration(p.Seeds) * (p.SlowAt + p.After + 20*time.Second)
}

// changesPolicies route by heft's weights, one per gateway.
func changesPolicies() []policy {
	var out []policy
	for _, p := range routingPolicies {
		if p.Key == "lc_heft" {
			out = append(out, p)
		}
	}
	return out
}

// changeRow is one gateway's outcome in one seed.
type changeRow struct {
	Gateway   string
	Seed      int
	Before    float64 // the fast worker's share at the slowdown
	Converged float64 // seconds after the slowdown; NaN: never within the run
	Final     float64 // its share at the end
	Res       loadgen.Result
	Err       error
}

// trueShares are the fast worker's share of the serving fleet's
// full-load capacity before and after the slowdown.
func trueShares(factor float64) (before, after float64) {
	total := routingCapacity()
	fast := routeServing[routeFast].FullCapacity(16)
	return fast / total, (fast / factor) / (total - fast + fast/factor)
}

func (e *env) areaChanges(ctx context.Context) *Section {
	plan := e.changesPlanFor()
	before, after := trueShares(plan.Factor)
	s := &Section{Title: "Capacity changes under load",
		Intro: fmt.Sprintf("Area 9's fleet (%s) behind real HAProxy and nginx, heft-sync applying heft's weights (leastconn). "+
			"The fast worker's heft-sim halves its speed %s after it starts (--slow-at, --slow-factor %s: same arguments, no restart); "+
			"its true share of the fleet's full-load capacity goes from %s to %s. Poisson load of %s of the fleet's full-load capacity, "+
			"half through each gateway, %d output tokens, from when the fleet is up until %s after the slowdown; agents' passive window %s "+
			"(probe.passive_window). \"converged\": seconds from the slowdown until the worker's weight share at the gateway "+
			"(HAProxy `show stat` weights, nginx's upstream file) is first within %s %% of its true share.",
			describeFleet(), plan.SlowAt, ftoa(plan.Factor), shareText(before), shareText(after), shareText(plan.Load), plan.Tokens, plan.After,
			plan.Window, num(100*plan.Tolered, 0)),
		Table: Table{Columns: []string{"case", "gateway", "seed", "share at slowdown", "converged", "share at end", "true share",
			"requests", "failed", "p95"}},
	}
	for seed := range plan.Seeds {
		rows, err := e.changesRun(ctx, plan, seed)
		for _, r := range rows {
			conv := "not within the run"
			if !math.IsNaN(r.Converged) {
				conv = num(r.Converged, 1) + " s"
			}
			s.Table.Add("halves its speed mid-run", r.Gateway, fmt.Sprint(r.Seed+1), shareText(r.Before), conv, shareText(r.Final), shareText(after),
				fmt.Sprint(r.Res.Sent), fmt.Sprint(r.Res.Failed+r.Res.Unfinished), num(r.Res.Latency.P95.Seconds(), 2)+" s")
			if r.Err != nil {
				s.Notes = append(s.Notes, fmt.Sprintf("%s seed %d: %v", r.Gateway, r.Seed+1, r.Err))
			}
		}
		if err != nil {
			s.Err = err
			break
		}
	}
	s.Notes = append(s.Notes, "Not built: a worker restarted at half speed with the same arguments and port, a worker joining, "+
		"GPU clock throttling (needs a stand-in NVML), p95 against the same run routed by true capacities, and the count of "+
		"requests that met a probe.")
	return s
}

func shareText(x float64) string { return num(100*x, 1) + " %" }

// changesRun starts the fleet with the fast worker set to slow down, loads
// it, and follows the fast worker's share at both gateways.
func (e *env) changesRun(ctx context.Context, plan changesPlan, seed int) ([]changeRow, error) {
	e.slowFast, e.passiveWindow = sim.Slow{At: plan.SlowAt, Factor: plan.Factor}, plan.Window
	defer func() { e.slowFast, e.passiveWindow = sim.Slow{}, 0 }()
	pols := changesPolicies()
	started := time.Now() // the sims start within a second of this
	f, err := e.startRoutingFleet(ctx, routingPlan{Policies: pols})
	if err != nil {
		return nil, err
	}
	defer f.stop()
	slowAt := started.Add(plan.SlowAt)
	if time.Now().After(slowAt) {
		return nil, fmt.Errorf("the fleet took %s to come up, past the slowdown at %s: raise SlowAt", time.Since(started).Round(time.Second), plan.SlowAt)
	}
	end := slowAt.Add(plan.After)
	_, trueAfter := trueShares(plan.Factor)
	rows := make([]changeRow, len(pols))
	var wg sync.WaitGroup
	for i, p := range pols {
		rows[i] = changeRow{Gateway: p.Gateway, Seed: seed, Converged: math.NaN()}
		cfg := loadgen.Config{URL: f.frontURL(p), Model: benchModel, Tokens: plan.Tokens, Drain: 20 * time.Second,
			MaxInFlight: 1024, Seed: uint64(seed) + 1, Client: f.client,
			Rate: plan.Load / float64(len(pols)) * routingCapacity() / float64(plan.Tokens), Duration: time.Until(end)}
		wg.Go(func() { rows[i].Res, rows[i].Err = loadgen.Run(ctx, cfg) })
	}
	e.logf("changes: seed %d: load on, slowdown in %s", seed+1, time.Until(slowAt).Round(time.Second))
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var lastPace time.Time
	for now := time.Now(); now.Before(end) && ctx.Err() == nil; now = <-tick.C {
		lastPace = f.logPace(ctx, lastPace)
		for i, p := range pols {
			share, err := f.fastShare(ctx, p)
			if err != nil {
				continue // a reload in progress; the next tick reads it
			}
			rows[i].Final = share
			if now.Before(slowAt) {
				rows[i].Before = share
			} else if math.IsNaN(rows[i].Converged) && math.Abs(share-trueAfter) <= plan.Tolered*trueAfter {
				rows[i].Converged = now.Sub(slowAt).Seconds()
			}
		}
	}
	wg.Wait()
	return rows, ctx.Err()
}

// fastShare is the fast worker's weight over the serving workers' sum at
// one gateway.
func (f *routingFleet) fastShare(ctx context.Context, p policy) (float64, error) {
	fast := f.simAddr(routeFast)
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

// logPace logs the fast worker's newest pace reading and weight source
// once per reading, so a run shows what moved its weight.
func (f *routingFleet) logPace(ctx context.Context, last time.Time) time.Time {
	list, err := f.co.workers(ctx)
	if err != nil {
		return last
	}
	for _, w := range list {
		if !samePort(w.URL, f.sims[routeFast].url) || w.Pace == nil || !w.Pace.At.After(last) {
			continue
		}
		p := w.Pace
		weights := ""
		if wt, err := f.co.weights(ctx, benchModel); err == nil {
			for _, x := range wt.Workers {
				weights += fmt.Sprintf(" %s=%.3f", x.URL, x.Weight)
			}
		}
		f.e.logf("changes: fast worker pace %.2f ms per token at %.1f running per rank, %.0f tok/s; weight source %s, factor %.2f; weights%s",
			1000*p.SecondsPerToken, p.Batch, p.ThroughputTPS, w.WeightSource, w.PaceFactor, weights)
		return p.At
	}
	return last
}
