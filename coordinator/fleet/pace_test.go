package fleet

import (
	"math"
	"strings"
	"testing"
	"time"

	"heft/shared/wire"
)

// A worker that halves its speed while it serves at partial load keeps
// delivering what it is offered, but its step time at the same batch size
// doubles: after PaceReadings slow readings its weight counts half its
// measurement (source "rescaled") and a re-measurement is asked for; when
// its pace agrees again the measurement counts once more. A reference
// learned at one batch size interpolates to another with the burst's point.
func TestPaceRescales(t *testing.T) {
	h := newHarness(t)
	a, b := engine("a", "http://1:8000", "m"), engine("b", "http://2:8000", "m")
	h.connectOnce("n")
	h.put("n", a)
	h.put("n", b)
	for _, e := range []wire.Engine{a, b} {
		m := measured(e.CapacityKey, 2000, h.clk.now())
		m.DecodeTPSP50 = 125 // 8 ms per token with 16 running
		h.result("n", m)
	}
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
	// Half speed: fewer requests leave per second, so more run (14).
	if r := reading(14, 2); len(r) != 0 || ratio() != 1 {
		t.Fatalf("one slow reading acted: %+v, ratio %v", r, ratio())
	}
	r := reading(14, 2)
	if len(r) != 1 || !strings.HasPrefix(r[0].Cause, CausePaceSlower+": 15.6 ms per token at 14.0 running per rank, 7.8 ms when measured") {
		t.Fatalf("after two slow readings: %+v", r)
	}
	w := h.worker("a")
	if w.WeightSource != SourceRescaled || math.Abs(w.PaceFactor-2) > 0.01 || math.Abs(ratio()-0.5) > 0.01 || w.Pace == nil {
		t.Fatalf("rescaled: source %q factor %v, weight ratio %v, pace %+v", w.WeightSource, w.PaceFactor, ratio(), w.Pace)
	}
	// Back to full speed: two agreeing readings end the rescale.
	reading(8, 1)
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
	for i := range 2 {
		c.Pace = &wire.Pace{At: h2.clk.now().Add(time.Duration(i+1) * time.Second), WindowSeconds: 5, SecondsPerToken: 2 * step(10), Batch: 10}
		h2.put("n", c)
	}
	if w := h2.worker("c"); w.WeightSource != SourceRescaled || math.Abs(w.PaceFactor-2*step(10)/0.008) > 1e-9 {
		t.Fatalf("burst point only: source %q factor %v, want %v", w.WeightSource, w.PaceFactor, 2*step(10)/0.008)
	}
}
