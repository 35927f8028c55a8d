package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	"heft/shared/view"
	"heft/shared/wire"
	"heft/sim"
)

// A vLLM DP4 deployment across two nodes (--data-parallel-size 4
// --data-parallel-size-local 2; the second node --headless
// --data-parallel-start-rank 2): each node's agent reads its own two
// ranks, and the coordinator joins them. The second node's rank 3 is
// starved, so both nodes' workers are held for the imbalance, each shows
// all four ranks as one complete set, and the dp_deployment finding names
// both nodes.
func TestMultiNodeDeploymentHeld(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := startCoordinator(t, filepath.Join(dir, "state"), "127.0.0.1:0")
	node := func(start int, headless bool, pools []int64, logPath string) sim.Config {
		return sim.Config{Flavor: sim.FlavorVLLM, Model: model, SingleTPS: 200, Batch16TPS: 1600, DP: 2, KVTokens: pools, LogPath: logPath,
			MultiNode: sim.MultiNode{Size: 4, StartRank: start, Address: "10.0.0.1", RPCPort: 13345, Headless: headless}}
	}
	headLog, tailLog := filepath.Join(dir, "head.log"), filepath.Join(dir, "tail.log")
	head := startSim(t, node(0, false, []int64{373696, 373552}, headLog), "127.0.0.1:0")
	tail := startSim(t, node(2, true, []int64{373600, 46704}, tailLog), "127.0.0.1:0")
	startAgent(t, c, "gpu-a", "vllm", head.URL(), headLog)
	startAgent(t, c, "gpu-b", "vllm", tail.URL(), tailLog)

	ws := c.waitFor(t, "both nodes measured and held", measuredWithin, func(ws []view.Worker) bool {
		for _, n := range []string{"gpu-a", "gpu-b"} {
			if w, ok := byNode(ws, n); !ok || w.State != view.StateHeld {
				return false
			}
		}
		return true
	})
	for _, n := range []string{"gpu-a", "gpu-b"} {
		w, _ := byNode(ws, n)
		x, ok := hasWarning(w, wire.CodeDPPoolImbalance)
		if !ok || x.Severity != wire.SeverityCritical || !strings.Contains(x.Message, "rank 3 only 46,704") {
			t.Fatalf("%s: %+v", n, w.Warnings)
		}
		if len(w.Ranks) != 4 || w.Complete == nil || !*w.Complete || w.ExpectedRanks == nil || *w.ExpectedRanks != 4 {
			t.Fatalf("%s: ranks %+v complete %v expected %v", n, w.Ranks, w.Complete, w.ExpectedRanks)
		}
		d, ok := hasWarning(w, wire.CodeDeployment)
		if !ok || !strings.Contains(d.Message, "gpu-a (DP 0, 1), gpu-b (DP 2, 3)") {
			t.Fatalf("%s: %+v", n, w.Warnings)
		}
		if _, ok := hasWarning(w, wire.CodePoolsIncomplete); ok {
			t.Fatalf("%s: pools_incomplete once every node reported: %+v", n, w.Warnings)
		}
		if _, ok := hasWarning(w, wire.CodeDeploymentMismatch); ok {
			t.Fatalf("%s: a mismatch with both nodes reporting: %+v", n, w.Warnings)
		}
	}
}
