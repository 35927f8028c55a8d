package app_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"heft/gateway/gwtest"
	"heft/shared/testutil"
	"heft/shared/view"
)

// One worker nginx cannot take (its host name does not resolve, so nginx
// -t refuses its line) is left out of nginx, logged and counted, and the
// other workers' weights still reach nginx. Before, the failed check kept
// every weight of the upstream frozen for as long as the worker was listed.
func TestOneBadWorkerIsDroppedNotTheGateway(t *testing.T) {
	r := start(t, 300*time.Millisecond)
	const bad = "heft-no-such-host.invalid:8000"
	// c, which nginx started with, is listed too: else heft-sync would
	// keep it for keep_unlisted, as the gateway served it.
	r.coord.SetWorkers(
		gwtest.Worker(model, r.a.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, r.b.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, r.c.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, bad, view.StateAdmitted, 1),
	)
	even := func(s map[string]int) bool { return s["a"] == 10 && s["b"] == 10 && s["c"] == 10 }
	r.waitSplit(t, "nginx to split between a, b and c", r.nx.Front, 30, even)

	// The good workers' weights change; nginx follows, the bad one stays out.
	r.coord.SetWorkers(
		gwtest.Worker(model, r.a.Addr, view.StateAdmitted, 3),
		gwtest.Worker(model, r.b.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, r.c.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, bad, view.StateAdmitted, 1),
	)
	t.Logf("nginx: %v", r.waitSplit(t, "nginx to follow a's new weight", r.nx.Front, 50, func(s map[string]int) bool { return s["a"] == 30 && s["b"] == 10 && s["c"] == 10 }))
	if data, _ := os.ReadFile(r.nx.Upstream); strings.Contains(string(data), bad) {
		t.Fatalf("the bad worker is in nginx's file:\n%s", data)
	}
	testutil.Eventually(t, "the drop to be counted", 10*time.Second, func() bool {
		m := r.metrics(t)
		return counter(m, `heft_sync_worker_drops_total{target="nginx:qwen"}`) == 1 && counter(m, `heft_sync_workers_dropped{target="nginx:qwen"}`) == 1
	})
	m := r.metrics(t)
	t.Logf("%s", grep(m, "drop"))
	if v := counter(m, `heft_sync_apply_failures_total{reason="check_failed",target="nginx:qwen"}`); v != 0 {
		t.Errorf("%g failed nginx applies, want 0: the worker is dropped, not the apply", v)
	}
}
