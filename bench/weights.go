package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"heft/agent/probe"
	"heft/shared/view"
	"heft/sim"
)

// weightWorkers are area 4's fleet: one model, four speeds, one of them
// with two data-parallel ranks.
var weightWorkers = []Calibration{
	{Name: "w-small", Flavor: sim.FlavorVLLM, SingleTPS: 50, Batch16TPS: 400},
	{Name: "w-mid", Flavor: sim.FlavorSGLang, SingleTPS: 80, Batch16TPS: 900},
	{Name: "w-dp2", Flavor: sim.FlavorSGLang, SingleTPS: 80, Batch16TPS: 900, DP: 2},
	{Name: "w-big", Flavor: sim.FlavorVLLM, SingleTPS: 160, Batch16TPS: 2500},
}

// median is the median as the fleet takes it: the mean of the two middle
// values for an even count.
func median(xs []float64) float64 { return Summarize(xs).Median }

// weightRun is what one run of area 4 saw of one worker.
type weightRun struct {
	weight   float64
	tps      float64
	admitted time.Duration // from the engine turning ready to the worker admitted with a weight
}

func (e *env) areaWeights(ctx context.Context) *Section {
	ws := weightWorkers
	notReady := 3 * time.Second
	if e.opts.Quick {
		ws = []Calibration{weightWorkers[1], weightWorkers[2], weightWorkers[3]}
		notReady = time.Second
	}
	s := &Section{
		Title: "Weight accuracy",
		Intro: fmt.Sprintf("A simulated fleet of one model on loopback: heft-coordinator, one heft-sim per worker and a heft-agent "+
			"beside each (%d workers, %d run(s), fresh state each run). Each sim keeps /health at 503 for its first %s; the bench "+
			"notes when it turns ready and when /api/v1/workers first shows the worker admitted with a weight. True weight = true "+
			"capacity / median true capacity, as heft computes it from measurements.", len(ws), e.runs, notReady),
		Table: Table{Columns: []string{"worker", "calibration", "true tok/s", "true weight", "heft weight", "heft / true − 1",
			"target", "verdict", "ready → admitted s", "two ideal bursts s", "idle settle s", "overhead s", "target", "verdict"}},
	}
	truths := make([]float64, len(ws))
	for i, c := range ws {
		truths[i] = c.FullCapacity(e.conc)
	}
	med := median(truths)
	runs := make([][]weightRun, len(ws))
	for run := range e.runs {
		e.logf("weight accuracy: run %d/%d", run+1, e.runs)
		got, err := e.weightRun(ctx, run, ws, notReady)
		if err != nil {
			s.Notes = append(s.Notes, fmt.Sprintf("run %d: %v", run+1, err))
			if ctx.Err() != nil {
				s.Err = ctx.Err()
				break
			}
			continue
		}
		for i := range ws {
			runs[i] = append(runs[i], got[i])
		}
	}
	for i, c := range ws {
		trueW := truths[i] / med
		var weight, ratio, lat, over []float64
		ideal2 := 2 * c.IdealBurstSeconds(c.Burst(e.conc), e.tokens)
		settle := probe.IdleSettle.Seconds()
		for _, r := range runs[i] {
			weight = append(weight, r.weight)
			ratio = append(ratio, r.weight/trueW)
			lat = append(lat, r.admitted.Seconds())
			over = append(over, r.admitted.Seconds()-ideal2-settle)
		}
		rs, ov := Summarize(ratio), Summarize(over)
		s.Table.Add(c.Name, c.String(), num(truths[i], 0), num(trueW, 3), Summarize(weight).Format(3), rs.FormatPct(2), "±3 %",
			within(rs, 0.03), Summarize(lat).Format(2), num(ideal2, 2), num(settle, 2), ov.Format(2), "< 1 s", atMost(ov, 1, 2, " s"))
	}
	s.Notes = append(s.Notes, fmt.Sprintf("The probe sends its warm-up only once the engine has stayed idle for %s (the idle settle, "+
		"docs/measuring.md: an engine idle at one instant may be between two of a gateway's requests); the overhead is what "+
		"remains beyond it and the two bursts: the agent noticing readiness (it polls its engine every second by default), the "+
		"coordinator's probe request, the readiness check of the probe, the settle's 250 ms reads, and the result's way back. "+
		"The agents run with [probe] prefill = false: this area times the decode probe; area 8 gives what the prefill burst adds.",
		probe.IdleSettle),
		`The coordinator runs with probation = "0s": this area checks the weights heft earns from its measurements. With the `+
			`default (1 h), a new worker weighs at most 1 until its weight is earned (docs/configure.md), so the workers above the `+
			`median would show 1.000 here for their first hour.`)
	return s
}

// weightRun starts the fleet, waits for every worker to be admitted and
// reads the weights.
func (e *env) weightRun(ctx context.Context, run int, ws []Calibration, notReady time.Duration) ([]weightRun, error) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	dir := filepath.Join(e.work, "weights-"+strconv.Itoa(run))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	co, err := e.startCoordinator(rctx, "weights-"+strconv.Itoa(run)+"-coordinator", `probation = "0s"`)
	if err != nil {
		return nil, err
	}
	procs := []*child{co.child}
	defer func() { stopAll(procs) }()

	sims := make([]*simProc, len(ws))
	for i, c := range ws {
		sp, err := e.startSimProc(dir, c.Name, c, notReady)
		if err != nil {
			return nil, err
		}
		sims[i] = sp
		procs = append(procs, sp.child)
	}
	// Catch each engine's turn to ready to within a few milliseconds.
	readyAt := make([]time.Time, len(ws))
	var watch sync.WaitGroup
	for i, sp := range sims {
		watch.Go(func() { readyAt[i] = waitHealthy(rctx, sp.url) })
	}
	for i, c := range ws {
		ag, err := e.startAgent(dir, fmt.Sprintf("bench-%s", c.Name), co, c.Flavor, sims[i], false)
		if err != nil {
			return nil, err
		}
		procs = append(procs, ag)
	}

	admittedAt := make([]time.Time, len(ws))
	out := make([]weightRun, len(ws))
	for {
		list, err := co.workers(rctx)
		now := time.Now()
		if err != nil && rctx.Err() != nil {
			return nil, fmt.Errorf("waiting for admission: %w", err)
		}
		for _, w := range list {
			for i, sp := range sims {
				if admittedAt[i].IsZero() && samePort(w.URL, sp.url) && w.State == "admitted" && w.Weight != nil {
					admittedAt[i] = now
				}
			}
		}
		if !slices.ContainsFunc(admittedAt, time.Time.IsZero) {
			break
		}
		for _, p := range procs {
			if !p.Alive() {
				return nil, fmt.Errorf("%s exited early%s", p.name, p.stderrTail())
			}
		}
		if rctx.Err() != nil {
			return nil, fmt.Errorf("not every worker was admitted in time: %s", describeWorkers(list))
		}
		time.Sleep(10 * time.Millisecond)
	}
	watch.Wait()
	wt, err := co.weights(rctx, benchModel)
	if err != nil {
		return nil, err
	}
	for i, sp := range sims {
		found := false
		for _, w := range wt.Workers {
			if samePort(w.URL, sp.url) {
				out[i].weight, found = w.Weight, true
				if w.Throughput != nil {
					out[i].tps = *w.Throughput
				}
			}
		}
		if !found {
			return nil, fmt.Errorf("%s is not in the weight table", ws[i].Name)
		}
		if readyAt[i].IsZero() {
			return nil, fmt.Errorf("%s: never saw its engine turn ready", ws[i].Name)
		}
		out[i].admitted = admittedAt[i].Sub(readyAt[i])
	}
	return out, nil
}

// waitHealthy polls url/health until it answers 200 and returns when.
func waitHealthy(ctx context.Context, url string) time.Time {
	for ctx.Err() == nil {
		resp, err := httpClient.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return time.Now()
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Time{}
}

// describeWorkers says where each worker got to, for an error.
func describeWorkers(list []view.Worker) string {
	if len(list) == 0 {
		return "no workers listed"
	}
	var parts []string
	for _, w := range list {
		p := fmt.Sprintf("%s %s", w.URL, w.State)
		for _, warn := range w.Warnings {
			p += " [" + warn.Code + ": " + warn.Message + "]"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}
