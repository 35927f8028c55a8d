package reliability

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"heft/bench/loadgen"
	"heft/gateway/gwtest"
	"heft/shared/testutil"
)

// The converse of the chaos test: evidence about the engine itself takes
// it out. An engine that dies, its agent alive or its agent gone first
// (so the coordinator still routes it, stale), stops getting requests at
// the gateway's own health check (HAProxy: check inter 1s fall 2; nginx:
// the passive check, at its first refused connection), and no request
// sent after the death fails: retries and redispatch (HAProxy), and
// proxy_next_upstream (nginx), send a refused connection to another
// server. A request streaming from the engine when it dies fails with it
// (no gateway can move a started generation): those are counted and
// logged, not asserted.
func TestEngineDeathUnderLoad(t *testing.T) {
	gwtest.RequireBinary(t, "haproxy")
	gwtest.RequireBinary(t, "nginx")
	t.Parallel() // mostly waiting on its load: it overlaps the other waiting tests; it judges failed requests, not speed
	r := newChaosRig(t)
	for i, agentToo := range []bool{false, true} {
		name := map[bool]string{false: "agent alive", true: "agent gone first"}[agentToo]
		t.Run(name, func(t *testing.T) {
			r.engineDies(t, i, agentToo)
		})
	}
}

// engineDies runs load through both gateways while sim i dies (its agent
// stopped first when agentToo), and checks what the gateways did.
func (r *chaosRig) engineDies(t *testing.T, i int, agentToo bool) {
	const load = 12 * time.Second
	dead := strings.TrimPrefix(r.sims[i].URL(), "http://")
	fronts := map[string]string{"haproxy": r.hx.Front, "nginx": r.nx.Front}
	var mu sync.Mutex
	results := map[string]loadgen.Result{}
	var wg sync.WaitGroup
	for gw, front := range fronts {
		wg.Go(func() {
			// Kept-alive connections, as clients keep them. An nginx
			// reload (heft-sync's, when a worker's state changes) closes
			// the idle ones, and a request sent on one at that instant
			// gets no answer: nginx's own race (docs/gateways.md,
			// gateway/nginx TestReloadsUnderKeepAliveLoad). The client
			// sends such a request again (ResendClosed), the docs'
			// remedy; they are counted apart, as resent.
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
			defer client.CloseIdleConnections()
			res, err := loadgen.Run(context.Background(), loadgen.Config{URL: "http://" + front, Model: testModel,
				Rate: 6, Duration: load, Tokens: 32, Drain: 30 * time.Second, Seed: uint64(21 + i), Client: client, KeepRequests: true, ResendClosed: true})
			if err != nil {
				t.Errorf("load through %s: %v", gw, err)
			}
			mu.Lock()
			results[gw] = res
			mu.Unlock()
		})
	}
	time.Sleep(load / 4) // the engine dies once the load runs
	if agentToo {
		r.agents[i].stop()
	}
	if err := r.sims[i].Close(); err != nil {
		t.Logf("closing the engine: %v", err)
	}
	death := time.Now()
	var down time.Duration
	testutil.Eventually(t, "HAProxy's check to mark the dead engine down", 30*time.Second, func() bool {
		for _, row := range r.hx.Stat(t) {
			if row["pxname"] == "qwen" && row["addr"] == dead && strings.HasPrefix(row["status"], "DOWN") {
				down = time.Since(death)
				return true
			}
		}
		return false
	})
	wg.Wait()

	t.Logf("HAProxy marked the dead engine %s down %.2f s after it died (check inter 1s fall 2)", dead, down.Seconds())
	for _, gw := range []string{"haproxy", "nginx"} {
		res := results[gw]
		var inFlight, after, sentAfter, retried, answered int
		var lastTry time.Time
		for _, q := range res.Requests {
			failed := q.Outcome != "completed" && q.Outcome != "unfinished"
			switch {
			case q.Start.Before(death) && failed:
				inFlight++
			case failed:
				after++
			}
			if failed {
				t.Logf("%s: a request sent %+.2f s from the death failed after %.2f s: %s", gw, q.Start.Sub(death).Seconds(), q.End.Sub(q.Start).Seconds(), q.Outcome)
			}
			if q.Start.Before(death) {
				if q.Backend == dead {
					answered++
				}
				continue
			}
			sentAfter++
			// nginx's $upstream_addr names every server a request
			// tried ("dead, next"); HAProxy's header only the last.
			if strings.Contains(q.Backend, dead) {
				retried++
				lastTry = q.Start
			}
		}
		tried := "none"
		if retried > 0 {
			tried = fmt.Sprintf("%d, the last sent %.2f s after the death", retried, lastTry.Sub(death).Seconds())
		}
		t.Logf("%s: %d requests, %d answered by the engine before it died, %d sent after, %d of them failed, %d failed in flight when it died (%v); "+
			"sent after it and tried on the dead engine first: %s; sent again after a kept-alive connection closed before any answer: %d",
			gw, res.Sent, answered, sentAfter, after, inFlight, res.Errors, tried, res.Resent)
		if answered == 0 {
			t.Errorf("%s: the engine answered no request before it died: the test saw nothing", gw)
		}
		if after != 0 || res.Unfinished != 0 {
			t.Errorf("%s: %d requests sent after the engine died failed, %d unfinished (%v)", gw, after, res.Unfinished, res.Errors)
		}
		if sentAfter == 0 {
			t.Errorf("%s: no request was sent after the engine died: the test saw nothing", gw)
		}
	}
}
