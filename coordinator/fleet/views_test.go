package fleet

import (
	"heft/shared/wire"
	"maps"
	"strings"
	"testing"
	"time"
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
