package fleet

import (
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"heft/shared/wire"
)

// twoMeasuredWorkers is a fleet with workers a and b of model m on node
// n, each measured at 2,000 tok/s and 8 ms per token with 16 running;
// with, if given, changes each measurement before it is stored.
func twoMeasuredWorkers(t *testing.T, with ...func(*wire.Measurement)) (*harness, wire.Engine, wire.Engine) {
	h := newHarness(t)
	a, b := engine("a", "http://1:8000", "m"), engine("b", "http://2:8000", "m")
	h.connectOnce("n")
	h.put("n", a)
	h.put("n", b)
	for _, e := range []wire.Engine{a, b} {
		m := measured(e.CapacityKey, 2000, h.clk.now())
		m.DecodeTPSP50 = 125
		for _, f := range with {
			f(&m)
		}
		h.result("n", m)
	}
	h.clk.advance(time.Minute) // the pace windows that follow start after the bursts
	return h, a, b
}

// A worker that halves its speed while it serves at partial load keeps
// delivering what it is offered, but its step time at the same batch size
// doubles: after PaceReadings slow readings its weight counts half its
// measurement (source "rescaled") and a re-measurement is asked for; when
// its pace agrees again the measurement counts once more. A reference
// learned at one batch size interpolates to another with the burst's point.
func TestPaceRescales(t *testing.T) {
	h, a, _ := twoMeasuredWorkers(t)
	// Step time 6.58 ms + 0.0889 ms per running request (heft-sim's fast
	// worker: 150 tok/s alone, 2,000 with 16).
	step := func(batch float64) float64 { return 0.00658 + 0.0000889*batch }
	sec := 0
	reading := func(batch, factor float64) []*wire.ProbeRequest {
		sec += 5
		a.Pace = &wire.Pace{At: h.clk.now().Add(time.Duration(sec) * time.Second), WindowSeconds: 5,
			SecondsPerToken: factor * step(batch), Batch: batch, ThroughputTPS: batch / (factor * step(batch))}
		return requests(h.put("n", a), "a")
	}
	ratio := func() float64 { w := h.weights("m"); return w["a"] / w["b"] }
	for range 3 { // at full speed with 8 running: learned, nothing changes
		if r := reading(8, 1); len(r) != 0 {
			t.Fatalf("a reading at full speed re-measured: %+v", r)
		}
	}
	if got := h.worker("a").WeightSource; got != SourceMeasured || ratio() != 1 {
		t.Fatalf("at full speed: source %q, weight ratio %v", got, ratio())
	}
	// 20 % slower, once: within what one reading may stray by, nothing.
	if r := reading(8, 1.2); len(r) != 0 || ratio() != 1 {
		t.Fatalf("one reading 20 %% slow acted: %+v, ratio %v", r, ratio())
	}
	reading(8, 1)
	// Half speed: fewer requests leave per second, so more run (14). One
	// reading that slow rescales the weight at once, tentatively, and asks
	// for nothing; the next reading that agrees ends it at once.
	if r := reading(14, 2); len(r) != 0 || math.Abs(ratio()-0.5) > 0.01 || !h.worker("a").PaceTentative {
		t.Fatalf("one reading twice as slow: requests %+v, weight ratio %v, tentative %v; want a tentative rescale by 2 and no request",
			r, ratio(), h.worker("a").PaceTentative)
	}
	if r := reading(8, 1); len(r) != 0 || ratio() != 1 || h.worker("a").WeightSource != SourceMeasured {
		t.Fatalf("after an agreeing reading: requests %+v, weight ratio %v, source %q", r, ratio(), h.worker("a").WeightSource)
	}
	// Two slow readings in a row: the second confirms the rescale and asks
	// for a re-measurement.
	if r := reading(14, 2); len(r) != 0 || !h.worker("a").PaceTentative {
		t.Fatalf("the first slow reading again: %+v", r)
	}
	r := reading(14, 2)
	if len(r) != 1 || !strings.HasPrefix(r[0].Cause, CausePaceSlower+": 15.6 ms per token at 14.0 running per rank, 7.8 ms when measured") {
		t.Fatalf("after two slow readings: %+v", r)
	}
	w := h.worker("a")
	if w.WeightSource != SourceRescaled || math.Abs(w.PaceFactor-2) > 0.01 || math.Abs(ratio()-0.5) > 0.01 || w.Pace == nil || w.PaceTentative {
		t.Fatalf("rescaled: source %q factor %v tentative %v, weight ratio %v, pace %+v", w.WeightSource, w.PaceFactor, w.PaceTentative, ratio(), w.Pace)
	}
	// Back to full speed: a confirmed rescale takes two agreeing readings
	// to end.
	if reading(8, 1); h.worker("a").WeightSource != SourceRescaled {
		t.Fatalf("one agreeing reading ended a confirmed rescale")
	}
	if reading(8, 1); h.worker("a").WeightSource != SourceMeasured || ratio() != 1 {
		t.Fatalf("after the engine recovered: source %q, ratio %v", h.worker("a").WeightSource, ratio())
	}
	// With only the burst's point, a slow engine at a smaller batch is
	// still caught, conservatively (the reference is the burst's 8 ms).
	h2 := newHarness(t)
	c := engine("c", "http://3:8000", "m")
	h2.connectOnce("n")
	h2.put("n", c)
	m := measured("c", 2000, h2.clk.now())
	m.DecodeTPSP50 = 125
	h2.result("n", m)
	h2.clk.advance(time.Minute)
	for i := range 2 {
		c.Pace = &wire.Pace{At: h2.clk.now().Add(time.Duration(i+1) * time.Second), WindowSeconds: 5, SecondsPerToken: 2 * step(10), Batch: 10}
		h2.put("n", c)
	}
	if w := h2.worker("c"); w.WeightSource != SourceRescaled || math.Abs(w.PaceFactor-2*step(10)/0.008) > 1e-9 {
		t.Fatalf("burst point only: source %q factor %v, want %v", w.WeightSource, w.PaceFactor, 2*step(10)/0.008)
	}
}

// A change late in a window shows in its newest half first: a reading
// whose whole window is only 25 % slower but whose newest half (Recent) is
// twice as slow rescales tentatively by the half's ratio; the next reading
// slow as a whole confirms it. A far-slower half that its prompts filled,
// or one only 20 % slower, does nothing.
func TestPaceRecentHalf(t *testing.T) {
	h, a, _ := twoMeasuredWorkers(t, func(m *wire.Measurement) {
		m.Prefill = &wire.Prefill{ThroughputTPS: 10000, Requests: 4, PromptTokens: 8192}
	})
	sec := 0
	reading := func(spt float64, recent *wire.PaceSpan) []*wire.ProbeRequest {
		sec += 5
		a.Pace = &wire.Pace{At: h.clk.now().Add(time.Duration(sec) * time.Second), WindowSeconds: 10,
			SecondsPerToken: spt, Batch: 16, ThroughputTPS: 16 / spt, Recent: recent}
		return requests(h.put("n", a), "a")
	}
	ratio := func() float64 { w := h.weights("m"); return w["a"] / w["b"] }
	// The burst's point: 8 ms at 16 running.
	if reading(0.008, &wire.PaceSpan{WindowSeconds: 5, SecondsPerToken: 0.0096, Batch: 16}); ratio() != 1 {
		t.Fatalf("a half 20 %% slower acted: weight ratio %v", ratio())
	}
	// Prompts took 60 % of the half's time: it says too little.
	if reading(0.008, &wire.PaceSpan{WindowSeconds: 5, SecondsPerToken: 0.016, Batch: 16, PromptTPS: 6000}); ratio() != 1 {
		t.Fatalf("a half its prompts filled acted: weight ratio %v", ratio())
	}
	r := reading(0.010, &wire.PaceSpan{WindowSeconds: 5, SecondsPerToken: 0.016, Batch: 16})
	if w := h.worker("a"); len(r) != 0 || !w.PaceTentative || math.Abs(ratio()-0.5) > 0.01 {
		t.Fatalf("a window 25 %% slower with its newest half twice as slow: requests %+v, tentative %v, weight ratio %v; want a tentative rescale by 2",
			r, w.PaceTentative, ratio())
	}
	r = reading(0.016, &wire.PaceSpan{WindowSeconds: 5, SecondsPerToken: 0.016, Batch: 16})
	if w := h.worker("a"); len(r) != 1 || w.PaceTentative || w.WeightSource != SourceRescaled || math.Abs(ratio()-0.5) > 0.01 {
		t.Fatalf("the next reading slow as a whole: requests %+v, tentative %v, source %q, weight ratio %v; want it confirmed and a request",
			r, w.PaceTentative, w.WeightSource, ratio())
	}
}

// A span shorter than 5 s strays more from its neighbours, so it must be
// slower in proportion to count as a change on its own: the agent's
// sudden 2 s span 60 % slower does nothing, twice as slow rescales
// tentatively; a whole 2.5 s window 50 % slower does nothing where a 5 s
// one would.
func TestPaceShortSpans(t *testing.T) {
	h, a, _ := twoMeasuredWorkers(t) // the burst's point: 8 ms per token at 16 running
	sec := 0
	reading := func(secs, spt float64, recent *wire.PaceSpan) []*wire.ProbeRequest {
		sec += 5
		a.Pace = &wire.Pace{At: h.clk.now().Add(time.Duration(sec) * time.Second), WindowSeconds: secs,
			SecondsPerToken: spt, Batch: 16, ThroughputTPS: 16 / spt, Recent: recent}
		return requests(h.put("n", a), "a")
	}
	ratio := func() float64 { w := h.weights("m"); return w["a"] / w["b"] }
	if reading(7, 0.009, &wire.PaceSpan{WindowSeconds: 2, SecondsPerToken: 0.0128, Batch: 16}); ratio() != 1 {
		t.Fatalf("a 2 s span 60 %% slower acted: weight ratio %v", ratio())
	}
	if reading(2.5, 0.012, nil); ratio() != 1 {
		t.Fatalf("a 2.5 s window 50 %% slower acted: weight ratio %v", ratio())
	}
	reading(10, 0.008, nil)
	r := reading(7, 0.0103, &wire.PaceSpan{WindowSeconds: 2, SecondsPerToken: 0.016, Batch: 16})
	if w := h.worker("a"); len(r) != 0 || !w.PaceTentative || ratio() > 0.55 {
		t.Fatalf("a 2 s span twice as slow: requests %+v, tentative %v, weight ratio %v; want a tentative rescale by about 2",
			r, w.PaceTentative, ratio())
	}
	if reading(5, 0.008, nil); ratio() != 1 {
		t.Fatalf("an agreeing 5 s reading left the rescale: weight ratio %v", ratio())
	}
	if reading(5, 0.012, nil); !h.worker("a").PaceTentative {
		t.Fatalf("a 5 s window 50 %% slower did not rescale tentatively")
	}
}

// A window that straddles a slowdown is far slower as a whole but not by
// the whole slowdown: it averages its older half, at the old speed, with
// its newest half, at the new. Where the halves disagree by more than
// PaceTolerance the reading counts its newest half, so the weight moves
// all the way at once; halves that agree leave the whole window's ratio.
func TestPaceStraddlingWindow(t *testing.T) {
	h, a, _ := twoMeasuredWorkers(t) // the burst's point: 8 ms per token at 16 running
	sec := 0
	// reading sends a 10 s window of two 5 s halves at 16 running, the
	// older at olderSPT and the newest at newestSPT seconds per token.
	reading := func(olderSPT, newestSPT float64) []*wire.ProbeRequest {
		sec += 5
		const batch, half = 16.0, 5.0
		tokens := batch*half/olderSPT + batch*half/newestSPT
		spt := 2 * batch * half / tokens
		a.Pace = &wire.Pace{At: h.clk.now().Add(time.Duration(sec) * time.Second), WindowSeconds: 2 * half,
			SecondsPerToken: spt, Batch: batch, ThroughputTPS: batch / spt,
			Recent: &wire.PaceSpan{WindowSeconds: half, SecondsPerToken: newestSPT, Batch: batch}}
		return requests(h.put("n", a), "a")
	}
	factor := func() float64 { return h.worker("a").PaceFactor }
	// Older half at the measured speed, newest twice as slow: the whole
	// window reads 1.33 (far slower), the newest half 2.
	reading(0.008, 0.016)
	if w := h.worker("a"); !w.PaceTentative || math.Abs(factor()-2) > 1e-9 {
		t.Fatalf("a window straddling a halving: tentative %v, factor %v; want a tentative rescale by the newest half's 2", w.PaceTentative, factor())
	}
	// The next window straddles it too (older half 1.4 times as slow): it
	// confirms by its newest half, not by its whole window's 1.64.
	if r := reading(0.0112, 0.016); len(r) != 1 || h.worker("a").PaceTentative || math.Abs(factor()-2) > 1e-9 {
		t.Fatalf("the confirming reading: requests %+v, factor %v; want confirmed by the newest half's 2", r, factor())
	}
	// Halves that agree within PaceTolerance (2.1 and 1.9 times as slow)
	// are a steady engine: the whole window counts.
	reading(0.0168, 0.0152)
	whole := func(olderSPT, newestSPT float64) float64 { // the window's ratio to 8 ms
		return 2 * 16 * 5 / (16*5/olderSPT + 16*5/newestSPT) / 0.008
	}
	if want := whole(0.0168, 0.0152); math.Abs(factor()-want) > 1e-9 {
		t.Fatalf("halves that agree: factor %v, want the whole window's %v", factor(), want)
	}
	// And where the newest half is the faster one, the whole window counts.
	reading(0.016, 0.012)
	if want := whole(0.016, 0.012); math.Abs(factor()-want) > 1e-9 {
		t.Fatalf("a newest half faster than the older: factor %v, want the whole window's %v", factor(), want)
	}
}

// The re-measurement a slower pace asks for measures the engine only while
// it is idle (wire.ProbeRequest.IdleOnly): the pace already keeps the
// weight on what the engine delivers, rescaled or agreeing again, so
// draining a busy engine would take capacity from its users for nothing.
// Retries after a busy engine deferred it stay idle-only; once the
// scheduled re-measurement is due anyway, probe_busy governs again. Any
// other cause is never idle-only.
func TestPaceReMeasureOnlyWhileIdle(t *testing.T) {
	h, a, b := twoMeasuredWorkers(t)
	b.PID = 41
	h.put("n", b)
	var r []*wire.ProbeRequest
	for i := range 2 { // twice as slow as measured, at the burst's batch
		a.Pace = &wire.Pace{At: h.clk.now().Add(time.Duration(i+1) * 5 * time.Second), WindowSeconds: 5, SecondsPerToken: 0.016, Batch: 16}
		r = requests(h.put("n", a), "a")
	}
	if len(r) != 1 || !strings.HasPrefix(r[0].Cause, CausePaceSlower) || !r[0].IdleOnly {
		t.Fatalf("the pace's re-measurement: %+v, want one, idle-only, with cause %s", r, CausePaceSlower)
	}
	// Another cause is measured as probe_busy says (drain drains).
	b.PID = 97
	if r := requests(h.put("n", b), "b"); len(r) != 1 || !strings.HasPrefix(r[0].Cause, CauseEngineRestarted) || r[0].IdleOnly {
		t.Fatalf("restarted engine: %+v", r)
	}
	// An admin's "measure again" meanwhile is what probe_busy says, even
	// with the pace's idle-only request outstanding.
	acts, err := h.f.Probe("a")
	if r := requests(acts, "a"); err != nil || len(r) != 1 || r[0].IdleOnly {
		t.Fatalf("admin's probe: %+v, %v; want one that is not idle-only", r, err)
	}
	defer1 := func() {
		t.Helper()
		h.f.ProbeStatus("n", wire.ProbeStatus{RequestID: h.requestID("a"), CapacityKey: "a", State: wire.ProbeDeferredBusy, Message: "engine busy"})
	}
	defer1()
	if w := h.worker("a"); w.WeightSource != SourceRescaled || w.Weight == nil || *w.Weight <= 0 {
		t.Fatalf("deferred: source %q weight %v; the worker must stay routed at its rescaled weight", w.WeightSource, w.Weight)
	}
	h.clk.advance(h.f.cfg.BusyRetry)
	if r := requests(h.f.Tick(), "a"); len(r) != 1 || !r[0].IdleOnly || !strings.HasPrefix(r[0].Cause, CausePaceSlower) {
		t.Fatalf("retry after a busy engine: %+v, want idle-only again", r)
	}
	// The pace agrees again: the weight is the measurement's, and the
	// re-measurement still has no reason to drain.
	for i := range 2 {
		a.Pace = &wire.Pace{At: h.clk.now().Add(time.Duration(i+1) * 5 * time.Second), WindowSeconds: 5, SecondsPerToken: 0.008, Batch: 16}
		h.put("n", a)
	}
	defer1()
	h.clk.advance(2 * h.f.cfg.BusyRetry)
	if r := requests(h.f.Tick(), "a"); len(r) != 1 || !r[0].IdleOnly || h.worker("a").WeightSource != SourceMeasured {
		t.Fatalf("retry once the pace agrees: %+v, source %q", r, h.worker("a").WeightSource)
	}
	// Due anyway: the engine is measured as probe_busy says.
	defer1()
	h.clk.advance(h.f.cfg.RemeasureEvery)
	if r := requests(h.f.Tick(), "a"); len(r) != 1 || r[0].IdleOnly {
		t.Fatalf("retry once the measurement is due anyway: %+v, want probe_busy to govern", r)
	}
}

// A rescale survives a coordinator restart: the worker record keeps the
// pace reference, so the restarted fleet routes by the slower capacity at
// once and does not count the agent's last reading a second time. A
// damaged stored reference is ignored and learned again; the worker
// itself is restored.
func TestPaceSurvivesRestart(t *testing.T) {
	h, a, b := twoMeasuredWorkers(t)
	for i := range 2 { // twice as slow as measured, at the burst's batch
		a.Pace = &wire.Pace{At: h.clk.now().Add(time.Duration(i+1) * 5 * time.Second), WindowSeconds: 5, SecondsPerToken: 0.016, Batch: 16}
		h.put("n", a)
	}
	h.put("n", b) // a later snapshot: every record is written by now
	ratio := func(h *harness) float64 { w := h.weights("m"); return w["a"] / w["b"] }
	if got := h.worker("a"); got.WeightSource != SourceRescaled || math.Abs(ratio(h)-0.5) > 1e-9 {
		t.Fatalf("before the restart: source %q, weight ratio %v", got.WeightSource, ratio(h))
	}
	rec := h.st.st.Workers["a"].Pace
	if rec == nil || rec.Factor != 2 || len(rec.Points) != 1 {
		t.Fatalf("stored pace %+v, want the burst's point and factor 2", rec)
	}

	h2 := h.restart()
	h2.connectOnce("n")
	h2.put("n", a) // the agent's last reading again
	h2.put("n", b)
	if got := h2.worker("a"); got.WeightSource != SourceRescaled || math.Abs(got.PaceFactor-2) > 1e-9 || math.Abs(ratio(h2)-0.5) > 1e-9 {
		t.Fatalf("after the restart: source %q factor %v, weight ratio %v; want rescaled by 2, ratio 0.5", got.WeightSource, got.PaceFactor, ratio(h2))
	}
	// Two readings that agree again end the rescale, as before the restart.
	for i := range 2 {
		a.Pace = &wire.Pace{At: h2.clk.now().Add(time.Duration(20+i*5) * time.Second), WindowSeconds: 5, SecondsPerToken: 0.008, Batch: 16}
		h2.put("n", a)
	}
	if got := h2.worker("a"); got.WeightSource != SourceMeasured || ratio(h2) != 1 {
		t.Fatalf("after agreeing readings: source %q, ratio %v", got.WeightSource, ratio(h2))
	}

	// A tentative rescale survives a restart as tentative: the next
	// agreeing reading ends it.
	a.Pace = &wire.Pace{At: h2.clk.now().Add(40 * time.Second), WindowSeconds: 5, SecondsPerToken: 0.016, Batch: 16}
	h2.put("n", a)
	h2.put("n", b)
	if rec := h2.st.st.Workers["a"].Pace; rec == nil || !rec.Tentative || rec.Factor != 2 {
		t.Fatalf("stored tentative pace %+v", rec)
	}
	h4 := h2.restart()
	h4.connectOnce("n")
	h4.put("n", a)
	h4.put("n", b)
	if got := h4.worker("a"); got.WeightSource != SourceRescaled || !got.PaceTentative {
		t.Fatalf("tentative rescale after the restart: source %q, tentative %v", got.WeightSource, got.PaceTentative)
	}
	a.Pace = &wire.Pace{At: h4.clk.now().Add(45 * time.Second), WindowSeconds: 5, SecondsPerToken: 0.008, Batch: 16}
	if h4.put("n", a); h4.worker("a").WeightSource != SourceMeasured {
		t.Fatalf("one agreeing reading did not end a restored tentative rescale: source %q", h4.worker("a").WeightSource)
	}

	for name, damage := range map[string]func(*PaceRecord){
		"tentative unset":  func(r *PaceRecord) { r.Factor, r.Tentative = 0, true },
		"negative point":   func(r *PaceRecord) { r.Points = [][2]float64{{16, -0.008}} },
		"points unordered": func(r *PaceRecord) { r.Points = [][2]float64{{16, 0.008}, {8, 0.007}} },
		"factor below 1":   func(r *PaceRecord) { r.Factor = 0.5 },
		"learned too many": func(r *PaceRecord) { r.Learned = PaceLearn + 1 },
	} {
		rec := *h.st.st.Workers["a"].Pace
		rec.Points = slices.Clone(rec.Points)
		damage(&rec)
		st := newMemStore()
		st.st = h.st.st
		st.st.Workers = maps.Clone(h.st.st.Workers)
		r := st.st.Workers["a"]
		r.Pace = &rec
		st.st.Workers["a"] = r
		h3 := newHarnessWith(t, h.f.cfg, st, h.clk)
		h3.connectOnce("n")
		h3.engines = h.engines
		h3.put("n", b)
		if got := h3.worker("a"); got.ID != "a" || got.WeightSource != SourceMeasured || got.PaceFactor != 0 {
			t.Errorf("%s: worker %q source %q factor %v, want the worker restored with its measured weight", name, got.ID, got.WeightSource, got.PaceFactor)
		}
	}
}

// Prompts read while requests decode stretch the time between their tokens
// by the share of the engine's time they take, at its measured prefill
// rate: a reading counts its decode part, so a burst of long prompts on an
// engine at full speed is no slowdown, and a reading whose prompts took
// most of the window counts for nothing; a real slowdown among a few
// prompts is still caught, by its decode part.
func TestPaceDiscountsPrefill(t *testing.T) {
	h, a, b := twoMeasuredWorkers(t, func(m *wire.Measurement) {
		m.Prefill = &wire.Prefill{ThroughputTPS: 10000, PromptTokens: 32768, ExpectedPromptTokens: 32768, PromptLength: 8192,
			Requests: 4, Concurrency: 4, WallSeconds: 3.2768}
	})
	sec := 0
	readingOf := func(e *wire.Engine, spt, promptTPS float64) []*wire.ProbeRequest {
		sec += 5
		e.Pace = &wire.Pace{At: h.clk.now().Add(time.Duration(sec) * time.Second), WindowSeconds: 10,
			SecondsPerToken: spt, Batch: 16, ThroughputTPS: 16 / spt, PromptTPS: promptTPS}
		return requests(h.put("n", *e), e.CapacityKey)
	}
	reading := func(spt, promptTPS float64) []*wire.ProbeRequest { return readingOf(&a, spt, promptTPS) }
	// Prompts at 3,000 tok/s take 30 % of the engine: 11.4 ms per token
	// is 8.0 ms of decoding, no slowdown, however many such readings come.
	for i := range 4 {
		if r := reading(0.0114, 3000); len(r) != 0 || h.worker("a").WeightSource != SourceMeasured {
			t.Fatalf("reading %d with prompts in its steps re-measured %+v, source %q", i, r, h.worker("a").WeightSource)
		}
	}
	// The same readings from an engine that does not say what it read.
	reading(0.0114, 0)
	if r := reading(0.0114, 0); len(r) != 1 || h.worker("a").WeightSource != SourceRescaled {
		t.Fatalf("without the prompt rate, two readings 43 %% slow did not rescale: %+v", r)
	}
	reading(0.008, 0)
	reading(0.008, 0)
	if got := h.worker("a").WeightSource; got != SourceMeasured {
		t.Fatalf("after two agreeing readings: source %q", got)
	}
	// Prompts that took 60 % of the window: the reading counts for
	// nothing, not as slow, not as agreeing; the tentative rescale the
	// slow reading before it started stands.
	reading(0.016, 0)
	if r := reading(0.030, 6000); len(r) != 0 || !h.worker("a").PaceTentative {
		t.Fatalf("a prefill-bound reading counted: %+v, tentative %v", r, h.worker("a").PaceTentative)
	}
	// With the slow reading before the skipped one, two in a row.
	reading(0.016, 0)
	if w := h.worker("a"); w.WeightSource != SourceRescaled || math.Abs(w.PaceFactor-2) > 0.01 || w.PaceTentative {
		t.Fatalf("after a slow reading, a skipped one and a slow one: source %q, factor %v, tentative %v", w.WeightSource, w.PaceFactor, w.PaceTentative)
	}
	// A real slowdown with 5 % of prompts: 16.8 ms is 16.0 of decoding,
	// twice the reference.
	readingOf(&b, 0.0168, 500)
	r := readingOf(&b, 0.0168, 500)
	if len(r) != 1 || !strings.HasPrefix(r[0].Cause, CausePaceSlower+": 16.0 ms per token at 16.0 running per rank, 8.0 ms when measured") {
		t.Fatalf("a slowdown among few prompts: %+v", r)
	}
	if w := h.worker("b"); math.Abs(w.PaceFactor-2) > 0.01 {
		t.Fatalf("pace factor %v, want 2", w.PaceFactor)
	}
}

// A pace window that began before the measurement finished holds the
// probe's own burst: 16 running, then nothing, which Little's law reads as
// a small batch at the burst's step time, far slower than the reference at
// that batch. It is not counted; the same reading from a window that began
// after the burst is. (The demo's idle fleet was rescaled by such a
// window: 0.0178 s per token at 2.44 running, the burst ending 4 s into
// its 11 s window.)
func TestPaceWindowHoldingTheBurstIsIgnored(t *testing.T) {
	h := newHarness(t)
	a := engine("a", "http://1:8000", "m")
	h.admit("n", engine("b", "http://2:8000", "m"), 2000)
	h.connectOnce("n")
	h.put("n", a)
	m := measured("a", 2000, h.clk.now())
	m.DecodeTPSP50 = 125 // 8 ms per token at 16 running
	h.result("n", m)
	slow := func(at time.Time) {
		a.Pace = &wire.Pace{At: at, WindowSeconds: 11, SecondsPerToken: 0.016, Batch: 2.44, ThroughputTPS: 2.44 / 0.016}
		h.put("n", a)
	}
	slow(m.FinishedAt.Add(4 * time.Second))
	if w := h.worker("a"); w.WeightSource != SourceMeasured || w.PaceFactor != 0 {
		t.Fatalf("a window holding the burst: source %q factor %v, want the measurement", w.WeightSource, w.PaceFactor)
	}
	slow(m.FinishedAt.Add(12 * time.Second))
	if w := h.worker("a"); w.WeightSource != SourceRescaled || !w.PaceTentative {
		t.Fatalf("a window after the burst: source %q tentative %v, want a tentative rescale", w.WeightSource, w.PaceTentative)
	}
}

// Traffic in bursts: an engine at its measured speed that ran 12
// requests for 4 s of a 10 s window and nothing the rest reads the
// 12-request step between its tokens, while Little's law over the window
// gives 4.8 running. Against a reference learned at 2 running, that reads
// 35 % slower than it is, and a healthy worker lost weight. The reading's
// TokenBatch, the 12 its tokens saw, is what it is weighed at; a reading
// without one (an older agent, an engine whose histogram cannot say)
// keeps its window's mean.
func TestPaceBurstyTrafficIsWeighedAtItsTokensBatch(t *testing.T) {
	// A step that grows steeply with the batch (235 tok/s alone, the
	// measured 2,000 with 16): 7 ms at 12, 5.2 ms at 4.8 on the reference.
	step := func(batch float64) float64 { return 0.004 + 0.00025*batch }
	for _, tt := range []struct {
		name       string
		tokenBatch float64
		rescaled   bool
	}{
		{"weighed at its tokens' batch", 12, false},
		{"no TokenBatch: the window's mean", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, a, _ := twoMeasuredWorkers(t)
			sec := 0
			send := func(p wire.Pace) {
				sec += 5
				p.At, p.WindowSeconds = h.clk.now().Add(time.Duration(sec)*time.Second), 10
				a.Pace = &p
				h.put("n", a)
			}
			for range 2 { // steady light traffic teaches the reference its 2-running point
				send(wire.Pace{SecondsPerToken: step(2), Batch: 2, TokenBatch: 2, ThroughputTPS: 2 / step(2)})
			}
			for range 2 {
				send(wire.Pace{SecondsPerToken: step(12), Batch: 4.8, TokenBatch: tt.tokenBatch, ThroughputTPS: 4.8 / step(12)})
			}
			w := h.worker("a")
			if got := w.WeightSource == SourceRescaled; got != tt.rescaled {
				t.Fatalf("rescaled %v (factor %v), want %v", got, w.PaceFactor, tt.rescaled)
			}
		})
	}
}

// Numbers the wire lets through as finite but no engine gives must not
// make a pace point or ratio of +Inf, which no worker record can be saved
// with (JSON has no Inf).
func TestPaceRefusesNumbersNoEngineGives(t *testing.T) {
	var s paceState
	m := measured("k", 500, t0)
	m.DecodeTPSP50 = 5e-324 // 1/x is +Inf
	s.reset(&m)
	if _, err := json.Marshal(WorkerRecord{ID: "k", Node: "n", Pace: s.record()}); err != nil || len(s.points) != 0 {
		t.Fatalf("a burst point from decode_tps_p50 5e-324: points %v, record %v", s.points, err)
	}

	h, a, _ := twoMeasuredWorkers(t, func(m *wire.Measurement) { m.DecodeTPSP50 = 1e300 })
	a.Pace = &wire.Pace{At: h.clk.now(), WindowSeconds: 10, SecondsPerToken: 1e10, Batch: 16, ThroughputTPS: 1}
	h.put("n", a)
	h.f.mu.Lock()
	ratio, rec := h.f.workers["a"].pace.ratio, h.f.workers["a"].pace.record()
	h.f.mu.Unlock()
	if _, err := json.Marshal(WorkerRecord{ID: "a", Node: "n", Pace: rec}); err != nil || math.IsInf(ratio, 0) {
		t.Fatalf("a reading 1e10 s per token against 1e-300: ratio %v, record %v", ratio, err)
	}

}

// A reading dated far ahead of the coordinator's clock (the agent's clock
// ran ahead, then was set right) freezes nothing: the readings after it,
// dated earlier, still count, and rescale a worker that slowed down. The
// ahead-dated reading sent again with the next snapshot counts once.
func TestPaceReadingDatedAheadFreezesNothing(t *testing.T) {
	h, a, _ := twoMeasuredWorkers(t)
	slow := func(at time.Time) *wire.Pace {
		return &wire.Pace{At: at, WindowSeconds: 5, SecondsPerToken: 0.016, Batch: 16, ThroughputTPS: 1000}
	}
	a.Pace = slow(h.clk.now().Add(365 * 24 * time.Hour))
	h.put("n", a)
	if w := h.worker("a"); !w.PaceTentative {
		t.Fatalf("one reading twice as slow: tentative %v, want a tentative rescale", w.PaceTentative)
	}
	if r := requests(h.put("n", a), "a"); len(r) != 0 || !h.worker("a").PaceTentative {
		t.Fatalf("the same reading sent again counted a second time: requests %+v", r)
	}
	h.clk.advance(5 * time.Second)
	a.Pace = slow(h.clk.now()) // the agent's clock set right
	r := requests(h.put("n", a), "a")
	if w := h.worker("a"); len(r) != 1 || w.WeightSource != SourceRescaled || w.PaceTentative || math.Abs(w.PaceFactor-2) > 0.01 {
		t.Fatalf("a reading after one dated a year ahead: requests %d, source %q, tentative %v, factor %v; want a confirmed rescale by 2",
			len(r), w.WeightSource, w.PaceTentative, w.PaceFactor)
	}
}

// A late snapshot's older reading is not counted again: readings are
// ordered by their time while the last one is not dated ahead.
func TestPaceOlderReadingIsNotCounted(t *testing.T) {
	h, a, _ := twoMeasuredWorkers(t)
	slow := func(at time.Time) *wire.Pace {
		return &wire.Pace{At: at, WindowSeconds: 5, SecondsPerToken: 0.016, Batch: 16, ThroughputTPS: 1000}
	}
	h.clk.advance(10 * time.Second)
	a.Pace = slow(h.clk.now())
	h.put("n", a)
	if !h.worker("a").PaceTentative {
		t.Fatal("one reading twice as slow: want a tentative rescale")
	}
	a.Pace = slow(h.clk.now().Add(-5 * time.Second))
	if r := requests(h.put("n", a), "a"); len(r) != 0 || !h.worker("a").PaceTentative {
		t.Fatalf("an older reading arriving late counted: requests %+v, tentative %v", r, h.worker("a").PaceTentative)
	}
	h.clk.advance(5 * time.Second)
	a.Pace = slow(h.clk.now())
	if r := requests(h.put("n", a), "a"); len(r) != 1 {
		t.Fatalf("a newer reading: requests %d, want the rescale confirmed", len(r))
	}
}
