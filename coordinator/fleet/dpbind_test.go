package fleet

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"heft/shared/view"
	"heft/shared/wire"
)

// boundDP binds the honest deployment of deployment_test.go
// (10.0.0.1:13345) to its two nodes.
var boundDP = []DeploymentBinding{{Address: "10.0.0.1:13345", Nodes: []string{"gpu-b", "gpu-a"}}}

// impostorFirst brings up a compromised node naming the honest deployment
// (its ranks are ranks) a minute before the honest head and tail (tail
// pools as given) report and are measured.
func impostorFirst(t *testing.T, bind []DeploymentBinding, x struct {
	name         string
	args         []string
	starve, even map[int]int64
}, ranks map[int]int64, tail ...int64) *harness {
	t.Helper()
	h := newHarness(t)
	if err := h.f.BindDeployments(bind); err != nil {
		t.Fatal(err)
	}
	h.connect("evil")
	h.put("evil", hostile(x.args, ranks))
	h.clk.advance(time.Minute)
	h.connect("gpu-a")
	h.put("gpu-a", dpNode("head", "http://10.0.0.1:8000", 0, false, 373696, 373552))
	h.result("gpu-a", measured("head", 500, h.clk.now()))
	h.connect("gpu-b")
	h.put("gpu-b", dpNode("tail", "http://10.0.0.2:8000", 2, true, tail...))
	h.result("gpu-b", measured("tail", 500, h.clk.now()))
	h.clk.advance(DeploymentGrace + time.Minute)
	for _, node := range []string{"evil", "gpu-a", "gpu-b"} {
		h.snapshot(node)
	}
	return h
}

// The case the join rule alone cannot close: a compromised node names
// the deployment's address before its real nodes report, with ranks that
// would hold it (a starved pool). With the address bound to gpu-a and
// gpu-b, whatever the impostor claims, the honest workers join each other
// only, stay admitted and weighted, and their warning says the impostor
// is not bound; the impostor's own worker joins no one.
func TestDeploymentBoundImpostorFirstCannotHold(t *testing.T) {
	for _, x := range hostiles {
		t.Run(x.name, func(t *testing.T) {
			h := impostorFirst(t, boundDP, x, x.starve, 373600, 373600)
			for _, id := range []string{"head", "tail"} {
				w := h.worker(id)
				if w.State != view.StateAdmitted || w.Weight == nil {
					t.Errorf("%s: %s weight %v, want admitted: %+v", id, w.State, w.Weight, w.Warnings)
				}
				if _, ok := warning(w, wire.CodeDPPoolImbalance); ok {
					t.Errorf("%s: %+v", id, w.Warnings)
				}
				if len(w.Ranks) != 4 || w.Complete == nil || !*w.Complete || *w.MaxContextTokens != 373552 {
					t.Errorf("%s: ranks %+v complete %v", id, w.Ranks, w.Complete)
				}
				if d := w.Deployment; d == nil || !slices.Equal(d.Nodes, []string{"gpu-a", "gpu-b"}) {
					t.Errorf("%s: deployment %+v", id, w.Deployment)
				}
				m, ok := warning(w, wire.CodeDeploymentMismatch)
				if !ok || !strings.Contains(m.Message, "evil is not bound to 10.0.0.1:13345 (dp_deployment binds gpu-a, gpu-b), so its ranks are not joined") ||
					!strings.Contains(m.Message, "only nodes bound to 10.0.0.1:13345 by dp_deployment join it") {
					t.Errorf("%s: no warning saying evil is not bound: %+v", id, w.Warnings)
				}
			}
			if wt := h.weights("m"); len(wt) != 2 || wt["head"] == 0 || wt["tail"] == 0 {
				t.Errorf("weights %v, want head and tail", wt)
			}
			e := h.worker("evil")
			if d := e.Deployment; d == nil || !slices.Equal(d.Nodes, []string{"evil"}) {
				t.Errorf("evil: deployment %+v", e.Deployment)
			}
			if m, ok := warning(e, wire.CodeDeploymentMismatch); !ok || !strings.Contains(m.Message, "evil is not bound to 10.0.0.1:13345") ||
				!strings.Contains(m.Message, "this worker joins no other node's ranks") {
				t.Errorf("evil: %+v", e.Warnings)
			}
		})
	}
}

// The reverse: bound, a deployment rightly held for its starved rank 3
// stays held whatever an impostor that came first claims.
func TestDeploymentBoundImpostorFirstCannotLift(t *testing.T) {
	for _, x := range hostiles {
		t.Run(x.name, func(t *testing.T) {
			h := impostorFirst(t, boundDP, x, x.even, 373600, 46704)
			wantHeldForRank3(t, h)
		})
	}
}

// Without a binding the rule is today's: an impostor that claims the
// tail's ranks before the tail reports is believed, its starved rank
// holds the head, and the real tail is only named in the warning. This
// pins that behaviour (and so what the binding changes).
func TestDeploymentUnboundImpostorFirstIsBelieved(t *testing.T) {
	x := hostiles[slices.IndexFunc(hostiles, func(x struct {
		name         string
		args         []string
		starve, even map[int]int64
	}) bool {
		return x.name == "tail's range"
	})]
	h := impostorFirst(t, nil, x, x.starve, 373600, 373600)
	w := h.worker("head")
	if w.State != view.StateHeld {
		t.Errorf("head: %s, want held by the impostor's rank: %+v", w.State, w.Warnings)
	}
	if d := w.Deployment; d == nil || !slices.Equal(d.Nodes, []string{"gpu-a", "evil"}) {
		t.Errorf("head: deployment %+v", w.Deployment)
	}
	if m, ok := warning(w, wire.CodeDeploymentMismatch); !ok || !strings.Contains(m.Message, "DP 2, 3 is reported by both evil and gpu-b") ||
		strings.Contains(m.Message, "bound") {
		t.Errorf("head: %+v", w.Warnings)
	}
}

// BindDeployments judges the workers already known again: a deployment
// held by an impostor that came first is freed when its address is bound
// (as at a start over a restored fleet), and held again when the binding
// is taken away.
func TestBindDeploymentsJudgesAgain(t *testing.T) {
	x := hostiles[2] // tail's range
	if x.name != "tail's range" {
		t.Fatalf("hostiles reordered: %s", x.name)
	}
	h := impostorFirst(t, nil, x, x.starve, 373600, 373600)
	if w := h.worker("head"); w.State != view.StateHeld {
		t.Fatalf("before: head %s", w.State)
	}
	if err := h.f.BindDeployments(boundDP); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"head", "tail"} {
		if w := h.worker(id); w.State != view.StateAdmitted || len(w.Ranks) != 4 {
			t.Errorf("bound: %s %s ranks %v", id, w.State, w.Ranks)
		}
	}
	if err := h.f.BindDeployments(nil); err != nil {
		t.Fatal(err)
	}
	if w := h.worker("head"); w.State != view.StateHeld {
		t.Errorf("unbound again: head %s", w.State)
	}
	if err := h.f.BindDeployments([]DeploymentBinding{{Address: "10.0.0.1:13345"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a binding with no nodes: %v", err)
	}
}

// A binding of another address leaves the deployment to the join rule,
// and a node of the deployment left out of its binding joins no one (the
// operator's list is believed over the agents').
func TestDeploymentBindingOtherAddressOrNode(t *testing.T) {
	x := hostiles[2]
	h := impostorFirst(t, []DeploymentBinding{{Address: "10.0.0.1:13346", Nodes: []string{"gpu-a", "gpu-b"}}}, x, x.starve, 373600, 373600)
	if w := h.worker("head"); w.State != view.StateHeld {
		t.Errorf("another port bound: head %s, want today's rule", w.State)
	}
	h = impostorFirst(t, []DeploymentBinding{{Address: "10.0.0.1:13345", Nodes: []string{"gpu-a"}}}, x, x.starve, 373600, 373600)
	head, tail := h.worker("head"), h.worker("tail")
	if d := head.Deployment; d == nil || !slices.Equal(d.Nodes, []string{"gpu-a"}) || head.State == view.StateHeld {
		t.Errorf("head: %s deployment %+v", head.State, head.Deployment)
	}
	if m, ok := warning(head, wire.CodeDeploymentMismatch); !ok || !strings.Contains(m.Message, "gpu-b is not bound") || !strings.Contains(m.Message, "evil is not bound") {
		t.Errorf("head: %+v", head.Warnings)
	}
	if d := tail.Deployment; d == nil || !slices.Equal(d.Nodes, []string{"gpu-b"}) {
		t.Errorf("tail: deployment %+v", tail.Deployment)
	}
}

// How a deployment's address finds its binding: the host as an address
// or a name in any spelling, the port as the engine reads it; with no
// port in the launch arguments, by every binding of its host.
func TestDeploymentBindingLookup(t *testing.T) {
	b := compile([]DeploymentBinding{
		{Address: "10.0.0.1:13345", Nodes: []string{"a"}},
		{Address: "10.0.0.1:29550", Nodes: []string{"b", "a"}},
		{Address: "[fd00::1]:5000", Nodes: []string{"c"}},
		{Address: "Head.Example:7000", Nodes: []string{"d"}},
		{Address: "10.0.0.3:", Nodes: []string{"e"}},
	})
	for _, c := range []struct {
		args  []string
		nodes []string // nil: not bound
	}{
		{[]string{"data_parallel_address=10.0.0.1", "data_parallel_rpc_port=13345"}, []string{"a"}},
		{[]string{"data_parallel_address=10.0.0.1", "data_parallel_rpc_port=013345"}, []string{"a"}},
		{[]string{"data_parallel_address=::ffff:10.0.0.1", "data_parallel_rpc_port=13345"}, []string{"a"}},
		{[]string{"data_parallel_address=10.0.0.1", "data_parallel_rpc_port=29550"}, []string{"a", "b"}},
		{[]string{"data_parallel_address=10.0.0.1", "data_parallel_rpc_port=1"}, nil},
		{[]string{"data_parallel_address=10.0.0.2", "data_parallel_rpc_port=13345"}, nil},
		{[]string{"data_parallel_address=10.0.0.1"}, []string{"a", "b"}}, // no port: every binding of the host
		{[]string{"dist_init_addr=[fd00:0::1]:5000", "nnodes=2"}, []string{"c"}},
		{[]string{"dist_init_addr=fd00::1", "nnodes=2"}, []string{"c"}},
		{[]string{"nccl_init_addr=[fd00::1]:5000", "nnodes=2"}, []string{"c"}}, // SGLang's older spelling
		{[]string{"master_addr=head.example.", "master_port=7000"}, []string{"d"}},
		{[]string{"master_addr=HEAD.example"}, []string{"d"}},
		{[]string{"master_addr=head.example", "master_port=7001"}, nil},
		// "HOST:" as the API shows a launch without a port binds those
		// launches only.
		{[]string{"data_parallel_address=10.0.0.3"}, []string{"e"}},
		{[]string{"data_parallel_address=10.0.0.3", "data_parallel_rpc_port=13345"}, nil},
	} {
		e := engine("x", "http://10.0.0.9:8000", "m")
		e.LaunchArgs = append(c.args, "data_parallel_size=4", "data_parallel_size_local=2")
		s, ok := spanOf(e)
		if !ok {
			t.Fatalf("%v: no span", c.args)
		}
		got, ok := b.bound(s)
		if ok != (c.nodes != nil) || !slices.Equal(got.nodes, c.nodes) {
			t.Errorf("%v: bound to %v (%v), want %v", c.args, got.nodes, ok, c.nodes)
		}
	}
	if _, ok := (*bindings)(nil).bound(span{host: "10.0.0.1", port: "13345"}); ok {
		t.Error("no bindings bound something")
	}
}

// An operator who binds only the head's node by mistake costs no request:
// the honest tail, left out, is neither held nor loses its weight, and
// each worker's warning names the node left out and the fix, rather than
// saying its ranks were reported by no node.
func TestDeploymentBindingMissingANodeIsClear(t *testing.T) {
	h := newHarness(t)
	if err := h.f.BindDeployments([]DeploymentBinding{{Address: "10.0.0.1:13345", Nodes: []string{"gpu-a"}}}); err != nil {
		t.Fatal(err)
	}
	h.connect("gpu-a")
	h.put("gpu-a", dpNode("head", "http://10.0.0.1:8000", 0, false, 373696, 373552))
	h.result("gpu-a", measured("head", 500, h.clk.now()))
	h.connect("gpu-b")
	h.put("gpu-b", dpNode("tail", "http://10.0.0.2:8000", 2, true, 373600, 373600))
	h.result("gpu-b", measured("tail", 500, h.clk.now()))
	h.clk.advance(DeploymentGrace + time.Minute)
	h.snapshot("gpu-a")
	h.snapshot("gpu-b")
	if wt := h.weights("m"); len(wt) != 2 || wt["head"] == 0 || wt["tail"] == 0 {
		t.Errorf("weights %v, want head and tail", wt)
	}
	for id, missing := range map[string]string{"head": "DP 2, 3", "tail": "DP 0, 1"} {
		w := h.worker(id)
		if w.State != view.StateAdmitted {
			t.Errorf("%s: %s, want admitted: %+v", id, w.State, w.Warnings)
		}
		found := false
		for _, x := range w.Warnings {
			if x.Code != wire.CodeDeploymentMismatch || !strings.Contains(x.Message, missing+" have not") {
				continue
			}
			found = true
			if strings.Contains(x.Message, "reported by any node (") || !strings.Contains(x.Message, "not bind them to 10.0.0.1:13345: gpu-b") ||
				!strings.Contains(x.Message, "add it to the binding's nodes") {
				t.Errorf("%s: %q, want it to name gpu-b as not bound and the fix", id, x.Message)
			}
		}
		if !found {
			t.Errorf("%s: no warning of %s missing: %+v", id, missing, w.Warnings)
		}
	}
}
