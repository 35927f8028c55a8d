package fleet

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"heft/shared/wire"
)

// A node cycling through new capacity keys holds at most MaxKeysPerNode
// of them, here and in the store; the least recently listed go first.
func TestCapacityKeysPerNodeAreBounded(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	const rounds = 5
	for r := range rounds {
		var list []wire.Engine
		for i := range wire.MaxEngines {
			list = append(list, engine(fmt.Sprintf("k%d-%d", r, i), fmt.Sprintf("http://%d:8000", i), "m"))
		}
		h.engines["n"] = list
		acts := h.snapshot("n")
		for _, req := range requests(acts, "") {
			m := measured(req.CapacityKey, 1000, h.clk.now())
			if _, err := h.f.ProbeResult("n", wire.ProbeResult{RequestID: req.RequestID, Measurement: m}); err != nil {
				t.Fatal(err)
			}
		}
		h.clk.advance(time.Second)
	}
	h.f.Tick() // writes the deletions
	st, stored := h.f.Stats(), h.st.state()
	t.Logf("%d keys listed over %d snapshots: %d remembered, %d evicted, %d stored measurements, %d stored worker records",
		rounds*wire.MaxEngines, rounds, st.CapacityKeys, st.KeysEvicted, len(stored.Latest), len(stored.Workers))
	if st.CapacityKeys > h.f.cfg.MaxKeysPerNode || len(stored.Latest) > h.f.cfg.MaxKeysPerNode || len(stored.Workers) > h.f.cfg.MaxKeysPerNode {
		t.Errorf("remembered %d keys, stored %d measurements and %d records; bound %d", st.CapacityKeys, len(stored.Latest), len(stored.Workers), h.f.cfg.MaxKeysPerNode)
	}
	if want := rounds*wire.MaxEngines - h.f.cfg.MaxKeysPerNode; st.KeysEvicted != want {
		t.Errorf("evicted %d, want %d", st.KeysEvicted, want)
	}
	// The keys listed now survived.
	for _, e := range h.engines["n"] {
		if _, ok := h.f.Worker(e.CapacityKey); !ok {
			t.Errorf("listed key %s was forgotten", e.CapacityKey)
		}
	}
}

// Measurements of a key no agent lists any more are dropped once too old
// to spare a burst; a listed key keeps its own.
func TestUnlistedMeasurementsAreDropped(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("old", "http://1:8000", "m"), 1000)
	h.put("n", engine("new", "http://1:8000", "m")) // restarted with other arguments
	h.result("n", measured("new", 1000, h.clk.now()))
	if _, ok := h.st.state().Latest["old"]; !ok {
		t.Fatal("the switched-away key's measurement should stay cached for a while")
	}
	h.clk.advance(h.f.cfg.CacheTTL + time.Minute)
	h.f.Tick()
	st := h.st.state()
	if _, ok := st.Latest["old"]; ok {
		t.Error("the unlisted key's measurement is still stored after cache_ttl")
	}
	if _, ok := st.Latest["new"]; !ok {
		t.Error("the listed key's measurement was dropped")
	}
	if s := h.f.Stats(); s.CapacityKeys != 1 {
		t.Errorf("%d keys remembered, want 1", s.CapacityKeys)
	}
}

// A node that said hello and left, with no workers, is not remembered:
// thirty thousand made-up names leave nothing behind.
func TestNodesWithoutWorkersAreForgotten(t *testing.T) {
	h := newHarness(t)
	for i := range 3000 {
		node := fmt.Sprintf("ghost-%d", i)
		h.connect(node)
		h.f.Snapshot(node, wire.Snapshot{Node: node})
		h.disconnect(node)
	}
	if n := h.f.Stats().Nodes; n != 0 {
		t.Errorf("%d nodes remembered after 3000 empty hellos", n)
	}
}

// An engine that does not say which GPUs it uses is shown with the host's
// GPUs only when it is the host's one engine.
func TestEngineGPUsAreTheEnginesOwn(t *testing.T) {
	gpus := []wire.GPU{{Index: 0, UUID: "GPU-0"}, {Index: 1, UUID: "GPU-1"}}
	h := newHarness(t)
	h.connect("one")
	h.f.Snapshot("one", wire.Snapshot{Node: "one", GPUs: gpus, Engines: []wire.Engine{engine("solo", "http://1:8000", "m")}})
	if g := h.worker("solo").GPUs; len(g) != 2 {
		t.Errorf("the host's one engine shows %d GPUs, want 2", len(g))
	}
	h.connect("many")
	e1, e2, e3 := engine("a", "http://1:8000", "m"), engine("b", "http://2:8000", "m"), engine("c", "http://3:8000", "m")
	e3.GPUUUIDs = []string{"GPU-1"}
	h.f.Snapshot("many", wire.Snapshot{Node: "many", GPUs: gpus, Engines: []wire.Engine{e1, e2, e3}})
	if ga, gb, gc := h.worker("a").GPUs, h.worker("b").GPUs, h.worker("c").GPUs; len(ga) != 0 || len(gb) != 0 || len(gc) != 1 || gc[0].UUID != "GPU-1" {
		t.Errorf("GPUs shown: a %v, b %v, c %v; want none, none, GPU-1", ga, gb, gc)
	}
}

// Since returns the whole fleet first, then only what changed: one node's
// heartbeat is that node's workers, a worker that left is a removal.
func TestSinceReturnsOnlyChanges(t *testing.T) {
	h := newHarness(t)
	h.admit("a", engine("a1", "http://1:8000", "m"), 1000)
	h.admit("b", engine("b1", "http://2:8000", "m"), 1000)
	d := h.f.Since(0)
	if !d.Full || len(d.Workers) != 2 {
		t.Fatalf("Since(0): full %v, %d workers", d.Full, len(d.Workers))
	}
	if again := h.f.Since(d.Seq); again.Full || len(again.Workers) != 0 || len(again.Removed) != 0 {
		t.Errorf("nothing changed, got %+v", again)
	}
	h.snapshot("a") // a heartbeat
	d2 := h.f.Since(d.Seq)
	if d2.Full || len(d2.Workers) != 1 || d2.Workers[0].ID != "a1" {
		t.Errorf("after a's heartbeat: full %v, workers %d", d2.Full, len(d2.Workers))
	}
	h.engines["b"] = nil
	h.snapshot("b")
	d3 := h.f.Since(d2.Seq)
	if len(d3.Removed) != 1 || d3.Removed[0] != "b1" {
		t.Errorf("after b's engine left: %+v", d3)
	}
	// A subscriber far behind gets the whole fleet again.
	for i := range maxTombs + 2 {
		e := engine(fmt.Sprintf("churn-%d", i), "http://9:8000", "m")
		h.engines["b"] = []wire.Engine{e}
		h.snapshot("b")
	}
	if d4 := h.f.Since(d3.Seq); !d4.Full {
		t.Error("a subscriber behind the tombstones did not get the whole fleet")
	}
}

// TestGPUListsAreBoundedInViews is issue 25's 60 MB view: a node whose
// engines each list all 64 GPUs (some twice, and GPUs it does not report)
// costs the views about one copy of its GPUs, not one per engine.
func TestGPUListsAreBoundedInViews(t *testing.T) {
	h := newHarness(t)
	var gpus []wire.GPU
	var uuids []string
	for i := range wire.MaxGPUs {
		g := wire.GPU{Index: i, UUID: fmt.Sprintf("GPU-%02d", i), Name: "NVIDIA H100"}
		for p := range 3 {
			g.Processes = append(g.Processes, wire.GPUProcess{PID: 100 + p, Name: strings.Repeat("x", 4000)})
		}
		gpus = append(gpus, g)
		uuids = append(uuids, g.UUID, g.UUID, fmt.Sprintf("GPU-unreported-%02d", i))
	}
	h.gpus["big"] = gpus
	h.connect("big")
	for i := range wire.MaxEngines {
		e := engine(fmt.Sprintf("e%02d", i), fmt.Sprintf("http://9:%d", 8000+i), "m")
		e.GPUUUIDs = uuids
		h.engines["big"] = append(h.engines["big"], e)
	}
	h.snapshot("big")
	snap, _ := json.Marshal(gpus)
	view, _ := json.Marshal(h.f.Workers())
	t.Logf("%d engines each listing %d GPU UUIDs (%d GPUs reported, %.2f MB of GPU facts): the workers' view is %.2f MB",
		wire.MaxEngines, len(uuids), len(gpus), float64(len(snap))/1e6, float64(len(view))/1e6)
	if len(view) > 3*len(snap) {
		t.Errorf("the view is %d bytes for %d bytes of GPU facts: GPUs are repeated per engine", len(view), len(snap))
	}
	h.f.mu.Lock()
	got := h.f.workers["e05"].eng.GPUUUIDs
	h.f.mu.Unlock()
	if len(got) != 64 || got[0] != "GPU-00" || got[1] != "GPU-01" {
		t.Errorf("an engine keeps %d gpu_uuids (%v...), want the 64 its node reports, each once", len(got), got[:min(3, len(got))])
	}
	ws := h.f.Workers()
	if len(ws) != wire.MaxEngines {
		t.Fatalf("%d workers, want %d", len(ws), wire.MaxEngines)
	}
	for _, w := range ws {
		if len(w.GPUs) != 64 {
			t.Fatalf("%s shows %d GPUs, want 64", w.ID, len(w.GPUs))
		}
	}
	if w := h.worker("e00"); len(w.GPUs[0].Processes) != 3 {
		t.Errorf("the first worker shows %d processes of GPU-00, want 3", len(w.GPUs[0].Processes))
	}

	// A GPU the snapshot lists twice is one GPU.
	h.gpus["twice"] = append(slices.Clone(gpus[:2]), gpus[:2]...)
	e := engine("t", "http://8:8000", "m")
	e.GPUUUIDs = []string{"GPU-00", "GPU-01"}
	h.connect("twice")
	h.put("twice", e)
	if n := len(h.worker("t").GPUs); n != 2 {
		t.Errorf("a snapshot listing 2 GPUs twice shows %d GPUs, want 2", n)
	}
}
