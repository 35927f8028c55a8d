package bench

import (
	"context"
	"math"
	"os"
	"testing"
	"time"

	"heft/gateway/gwproc"
)

// TestChangesShort is area 11 in miniature on a real fleet behind real
// HAProxy and nginx: the fast worker halves its speed while serving 60 %
// load, below saturation, and its weight share at both gateways must come
// within 10 % of its new true share (25 %) by the end of the run. Nothing
// is timed: the run's end is the deadline, and only the shares read at the
// gateways are judged.
func TestChangesShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fleet, haproxy and nginx, and offers load for about 100 s")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("the bench reads /proc: Linux only")
	}
	gwproc.Require(t, "haproxy")
	gwproc.Require(t, "nginx")
	bin := testBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := &env{opts: Options{Bin: bin, Progress: testLog{t}, Quick: true}, bin: bin, work: t.TempDir(), runs: 1, tokens: 32, conc: 16}
	plan := e.changesPlanFor()
	rows, _, err := e.changesRun(ctx, plan, caseSlows, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, want := trueShares(plan.Factor)
	for _, r := range rows {
		t.Logf("%s: share %.3f at the slowdown, %.3f at the end (true %.3f), converged after %v s; %d requests, %d failed, p95 %.2f s",
			r.Gateway, r.Before, r.Final, want, r.Converged, r.Res.Sent, r.Res.Failed+r.Res.Unfinished, r.Res.Latency.P95.Seconds())
		if r.Err != nil {
			t.Errorf("%s: %v", r.Gateway, r.Err)
		}
		if math.Abs(r.Final-want) > 0.1*want {
			t.Errorf("%s: the fast worker's share ended at %.3f, not within 10 %% of its true %.3f", r.Gateway, r.Final, want)
		}
	}
}
