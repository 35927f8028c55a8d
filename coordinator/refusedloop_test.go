package coordinator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

// An agent that comes back only to say hello and send a snapshot the
// coordinator refuses (closed 1008), over and over, has said nothing valid
// about its engine since it left: its worker turns stale after the grace
// and offline once stale_weight_ttl has run from the first departure, as
// if the agent had stayed away; it never shows as admitted meanwhile, not
// even while one of those connections is open. Each hello used to restart
// the clock, so the loop kept the last weight forever. A hello followed by
// a valid snapshot brings the worker back at once, as before.
func TestRefusedSnapshotsDoNotBringTheAgentBack(t *testing.T) {
	clk := newClock()
	cfg := testConfig(t)
	ttl := 10 * time.Minute
	cfg.Fleet.StaleWeightTTL = ttl
	r := start(t, cfg, WithClock(clk.now))
	key := "gpu-a|vllm|" + testModel + "|--port=8000"
	a := admitted(t, r, clk, "gpu-a", key)
	left := clk.now()
	_ = a.c.CloseNow()
	gone := func() {
		t.Helper()
		testutil.Eventually(t, "the agent seen gone", 10*time.Second, func() bool {
			w, ok := r.Fleet().Worker(key)
			return ok && !w.AgentConnected
		})
	}
	gone()

	worker := func() view.Worker {
		t.Helper()
		var w view.Worker
		status, body := r.do(t, "GET", "/api/v1/workers/"+key, "", "")
		if status != http.StatusOK || json.Unmarshal(body, &w) != nil {
			t.Fatalf("worker: %d %s", status, body)
		}
		return w
	}
	// away checks the worker reads as its agent being away: stale with its
	// weight and a warning before the TTL from the departure, offline
	// without one and a critical warning from then on.
	away := func(when string, connected bool) {
		t.Helper()
		w := worker()
		x, ok := warningOf(w, wire.CodeAgentOffline)
		if clk.now().Before(left.Add(ttl)) {
			if w.State != view.StateStale || w.Weight == nil || !ok || x.Severity != wire.SeverityWarning {
				t.Fatalf("%s, %s after the agent left: state %s weight %v agent_offline %+v, want stale with its weight",
					when, clk.now().Sub(left), w.State, w.Weight, x)
			}
		} else if w.State != view.StateOffline || w.Weight != nil || !ok || x.Severity != wire.SeverityCritical {
			t.Fatalf("%s, %s after the agent left: state %s weight %v agent_offline %+v, want offline without a weight",
				when, clk.now().Sub(left), w.State, w.Weight, x)
		}
		if connected && strings.Contains(x.Message, "not connected") {
			t.Errorf("%s: the warning says the agent is not connected while it is: %s", when, x.Message)
		}
		if !strings.Contains(x.Message, left.UTC().Format(time.RFC3339)) {
			t.Errorf("%s: the warning does not date the departure (%s): %s", when, left.UTC().Format(time.RFC3339), x.Message)
		}
		if w.AgentConnected != connected {
			t.Errorf("%s: agent_connected %v, want %v", when, w.AgentConnected, connected)
		}
	}

	// Three ways a snapshot is refused: a load no engine reports (the
	// decoder), a model name no gateway may be given (the grammar),
	// another node's name (the hub).
	refused := func(i int) []byte {
		e := engine(key, 8000)
		s := snapshot("gpu-a", clk.now(), e)
		switch i % 3 {
		case 0:
			s.Engines[0].Load = wire.Load{Known: true, KVUsage: 85, Ranks: []wire.RankLoad{{KVUsage: 85}}}
		case 1:
			s.Engines[0].Model = "Qwen/Qwen3-8B\nserver evil 10.9.9.9:80"
		case 2:
			s.Node = "gpu-b"
		}
		data, err := json.Marshal(wire.Envelope{Version: wire.ProtocolVersion, Type: wire.TypeSnapshot, Snapshot: &s})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	step := 2 * time.Minute
	for i := 0; clk.now().Sub(left) < ttl+2*step; i++ {
		clk.add(step)
		b := connectAgent(t, r, "gpu-a")
		testutil.Eventually(t, "the new connection registered", 10*time.Second, func() bool {
			w, ok := r.Fleet().Worker(key)
			return ok && w.AgentConnected
		})
		away("after a hello", true)
		if err := b.c.Write(t.Context(), websocket.MessageText, refused(i)); err != nil {
			t.Fatal(err)
		}
		if _, err := b.next(); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
			for err == nil {
				_, err = b.next()
			}
			if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
				t.Fatalf("refused snapshot %d: the connection ended with %v, want 1008", i, err)
			}
		}
		gone()
		r.Fleet().Tick()
		away("after a refused snapshot", false)
	}
	if wt := weightsOf(t, r); len(wt) != 0 {
		t.Errorf("the weight table still routes to the looping agent's engine: %v", wt)
	}

	// The agent fixed: a hello and a valid snapshot bring the worker back
	// at once, its measurement reused (no burst).
	c := connectAgent(t, r, "gpu-a")
	s := snapshot("gpu-a", clk.now(), engine(key, 8000))
	c.send(&s)
	testutil.Eventually(t, "the worker back", 10*time.Second, func() bool {
		w, ok := r.Fleet().Worker(key)
		return ok && w.State == view.StateAdmitted && w.Weight != nil && w.AgentConnected
	})
	if x, ok := warningOf(worker(), wire.CodeAgentOffline); ok {
		t.Errorf("back with a valid snapshot, still warned: %+v", x)
	}
	if wt := weightsOf(t, r); wt[key] != 1 {
		t.Errorf("weights after the valid snapshot: %v, want %s at 1", wt, key)
	}
}

func warningOf(w view.Worker, code string) (view.Warning, bool) {
	for _, x := range w.Warnings {
		if x.Code == code {
			return x, true
		}
	}
	return view.Warning{}, false
}

// weightsOf is the weight table of testModel, by worker ID.
func weightsOf(t *testing.T, r *running) map[string]float64 {
	t.Helper()
	wt, ok, err := r.Fleet().WeightsOf(testModel, view.WeightDecode)
	out := map[string]float64{}
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return out
	}
	for _, w := range wt.Workers {
		out[w.ID] = w.Weight
	}
	return out
}
