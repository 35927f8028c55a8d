package store

import (
	"sync"
	"testing"
	"time"

	"heft/coordinator/fleet"
	"heft/shared/wire"
)

// countingBolt is the real store, counting the worker records written.
type countingBolt struct {
	*Bolt
	mu     sync.Mutex
	writes map[string]int
}

func (c *countingBolt) SaveWorker(r fleet.WorkerRecord) error {
	c.mu.Lock()
	c.writes[r.ID]++
	c.mu.Unlock()
	return c.Bolt.SaveWorker(r)
}

// take returns the writes counted since the last take.
func (c *countingBolt) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.writes
	c.writes = map[string]int{}
	return w
}

// A reconnect writes each of the node's worker records once as its agent
// goes (it is gone from then: a restart keeps counting its grace) and
// once at the first snapshot back (it is not), with nothing in between
// and nothing on the snapshots after; a newer connection that supersedes
// the node's current one writes none, and neither does a coordinator
// started again over records that already say the agent went. Counted against the bbolt store,
// whose records say so.
func TestReconnectWritesEachRecordOncePerChange(t *testing.T) {
	st := &countingBolt{Bolt: open(t, t.TempDir()), writes: map[string]int{}}
	t.Cleanup(func() { _ = st.Close() })
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	step := func() { mu.Lock(); now = now.Add(10 * time.Second); mu.Unlock() }
	cfg := fleet.DefaultConfig()
	cfg.Probation, cfg.MaxNodeShare = 0, 0
	f, err := fleet.New(cfg, st, clock, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	engines := []wire.Engine{
		{Kind: wire.EngineVLLM, URL: "http://10.0.0.1:8000", Model: "m", Ready: true, CapacityKey: "k1", PID: 41,
			LaunchArgs: []string{"--port=8000"}, Ranks: []wire.Rank{{DPRank: 0, KVTokens: 9000}}},
		{Kind: wire.EngineVLLM, URL: "http://10.0.0.1:8001", Model: "m", Ready: true, CapacityKey: "k2", PID: 42,
			LaunchArgs: []string{"--port=8001"}, Ranks: []wire.Rank{{DPRank: 0, KVTokens: 9000}}},
	}
	load := 0
	snap := func() []fleet.Action {
		step()
		load++ // a real agent's load moves with every snapshot; it is not a record's
		es := make([]wire.Engine, len(engines))
		for i, e := range engines {
			e.Load = wire.Load{Known: true, Running: load % 7, KVUsage: float64(load%10) / 10}
			es[i] = e
		}
		return f.Snapshot("n", wire.Snapshot{Node: "n", At: clock(), Engines: es})
	}
	f.Connect("n", 1, wire.Hello{Node: "n", AgentVersion: "test"})
	for _, a := range snap() {
		if r, ok := a.Message.(*wire.ProbeRequest); ok {
			m := wire.Measurement{CapacityKey: r.CapacityKey, Node: "n", EngineKind: wire.EngineVLLM, Model: "m",
				ThroughputTPS: 900, WarmupTPS: 850, OutputTokens: 2048, ExpectedTokens: 2048, WallSeconds: 2048.0 / 900,
				Requests: 16, Concurrency: 16, TokensPerReq: 128, Complete: true, Trigger: r.Reason,
				StartedAt: clock().Add(-3 * time.Second), FinishedAt: clock()}
			if _, err := f.ProbeResult("n", wire.ProbeResult{RequestID: r.RequestID, Measurement: m}); err != nil {
				t.Fatal(err)
			}
		}
	}
	snap()
	st.take()

	expect := func(when string, want int, gone bool) {
		t.Helper()
		got := st.take()
		state, err := st.Load()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range engines {
			if got[e.CapacityKey] != want {
				t.Errorf("%s: %s written %d times, want %d", when, e.CapacityKey, got[e.CapacityKey], want)
			}
			if r, ok := state.Workers[e.CapacityKey]; !ok || (r.AgentGone != nil) != gone || r.URL != e.URL || len(r.Ranks) != 1 {
				t.Errorf("%s: stored record of %s %+v (present %v), want agent gone %v", when, e.CapacityKey, r, ok, gone)
			}
		}
	}
	f.Disconnect("n", 1)
	expect("the agent gone", 1, true)
	step()
	f.Connect("n", 2, wire.Hello{Node: "n", AgentVersion: "test"})
	expect("its hello", 0, true)
	snap()
	expect("its first snapshot back", 1, false)
	for range 3 {
		snap()
	}
	expect("the snapshots after", 0, false)
	// A restarted agent's connection comes before the old one ends.
	f.Connect("n", 3, wire.Hello{Node: "n", AgentVersion: "test"})
	f.Disconnect("n", 2)
	snap()
	expect("a superseding connection", 0, false)

	// A coordinator that stops says its agents go; started again over the
	// same file it has nothing to write until they are back.
	f.Disconnect("n", 3)
	expect("the coordinator stopping", 1, true)
	step()
	if f, err = fleet.New(cfg, st, clock, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	expect("the coordinator starting again", 0, true)
	f.Connect("n", 1, wire.Hello{Node: "n", AgentVersion: "test"})
	snap()
	snap()
	expect("the agent back after the restart", 1, false)
}
