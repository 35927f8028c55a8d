package coordinator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"heft/coordinator/fleet"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

// Decommission is one call: DELETE /api/v1/nodes/NAME?forget=workers on a
// node whose agent is gone (its worker offline, its agent_offline alert
// firing) leaves nothing of it in /api/v1/workers or on /metrics, in
// memory or in the state.
func TestDecommissionForgetsWorkersAndAlerts(t *testing.T) {
	clk := newClock()
	r := start(t, testConfig(t), WithClock(clk.now))
	key := "gpu-a|vllm|" + testModel + "|--port=8000"
	a := admitted(t, r, clk, "gpu-a", key)
	if status, body := r.do(t, "POST", "/api/v1/workers/"+key+"/pin", adminToken, `{"weight":1.5}`); status != http.StatusOK {
		t.Fatalf("pin: %d %s", status, body)
	}

	// The host is switched off: the agent goes, the worker turns offline
	// with its critical alert.
	_ = a.c.CloseNow()
	testutil.Eventually(t, "the agent seen gone", 10*time.Second, func() bool {
		ws, _ := r.Fleet().Find(fleet.Query{})
		return len(ws) == 1 && !ws[0].AgentConnected
	})
	clk.add(fleet.DefaultConfig().OfflineGrace + fleet.DefaultConfig().CacheTTL)
	r.Fleet().Tick()
	alert := `heft_worker_warning_active{code="agent_offline",id="` + key + `",model="` + testModel + `",node="gpu-a",severity="critical"} 1`
	if !r.exposes(t, alert) {
		t.Fatalf("no offline alert before the decommission:\n%s", metricLines(t, r))
	}

	if status, body := r.do(t, "DELETE", "/api/v1/nodes/gpu-a?forget=nodes", adminToken, ""); status != http.StatusBadRequest {
		t.Errorf("forget=nodes: %d %s, want 400", status, body)
	}
	if status, body := r.do(t, "DELETE", "/api/v1/nodes/gpu-a?forget=workers", adminToken, ""); status != http.StatusNoContent {
		t.Fatalf("decommission: %d %s", status, body)
	}
	status, body := r.do(t, "GET", "/api/v1/workers", "", "")
	var list view.Workers
	if status != http.StatusOK || json.Unmarshal(body, &list) != nil || len(list.Workers) != 0 {
		t.Errorf("workers after the decommission: %d %s", status, body)
	}
	if lines := metricLines(t, r); strings.Contains(lines, `node="gpu-a"`) {
		t.Errorf("series of gpu-a remain on /metrics:\n%s", lines)
	}
	if status, _ := r.do(t, "GET", "/api/v1/nodes/gpu-a", adminToken, ""); status != http.StatusNotFound {
		t.Errorf("node record after the decommission: %d", status)
	}
	st, err := r.st.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Pins) != 0 || len(st.Workers) != 0 {
		t.Errorf("the state still holds pins %v, workers %d", st.Pins, len(st.Workers))
	}
}

// admitted connects node's agent, lists one engine under key and answers
// its probe, and returns once the worker is admitted.
func admitted(t *testing.T, r *running, clk *clock, node, key string) *agent {
	t.Helper()
	a := connectAgent(t, r, node)
	s := snapshot(node, clk.now(), engine(key, 8000))
	a.send(&s)
	var req *wire.ProbeRequest
	for req == nil {
		if env := a.read(); env.Type == wire.TypeProbeRequest {
			req = env.ProbeRequest
		}
	}
	a.send(&wire.ProbeResult{RequestID: req.RequestID, Measurement: measured(key, node, 900, clk.now())})
	testutil.Eventually(t, "the worker admitted", 10*time.Second, func() bool {
		ws, _ := r.Fleet().Find(fleet.Query{State: view.StateAdmitted})
		return len(ws) == 1
	})
	return a
}

// metricLines is /metrics without comments, for messages and searches.
func metricLines(t *testing.T, r *running) string {
	t.Helper()
	_, body := r.do(t, "GET", "/metrics", "", "")
	var out []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "heft_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A name forgotten after forget_nodes_after goes the way an admin's
// release goes (fleet.ForgetNode): its pins, decisions, keys and
// measurements are forgotten with it, in the state too, so whoever says
// the name next inherits nothing. Before, the record went and the pin and
// the admit stayed for the next holder.
func TestForgottenNameLeavesNothingToInherit(t *testing.T) {
	clk := newClock()
	cfg := testConfig(t)
	cfg.Nodes.ForgetAfter = 48 * time.Hour
	r := start(t, cfg, WithClock(clk.now))
	key := "gpu-a|vllm|" + testModel + "|--port=8000"
	a := admitted(t, r, clk, "gpu-a", key)
	for _, act := range []struct{ path, body string }{{"/pin", `{"weight":1.5}`}, {"/admit", ""}} {
		if status, body := r.do(t, "POST", "/api/v1/workers/"+key+act.path, adminToken, act.body); status != http.StatusOK {
			t.Fatalf("%s: %d %s", act.path, status, body)
		}
	}
	_ = a.c.CloseNow()
	testutil.Eventually(t, "the agent seen gone", 10*time.Second, func() bool {
		ws, _ := r.Fleet().Find(fleet.Query{})
		return len(ws) == 1 && !ws[0].AgentConnected
	})
	clk.add(49 * time.Hour)
	testutil.Eventually(t, "the name forgotten", 10*time.Second, func() bool {
		status, _ := r.do(t, "GET", "/api/v1/nodes/gpu-a", adminToken, "")
		return status == http.StatusNotFound
	})
	st, err := r.st.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Pins) != 0 || len(st.Decisions) != 0 || len(st.Latest) != 0 || len(st.Workers) != 0 {
		t.Errorf("the forgotten name's state remains: pins %v, decisions %v, measurements %d, workers %d",
			st.Pins, st.Decisions, len(st.Latest), len(st.Workers))
	}
	// The next holder of the name is probed, and neither pinned nor admitted.
	b := connectAgent(t, r, "gpu-a")
	s := snapshot("gpu-a", clk.now(), engine(key, 8000))
	b.send(&s)
	for {
		env := b.read()
		if env.Type == wire.TypeCached {
			t.Fatal("the next holder of the name was handed the old measurement")
		}
		if env.Type == wire.TypeProbeRequest {
			break
		}
	}
	if w, ok := r.Fleet().Worker(key); !ok || w.PinnedWeight != nil || w.AdminDecision != "" {
		t.Errorf("the next holder's worker: pinned %v, decision %q", w.PinnedWeight, w.AdminDecision)
	}
}
