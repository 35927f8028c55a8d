package fleet

import (
	"slices"
	"strings"
	"testing"
	"time"

	"heft/shared/view"
	"heft/shared/wire"
)

// node runs DP ranks start.. of a four-rank vLLM deployment whose head is
// 10.0.0.1:13345, as its agent reports them (its own ranks only).
func dpNode(key, url string, start int, headless bool, pools ...int64) wire.Engine {
	e := engine(key, url, "m", pools...)
	for i := range e.Ranks {
		e.Ranks[i].DPRank += start
	}
	e.LaunchArgs = []string{"data_parallel_address=10.0.0.1", "data_parallel_rpc_port=13345", "data_parallel_size=4",
		"data_parallel_size_local=2", "max_num_seqs=64"}
	if start > 0 {
		e.LaunchArgs = append(e.LaunchArgs, "data_parallel_start_rank=2")
	}
	if headless {
		e.LaunchArgs = append(e.LaunchArgs, "headless=true")
	}
	complete := false
	e.ExpectedRanks, e.Complete = 4, &complete
	for dp := range 4 {
		if dp < start || dp >= start+2 {
			e.MissingRanks = append(e.MissingRanks, dp)
		}
	}
	return e
}

// Two nodes of one vLLM DP4 deployment (--data-parallel-size 4
// --data-parallel-size-local 2): each agent sees two ranks, the
// coordinator judges four. Alone, the head node's worker says which ranks
// no node has reported; once both report, the starved rank on the second
// node holds both workers, and the view shows the whole set.
func TestDeploymentJoinedAcrossNodes(t *testing.T) {
	h := newHarness(t)
	h.connect("gpu-a")
	h.put("gpu-a", dpNode("head", "http://10.0.0.1:8000", 0, false, 373696, 373552))
	h.result("gpu-a", measured("head", 500, h.clk.now()))
	w := h.worker("head")
	if w.State != view.StateAdmitted || w.Complete == nil || *w.Complete || !slices.Equal(w.MissingRanks, []int{2, 3}) {
		t.Fatalf("head alone: state %s complete %v missing %v warnings %+v", w.State, w.Complete, w.MissingRanks, w.Warnings)
	}
	x, ok := warning(w, wire.CodeDeploymentMismatch)
	if !ok || !strings.Contains(x.Message, "DP 2, 3 have not yet been reported") || !strings.Contains(x.Message, "gpu-a (DP 0, 1)") {
		t.Fatalf("missing node: %+v", w.Warnings)
	}

	// Past the grace the warning says the node has not reported.
	h.clk.advance(DeploymentGrace + time.Minute)
	h.snapshot("gpu-a")
	if x, ok := warning(h.worker("head"), wire.CodeDeploymentMismatch); !ok || !strings.Contains(x.Message, "not in the 2m0s since the first node reported") {
		t.Fatalf("past the grace: %+v", x)
	}

	h.connect("gpu-b")
	h.put("gpu-b", dpNode("tail", "http://10.0.0.2:8000", 2, true, 373600, 46704))
	h.result("gpu-b", measured("tail", 500, h.clk.now()))
	for _, id := range []string{"head", "tail"} {
		w := h.worker(id)
		if w.State != view.StateHeld {
			t.Fatalf("%s: %s, want held; warnings %+v", id, w.State, w.Warnings)
		}
		x, ok := warning(w, wire.CodeDPPoolImbalance)
		if !ok || x.Severity != wire.SeverityCritical || !strings.Contains(x.Message, "rank 3 only 46,704") {
			t.Fatalf("%s: %+v", id, w.Warnings)
		}
		if len(w.Ranks) != 4 || w.Complete == nil || !*w.Complete || *w.ExpectedRanks != 4 || w.MaxContextTokens == nil || *w.MaxContextTokens != 46704 {
			t.Fatalf("%s: ranks %+v complete %v max context %v", id, w.Ranks, w.Complete, w.MaxContextTokens)
		}
		d, ok := warning(w, wire.CodeDeployment)
		if !ok || !strings.Contains(d.Message, "gpu-a (DP 0, 1), gpu-b (DP 2, 3)") {
			t.Fatalf("%s: %+v", id, w.Warnings)
		}
		if _, ok := warning(w, wire.CodeDeploymentMismatch); ok {
			t.Fatalf("%s: mismatch with both nodes in: %+v", id, w.Warnings)
		}
		// The view says which deployment, and this node's part of it, so
		// the dashboard can show one group spanning the nodes.
		start := map[string]int{"head": 0, "tail": 2}[id]
		if d := w.Deployment; d == nil || d.Address != "10.0.0.1:13345" || d.Size != 4 || d.StartRank != start || d.LocalRanks != 2 ||
			!slices.Equal(d.Nodes, []string{"gpu-a", "gpu-b"}) {
			t.Fatalf("%s: deployment %+v", id, w.Deployment)
		}
	}
}

// Nodes that disagree on the deployment's size are not joined, and the
// warning names them.
func TestDeploymentNodesDisagree(t *testing.T) {
	h := newHarness(t)
	h.connect("gpu-a")
	h.put("gpu-a", dpNode("head", "http://10.0.0.1:8000", 0, false, 9000, 9000))
	b := dpNode("tail", "http://10.0.0.2:8000", 2, true, 9000, 9000)
	b.LaunchArgs = slices.DeleteFunc(b.LaunchArgs, func(a string) bool { return strings.HasPrefix(a, "data_parallel_size=") })
	b.LaunchArgs = append(b.LaunchArgs, "data_parallel_size=8")
	h.connect("gpu-b")
	h.put("gpu-b", b)
	w := h.worker("tail")
	x, ok := warning(w, wire.CodeDeploymentMismatch)
	if !ok || !strings.Contains(x.Message, "data_parallel_size=") || !strings.Contains(x.Message, "gpu-a") || len(w.Ranks) != 2 {
		t.Fatalf("%+v ranks %+v", w.Warnings, w.Ranks)
	}
}

// A single-node engine is untouched: no deployment finding.
func TestSingleNodeIsNoDeployment(t *testing.T) {
	if _, ok := spanOf(engine("x", "http://1:8000", "m", 9000, 9000)); ok {
		t.Fatal("a plain engine read as a deployment")
	}
	h := newHarness(t)
	h.connect("gpu-a")
	h.put("gpu-a", engine("x", "http://1:8000", "m", 9000, 9000))
	if d := h.worker("x").Deployment; d != nil {
		t.Fatalf("deployment %+v", d)
	}
	e := engine("x", "http://1:8000", "m", 9000)
	e.LaunchArgs = []string{"dist_init_addr=10.0.0.1:5000", "nnodes=2", "node_rank=1", "data_parallel_size=4"}
	s, ok := spanOf(e)
	if !ok || s.start != 2 || s.local != 2 {
		t.Fatalf("sglang node rank 1 of 2: %+v %v", s, ok)
	}
}
