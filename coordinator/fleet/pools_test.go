package fleet

import (
	"slices"
	"strings"
	"testing"

	"heft/shared/view"
	"heft/shared/wire"
)

// partial lists e's first n ranks of expected as found, the rest missing.
func partial(e wire.Engine, n, expected int) wire.Engine {
	e.Ranks = e.Ranks[:n]
	complete := n == expected
	e.ExpectedRanks, e.Complete, e.MissingRanks = expected, &complete, nil
	for dp := n; dp < expected; dp++ {
		e.MissingRanks = append(e.MissingRanks, dp)
	}
	return e
}

// A DP4 engine whose rank 3 has printed no pool yet: the ranks found are
// real, so its worker is measured and admitted with pools_incomplete (a
// warning, not a hold) and no pool ratio; an eighth-size pool already
// among them is named as a warning. Once the set is whole the usual rule
// holds it.
func TestIncompletePoolsWarnAndDoNotHold(t *testing.T) {
	h := newHarness(t)
	h.admit("n1", engine("even", "http://1:8000", "m", 24000, 23900), 500)
	full := engine("dp4", "http://2:8000", "m", 373696, 46704, 373600, 373552)

	h.connect("n2")
	h.put("n2", partial(full, 1, 4))
	h.result("n2", measured("dp4", 500, h.clk.now()))
	w := h.worker("dp4")
	if w.State != view.StateAdmitted {
		t.Fatalf("one of four pools: state %s, want admitted; warnings %+v", w.State, w.Warnings)
	}
	x, ok := warning(w, wire.CodePoolsIncomplete)
	if !ok || x.Severity != wire.SeverityWarning || !strings.Contains(x.Message, "expected 4 data-parallel ranks but 1 printed a KV pool; none from DP 1-3") {
		t.Fatalf("pools_incomplete %+v, ok %v", x, ok)
	}
	if w.PoolRatio != nil || w.Complete == nil || *w.Complete || w.ExpectedRanks == nil || *w.ExpectedRanks != 4 || !slices.Equal(w.MissingRanks, []int{1, 2, 3}) {
		t.Errorf("view: ratio %v complete %v expected %v missing %v", w.PoolRatio, w.Complete, w.ExpectedRanks, w.MissingRanks)
	}

	h.put("n2", partial(full, 3, 4))
	w = h.worker("dp4")
	if w.State != view.StateAdmitted || w.PoolRatio != nil {
		t.Fatalf("three of four, one starved: state %s ratio %v, want admitted without a ratio", w.State, w.PoolRatio)
	}
	x, ok = warning(w, wire.CodeDPPoolImbalance)
	if !ok || x.Severity != wire.SeverityWarning || !strings.Contains(x.Message, "rank 1 only 46,704") || !strings.Contains(x.Message, "among the 3 of 4 ranks") {
		t.Fatalf("imbalance among the found ranks: %+v, ok %v", x, ok)
	}
	if _, ok := warning(w, wire.CodePoolsIncomplete); !ok {
		t.Error("no pools_incomplete")
	}

	h.put("n2", partial(full, 4, 4))
	w = h.worker("dp4")
	if w.State != view.StateHeld || w.PoolRatio == nil || *w.PoolRatio > 0.13 {
		t.Fatalf("whole and uneven: state %s ratio %v, want held at 0.125", w.State, w.PoolRatio)
	}
	if x, ok := warning(w, wire.CodeDPPoolImbalance); !ok || x.Severity != wire.SeverityCritical {
		t.Errorf("whole: %+v", w.Warnings)
	}
	if _, ok := warning(w, wire.CodePoolsIncomplete); ok {
		t.Error("a whole set still called incomplete")
	}
	if _, ok := h.weights("m")["dp4"]; ok {
		t.Error("a held worker in the weight table")
	}
}

// An admin's admit stores a decision only for pools that would hold the
// worker; an incomplete set does not, so admit leaves none.
func TestAdmitOnIncompletePoolsStoresNoDecision(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	h.put("n", partial(engine("k", "http://1:8000", "m", 24094, 2925, 24000), 2, 3))
	h.result("n", measured("k", 500, h.clk.now()))
	if err := h.f.Admit("k"); err != nil {
		t.Fatal(err)
	}
	if d := h.st.state().Decisions["k"]; d != "" {
		t.Errorf("decision %q stored for a worker its pools do not hold", d)
	}
}

// No pool known where one matters: a DP2 engine's launch arguments and no
// pools, or a log the agent cannot read. A warning, not a hold.
func TestPoolsUnknown(t *testing.T) {
	h := newHarness(t)
	dp2 := engine("dp2", "http://1:8000", "m")
	dp2.LaunchArgs = []string{"data_parallel_size=2"}
	h.admit("n", dp2, 500)
	x, ok := warning(h.worker("dp2"), wire.CodePoolsUnknown)
	if !ok || x.Severity != wire.SeverityWarning || !strings.Contains(x.Message, "runs 2 data-parallel ranks") {
		t.Fatalf("pools_unknown %+v, ok %v", x, ok)
	}
	unread := engine("unread", "http://2:8000", "m")
	unread.LogSource = &wire.LogSource{Spec: "journald:vllm.service", Error: "journald: no entries for unit vllm.service"}
	h.admit("n", unread, 500)
	x, ok = warning(h.worker("unread"), wire.CodePoolsUnknown)
	if !ok || !strings.Contains(x.Message, "(journald:vllm.service) cannot be read: journald: no entries") {
		t.Fatalf("pools_unknown %+v, ok %v", x, ok)
	}
	if v := h.worker("unread"); v.LogSource == nil || v.LogSource.Spec != "journald:vllm.service" {
		t.Errorf("view's log source %+v", v.LogSource)
	}
}

// The log's pools and the engine's metrics disagree: a warning naming
// both figures; the worker is judged on the log's pools.
func TestPoolsDisagree(t *testing.T) {
	h := newHarness(t)
	e := engine("k", "http://1:8000", "m", 24094, 24094)
	e.RanksSource = "k8s:inference/sglang-0/sglang"
	e.PoolCheck = &wire.PoolCheck{Source: "metrics", Ranks: []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}}
	h.admit("n", e, 500)
	x, ok := warning(h.worker("k"), wire.CodePoolsDisagree)
	if !ok || x.Severity != wire.SeverityWarning || !strings.Contains(x.Message, "rank 1: 24,094 tokens in the log, 2,925 in /metrics") {
		t.Fatalf("pools_disagree %+v, ok %v", x, ok)
	}
}

// A coordinator restart restores whether a worker's pools were whole: an
// incomplete set does not come back as a whole one with a ratio.
func TestRestartKeepsIncompleteness(t *testing.T) {
	h := newHarness(t)
	h.connect("n")
	h.put("n", partial(engine("k", "http://1:8000", "m", 24094, 2925, 24000), 2, 3))
	h.result("n", measured("k", 500, h.clk.now()))
	h.f.writeRecords()
	if r := h.st.state().Workers["k"]; r.Complete == nil || *r.Complete || r.ExpectedRanks != 3 {
		t.Fatalf("stored record %+v", r)
	}
	h2 := h.restart()
	w := h2.worker("k")
	if w.Complete == nil || *w.Complete || w.PoolRatio != nil || !slices.Equal(w.MissingRanks, []int{2}) {
		t.Fatalf("restored: complete %v ratio %v missing %v", w.Complete, w.PoolRatio, w.MissingRanks)
	}
	if x, ok := warning(w, wire.CodeDPPoolImbalance); ok && x.Severity == wire.SeverityCritical {
		t.Errorf("a restored partial set judged as whole: %+v", x)
	}
}
