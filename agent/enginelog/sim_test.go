package enginelog_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"heft/agent/enginelog"
	"heft/shared/wire"
	"heft/sim"
)

// TestSimLogsGiveBackTheirPools starts heft-sim with known pools and reads
// its start-up log back: what the simulator was told is what the agent sees.
func TestSimLogsGiveBackTheirPools(t *testing.T) {
	for _, tc := range []struct {
		flavor string
		pools  []int64
	}{
		{"vllm", []int64{379088}},
		{"vllm", []int64{373696, 373552}},
		{"vllm", []int64{50000, 48000, 47000, 12000}},
		{"sglang", []int64{24094}},
		{"sglang", []int64{24094, 2925}},
		{"sglang", []int64{24094, 24037, 24000, 23990}},
	} {
		t.Run(tc.flavor+"-"+string(rune('0'+len(tc.pools))), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "engine.log")
			s, err := sim.Start(sim.Config{Flavor: tc.flavor, SingleTPS: 100, Batch16TPS: 800, DP: len(tc.pools),
				KVTokens: tc.pools, LogPath: path}, "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			facts, err := enginelog.Read(tc.flavor, f)
			if err != nil {
				t.Fatalf("read the sim's log: %v", err)
			}
			var want []wire.Rank
			for i, p := range tc.pools {
				want = append(want, wire.Rank{DPRank: i, KVTokens: p})
			}
			if !slices.Equal(facts.Ranks, want) {
				t.Errorf("pools = %v, want %v", facts.Ranks, want)
			}
			if facts.Model != sim.DefaultModel || !facts.Ready {
				t.Errorf("model %q ready %v", facts.Model, facts.Ready)
			}
			if facts.LaunchArgs["heft_sim_single_tps"] == "" {
				t.Errorf("launch args lack the calibration: %v", facts.LaunchArgs)
			}
		})
	}
}
