package bench

import (
	"context"
	"fmt"
	"time"

	"heft/agent/probe"
	"heft/shared/wire"
	"heft/sim"
)

// benchModel is the one model every simulated worker serves.
const benchModel = "Qwen/Qwen3-8B"

// fidelityWorkers are the six workers of areas 1–3: from a small Mac-like
// engine up to a big GPU, one with two data-parallel ranks, one with
// speculative decoding (three tokens a step, streamed as one chunk).
var fidelityWorkers = []Calibration{
	{Name: "mac-small", Flavor: sim.FlavorLlamaCpp, SingleTPS: 60, Batch16TPS: 300},
	{Name: "gpu-mid", Flavor: sim.FlavorSGLang, SingleTPS: 80, Batch16TPS: 900},
	{Name: "gpu-fast", Flavor: sim.FlavorVLLM, SingleTPS: 100, Batch16TPS: 1200},
	{Name: "gpu-big", Flavor: sim.FlavorVLLM, SingleTPS: 160, Batch16TPS: 2500},
	{Name: "gpu-dp2", Flavor: sim.FlavorSGLang, SingleTPS: 80, Batch16TPS: 900, DP: 2},
	{Name: "gpu-spec", Flavor: sim.FlavorVLLM, SingleTPS: 100, Batch16TPS: 1200, SpecAccept: 3},
}

// coldStarts are each worker's cold start in area 2: steps 3–4 times
// slower for the first seconds after start.
var coldStarts = map[string]Cold{
	"mac-small": {Factor: 3, Seconds: 3},
	"gpu-mid":   {Factor: 3.5, Seconds: 2},
	"gpu-fast":  {Factor: 4, Seconds: 2},
	"gpu-big":   {Factor: 3.6, Seconds: 2},
	"gpu-dp2":   {Factor: 3.5, Seconds: 2},
	"gpu-spec":  {Factor: 4, Seconds: 2},
}

// longCold is area 2's informative limit case: a cold period that outlasts
// the whole warm-up burst (the demo's gpu-a is cold this long).
var longCold = Cold{Factor: 3.6, Seconds: 6}

func (e *env) workers() []Calibration {
	if e.opts.Quick {
		return []Calibration{fidelityWorkers[3], fidelityWorkers[4]}
	}
	return fidelityWorkers
}

func (e *env) coldOf(c Calibration) Cold {
	cold := coldStarts[c.Name]
	if e.opts.Quick {
		cold.Seconds = 0.3 // the quick bursts are short
	}
	return cold
}

// probeResult is one probe as the bench saw it.
type probeResult struct {
	m    wire.Measurement
	wall time.Duration // around probe.Run, as its caller pays it
}

// workerRuns are one worker's probes over the runs.
type workerRuns struct {
	cal    Calibration
	probes []probeResult
	notes  []string
}

// probeSim starts an in-process sim for c, probes it, runs then (if any)
// against the same engine, and stops it.
func (e *env) probeSim(ctx context.Context, c Calibration, cold Cold, then func(url string) error) (probeResult, error) {
	srv, err := sim.Start(c.simConfig(benchModel, cold), "127.0.0.1:0")
	if err != nil {
		return probeResult{}, err
	}
	defer srv.Close()
	pr, err := e.probe(ctx, c, srv.URL())
	if err != nil || then == nil {
		return pr, err
	}
	return pr, then(srv.URL())
}

// probe runs one standard probe (warm-up burst + measured burst).
func (e *env) probe(ctx context.Context, c Calibration, url string) (probeResult, error) {
	start := time.Now()
	m, err := probe.Run(ctx, probe.Config{
		URL: url, Kind: c.Flavor, Model: benchModel, Concurrency: c.Burst(e.conc), Ranks: c.ranks(), Tokens: e.tokens,
		ReadyTimeout: 30 * time.Second, BurstTimeout: 3 * time.Minute, Trigger: "cli",
	})
	pr := probeResult{m: m, wall: time.Since(start)}
	if err != nil {
		return pr, fmt.Errorf("probe %s: %w", c.Name, err)
	}
	if !m.Valid() {
		return pr, fmt.Errorf("probe %s: measurement not valid: %s %v", c.Name, m.Failure, m.Problems)
	}
	return pr, nil
}

// fidelityProbes runs area 1's probes once and keeps them for area 3: for
// each run, each worker on a fresh warm sim.
func (e *env) fidelityProbes(ctx context.Context) ([]workerRuns, error) {
	e.fidelityOnce.Do(func() {
		ws := e.workers()
		out := make([]workerRuns, len(ws))
		for i, c := range ws {
			out[i].cal = c
		}
		for run := range e.runs {
			for i, c := range ws {
				e.logf("probe fidelity: run %d/%d, %s", run+1, e.runs, c.Name)
				pr, err := e.probeSim(ctx, c, Cold{}, nil)
				if err != nil {
					if ctx.Err() != nil {
						e.fidelityErr = ctx.Err()
						e.fidelity = out
						return
					}
					out[i].notes = append(out[i].notes, err.Error())
					continue
				}
				out[i].probes = append(out[i].probes, pr)
			}
		}
		e.fidelity = out
	})
	return e.fidelity, e.fidelityErr
}

func (e *env) areaFidelity(ctx context.Context) *Section {
	s := &Section{
		Title: "Probe fidelity",
		Intro: fmt.Sprintf("Each worker is a fresh heft-sim, probed by heft/agent/probe exactly as the agent does "+
			"(warm-up burst, then the measured burst of %d × %d tokens). True capacity comes from the sim's step model "+
			"(see README). Median of %d run(s), min–max in brackets.", e.conc, e.tokens, e.runs),
		Table: Table{Columns: []string{"worker", "calibration", "true capacity tok/s", "measured tok/s",
			"measured / true − 1", "target", "verdict"}},
	}
	ws, err := e.fidelityProbes(ctx)
	s.Err = err
	for _, w := range ws {
		truth := w.cal.FullCapacity(e.conc)
		var tps, ratio []float64
		for _, p := range w.probes {
			tps = append(tps, p.m.ThroughputTPS)
			ratio = append(ratio, p.m.ThroughputTPS/truth)
		}
		rs := Summarize(ratio)
		s.Table.Add(w.cal.Name, w.cal.String(), num(truth, 0), Summarize(tps).Format(0), rs.FormatPct(2),
			"±2 %", within(rs, 0.02))
		for _, n := range w.notes {
			s.Notes = append(s.Notes, w.cal.Name+": "+n)
		}
	}
	return s
}

func (e *env) areaCost(ctx context.Context) *Section {
	s := &Section{
		Title: "Probe cost",
		Intro: "Wall time of a whole probe (readiness check, warm-up burst, measured burst), as its caller waits for it, " +
			"over two ideal bursts of the worker (its true step time × tokens). Same probes as area 1.",
		Table: Table{Columns: []string{"worker", "ideal burst s", "probe wall s", "wall / (2 × ideal)", "target", "verdict"}},
	}
	ws, err := e.fidelityProbes(ctx)
	s.Err = err
	for _, w := range ws {
		ideal := w.cal.IdealBurstSeconds(w.cal.Burst(e.conc), e.tokens)
		var wall, ratio []float64
		for _, p := range w.probes {
			wall = append(wall, p.wall.Seconds())
			ratio = append(ratio, p.wall.Seconds()/(2*ideal))
		}
		rs := Summarize(ratio)
		s.Table.Add(w.cal.Name, num(ideal, 3), Summarize(wall).Format(3), rs.Format(3), "≤ 1.1", atMost(rs, 1.1, 3, ""))
	}
	return s
}

func (e *env) areaCold(ctx context.Context) *Section {
	s := &Section{
		Title: "Cold-start immunity",
		Intro: "Each worker's sim starts cold (every step F× slower for its first C seconds) and is probed at once; the " +
			"same engine is then probed again, warm. The cold-start probe's measured burst is compared with the warm one. " +
			"\"Single burst\" is the cold-start probe's warm-up burst: what a probe without warm-up would have reported.",
		Table: Table{Columns: []string{"worker", "cold start", "warm probe tok/s", "cold-start probe tok/s",
			"cold-start / warm − 1", "single burst / warm − 1", "target", "verdict"}},
	}
	type row struct {
		cal   Calibration
		cold  Cold
		limit bool
	}
	var rows []row
	for _, c := range e.workers() {
		rows = append(rows, row{cal: c, cold: e.coldOf(c)})
	}
	if !e.opts.Quick {
		big := fidelityWorkers[3]
		big.Name = "gpu-big, long cold (limit)"
		rows = append(rows, row{cal: big, cold: longCold, limit: true})
	}
	for _, r := range rows {
		var warmTPS, coldTPS, ratio, single []float64
		for run := range e.runs {
			e.logf("cold start: run %d/%d, %s", run+1, e.runs, r.cal.Name)
			var warm probeResult
			cold, err := e.probeSim(ctx, r.cal, r.cold, func(url string) error {
				var err error
				warm, err = e.probe(ctx, r.cal, url)
				return err
			})
			if err != nil {
				if ctx.Err() != nil {
					s.Err = ctx.Err()
					return s
				}
				s.Notes = append(s.Notes, r.cal.Name+": "+err.Error())
				continue
			}
			w := warm.m.ThroughputTPS
			warmTPS = append(warmTPS, w)
			coldTPS = append(coldTPS, cold.m.ThroughputTPS)
			ratio = append(ratio, cold.m.ThroughputTPS/w)
			single = append(single, cold.m.WarmupTPS/w)
		}
		rs := Summarize(ratio)
		target, verdict := "±3 %", within(rs, 0.03)
		if r.limit {
			target, verdict = "outside design", Info
		}
		s.Table.Add(r.cal.Name, fmt.Sprintf("×%g for %g s", r.cold.Factor, r.cold.Seconds), Summarize(warmTPS).Format(0),
			Summarize(coldTPS).Format(0), rs.FormatPct(2), Summarize(single).FormatPct(1), target, verdict)
	}
	// What the step model predicts, so a reader can check the single-burst column.
	for _, r := range rows {
		warmup := r.cal.ColdBurstSeconds(r.cal.Burst(e.conc), e.tokens, r.cold, 0)
		ideal := r.cal.IdealBurstSeconds(r.cal.Burst(e.conc), e.tokens)
		measured := r.cal.ColdBurstSeconds(r.cal.Burst(e.conc), e.tokens, r.cold, warmup)
		s.Notes = append(s.Notes, fmt.Sprintf("%s: the step model predicts a warm-up burst of %s s (warm: %s s), so a single burst "+
			"would read %s; the measured burst starts %s.", r.cal.Name, num(warmup, 2), num(ideal, 2), pct(ideal/warmup-1, 1),
			coldVerdict(measured, ideal)))
	}
	if !e.opts.Quick {
		s.Notes = append(s.Notes, "The limit row is outside the design on purpose: when an engine stays cold longer than its whole "+
			"warm-up burst, the measured burst is partly cold too. Two bursts absorb a cold period only while it ends within the first.")
	}
	return s
}

func coldVerdict(measured, ideal float64) string {
	if measured <= ideal*1.0001 {
		return "warm"
	}
	return fmt.Sprintf("while still cold, and should read %s", pct(ideal/measured-1, 1))
}
