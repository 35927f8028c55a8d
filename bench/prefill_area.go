package bench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"heft/agent/engine"
	"heft/agent/probe"
	"heft/shared/wire"
	"heft/sim"
)

// prefillRun is one probe, prefill burst included, of one calibration.
type prefillRun struct {
	m wire.Measurement
	// decode is the probe's wall time up to the prefill burst (readiness,
	// both decode bursts), prefill the time the prefill burst added (both
	// of its bursts, from the first prefill request built to the end).
	decode, prefill time.Duration
}

// prefillWorker is one calibration's runs.
type prefillWorker struct {
	cal   PrefillCalibration
	runs  []prefillRun
	notes []string
}

// prefillSetup is what areas 7 and 8 send: the calibrations, and the prompt
// length and count of each prefill burst.
func (e *env) prefillSetup() ([]PrefillCalibration, int, int) {
	if e.opts.Quick {
		return []PrefillCalibration{PrefillCalibrations[1], PrefillCalibrations[3]}, probe.DefaultPrefillConcurrency, 2048
	}
	return PrefillCalibrations, probe.DefaultPrefillConcurrency, probe.DefaultPrefillTokens
}

// prefillProbes runs areas 7 and 8's probes once: for each run, each
// calibration on a fresh warm sim, probed with the prefill burst as the
// agent probes (the worker's max_context_tokens read from the engine as
// the agent reads it).
func (e *env) prefillProbes(ctx context.Context) ([]prefillWorker, error) {
	e.prefillOnce.Do(func() {
		cals, n, length := e.prefillSetup()
		out := make([]prefillWorker, len(cals))
		for i, c := range cals {
			out[i].cal = c
		}
		for run := range e.runs {
			for i, c := range cals {
				e.logf("prefill fidelity: run %d/%d, %s", run+1, e.runs, c.Name)
				r, err := e.prefillProbe(ctx, c, n, length)
				if err != nil {
					if ctx.Err() != nil {
						e.prefill, e.prefillErr = out, ctx.Err()
						return
					}
					out[i].notes = append(out[i].notes, err.Error())
					continue
				}
				out[i].runs = append(out[i].runs, r)
			}
		}
		e.prefill = out
	})
	return e.prefill, e.prefillErr
}

func (e *env) prefillProbe(ctx context.Context, c PrefillCalibration, n, length int) (prefillRun, error) {
	srv, err := sim.Start(c.SimConfig(benchModel, Cold{}), "127.0.0.1:0")
	if err != nil {
		return prefillRun{}, err
	}
	defer srv.Close()
	client, err := engine.New(engine.Config{Kind: c.Flavor, URL: srv.URL()}, nil)
	if err != nil {
		return prefillRun{}, err
	}
	maxContext := client.Facts(ctx, nil, nil).MaxContextTokens()

	// The prefill part starts where the decode part ends: at the measured
	// decode burst's last progress report, so building and sizing the
	// prompts count as prefill cost.
	var mu sync.Mutex
	var decodeEnd, prefillAt time.Time
	start := time.Now()
	m, err := probe.Run(ctx, probe.Config{
		URL: srv.URL(), Kind: c.Flavor, Model: benchModel, Concurrency: e.conc, Tokens: e.tokens,
		ReadyTimeout: 30 * time.Second, BurstTimeout: 3 * time.Minute, Trigger: "cli",
		Prefill: true, PrefillConcurrency: n, PrefillTokens: length, MaxContextTokens: maxContext,
		Progress: func(p probe.Progress) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case p.Phase == probe.PhaseMeasure:
				decodeEnd = time.Now()
			case p.Phase == probe.PhasePrefillWarmup && prefillAt.IsZero():
				prefillAt = decodeEnd
			}
		},
	})
	end := time.Now()
	if err != nil {
		return prefillRun{}, fmt.Errorf("probe %s: %w", c.Name, err)
	}
	if !m.PrefillValid() {
		var why []string
		if m.Prefill != nil {
			why = append([]string{m.Prefill.Failure}, m.Prefill.Problems...)
		}
		return prefillRun{}, fmt.Errorf("probe %s: no valid prefill measurement: %s %v %v", c.Name, m.Failure, m.Problems, why)
	}
	mu.Lock()
	defer mu.Unlock()
	return prefillRun{m: m, decode: prefillAt.Sub(start), prefill: end.Sub(prefillAt)}, nil
}

func (e *env) areaPrefill(ctx context.Context) *Section {
	_, n, length := e.prefillSetup()
	s := &Section{
		Title: "Prefill fidelity",
		Intro: fmt.Sprintf("Each calibration of bench/prefill.go is a fresh heft-sim with a prefill rate, probed by heft/agent/probe as "+
			"the agent probes it: the decode burst (%d × %d tokens, twice), then the prefill burst (%d prompts of %d tokens with a unique "+
			"random prefix and one output token, twice), within the max_context_tokens the agent reads from the engine. True prefill "+
			"capacity is sim.Config.PrefillCapacity (see README). Each weight is the worker's throughput over the median of the workers "+
			"below, as the coordinator computes it. Median of %d run(s), min–max in brackets.", e.conc, e.tokens, n, length, e.runs),
		Table: Table{Columns: []string{"worker", "calibration", "true prefill tok/s", "measured prefill tok/s", "measured / true − 1",
			"decode weight", "prefill weight", "target", "verdict"}},
	}
	ws, err := e.prefillProbes(ctx)
	s.Err = err
	decode, prefill := make([]float64, len(ws)), make([]float64, len(ws))
	for i, w := range ws {
		var d, p []float64
		for _, r := range w.runs {
			d = append(d, r.m.ThroughputTPS)
			p = append(p, r.m.Prefill.ThroughputTPS)
		}
		decode[i], prefill[i] = Summarize(d).Median, Summarize(p).Median
	}
	dmed, pmed := median(decode), median(prefill)
	for i, w := range ws {
		truth, terr := w.cal.TruePrefillCapacity(n, length)
		var tps, ratio []float64
		for _, r := range w.runs {
			tps = append(tps, r.m.Prefill.ThroughputTPS)
			ratio = append(ratio, r.m.Prefill.ThroughputTPS/truth)
		}
		if terr != nil {
			s.Notes = append(s.Notes, w.cal.Name+": "+terr.Error())
		}
		rs := Summarize(ratio)
		s.Table.Add(w.cal.Name, w.cal.String(), num(truth, 0), Summarize(tps).Format(0), rs.FormatPct(2),
			num(decode[i]/dmed, 3), num(prefill[i]/pmed, 3), "±3 %", within(rs, 0.03))
		for _, note := range w.notes {
			s.Notes = append(s.Notes, w.cal.Name+": "+note)
		}
	}
	// The two weights rank the workers as the calibrations' true
	// capacities say, and not alike.
	names := make([]string, len(ws))
	trueDecode, truePrefill := make([]float64, len(ws)), make([]float64, len(ws))
	for i, w := range ws {
		names[i] = w.cal.Name
		trueDecode[i], _ = w.cal.TrueDecodeCapacity(e.conc, decodePromptTokens, e.tokens)
		truePrefill[i], _ = w.cal.TruePrefillCapacity(n, length)
	}
	gotD, gotP := ranking(names, decode), ranking(names, prefill)
	wantD, wantP := ranking(names, trueDecode), ranking(names, truePrefill)
	verdict := Pass
	switch {
	case !slices.Equal(gotD, wantD) || !slices.Equal(gotP, wantP):
		verdict = "miss: not the calibrations' order"
	case slices.Equal(gotD, gotP):
		verdict = "miss: the two rank alike"
	}
	s.Table.Add("ranking", "decode weight: "+strings.Join(gotD, " > "), "", "prefill weight: "+strings.Join(gotP, " > "), "",
		"", "", "the calibrations' orders, unlike each other", verdict)
	if e.opts.Quick {
		s.Notes = append(s.Notes, fmt.Sprintf("Quick mode: two calibrations and prompts of %d tokens.", length))
	}
	return s
}

// decodePromptTokens is what heft-sim's tokenizer counts of the probe's
// default prompt in a chat request (bench/prefill_test.go).
const decodePromptTokens = 18

func (e *env) areaPrefillCost(ctx context.Context) *Section {
	s := &Section{
		Title: "Prefill probe cost",
		Intro: "What the prefill burst adds to a probe (same probes as area 7): from the end of the measured decode burst to the end " +
			"of the probe, over the wall time of its measured prefill burst. The prefill burst is a warm-up and a measured burst of the " +
			"same prompts' size; the measured prompts are built and counted by the tokenizer while the warm-up runs, so it adds two " +
			"bursts and the few milliseconds of sizing and building the warm-up's prompts. Target: two bursts, with 1 % for the noise between two bursts of one engine " +
			"(verdict against 2.02). The decode probe's own cost (readiness, both decode bursts) is shown beside it.",
		Table: Table{Columns: []string{"worker", "decode probe s", "prefill adds s", "measured prefill burst s",
			"prefill adds / measured burst", "target", "verdict"}},
	}
	ws, err := e.prefillProbes(ctx)
	s.Err = err
	for _, w := range ws {
		var dec, add, burst, ratio []float64
		for _, r := range w.runs {
			dec = append(dec, r.decode.Seconds())
			add = append(add, r.prefill.Seconds())
			burst = append(burst, r.m.Prefill.WallSeconds)
			ratio = append(ratio, r.prefill.Seconds()/r.m.Prefill.WallSeconds)
		}
		rs := Summarize(ratio)
		s.Table.Add(w.cal.Name, Summarize(dec).Format(2), Summarize(add).Format(2), Summarize(burst).Format(3), rs.Format(3),
			"≤ 2 (+1 %)", atMost(rs, 2.02, 3, ""))
	}
	return s
}

// ranking orders names by value, highest first.
func ranking(names []string, values []float64) []string {
	idx := make([]int, len(names))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(values[b], values[a]) })
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = names[j]
	}
	return out
}
