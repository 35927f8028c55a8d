package e2e

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"heft/coordinator/config"
	"heft/coordinator/fleet"
	"heft/shared/view"
	"heft/shared/wire"
	"heft/sim"
)

// An impostor node names a vLLM DP4 deployment's address and claims its
// tail's ranks (DP 2–3, rank 3 starved) before the real nodes report.
// With [[dp_deployment]] binding the address to gpu-a and gpu-b, the real
// head and tail join each other only, whatever came first: both are
// admitted on four even ranks, and their warning says the impostor is
// not bound. (Without the binding the impostor's claim is believed and
// its starved rank holds the head: coordinator/fleet
// TestDeploymentUnboundImpostorFirstIsBelieved.)
func TestBoundDeploymentKeepsAnImpostorOut(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := startCoordinatorWith(t, filepath.Join(dir, "state"), "127.0.0.1:0", func(cfg *config.Config) {
		cfg.DPDeployments = []fleet.DeploymentBinding{{Address: "10.0.0.1:13345", Nodes: []string{"gpu-a", "gpu-b"}}}
	})
	node := func(start int, headless bool, pools []int64, logPath string) sim.Config {
		return sim.Config{Flavor: sim.FlavorVLLM, Model: model, SingleTPS: 200, Batch16TPS: 1600, DP: 2, KVTokens: pools, LogPath: logPath,
			MultiNode: sim.MultiNode{Size: 4, StartRank: start, Address: "10.0.0.1", RPCPort: 13345, Headless: headless}}
	}
	evilLog := filepath.Join(dir, "evil.log")
	evil := startSim(t, node(2, true, []int64{373600, 46704}, evilLog), "127.0.0.1:0")
	startAgent(t, c, "evil", "vllm", evil.URL(), evilLog)
	c.waitFor(t, "the impostor listed", measuredWithin, func(ws []view.Worker) bool {
		w, ok := byNode(ws, "evil")
		return ok && len(w.Ranks) == 2
	})

	headLog, tailLog := filepath.Join(dir, "head.log"), filepath.Join(dir, "tail.log")
	head := startSim(t, node(0, false, []int64{373696, 373552}, headLog), "127.0.0.1:0")
	tail := startSim(t, node(2, true, []int64{373600, 373600}, tailLog), "127.0.0.1:0")
	startAgent(t, c, "gpu-a", "vllm", head.URL(), headLog)
	startAgent(t, c, "gpu-b", "vllm", tail.URL(), tailLog)

	ws := c.waitFor(t, "head and tail measured and admitted", measuredWithin, func(ws []view.Worker) bool {
		for _, n := range []string{"gpu-a", "gpu-b"} {
			if w, ok := byNode(ws, n); !ok || w.State != view.StateAdmitted || w.Throughput == nil || len(w.Ranks) != 4 {
				return false
			}
		}
		return true
	})
	for _, n := range []string{"gpu-a", "gpu-b"} {
		w, _ := byNode(ws, n)
		if _, ok := hasWarning(w, wire.CodeDPPoolImbalance); ok {
			t.Errorf("%s: %+v", n, w.Warnings)
		}
		if d := w.Deployment; d == nil || !slices.Equal(d.Nodes, []string{"gpu-a", "gpu-b"}) {
			t.Errorf("%s: deployment %+v", n, w.Deployment)
		}
		if m, ok := hasWarning(w, wire.CodeDeploymentMismatch); !ok || !strings.Contains(m.Message, "evil is not bound to 10.0.0.1:13345") {
			t.Errorf("%s: no warning that evil is not bound: %+v", n, w.Warnings)
		}
	}
	if w, _ := byNode(ws, "evil"); w.Deployment == nil || !slices.Equal(w.Deployment.Nodes, []string{"evil"}) {
		t.Errorf("evil: deployment %+v", w.Deployment)
	}
}
