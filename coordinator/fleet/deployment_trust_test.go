package fleet

import (
	"slices"
	"strings"
	"testing"
	"time"

	"heft/shared/view"
	"heft/shared/wire"
)

// honestDeployment brings up the two nodes of deployment_test.go's vLLM
// DP4 deployment, both measured: gpu-a runs the head (DP 0-1), gpu-b the
// tail (DP 2-3) with the given pools.
func honestDeployment(t *testing.T, tail ...int64) *harness {
	h := newHarness(t)
	h.connect("gpu-a")
	h.put("gpu-a", dpNode("head", "http://10.0.0.1:8000", 0, false, 373696, 373552))
	h.result("gpu-a", measured("head", 500, h.clk.now()))
	h.connect("gpu-b")
	h.put("gpu-b", dpNode("tail", "http://10.0.0.2:8000", 2, true, tail...))
	h.result("gpu-b", measured("tail", 500, h.clk.now()))
	return h
}

// hostile is an engine of model m on node evil naming the honest
// deployment's data-parallel address.
func hostile(args []string, ranks map[int]int64) wire.Engine {
	e := engine("evil", "http://10.9.9.9:8000", "m")
	e.LaunchArgs = append([]string{"data_parallel_address=10.0.0.1", "data_parallel_rpc_port=13345"}, args...)
	for dp, kv := range ranks {
		e.Ranks = append(e.Ranks, wire.Rank{DPRank: dp, KVTokens: kv})
	}
	slices.SortFunc(e.Ranks, func(a, b wire.Rank) int { return a.DPRank - b.DPRank })
	return e
}

// The ways a third node can name an honest deployment, each with ranks
// that would hold it (a starved pool) or lift its hold (pools as large as
// the rest), as the review (F1) found and the variants around it.
var hostiles = []struct {
	name string
	args []string
	// starve and even are its ranks against a balanced and a starved
	// deployment.
	starve, even map[int]int64
}{
	// The review's: one rank past the four, or one the head reports.
	{"extra rank", []string{"data_parallel_size=4", "headless=true"}, map[int]int64{4: 1}, map[int]int64{0: 1}},
	// It says the deployment is larger.
	{"larger size", []string{"data_parallel_size=5", "data_parallel_start_rank=4", "data_parallel_size_local=1", "headless=true"},
		map[int]int64{4: 1}, map[int]int64{4: 373600}},
	// It takes the tail's ranks over, by its range or by its reports.
	{"tail's range", []string{"data_parallel_size=4", "data_parallel_start_rank=2", "data_parallel_size_local=2", "headless=true"},
		map[int]int64{2: 373600, 3: 1}, map[int]int64{2: 373600, 3: 373600}},
	{"tail's rank", []string{"data_parallel_size=4", "headless=true"}, map[int]int64{3: 1}, map[int]int64{3: 373600}},
	// It poses as the head.
	{"head's ranks", []string{"data_parallel_size=4", "data_parallel_size_local=2"}, map[int]int64{0: 1, 1: 1}, map[int]int64{0: 46704, 1: 46704}},
	// Its ranks lie outside its own range.
	{"outside its range", []string{"data_parallel_size=4", "data_parallel_start_rank=0", "data_parallel_size_local=1", "headless=true"},
		map[int]int64{3: 1}, map[int]int64{3: 373600}},
	// It reports nothing and says nothing of its ranks (Complete absent).
	{"no ranks", []string{"data_parallel_size=4", "headless=true"}, nil, nil},
}

// A compromised node that names an honest, evenly pooled deployment cannot
// hold its workers (story 4's hold is for uneven pools the deployment's
// own nodes report): both stay admitted and weighted, the deployment is
// still the two honest nodes', and their warning names the node it did
// not join.
func TestDeploymentHostileNodeCannotHold(t *testing.T) {
	for _, x := range hostiles {
		t.Run(x.name, func(t *testing.T) {
			h := honestDeployment(t, 373600, 373600)
			for _, id := range []string{"head", "tail"} {
				if w := h.worker(id); w.State != view.StateAdmitted {
					t.Fatalf("before: %s %s %+v", id, w.State, w.Warnings)
				}
			}
			h.clk.advance(30 * time.Second) // it names the deployment once it is seen in the API
			h.connect("evil")
			h.put("evil", hostile(x.args, x.starve))
			h.clk.advance(DeploymentGrace + time.Minute)
			for _, node := range []string{"gpu-a", "gpu-b", "evil"} {
				h.snapshot(node)
			}
			for _, id := range []string{"head", "tail"} {
				w := h.worker(id)
				if w.State != view.StateAdmitted || w.Weight == nil {
					t.Errorf("%s: %s weight %v, want admitted: %+v", id, w.State, w.Weight, w.Warnings)
				}
				if _, ok := warning(w, wire.CodeDPPoolImbalance); ok {
					t.Errorf("%s: %+v", id, w.Warnings)
				}
				if len(w.Ranks) != 4 || w.Complete == nil || !*w.Complete || *w.ExpectedRanks != 4 || w.MaxContextTokens == nil || *w.MaxContextTokens != 373552 {
					t.Errorf("%s: ranks %+v complete %v expected %v", id, w.Ranks, w.Complete, w.ExpectedRanks)
				}
				if d := w.Deployment; d == nil || !slices.Equal(d.Nodes, []string{"gpu-a", "gpu-b"}) {
					t.Errorf("%s: deployment %+v", id, w.Deployment)
				}
				if m, ok := warning(w, wire.CodeDeploymentMismatch); !ok || !strings.Contains(m.Message, "evil") {
					t.Errorf("%s: no warning naming evil: %+v", id, w.Warnings)
				}
			}
			if wt := h.weights("m"); len(wt) != 2 {
				t.Errorf("weights %v, want head and tail", wt)
			}
		})
	}
}

// The reverse: a deployment rightly held for its starved rank 3 (story
// 4) stays held whatever a compromised node names, where the review
// found a contested rank judged each worker on its own ranks, which never
// hold.
func TestDeploymentHostileNodeCannotLift(t *testing.T) {
	for _, x := range hostiles {
		t.Run(x.name, func(t *testing.T) {
			h := honestDeployment(t, 373600, 46704)
			h.clk.advance(30 * time.Second)
			h.connect("evil")
			h.put("evil", hostile(x.args, x.even))
			for _, node := range []string{"gpu-a", "gpu-b", "evil"} {
				h.snapshot(node)
			}
			wantHeldForRank3(t, h)
		})
	}
}

// The review's reproductions as it wrote them: no time passes between the
// reports, so only the rules, not the order nodes were first seen in,
// keep the third node out.
func TestDeploymentReviewReproductions(t *testing.T) {
	h := headAndTail(t, [2]int64{9000, 9000}, [2]int64{9000, 9000})
	evil := engine("evil", "http://10.9.9.9:8000", "m", 1)
	evil.Ranks[0].DPRank = 4
	evil.LaunchArgs = []string{"data_parallel_address=10.0.0.1", "data_parallel_rpc_port=13345", "data_parallel_size=4", "headless=true"}
	h.connect("evil")
	h.put("evil", evil)
	if wt := h.weights("m"); len(wt) != 2 {
		t.Errorf("poisoned: weights %v, want head and tail", wt)
	}

	h = headAndTail(t, [2]int64{373696, 373552}, [2]int64{373600, 46704})
	evil = engine("evil", "http://10.9.9.9:8000", "m", 1)
	evil.LaunchArgs = []string{"data_parallel_address=10.0.0.1", "data_parallel_rpc_port=13345", "data_parallel_size=4", "headless=true"}
	h.connect("evil")
	h.put("evil", evil) // DP 0, which gpu-a reports
	for _, id := range []string{"head", "tail"} {
		if w := h.worker(id); w.State != view.StateHeld {
			t.Errorf("lifted: %s %s", id, w.State)
		}
	}
}

// A head the server's address check ties to the data-parallel address
// comes before a node first seen earlier that poses as the head: the
// tail is judged on the real head's ranks. Without that tie (the head's
// address refused as not its node's), the earlier one is believed.
func TestDeploymentHeadTiedByAddress(t *testing.T) {
	for _, tied := range []bool{true, false} {
		h := newHarness(t)
		h.connect("evil")
		h.put("evil", hostile([]string{"data_parallel_size=4", "data_parallel_size_local=2"}, map[int]int64{0: 373600, 1: 373600}))
		h.clk.advance(time.Minute)
		h.connect("gpu-a")
		if !tied {
			h.f.SetAddressRefusals("gpu-a", map[string]string{"head": "not gpu-a's"})
		}
		h.put("gpu-a", dpNode("head", "http://10.0.0.1:8000", 0, false, 46704, 373552))
		h.connect("gpu-b")
		h.put("gpu-b", dpNode("tail", "http://10.0.0.2:8000", 2, true, 373600, 373600))
		h.result("gpu-b", measured("tail", 500, h.clk.now()))
		w := h.worker("tail")
		_, starved := warning(w, wire.CodeDPPoolImbalance)
		d := w.Deployment
		if d == nil || starved != tied || slices.Contains(d.Nodes, "evil") == tied {
			t.Errorf("tied %v: tail %s deployment %+v warnings %+v", tied, w.State, d, w.Warnings)
		}
	}
}

// The deployment of a worker whose own launch arguments do not say how
// many ranks there are joins no other node's: nothing would bound them.
func TestDeploymentWithoutSizeJoinsNothing(t *testing.T) {
	h := newHarness(t)
	e := dpNode("tail", "http://10.0.0.2:8000", 2, true, 9000, 9000)
	e.LaunchArgs = slices.DeleteFunc(e.LaunchArgs, func(a string) bool { return strings.HasPrefix(a, "data_parallel_size=") })
	h.connect("gpu-b")
	h.put("gpu-b", e)
	h.connect("evil")
	h.put("evil", hostile([]string{"data_parallel_size=4", "headless=true"}, map[int]int64{0: 1, 1: 1}))
	w := h.worker("tail")
	if len(w.Ranks) != 2 || w.State == view.StateHeld {
		t.Fatalf("%s ranks %+v %+v", w.State, w.Ranks, w.Warnings)
	}
	if m, ok := warning(w, wire.CodeDeploymentMismatch); !ok || !strings.Contains(m.Message, "do not say data_parallel_size") {
		t.Fatalf("%+v", w.Warnings)
	}
}

// The starved tail of a held DP4 deployment goes away, and the engine,
// fixed, comes back under another node name (node.name corrected, or
// another host) with even pools. The old worker stays listed, offline,
// until forgotten: its stale starved rank must not keep the head held,
// nor keep out the live tail's ranks.
func TestDeploymentLiveNodeWinsOverAnOfflineOne(t *testing.T) {
	h := headAndTail(t, [2]int64{373696, 373552}, [2]int64{373600, 46704})
	if w := h.worker("head"); w.State != view.StateHeld {
		t.Fatalf("before: head %s, want held for the starved rank", w.State)
	}
	h.disconnect("gpu-b")
	h.clk.advance(time.Second)
	h.connect("gpu-b2")
	h.put("gpu-b2", dpNode("tail2", "http://10.0.0.2:8000", 2, true, 373600, 373600))
	h.result("gpu-b2", measured("tail2", 500, h.clk.now()))
	h.snapshot("gpu-a")
	for _, id := range []string{"head", "tail2"} {
		if w := h.worker(id); w.State != view.StateAdmitted || len(w.Ranks) != 4 {
			t.Errorf("%s: %s on ranks %v, want admitted on the four live ranks", id, w.State, w.Ranks)
		}
	}
}

// The same, with the old tail's agent connected again but every snapshot
// it sends refused (a hello reaches the fleet, no snapshot does): it is as
// away as one that never came back (bdf1652), and its stale starved rank
// kept the head held on that rank alone while "live" meant connected.
func TestDeploymentHelloAloneIsNotLive(t *testing.T) {
	h := headAndTail(t, [2]int64{373696, 373552}, [2]int64{373600, 46704})
	h.disconnect("gpu-b")
	h.clk.advance(time.Second)
	h.connect("gpu-b") // hello only: its snapshots are refused before the fleet
	h.connect("gpu-b2")
	h.put("gpu-b2", dpNode("tail2", "http://10.0.0.2:8000", 2, true, 373600, 373600))
	h.result("gpu-b2", measured("tail2", 500, h.clk.now()))
	h.snapshot("gpu-a")
	for _, id := range []string{"head", "tail2"} {
		if w := h.worker(id); w.State != view.StateAdmitted || len(w.Ranks) != 4 {
			t.Errorf("%s: %s on ranks %v, want admitted on the four live ranks", id, w.State, w.Ranks)
		}
	}
}

// headAndTail is an honest vLLM DP4 deployment over two nodes, measured:
// the head (gpu-a, DP 0–1) and a headless tail (gpu-b, DP 2–3) with the
// given pools.
func headAndTail(t *testing.T, head, tail [2]int64) *harness {
	h := newHarness(t)
	h.connect("gpu-a")
	h.put("gpu-a", dpNode("head", "http://10.0.0.1:8000", 0, false, head[0], head[1]))
	h.result("gpu-a", measured("head", 500, h.clk.now()))
	h.connect("gpu-b")
	h.put("gpu-b", dpNode("tail", "http://10.0.0.2:8000", 2, true, tail[0], tail[1]))
	h.result("gpu-b", measured("tail", 500, h.clk.now()))
	return h
}

// wantHeldForRank3 checks that the head and the tail are both held, for
// rank 3's pool of 46,704 tokens.
func wantHeldForRank3(t *testing.T, h *harness) {
	t.Helper()
	for _, id := range []string{"head", "tail"} {
		w := h.worker(id)
		if w.State != view.StateHeld {
			t.Errorf("%s: %s, want held: %+v", id, w.State, w.Warnings)
		}
		if i, ok := warning(w, wire.CodeDPPoolImbalance); !ok || i.Severity != wire.SeverityCritical || !strings.Contains(i.Message, "rank 3 only 46,704") {
			t.Errorf("%s: %+v", id, w.Warnings)
		}
	}
}

// Nodes that spell the deployment's address differently ([fd00::1] and
// FD00:0::1, a port with a leading zero) are one deployment: the tail's
// starved rank 3 holds the head too.
func TestDeploymentAddressSpellingsAreOne(t *testing.T) {
	respell := func(e wire.Engine, host, port string) wire.Engine {
		for i, a := range e.LaunchArgs {
			switch {
			case strings.HasPrefix(a, "data_parallel_address="):
				e.LaunchArgs[i] = "data_parallel_address=" + host
			case strings.HasPrefix(a, "data_parallel_rpc_port="):
				e.LaunchArgs[i] = "data_parallel_rpc_port=" + port
			}
		}
		return e
	}
	h := newHarness(t)
	h.connect("gpu-a")
	h.put("gpu-a", respell(dpNode("head", "http://10.0.0.1:8000", 0, false, 373600, 373600), "fd00::1", "13345"))
	h.result("gpu-a", measured("head", 500, h.clk.now()))
	h.connect("gpu-b")
	h.put("gpu-b", respell(dpNode("tail", "http://10.0.0.2:8000", 2, true, 373600, 46704), "[FD00:0::1]", "013345"))
	h.result("gpu-b", measured("tail", 500, h.clk.now()))
	wantHeldForRank3(t, h)
	if d := h.worker("head").Deployment; d == nil || d.Address != "[fd00::1]:13345" {
		t.Errorf("head: deployment %+v, want address [fd00::1]:13345", d)
	}
}
