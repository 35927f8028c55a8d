package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"heft/coordinator/fleet"
)

// routingTolerance is the target: heft's weights within 3 % of
// the oracle's on delivered tok/s and p95 latency.
const routingTolerance = 0.03

// quietShare is the target for the quiet case: this share of
// sequential requests on the fastest worker.
const quietShare = 0.95

// cellsOf returns the cells of one policy at one load, in seed order.
func (r *routingResult) cellsOf(p policy, load float64) []cell {
	var out []cell
	for _, c := range r.Cells {
		if c.Policy == p && c.Load == load {
			out = append(out, c)
		}
	}
	return out
}

// summarize applies get to each cell that ran and summarises.
func summarizeCells(cs []cell, get func(cell) float64) Summary {
	var xs []float64
	for _, c := range cs {
		if c.Res.Sent > 0 {
			xs = append(xs, get(c))
		}
	}
	return Summarize(xs)
}

func secs(d time.Duration) float64 { return d.Seconds() }

func loadLabel(load float64) string {
	if load == 0 {
		return "quiet"
	}
	return num(100*load, 0) + " %"
}

// render fills the section: the results per policy and load, then the
// issue's targets with their verdicts, then the notes.
func (r *routingResult) render(s *Section) {
	names := make([]string, len(routingWorkers))
	for i, c := range routingWorkers {
		names[i] = c.Name
	}
	s.Table = Table{Columns: []string{"load", "gateway", "policy", "delivered tok/s", "p50 latency s", "p95 latency s",
		"p95 TTFT s", "unfinished / refused / failed", "requests " + strings.Join(names, " / ")}}
	loads := append(append([]float64{}, r.Plan.Loads...), 0)
	if r.Plan.Quiet == 0 {
		loads = r.Plan.Loads
	}
	for _, load := range loads {
		for _, p := range r.Plan.Policies {
			cs := r.cellsOf(p, load)
			if len(cs) == 0 {
				continue
			}
			var unfinished, refused, failed, other int
			split := make([]string, len(routingWorkers))
			counts := make([]int, len(routingWorkers))
			errs := map[string]int{}
			for _, c := range cs {
				unfinished += c.Res.Unfinished
				refused += c.Res.Refused
				failed += c.Res.Failed
				other += c.Other
				for i, n := range c.Split {
					counts[i] += n
				}
				for k, n := range c.Res.Errors {
					errs[k] += n
				}
				if c.Err != nil {
					s.Notes = append(s.Notes, fmt.Sprintf("%s at %s, seed %d: %v", p, loadLabel(load), c.Seed+1, c.Err))
				}
			}
			for i, n := range counts {
				split[i] = fmt.Sprint(n)
			}
			lost := fmt.Sprintf("%d / %d / %d", unfinished, refused, failed)
			if len(errs) > 0 {
				lost += " (" + describeCounts(errs) + ")"
			}
			req := strings.Join(split, " / ")
			if other > 0 {
				req += fmt.Sprintf(" (+%d unknown)", other)
			}
			s.Table.Add(loadLabel(load), p.Gateway, p.Name,
				summarizeCells(cs, func(c cell) float64 { return c.Res.TokensPerSecond }).Format(0),
				summarizeCells(cs, func(c cell) float64 { return secs(c.Res.Latency.P50) }).Format(2),
				summarizeCells(cs, func(c cell) float64 { return secs(c.Res.Latency.P95) }).Format(2),
				summarizeCells(cs, func(c cell) float64 { return secs(c.Res.TTFT.P95) }).Format(3),
				lost, req)
		}
	}
	s.More = append(s.More, r.targets())
	s.Notes = append(s.Notes, r.notes()...)
}

func describeCounts(m map[string]int) string {
	var parts []string
	for k, n := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// notWorse judges paired ratios (heft / reference) against a one-sided
// tolerance: a policy doing better than its reference is no miss. up says
// whether higher is better.
func notWorse(s Summary, tol float64, up bool) string {
	if !s.Known() {
		return "miss: not measured"
	}
	bad := func(r float64) bool {
		if up {
			return r < 1-tol
		}
		return r > 1+tol
	}
	v := Pass
	if bad(s.Median) {
		v = fmt.Sprintf("miss by %s pp", num(100*(math.Abs(s.Median-1)-tol), 1))
	}
	return v + outside(s, bad)
}

// findPolicy returns the plan's policy of a gateway with the given key.
func (r *routingResult) findPolicy(gateway, key string) (policy, bool) {
	for _, p := range r.Plan.Policies {
		if p.Gateway == gateway && p.Key == key {
			return p, true
		}
	}
	return policy{}, false
}

// targets is the table of the targets, each with its verdict.
func (r *routingResult) targets() Table {
	t := Table{Caption: "Targets", Columns: []string{"target", "gateway", "case", "measured", "limit", "verdict"}}
	// heft's weights against the true capacities, paired by seed.
	for _, gw := range []string{gwHAProxy, gwNginx} {
		heft, ok1 := r.findPolicy(gw, "lc_heft")
		oracle, ok2 := r.findPolicy(gw, "lc_oracle")
		if !ok1 || !ok2 {
			continue
		}
		for _, load := range r.Plan.Loads {
			hs, os := r.cellsOf(heft, load), r.cellsOf(oracle, load)
			var tps, p95 []float64
			for i := range min(len(hs), len(os)) {
				if hs[i].Res.Sent == 0 || os[i].Res.Sent == 0 {
					continue
				}
				tps = append(tps, hs[i].Res.TokensPerSecond/os[i].Res.TokensPerSecond)
				p95 = append(p95, secs(hs[i].Res.Latency.P95)/secs(os[i].Res.Latency.P95))
			}
			ts, ps := Summarize(tps), Summarize(p95)
			case_ := fmt.Sprintf("%s, %s vs %s", loadLabel(load), heft.Name, oracle.Name)
			t.Add("delivered tok/s: heft's weights vs the oracle", gw, case_,
				fmt.Sprintf("%s (%s vs %s tok/s)", ts.FormatPct(1),
					summarizeCells(hs, func(c cell) float64 { return c.Res.TokensPerSecond }).Format(0),
					summarizeCells(os, func(c cell) float64 { return c.Res.TokensPerSecond }).Format(0)),
				"≥ −3 %", notWorse(ts, routingTolerance, true))
			t.Add("p95 latency: heft's weights vs the oracle", gw, case_,
				fmt.Sprintf("%s (%s vs %s s)", ps.FormatPct(1),
					summarizeCells(hs, func(c cell) float64 { return secs(c.Res.Latency.P95) }).Format(2),
					summarizeCells(os, func(c cell) float64 { return secs(c.Res.Latency.P95) }).Format(2)),
				"≤ +3 %", notWorse(ps, routingTolerance, false))
		}
	}
	// Quiet: sequential requests on the fastest worker.
	if r.Plan.Quiet > 0 {
		for _, p := range r.Plan.Policies {
			if p.Weights != weightsHeft {
				continue
			}
			for _, c := range r.cellsOf(p, 0) {
				sent := c.Res.Sent
				share := math.NaN()
				if sent > 0 {
					share = float64(c.Split[routeFast]) / float64(sent)
				}
				v := Pass
				if !(share >= quietShare) {
					v = fmt.Sprintf("miss by %s pp", num(100*(quietShare-share), 0))
				}
				t.Add("quiet: requests on the fastest worker", p.Gateway, p.Name,
					fmt.Sprintf("%s %% (%d of %d)", num(100*share, 0), c.Split[routeFast], sent), "≥ 95 %", v)
			}
		}
	}
	// The held worker: no request through any gateway, and none counted by
	// its own engine while the cells ran.
	held := 0
	for _, c := range r.Cells {
		held += c.Split[routeHeld]
	}
	v := Pass
	if held != 0 || r.HeldSeen != 0 {
		v = "miss"
	}
	t.Add("the held worker gets no request", "both", fmt.Sprintf("all %d cells", len(r.Cells)),
		fmt.Sprintf("%d through the gateways; its engine counted %s", held, num(r.HeldSeen, 0)), "0", v)

	if ch := r.Checks; ch != nil {
		limit := routeOfflineGrace + time.Second
		for _, o := range ch.Offline {
			measured := fmt.Sprintf("last request %s s after the kill (%d after it); gateway seen draining it at %s s",
				signed(o.LastRequest.Seconds(), 2), o.AfterKill, num(o.Drained.Seconds(), 2))
			v := Pass
			switch d := o.judged(); {
			case o.Drained == 0:
				measured = fmt.Sprintf("last request %s s after the kill (%d after it); never drained", signed(o.LastRequest.Seconds(), 2), o.AfterKill)
				v = "miss: never drained"
			case d > limit:
				v = fmt.Sprintf("miss: %s s over", num((d-limit).Seconds(), 2))
			}
			t.Add("a worker whose agent dies stops getting new requests", o.Policy.Gateway, o.Policy.Name, measured,
				fmt.Sprintf("≤ %s s (offline_grace %s + 1 s)", num(limit.Seconds(), 1), routeOfflineGrace), v)
		}
		for _, fr := range ch.Frozen {
			v, measured := Pass, "unchanged over 3 resyncs"
			if !fr.unchanged() {
				v, measured = "miss", fmt.Sprintf("before:\n%s\nafter:\n%s", fr.Before, fr.After)
				measured = strings.ReplaceAll(measured, "\n", " ⏎ ")
			}
			t.Add("the coordinator killed mid-run changes no gateway weight", fr.Policy.Gateway, fr.Policy.Name, measured, "unchanged", v)
		}
	}
	return t
}

// notes are the section's notes: weights, what each gateway carried, the
// checks' load and anything that went wrong.
func (r *routingResult) notes() []string {
	var out []string
	var heftW, trueW []string
	caps := make([]float64, len(routeServing))
	for i, c := range routeServing {
		caps[i] = c.FullCapacity(16)
	}
	med := median(caps)
	for i, c := range routingWorkers {
		w := "held (no weight)"
		if i < len(r.Weights) && !math.IsNaN(r.Weights[i]) {
			w = num(r.Weights[i], 3)
		}
		heftW = append(heftW, c.Name+" "+w)
		if i < len(routeServing) {
			trueW = append(trueW, fmt.Sprintf("%s %s", c.Name, num(caps[i]/med, 3)))
		}
	}
	weightMin, whose := r.Plan.WeightMin, "weight_min"
	if weightMin == 0 {
		weightMin, whose = fleet.DefaultConfig().WeightMin, "its default weight_min"
	}
	out = append(out, "heft's weights (coordinator, after the agents' probes): "+strings.Join(heftW, ", ")+
		"; true weights (true capacity / median): "+strings.Join(trueW, ", ")+
		fmt.Sprintf("; the coordinator gives no weight under %v (%s), so a worker truly below it is routed at it.", weightMin, whose))
	if r.Caps != "" {
		out = append(out, "The coordinator's view of what each engine runs at once: "+r.Caps+".")
	}
	if len(r.Applied) > 0 {
		out = append(out, "Integer weights the gateways carried once heft-sync had applied heft's state (read back from HAProxy's "+
			"`show stat` and nginx's upstream file): "+strings.Join(r.Applied, "; ")+".")
	}
	oracleDesc := func(ints []int) string {
		parts := make([]string, len(ints))
		for i, n := range ints {
			parts[i] = fmt.Sprintf("%s %d", routeServing[i].Name, n)
		}
		return strings.Join(parts, ", ")
	}
	out = append(out, fmt.Sprintf("Oracle weights (true capacities scaled as heft-sync scales): HAProxy %s; nginx %s.",
		oracleDesc(oracleWeights(haproxyWeights)), oracleDesc(oracleWeights(nginxWeights))))
	out = append(out, fmt.Sprintf("\"heft's maxconn\": heft-sync's maxconn = true sets each server's maxconn to the coordinator's "+
		"max_concurrency = max(R, ⌈R × weight⌉), R being what the engine runs at once as its agent reports it (%d here); "+
		"\"maxconn = engine's\": %d on the server-template line, the same for every worker. Baselines and the oracle list the "+
		"%d serving workers; heft's backends start with empty server-template slots (HAProxy) or a placeholder upstream "+
		"(nginx) and heft-sync fills them with all %d workers' states.", maxConnOf(routeServing[0]), maxConnOf(routeServing[0]),
		len(routeServing), len(routingWorkers)))
	if ch := r.Checks; ch != nil {
		var parts []string
		for i, l := range ch.Loads {
			if i < len(ch.Offline) {
				parts = append(parts, fmt.Sprintf("%s: %d sent, %d completed, %d failed%s", ch.Offline[i].Policy, l.Sent, l.Completed, l.Failed,
					errSuffix(l.Errors)))
			}
		}
		out = append(out, fmt.Sprintf("Checks: %s of capacity in total, split over the heft-driven policies for 20 s; the fast worker's agent "+
			"killed (SIGKILL) after 3 s, the coordinator once every gateway had drained it; gateway state polled every 25 ms. %s.",
			num(100*ch.Load, 0)+" %", strings.Join(parts, "; ")))
		if ch.Err != nil {
			out = append(out, "Checks: "+ch.Err.Error())
		}
	}
	return out
}

func errSuffix(errs map[string]int) string {
	if len(errs) == 0 {
		return ""
	}
	return " (" + describeCounts(errs) + ")"
}
