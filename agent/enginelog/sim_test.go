package enginelog_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
			facts, err := enginelog.Read(gram(t, tc.flavor), f)
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

// heft-sim prints each naming an engine has used (sim/naming.go), and the
// log reader reads each as the engine meant it.
func TestSimLogNamings(t *testing.T) {
	r := func(pairs ...int64) []wire.Rank {
		var out []wire.Rank
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, wire.Rank{DPRank: int(pairs[i]), KVTokens: pairs[i+1]})
		}
		return out
	}
	tests := []struct {
		name     string
		cfg      sim.Config
		ranks    []wire.Rank
		expected int
		complete bool
		servers  int
		contains string
	}{
		{"vllm EngineCore_<n>", sim.Config{Flavor: "vllm", DP: 2, KVTokens: []int64{9000, 8000}, LogNaming: sim.NamingEngineCoreN},
			r(0, 9000, 1, 8000), 2, true, 0, "(EngineCore_1 pid="},
		{"sglang DP attention", sim.Config{Flavor: "sglang", DP: 4, KVTokens: []int64{7000}, LogNaming: sim.NamingDPAttention},
			r(0, 7000, 1, 7000, 2, 7000, 3, 7000), 4, true, 0, "enable_dp_attention=True"},
		{"sglang router workers", sim.Config{Flavor: "sglang", DP: 2, KVTokens: []int64{7000, 5000}, LogNaming: sim.NamingRouter},
			nil, 0, false, 2, "sglang_router.launch_server"},
		{"vllm second node", sim.Config{Flavor: "vllm", DP: 2, KVTokens: []int64{9000, 1000},
			MultiNode: sim.MultiNode{Size: 4, StartRank: 2, Address: "10.0.0.1", RPCPort: 13345, Headless: true}},
			r(2, 9000, 3, 1000), 4, false, 0, "'data_parallel_start_rank': 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.SingleTPS, tc.cfg.Batch16TPS = 100, 800
			tc.cfg.LogPath = filepath.Join(t.TempDir(), "engine.log")
			s, err := sim.Start(tc.cfg, "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			text, err := os.ReadFile(tc.cfg.LogPath)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(text), tc.contains) {
				t.Fatalf("log lacks %q:\n%s", tc.contains, text)
			}
			f, err := enginelog.Read(gram(t, tc.cfg.Flavor), strings.NewReader(string(text)))
			if tc.servers > 0 {
				if !errors.Is(err, enginelog.ErrSeveralServers) || f.Servers != tc.servers || len(f.Ranks) != 0 || f.Complete {
					t.Fatalf("router: err %v facts %+v", err, f)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(f.Ranks, tc.ranks) || f.ExpectedRanks != tc.expected || f.Complete != tc.complete {
				t.Fatalf("ranks %v expected %d complete %v; notes %q", f.Ranks, f.ExpectedRanks, f.Complete, f.Notes)
			}
		})
	}
}
