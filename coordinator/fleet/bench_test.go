package fleet

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/shared/wire"
)

// bigFleet restores 10,000 admitted workers (1,000 nodes × 10 engines,
// 10 models, 50 measurements of history each) from a store.
func bigFleet(b *testing.B) (*Fleet, *clock) {
	b.Helper()
	st := newMemStore()
	clk := &clock{t: t0}
	for n := range 1000 {
		node := fmt.Sprintf("node-%04d", n)
		for e := range 10 {
			id := fmt.Sprintf("%s/vllm/model-%d/%d", node, e, e)
			st.st.Workers[id] = WorkerRecord{ID: id, Node: node, Model: fmt.Sprintf("model-%d", e), Engine: wire.EngineVLLM,
				URL: fmt.Sprintf("http://10.0.%d.%d:%d", n/256, n%256, 8000+e), Ranks: []wire.Rank{{DPRank: 0, KVTokens: 20000}, {DPRank: 1, KVTokens: 19000}},
				FirstSeen: t0, LastSeen: t0}
			var hist []wire.Measurement
			for i := range 50 {
				hist = append(hist, measured(id, float64(300+(n*7+e*13+i)%900), t0.Add(-time.Duration(50-i)*time.Hour)))
			}
			st.st.History[id] = hist
			st.st.Latest[id] = hist[49]
		}
	}
	f, err := New(DefaultConfig(), st, clk.now, hclog.NewNullLogger())
	if err != nil {
		b.Fatal(err)
	}
	if n := len(f.Workers()); n != 10000 {
		b.Fatalf("%d workers", n)
	}
	if wt, _ := f.Weights("model-3"); len(wt.Workers) != 1000 {
		b.Fatalf("model-3 has %d weighted workers", len(wt.Workers))
	}
	return f, clk
}

func BenchmarkRecomputeWeights10k(b *testing.B) {
	f, _ := bigFleet(b)
	b.ReportAllocs()
	for b.Loop() {
		f.RecomputeWeights()
	}
}

func BenchmarkWorkers10k(b *testing.B) {
	f, _ := bigFleet(b)
	b.ReportAllocs()
	for b.Loop() {
		if len(f.Workers()) != 10000 {
			b.Fatal("lost workers")
		}
	}
}

// BenchmarkSnapshot10k times one node's heartbeat in a fleet of 10,000:
// it should cost the node's workers, not the fleet's.
func BenchmarkSnapshot10k(b *testing.B) {
	f, _ := bigFleet(b)
	var s wire.Snapshot
	s.Node = "node-0042"
	for e := range 10 {
		s.Engines = append(s.Engines, wire.Engine{Kind: wire.EngineVLLM, URL: fmt.Sprintf("http://10.0.0.42:%d", 8000+e), Model: fmt.Sprintf("model-%d", e),
			Ready: true, CapacityKey: fmt.Sprintf("node-0042/vllm/model-%d/%d", e, e),
			Ranks: []wire.Rank{{DPRank: 0, KVTokens: 20000}, {DPRank: 1, KVTokens: 19000}}})
	}
	f.Connect("node-0042", 1, wire.Hello{Node: "node-0042"})
	b.ReportAllocs()
	for b.Loop() {
		f.Snapshot("node-0042", s)
	}
}

// BenchmarkNewWorker10k times the first snapshot of a new node's engine,
// not measured yet, in a fleet of 10,000 (1,000 workers in its model): it
// should cost the new worker, not its model, or admitting a fleet costs
// the square of its size.
func BenchmarkNewWorker10k(b *testing.B) {
	f, _ := bigFleet(b)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		node := fmt.Sprintf("new-%06d", i)
		f.Connect(node, 1, wire.Hello{Node: node})
		f.Snapshot(node, wire.Snapshot{Node: node, Engines: []wire.Engine{{Kind: wire.EngineVLLM, Model: "model-3", Ready: true,
			URL: fmt.Sprintf("http://10.1.%d.%d:8000", i/250%250, i%250+1), CapacityKey: node + "/vllm/model-3"}}})
	}
}

// BenchmarkTickIdle10k times a Tick with nothing due.
func BenchmarkTickIdle10k(b *testing.B) {
	f, clk := bigFleet(b)
	for n := range 1000 {
		node := fmt.Sprintf("node-%04d", n)
		f.Connect(node, 1, wire.Hello{Node: node})
	}
	f.Tick()
	clk.advance(time.Second)
	b.ReportAllocs()
	for b.Loop() {
		f.Tick()
	}
}

func BenchmarkReevaluate10k(b *testing.B) {
	f, _ := bigFleet(b)
	b.ReportAllocs()
	for b.Loop() {
		f.Reevaluate()
	}
}

// A page of 100 workers, or one node's workers, renders only those: the
// cost a script or gateway pays instead of the whole fleet's.
func BenchmarkFindPage10k(b *testing.B) {
	f, _ := bigFleet(b)
	b.ReportAllocs()
	for b.Loop() {
		if ws, more := f.Find(Query{Limit: 100, After: "node-0500"}); len(ws) != 100 || !more {
			b.Fatal("short page")
		}
	}
}

func BenchmarkFindNode10k(b *testing.B) {
	f, _ := bigFleet(b)
	b.ReportAllocs()
	for b.Loop() {
		if ws, _ := f.Find(Query{Node: "node-0500"}); len(ws) != 10 {
			b.Fatal("lost workers")
		}
	}
}

// BenchmarkBuryAmong10kTombs times one forgotten key's tomb among 10,000
// others (1,000 nodes): a sweep that forgets many workers buries each
// under the fleet's lock.
func BenchmarkBuryAmong10kTombs(b *testing.B) {
	clk := &clock{t: t0}
	f, err := New(DefaultConfig(), newMemStore(), clk.now, hclog.NewNullLogger())
	if err != nil {
		b.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range 10000 {
		f.bury(fmt.Sprintf("key-%05d", i), fmt.Sprintf("node-%04d", i%1000), t0)
	}
	if len(f.keyTombs) != 10000 {
		b.Fatalf("%d tombs", len(f.keyTombs))
	}
	b.ReportAllocs()
	for b.Loop() {
		f.bury("key-x", "node-0001", t0)
		f.unbury("key-x")
		f.tombWrites = f.tombWrites[:0]
	}
}

// BenchmarkBuryAmongFullTombs times one forgotten key's tomb once
// MaxKeyTombs (50,000) are held, over 1,000 nodes: each new tomb evicts
// the oldest, which a scan of them all used to find.
func BenchmarkBuryAmongFullTombs(b *testing.B) {
	f, next := fullTombs(b)
	b.ReportAllocs()
	for b.Loop() {
		next()
	}
	if len(f.keyTombs) != f.cfg.MaxKeyTombs {
		b.Fatalf("%d tombs after the loop, want %d", len(f.keyTombs), f.cfg.MaxKeyTombs)
	}
}

// BenchmarkSweepFullTombs times the minute's sweep of 50,000 tombs with
// none past KeyTombTTL.
func BenchmarkSweepFullTombs(b *testing.B) {
	f, _ := fullTombs(b)
	b.ReportAllocs()
	for b.Loop() {
		f.sweepTombs(t0.Add(time.Hour))
	}
	if len(f.keyTombs) != f.cfg.MaxKeyTombs {
		b.Fatalf("%d tombs after the sweeps, want %d", len(f.keyTombs), f.cfg.MaxKeyTombs)
	}
}

// fullTombs is a fleet holding MaxKeyTombs tombs over 1,000 nodes, its
// lock held until the benchmark ends, and a function that buries one
// more, a millisecond after the last.
func fullTombs(b *testing.B) (*Fleet, func()) {
	b.Helper()
	f, err := New(DefaultConfig(), newMemStore(), (&clock{t: t0}).now, hclog.NewNullLogger())
	if err != nil {
		b.Fatal(err)
	}
	f.mu.Lock()
	b.Cleanup(f.mu.Unlock)
	i := 0
	next := func() {
		i++
		f.bury(fmt.Sprintf("key-%07d", i), fmt.Sprintf("node-%04d", i%1000), t0.Add(time.Duration(i)*time.Millisecond))
		f.tombWrites = f.tombWrites[:0]
	}
	for range f.cfg.MaxKeyTombs {
		next()
	}
	if len(f.keyTombs) != f.cfg.MaxKeyTombs {
		b.Fatalf("%d tombs, want %d", len(f.keyTombs), f.cfg.MaxKeyTombs)
	}
	return f, next
}
