package fleet

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"heft/shared/view"
	"heft/shared/wire"
)

func TestClipProblems(t *testing.T) {
	var ps []string
	for i := 0; i < 64; i++ {
		ps = append(ps, strings.Repeat("é", 4096)) // 2 bytes a rune: cuts must keep UTF-8 valid
	}
	got := clipProblems(ps)
	if len(got) != viewProblems+1 || got[viewProblems] != "(56 more)" {
		t.Fatalf("got %d problems, last %q", len(got), got[len(got)-1])
	}
	for _, p := range got[:viewProblems] {
		if len(p) > viewProblemBytes+len("…") || !strings.HasSuffix(p, "…") || strings.ToValidUTF8(p, "?") != p {
			t.Errorf("problem of %d bytes", len(p))
		}
	}
	if short := clipProblems([]string{"a", "b"}); len(short) != 2 || short[1] != "b" {
		t.Errorf("short list changed: %q", short)
	}
}

// Stats counts every probe request the fleet makes, by reason, and lists
// every reason from the start.
func TestStatsCountProbeRequests(t *testing.T) {
	h := newHarness(t)
	want := map[string]int{wire.ReasonRegistration: 0, wire.ReasonScheduled: 0, wire.ReasonOnDemand: 0}
	check := func(when string) {
		t.Helper()
		if got := h.f.Stats().ProbeRequests; !maps.Equal(got, want) {
			t.Errorf("%s: probe requests %v, want %v", when, got, want)
		}
	}
	check("at the start")
	h.admit("n", engine("k", "http://1:8000", "m"), 640) // asks for a registration probe
	want[wire.ReasonRegistration] = 1
	check("after registration")
	if _, err := h.f.Probe("k"); err != nil {
		t.Fatal(err)
	}
	want[wire.ReasonOnDemand] = 1
	check("after an on-demand probe")
	h.result("n", measured("k", 640, h.clk.now()))
	h.clk.advance(6 * time.Hour)
	if r := requests(h.f.Tick(), "k"); len(r) != 1 {
		t.Fatalf("at 6h: %d requests", len(r))
	}
	want[wire.ReasonScheduled] = 1
	check("at the scheduled re-measurement")
	h.snapshot("n") // a reconnect-free snapshot with a fresh measurement asks for nothing
	check("after another snapshot")
}

// Find filters by model, node, state and warning, all at once, and pages
// in ID order; a worker that arrives between pages does not shift them.
func TestFind(t *testing.T) {
	h := newHarness(t)
	h.admit("a", engine("k3", "http://a:8000", "m1"), 1000)
	h.admit("a", engine("k1", "http://a:8001", "m2"), 1000)
	h.admit("b", engine("k5", "http://b:8000", "m1"), 1000)
	h.connect("c")
	h.put("c", engine("k2", "http://c:8000", "m1", 24094, 2925)) // measuring, uneven pools
	ids := func(ws []view.Worker) []string {
		var out []string
		for _, w := range ws {
			out = append(out, w.ID)
		}
		return out
	}
	for _, tc := range []struct {
		q    Query
		want []string
	}{
		{Query{}, []string{"k3", "k5", "k2", "k1"}}, // by model, node, URL, as Workers
		{Query{Model: "m1"}, []string{"k3", "k5", "k2"}},
		{Query{Node: "a"}, []string{"k3", "k1"}},
		{Query{Node: "a", Model: "m2"}, []string{"k1"}},
		{Query{Node: "b", Model: "m2"}, nil},
		{Query{Node: "nowhere"}, nil},
		{Query{State: view.StateMeasuring}, []string{"k2"}},
		{Query{Warning: wire.CodeDPPoolImbalance}, []string{"k2"}},
		{Query{Model: "m1", State: view.StateAdmitted}, []string{"k3", "k5"}},
		{Query{Limit: 2}, []string{"k1", "k2"}},
		{Query{Limit: 2, After: "k2"}, []string{"k3", "k5"}},
		{Query{Limit: 2, After: "k5"}, nil},
		{Query{Limit: 5, Model: "m1", After: "k2"}, []string{"k3", "k5"}},
	} {
		got, _ := h.f.Find(tc.q)
		if !slices.Equal(ids(got), tc.want) {
			t.Errorf("Find(%+v) = %v, want %v", tc.q, ids(got), tc.want)
		}
	}
	if ws, _ := h.f.Find(Query{}); !slices.EqualFunc(ws, h.f.Workers(), func(a, b view.Worker) bool { return a.ID == b.ID }) {
		t.Error("Find(Query{}) and Workers differ")
	}

	// Page through by two; k0 arrives after the first page and sorts
	// before the cursor, so it is not seen, and nothing is seen twice.
	var seen []string
	after := ""
	for range 10 {
		page, more := h.f.Find(Query{Limit: 2, After: after})
		seen = append(seen, ids(page)...)
		if !more {
			break
		}
		after = page[len(page)-1].ID
		if len(seen) == 2 {
			h.admit("d", engine("k0", "http://d:8000", "m1"), 1000)
		}
	}
	if want := []string{"k1", "k2", "k3", "k5"}; !slices.Equal(seen, want) {
		t.Errorf("paged %v, want %v", seen, want)
	}
	if _, more := h.f.Find(Query{Limit: 5}); more {
		t.Error("more after a page that holds everything")
	}
}

// Stats gives each worker's pools, warnings and the time of its newest
// valid measurement, which a failed probe after it does not change.
func TestStatsPerWorker(t *testing.T) {
	h := newHarness(t)
	h.admit("a", engine("k", "http://a:8000", "m", 1000, 950), 800)
	measuredAt := h.clk.now()
	h.clk.advance(time.Hour)
	failed := measured("k", 0, h.clk.now())
	failed.Failure, failed.OutputTokens = wire.CodeProbeFailed, 0
	if _, err := h.f.Probe("k"); err != nil { // results answer requests
		t.Fatal(err)
	}
	h.result("a", failed)
	st := h.f.Stats()
	if len(st.Workers) != 1 {
		t.Fatalf("workers %+v", st.Workers)
	}
	w := st.Workers[0]
	if w.MeasuredAt == nil || !w.MeasuredAt.Equal(measuredAt) {
		t.Errorf("MeasuredAt = %v, want %v (the valid one)", w.MeasuredAt, measuredAt)
	}
	if w.Throughput != nil {
		t.Errorf("Throughput = %v after a failed probe, want none", *w.Throughput)
	}
	if len(w.Ranks) != 2 || w.Ranks[1].KVTokens != 950 {
		t.Errorf("Ranks = %+v", w.Ranks)
	}
	if !slices.Contains(w.Warnings, WarningStats{Code: wire.CodeProbeFailed, Severity: wire.SeverityCritical}) {
		t.Errorf("Warnings = %+v", w.Warnings)
	}
}
