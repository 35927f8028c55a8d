package agent

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"heft/agent/collect"
	"heft/agent/engine"
	"heft/agent/probe"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

func busyLoad(running ...int) wire.Load {
	l := wire.Load{Known: true, Waiting: 3}
	for i, r := range running {
		l.Ranks = append(l.Ranks, wire.RankLoad{DPRank: i, Running: r})
		l.Running += r
	}
	return l
}

// A window of saturation (every rank at the burst's per-rank load, work
// waiting) is a capacity reading; anything else starts over.
func TestPassiveReadings(t *testing.T) {
	p := &passive{window: 30 * time.Second, perRank: 16, ranks: 2}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

	// 1,800 tok/s with both ranks full; one rank short at 10 s starts over.
	gen := 0.0
	for s := 0; s <= 10; s += 5 {
		load := busyLoad(16, 16)
		if s == 10 {
			load = busyLoad(16, 8)
		}
		if r := p.add(at(s), engine.Counters{Generated: gen, Load: load}); r != nil {
			t.Fatalf("reading at %d s: %+v", s, r)
		}
		gen += 5 * 1800
	}
	var got *wire.Passive
	for s := 15; s <= 45; s += 5 {
		got = p.add(at(s), engine.Counters{Generated: gen, Load: busyLoad(16, 17)})
		if got != nil && s != 45 {
			t.Fatalf("reading after %d s of a 30 s window: %+v", s-15, got)
		}
		gen += 5 * 1800
	}
	if got == nil || got.ThroughputTPS != 1800 || got.WindowSeconds != 30 || got.Concurrency != 33 || got.Spread != 0 || !got.At.Equal(at(45)) {
		t.Fatalf("reading %+v, want 1800 tok/s over 30 s at 33 running", got)
	}

	// No work waiting: not saturated, no reading; the last one is kept.
	if r := p.add(at(50), engine.Counters{Generated: gen, Load: wire.Load{Known: true, Ranks: busyLoad(16, 16).Ranks}}); r != nil || p.latest != got {
		t.Errorf("unsaturated sample gave %+v", r)
	}
}

// A counter that moves as tokens are made and stands still for 2 s while
// the gauges read saturated (vLLM's stats after every request was aborted
// at once) is no capacity: the window starts over, and none ends on a
// still sample. A counter that moves only as requests finish (llama.cpp)
// may stand still in a saturated window.
func TestPassiveStillCounter(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	run := func(live bool, gen func(s int) float64, upTo int) (readings []*wire.Passive) {
		p := &passive{window: 30 * time.Second, perRank: 16, ranks: 1}
		for s := 0; s <= upTo; s++ {
			if r := p.add(at(s), engine.Counters{Generated: gen(s), GeneratedLive: live, Load: busyLoad(20)}); r != nil {
				readings = append(readings, r)
			}
		}
		return readings
	}
	// 1,800 tok/s, but the counter stands still from 10 s to 13 s: the
	// engine was idle, its gauges stale.
	stalled := func(s int) float64 {
		switch {
		case s <= 10:
			return float64(s) * 1800
		case s <= 13:
			return 10 * 1800
		}
		return float64(s-3) * 1800
	}
	got := run(true, stalled, 45)
	if len(got) != 1 || got[0].ThroughputTPS != 1800 || !got[0].At.Equal(at(43)) {
		t.Errorf("live counter: readings %+v, want one of 1,800 tok/s, its window from 13 s to 43 s", got)
	}
	// The same counter standing still at the end of the window: no reading
	// ends on it.
	tail := func(s int) float64 { return float64(min(s, 29)) * 1800 }
	if got := run(true, tail, 31); len(got) != 0 {
		t.Errorf("live counter still at the window's end: readings %+v, want none", got)
	}
	// A counter of finished requests moves in jumps: 9,000 tokens every
	// 5 s is 1,800 tok/s, and its still seconds are no stall.
	jumps := func(s int) float64 { return float64(s/5*5) * 1800 }
	if got := run(false, jumps, 30); len(got) != 1 || got[0].ThroughputTPS != 1800 {
		t.Errorf("finish counter: readings %+v, want one of 1,800 tok/s", got)
	}
}

// users sends n streamed requests of 5,000 tokens of model test/model to
// s; they run until the test ends or leave is called, when every client
// goes at once.
func users(t *testing.T, s *sim.Server, n int) (leave func()) {
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	leave = func() { cancel(); wg.Wait() }
	t.Cleanup(leave)
	body := []byte(`{"model":"test/model","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5000,"ignore_eos":true}`)
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/chat/completions", bytes.NewReader(body))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body) // until they leave
				resp.Body.Close()
			}
		})
	}
	return leave
}

// The whole agent: an engine kept saturated by its users (every rank at
// the burst's per-rank load, more waiting) gets a passive reading in its
// snapshots, with no burst sent.
func TestPassiveReadingInSnapshots(t *testing.T) {
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorSGLang, Model: "test/model", SingleTPS: 200, Batch16TPS: 1600, DP: 2, MaxRunning: 4}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	fc, _ := startAgentOn(t, s, wire.EngineSGLang, nil, withPassiveWindow(500*time.Millisecond))

	users(t, s, 12) // 4 running per rank, 4 waiting
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		e := fc.Next(t, wire.TypeSnapshot).Snapshot.Engines[0]
		if p := e.Passive; p != nil {
			t.Logf("passive: %.0f tok/s over %.2f s at %d running", p.ThroughputTPS, p.WindowSeconds, p.Concurrency)
			if p.ThroughputTPS <= 0 || p.Concurrency < 8 || p.WindowSeconds < 0.5 {
				t.Fatalf("passive %+v", p)
			}
			return
		}
	}
	t.Fatal("no passive reading within a minute of saturation")
}

// vLLM keeps its stats when every request is aborted at once (vllm issues
// #22545 and #29928; heft-sim's StaleGaugesOnAbort): its gauges go on
// showing a saturated engine that makes no token. The agent takes no
// passive reading from that; its reading from the real saturation stands.
func TestPassiveStaleGauges(t *testing.T) {
	cfg := sim.Config{Model: "test/model", SingleTPS: 200, Batch16TPS: 1600, MaxRunning: 4}
	cfg.Faults.StaleGaugesOnAbort = true
	s, err := sim.Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	const staleAfter = time.Second
	fc, _ := startAgentOn(t, s, wire.EngineVLLM, nil, withPassiveWindow(500*time.Millisecond), withStaleAfter(staleAfter))

	leave := users(t, s, 8) // 4 running, 4 waiting
	var saturated *wire.Passive
	busy := time.Now()
	for deadline := time.Now().Add(time.Minute); (saturated == nil || time.Since(busy) < 3*staleAfter) && time.Now().Before(deadline); {
		e := fc.Next(t, wire.TypeSnapshot).Snapshot.Engines[0]
		if e.Load.StaleSeconds > 0 { // the gauges hold 4 and 4 all along; the counters move
			t.Fatalf("a saturated engine's load called stale: %+v", e.Load)
		}
		saturated = cmp.Or(saturated, e.Passive)
	}
	if saturated == nil || saturated.ThroughputTPS <= 0 {
		t.Fatalf("no passive reading within a minute of saturation: %+v", saturated)
	}
	leave()
	testutil.Eventually(t, "the aborted requests to leave the engine", 10*time.Second, func() bool { r, w := s.InFlight(); return r+w == 0 })
	aborted := time.Now()
	var stale wire.Load
	for time.Since(aborted) < 4*staleAfter || stale.StaleSeconds == 0 {
		if time.Since(aborted) > 20*staleAfter {
			t.Fatalf("the stale load never called stale in snapshots; last %+v", stale)
		}
		e := fc.Next(t, wire.TypeSnapshot).Snapshot.Engines[0]
		if p := e.Passive; p != nil && p.At.After(aborted) {
			t.Fatalf("a passive reading after every request was aborted: %.0f tok/s over %.1f s at %d running (load %+v)",
				p.ThroughputTPS, p.WindowSeconds, p.Concurrency, e.Load)
		}
		if e.Load.StaleSeconds > 0 {
			stale = e.Load
		}
	}
	if stale.Running == 0 || stale.StaleSeconds < staleAfter.Seconds() {
		t.Errorf("snapshots called %+v stale, want the aborted requests, still for %v or more", stale, staleAfter)
	}
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	gauges, err := engine.ParseMetrics(wire.EngineVLLM, resp.Body)
	resp.Body.Close()
	// All eight where they were aborted within one step; fewer where a
	// loaded machine spread the aborts over several.
	if err != nil || gauges.Load.Running == 0 {
		t.Errorf("the gauges read %+v (%v), want aborted requests still on them", gauges.Load, err)
	}
	// One request moves the engine: its load is news again.
	one, err := http.Post(s.URL()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"test/model","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, one.Body)
	one.Body.Close()
	testutil.Eventually(t, "a snapshot whose load is not called stale", 30*time.Second, func() bool {
		return fc.Next(t, wire.TypeSnapshot).Snapshot.Engines[0].Load.StaleSeconds == 0
	})
}

// The agent wires the stale-load watch into its probes: a scheduled probe
// of a vLLM whose users were all aborted at once, its gauges still showing
// them, measures once they and its counters have stood still for
// probe.StaleLoadAfter, where it used to defer for as long as nobody sent
// the engine a request.
func TestScheduledProbeOfStaleLoad(t *testing.T) {
	t.Parallel()
	cfg := sim.Config{Model: "test/model", SingleTPS: 200, Batch16TPS: 1600}
	cfg.Faults.StaleGaugesOnAbort = true
	s, err := sim.Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	fc, eng := startAgentOn(t, s, wire.EngineVLLM, nil)

	leave := users(t, s, 6)
	for fc.Next(t, wire.TypeSnapshot).Snapshot.Engines[0].Load.Running != 6 {
		// until the gauges show all six
	}
	leave()
	testutil.Eventually(t, "the aborted requests to leave the engine", 10*time.Second, func() bool { r, w := s.InFlight(); return r+w == 0 })
	start := time.Now()
	fc.Send(t, &wire.ProbeRequest{RequestID: "r1", CapacityKey: eng.CapacityKey, Reason: wire.ReasonScheduled})
	res := fc.NextWithin(t, wire.TypeProbeResult, probe.StaleLoadAfter+time.Minute).ProbeResult
	m := res.Measurement
	if !m.Valid() || m.LoadBefore.Running == 0 || m.LoadBefore.StaleSeconds < probe.StaleLoadAfter.Seconds() ||
		!strings.Contains(strings.Join(m.Problems, "; "), "stood still") {
		t.Fatalf("after %v: valid %v, load before %+v, problems %q (result %+v)", time.Since(start).Round(time.Second), m.Valid(), m.LoadBefore, m.Problems, res)
	}
}

// A busy load is called stale only once it and the live counters have
// stood still together; any move, an idle read, or counters that move
// only as requests finish start over.
func TestStillLoad(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	busy := wire.Load{Known: true, Running: 6, KVUsage: 0.4}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	read := func(gen, prompt float64, l wire.Load) engine.Counters {
		return engine.Counters{Generated: gen, PromptComputed: prompt, GeneratedLive: true, Load: l}
	}
	var w probe.StillLoad
	steps := []struct {
		name string
		s    int
		c    engine.Counters
		want time.Duration
	}{
		{"first read", 0, read(100, 50, busy), 0},
		{"still", 10, read(100, 50, busy), 10 * time.Second},
		{"still longer", 31, read(100, 50, busy), 31 * time.Second},
		{"a token", 32, read(101, 50, busy), 0},
		{"still again", 40, read(101, 50, busy), 8 * time.Second},
		{"a prompt token", 41, read(101, 51, busy), 0},
		{"still again", 45, read(101, 51, busy), 4 * time.Second},
		{"the load moves", 46, read(101, 51, wire.Load{Known: true, Running: 5, KVUsage: 0.4}), 0},
		{"its KV usage moves", 47, read(101, 51, wire.Load{Known: true, Running: 5, KVUsage: 0.3}), 0},
		{"still again", 50, read(101, 51, wire.Load{Known: true, Running: 5, KVUsage: 0.3}), 3 * time.Second},
		{"idle", 51, read(101, 51, wire.Load{Known: true}), 0},
		{"busy after idle", 52, read(101, 51, busy), 0},
		{"still", 60, read(101, 51, busy), 8 * time.Second},
		{"finish counter", 61, engine.Counters{Generated: 101, PromptComputed: 51, Load: busy}, 0},
		{"live again", 62, read(101, 51, busy), 0},
		{"still", 63, read(101, 51, busy), time.Second},
	}
	for _, st := range steps {
		if got := stillFor(&w, at(st.s), st.c); got != st.want {
			t.Errorf("at %ds (%s): still %v, want %v", st.s, st.name, got, st.want)
		}
	}
}

// passiveSnapshot is a snapshot of idle engines by capacity key ("": an
// engine the agent could not reach, so no key).
func passiveSnapshot(keys ...string) *wire.Snapshot {
	s := &wire.Snapshot{}
	for _, k := range keys {
		s.Engines = append(s.Engines, wire.Engine{CapacityKey: k, Load: wire.Load{Known: true}})
	}
	return s
}

// agePassive makes every tracker's key last seen d earlier.
func agePassive(h *Handler, d time.Duration) {
	for _, p := range h.passive {
		p.seen = p.seen.Add(-d)
	}
}

// An engine that crash-loops with changing arguments gets a new capacity
// key at every start: the passive and pace trackers of keys no snapshot
// carries any more are forgotten (at most maxPassiveKeys, and none unseen
// for passiveForget), while the steady engine beside it keeps its own.
// They were kept for good, one pair per key ever seen.
func TestPassiveTrackersOfGoneKeysAreForgotten(t *testing.T) {
	h := &Handler{col: &collect.Collector{}}
	for _, every := range []time.Duration{time.Second, 30 * time.Second} {
		for i := range 1000 {
			h.passiveReadings(context.Background(), passiveSnapshot("steady", fmt.Sprintf("loop-%v-%d", every, i)))
			if len(h.passive) > maxPassiveKeys || len(h.paces) != len(h.passive) {
				t.Fatalf("a new key every %v, start %d: %d passive and %d pace trackers, want at most %d each",
					every, i, len(h.passive), len(h.paces), maxPassiveKeys)
			}
			if h.passive["steady"] == nil || h.passive[fmt.Sprintf("loop-%v-%d", every, i)] == nil {
				t.Fatalf("a new key every %v, start %d: a tracker of a key in the snapshot was forgotten", every, i)
			}
			agePassive(h, every)
		}
	}
	// A new key every 30 s: the time bound bites before the count.
	if want := int(passiveForget/(30*time.Second)) + 2; len(h.passive) > want {
		t.Fatalf("a new key every 30 s: %d trackers, want at most %d", len(h.passive), want)
	}
	agePassive(h, passiveForget)
	h.passiveReadings(context.Background(), passiveSnapshot("steady"))
	if len(h.passive) != 1 || len(h.paces) != 1 || h.passive["steady"] == nil || h.paces["steady"] == nil {
		t.Fatalf("after the loop stopped: %d passive and %d pace trackers, want the steady engine's alone", len(h.passive), len(h.paces))
	}
	// More engines in one snapshot than the bound: none of theirs goes.
	many := make([]string, maxPassiveKeys+6)
	for i := range many {
		many[i] = fmt.Sprintf("engine-%d", i)
	}
	agePassive(h, time.Second)
	h.passiveReadings(context.Background(), passiveSnapshot(many...))
	if len(h.passive) != len(many) || len(h.paces) != len(many) || h.passive["steady"] != nil {
		t.Fatalf("%d engines in one snapshot: %d passive and %d pace trackers, want theirs alone", len(many), len(h.passive), len(h.paces))
	}
}

// An engine unreachable for a moment reads no capacity key: its trackers
// stay, with the pace window that runs and the readings it gives, and so
// they do while another engine crash-loops beside it.
func TestPassiveTrackersKeptThroughABriefGap(t *testing.T) {
	h := &Handler{col: &collect.Collector{}}
	h.passiveReadings(context.Background(), passiveSnapshot("k"))
	p, pc := h.passive["k"], h.paces["k"]
	if p == nil || pc == nil {
		t.Fatal("no trackers for the engine's key")
	}
	start := paceSample{at: time.Now(), gen: 1234, itlN: 500}
	pc.start = start // a pace window runs
	pc.latest = &wire.Pace{WindowSeconds: 10}
	p.latest = &wire.Passive{ThroughputTPS: 1800}
	for i := range 64 { // 5 min 20 s unreachable, while 32 keys come and go
		agePassive(h, 5*time.Second)
		h.passiveReadings(context.Background(), passiveSnapshot("", fmt.Sprintf("loop-%d", i/2)))
	}
	if h.passive["k"] != p || h.paces["k"] != pc || pc.start != start {
		t.Fatal("the trackers of an engine unreachable for a few minutes were forgotten")
	}
	s := passiveSnapshot("k")
	h.passiveReadings(context.Background(), s) // its counters are not read: the window stays as it was
	if e := s.Engines[0]; e.Pace == nil || e.Pace.WindowSeconds != 10 || e.Passive == nil || e.Passive.ThroughputTPS != 1800 || pc.start != start {
		t.Fatalf("back after the gap: pace %+v, passive %+v; want the readings from before it, and the window", e.Pace, e.Passive)
	}
}

// twoRanks is one reading of a two-rank engine whose generated-tokens
// counter is labelled by rank: rank 0 has made r0 tokens, rank 1 r1 (< 0:
// its series is missing from the page), each rank running 20 with work
// waiting.
func twoRanks(r0, r1 float64) engine.Counters {
	c := engine.Counters{Generated: r0, GeneratedLive: true, Ranks: map[int]float64{0: r0}, Load: busyLoad(20)}
	if r1 >= 0 {
		c.Generated += r1
		c.Ranks[1] = r1
		c.Load = busyLoad(20, 20)
	}
	return c
}

// A counter summed over ranks is one counter only while the same ranks
// make it: a rank whose series is missing from one read (where nothing
// else says how many ranks the engine has, the load then reads one rank,
// saturated) and back at the next adds all its tokens since it started
// to the window. Before, a window that started on the short read counted
// them as made within it: 1,800 tok/s read as 35,000. Now a window starts
// over where the counter's ranks change.
func TestPassiveCounterRanksChange(t *testing.T) {
	p := &passive{window: 30 * time.Second, perRank: 16, ranks: 1}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	// 900 tok/s per rank; rank 1 had made 1,000,000 tokens before.
	var got []*wire.Passive
	for s := 0; s <= 50; s++ {
		r1 := 1e6 + 900*float64(s)
		if s == 6 {
			r1 = -1
		}
		if r := p.add(at(s), twoRanks(900*float64(s), r1)); r != nil {
			got = append(got, r)
		}
	}
	if len(got) == 0 {
		t.Fatal("no reading from 44 s of saturation")
	}
	for _, r := range got {
		if math.Abs(r.ThroughputTPS-1800) > 1e-6 {
			t.Errorf("reading %+v, want 1,800 tok/s", r)
		}
	}
}
