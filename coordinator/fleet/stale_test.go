package fleet

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"heft/shared/view"
	"heft/shared/wire"
)

// The agent being gone says nothing of the engine: its worker stays
// routed at its last weight (stale) until stale_weight_ttl after the
// disconnect. Only the agent saying the engine is down, or the TTL running
// out, takes it out; a coordinator restart changes neither.

func TestEngineDownBeforeTheAgentLeftGoesOffline(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.admit("n2", engine("k2", "http://2:8000", "m"), 640)
	down := engine("k", "http://1:8000", "m")
	down.Ready = false
	h.put("n", down)
	if w := h.worker("k"); w.State != view.StatePending || w.Weight != nil {
		t.Fatalf("engine not ready: state %s weight %v, want pending without a weight", w.State, w.Weight)
	}
	h.disconnect("n")
	h.clk.advance(time.Minute)
	h.f.Tick()
	w := h.worker("k")
	x, ok := warning(w, wire.CodeAgentOffline)
	if w.State != view.StateOffline || w.Weight != nil || !ok || x.Severity != wire.SeverityCritical {
		t.Fatalf("agent gone after saying its engine was down: state %s weight %v warning %+v, want offline", w.State, w.Weight, x)
	}
	if wt := h.weights("m"); len(wt) != 1 || wt["k2"] != 1 {
		t.Errorf("weights %v, want k2 alone", wt)
	}
}

func TestStaleWeightTTLSetting(t *testing.T) {
	cfg := testConfig()
	cfg.StaleWeightTTL = 10 * time.Minute
	h := newHarnessWith(t, cfg, newMemStore(), &clock{t: t0})
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.disconnect("n")
	h.clk.advance(10*time.Minute - time.Second)
	h.f.Tick()
	if w := h.worker("k"); w.State != view.StateStale || w.Weight == nil {
		t.Fatalf("within stale_weight_ttl: state %s weight %v", w.State, w.Weight)
	}
	h.clk.advance(time.Second)
	h.f.Tick()
	if w := h.worker("k"); w.State != view.StateOffline || w.Weight != nil {
		t.Fatalf("at stale_weight_ttl: state %s weight %v, want offline", w.State, w.Weight)
	}
	cfg.StaleWeightTTL = -time.Second
	if cfg.Validate() == nil {
		t.Error("a negative stale_weight_ttl validated")
	}
}

func TestAdminHoldOfAStaleWorker(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.disconnect("n")
	h.clk.advance(time.Minute)
	h.f.Tick()
	if err := h.f.Hold("k"); err != nil {
		t.Fatal(err)
	}
	if w := h.worker("k"); w.State != view.StateOffline || w.Weight != nil {
		t.Errorf("held while away: state %s weight %v, want out of the table", w.State, w.Weight)
	}
	if err := h.f.Admit("k"); err != nil {
		t.Fatal(err)
	}
	if w := h.worker("k"); w.State != view.StateStale || w.Weight == nil {
		t.Errorf("hold lifted while away: state %s weight %v, want stale again", w.State, w.Weight)
	}
}

func TestReconnectEndsStale(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.disconnect("n")
	h.clk.advance(time.Hour)
	h.f.Tick()
	h.connect("n")
	h.snapshot("n")
	w := h.worker("k")
	if _, ok := warning(w, wire.CodeAgentOffline); w.State != view.StateAdmitted || ok {
		t.Fatalf("reconnected: state %s warnings %+v", w.State, w.Warnings)
	}
	if r := h.st.state().Workers["k"]; r.AgentGone != nil || r.EngineDown {
		t.Errorf("record after the reconnect: gone %v down %v, want neither", r.AgentGone, r.EngineDown)
	}
}

// A restart shows k (stale before it) stale, and k2 (its agent said the
// engine was down, then left) and k3 (stale past its TTL) offline.
func TestRestartDoesNotReviveTheDead(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.admit("n2", engine("k2", "http://2:8000", "m"), 640)
	h.admit("n3", engine("k3", "http://3:8000", "m"), 640)
	h.disconnect("n3")
	h.clk.advance(5 * time.Hour)
	down := engine("k2", "http://2:8000", "m")
	down.Ready = false
	h.put("n2", down)
	h.disconnect("n2")
	h.disconnect("n")
	h.clk.advance(90 * time.Minute) // n3 gone 6.5 h: offline; n, n2 gone 1.5 h
	h.f.Tick()
	want := map[string]string{"k": view.StateStale, "k2": view.StateOffline, "k3": view.StateOffline}
	check := func(h *harness, when string) {
		t.Helper()
		for id, st := range want {
			if w := h.worker(id); w.State != st || (w.Weight != nil) != view.Serving(st) {
				t.Errorf("%s: %s is %s with weight %v, want %s", when, id, w.State, w.Weight, st)
			}
		}
	}
	check(h, "before the restart")

	h2 := h.restart()
	check(h2, "right after the restart")
	if wt := h2.weights("m"); len(wt) != 1 || wt["k"] != 1 {
		t.Errorf("weights after the restart %v, want the stale k alone", wt)
	}
	// k's stale weight still ends 6 h after its agent left, not after the
	// restart.
	h2.clk.advance(4*time.Hour + 30*time.Minute)
	h2.f.Tick()
	want["k"] = view.StateOffline
	check(h2, "6 h after k's agent left")
}

// A worker whose agent was connected when the coordinator stopped counts
// as gone from that start; a second restart keeps that time.
func TestRestartsKeepCountingFromTheFirst(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h2 := h.restart() // at t0: n counts as gone from now
	if r := h2.st.state().Workers["k"]; r.AgentGone == nil || !r.AgentGone.Equal(t0) {
		t.Fatalf("record after the restart says gone at %v, want %v", r.AgentGone, t0)
	}
	h2.clk.advance(5 * time.Hour)
	h3 := h2.restart()
	if w := h3.worker("k"); w.State != view.StateStale {
		t.Fatalf("5 h after the first restart: %s, want stale", w.State)
	}
	h3.clk.advance(time.Hour)
	h3.f.Tick()
	if w := h3.worker("k"); w.State != view.StateOffline {
		t.Fatalf("6 h after the first restart: %s, want offline", w.State)
	}
}

// A worker held as an outlier whose agent left is let in, stale, when its
// model's median catches up with it; its stale weight still ends at
// stale_weight_ttl, although only another worker's measurement moved it.
func TestReleasedOutlierStaysStaleNoLonger(t *testing.T) {
	cfg := testConfig()
	cfg.StaleWeightTTL = 10 * time.Minute
	h := newHarnessWith(t, cfg, newMemStore(), &clock{t: t0})
	h.admit("n1", engine("a", "http://1:8000", "m"), 1000)
	h.admit("n2", engine("b", "http://2:8000", "m"), 9000)
	h.admit("n3", engine("c", "http://3:8000", "m"), 1100)
	if b := h.worker("b"); b.State != view.StateHeld {
		t.Fatalf("b: %s, want held as an outlier", b.State)
	}
	h.disconnect("n2")
	h.clk.advance(time.Minute)
	h.f.Tick()
	h.admit("n4", engine("d", "http://4:8000", "m"), 8000)
	h.admit("n5", engine("e", "http://5:8000", "m"), 7000)
	if b := h.worker("b"); b.State != view.StateStale || b.Weight == nil {
		t.Fatalf("b after the median rose: %s weight %v, want stale with a weight", b.State, b.Weight)
	}
	h.clk.advance(9 * time.Minute)
	h.f.Tick()
	if b := h.worker("b"); b.State != view.StateOffline || b.Weight != nil {
		t.Fatalf("b at stale_weight_ttl: %s weight %v, want offline", b.State, b.Weight)
	}
}

// The weight table marks a worker whose agent is away: its entry says
// "state":"stale" (decode and prefill tables alike), never passing for a
// fresh one, while the other worker's says "admitted". Each entry carries
// its engine's max_running, null while the agent has not said it.
func TestStaleWorkerWeightEntrySaysStale(t *testing.T) {
	h := newHarness(t)
	away := engine("k", "http://1:8000", "m")
	away.MaxRunning = 48
	h.admitPrefill("n", away, 640, 8000)
	h.admitPrefill("n2", engine("k2", "http://2:8000", "m"), 640, 8000)
	h.disconnect("n")
	h.clk.advance(time.Minute)
	h.f.Tick()
	if w := h.worker("k"); w.State != view.StateStale {
		t.Fatalf("agent away a minute: state %s, want stale", w.State)
	}
	for _, kind := range []string{view.WeightDecode, view.WeightPrefill} {
		wt, ok, err := h.f.WeightsOf("m", kind)
		if !ok || err != nil || len(wt.Workers) != 2 {
			t.Fatalf("%s table: ok %v err %v %+v, want both workers (fail static)", kind, ok, err, wt)
		}
		body, err := json.Marshal(wt)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Workers []map[string]any `json:"workers"`
		}
		if err := json.Unmarshal(body, &doc); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"k": view.StateStale, "k2": view.StateAdmitted}
		wantRunning := map[string]any{"k": 48.0, "k2": nil}
		for _, e := range doc.Workers {
			id, _ := e["id"].(string)
			if e["state"] != want[id] {
				t.Errorf("%s table: %s has \"state\":%v, want %q\n%s", kind, id, e["state"], want[id], body)
			}
			if running, ok := e["max_running"]; !ok || running != wantRunning[id] {
				t.Errorf("%s table: %s has \"max_running\":%v (present %v), want %v", kind, id, running, ok, wantRunning[id])
			}
		}
	}
}

// An agent back only to say hello (its snapshots refused, or none sent)
// has said nothing valid of its engine since it left: the grace and the
// stale weight's TTL run on from its departure, whether a connection is
// open or not, in the record too, so a restart keeps that time. Each
// hello used to restart both, so a looping agent kept its weight forever.
// A valid snapshot brings it back.
func TestHelloAloneDoesNotBringTheAgentBack(t *testing.T) {
	cfg := testConfig()
	cfg.StaleWeightTTL = 10 * time.Minute
	h := newHarnessWith(t, cfg, newMemStore(), &clock{t: t0})
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.admit("n2", engine("k2", "http://2:8000", "m"), 640)
	h.disconnect("n")
	left := h.clk.now()
	check := func(when string, connected bool) {
		t.Helper()
		w := h.worker("k")
		x, ok := warning(w, wire.CodeAgentOffline)
		away := h.clk.now().Sub(left)
		switch {
		case away < cfg.OfflineGrace:
			if w.State != view.StateAdmitted {
				t.Fatalf("%s, %s after the agent left: %s, want admitted within the grace", when, away, w.State)
			}
		case away < cfg.StaleWeightTTL:
			if w.State != view.StateStale || w.Weight == nil || !ok || x.Severity != wire.SeverityWarning {
				t.Fatalf("%s, %s after the agent left: %s weight %v warning %+v, want stale", when, away, w.State, w.Weight, x)
			}
		default:
			if w.State != view.StateOffline || w.Weight != nil || !ok || x.Severity != wire.SeverityCritical {
				t.Fatalf("%s, %s after the agent left: %s weight %v warning %+v, want offline", when, away, w.State, w.Weight, x)
			}
		}
		if ok && connected != !strings.Contains(x.Message, "is not connected") {
			t.Errorf("%s: connected %v, warning %q", when, connected, x.Message)
		}
		if w.AgentConnected != connected {
			t.Errorf("%s: agent_connected %v, want %v", when, w.AgentConnected, connected)
		}
		if r := h.st.state().Workers["k"]; r.AgentGone == nil || !r.AgentGone.Equal(left) {
			t.Errorf("%s: the record says the agent left at %v, want %v", when, r.AgentGone, left)
		}
	}
	for h.clk.now().Sub(left) < cfg.StaleWeightTTL+5*time.Minute {
		h.clk.advance(20 * time.Second)
		h.connect("n")
		h.f.Tick()
		check("after a hello", true)
		h.disconnect("n")
		h.f.Tick()
		check("after the connection ended", false)
	}
	if wt := h.weights("m"); len(wt) != 1 || wt["k2"] != 1 {
		t.Errorf("weights %v, want k2 alone", wt)
	}
	h2 := h.restart()
	if w := h2.worker("k"); w.State != view.StateOffline {
		t.Errorf("after a restart: %s, want offline", w.State)
	}
	h2.connect("n")
	h2.snapshot("n")
	if w := h2.worker("k"); w.State != view.StateAdmitted || w.Weight == nil || !w.AgentConnected {
		t.Errorf("after a valid snapshot: %s weight %v connected %v, want admitted", w.State, w.Weight, w.AgentConnected)
	}
	if r := h2.st.state().Workers["k"]; r.AgentGone != nil {
		t.Errorf("after a valid snapshot the record says the agent left at %v", r.AgentGone)
	}
}

// A connection that replaces a reporting one without a snapshot of its own
// counts as the agent away from the replacement: stale after the grace,
// until stale_weight_ttl from then. The snapshot an agent sends at once
// keeps the worker admitted throughout.
func TestReplacedConnectionCountsFromTheReplacement(t *testing.T) {
	cfg := testConfig()
	cfg.StaleWeightTTL = 10 * time.Minute
	h := newHarnessWith(t, cfg, newMemStore(), &clock{t: t0})
	h.admit("n", engine("k", "http://1:8000", "m"), 640)
	h.clk.advance(time.Hour)
	h.connect("n")
	h.snapshot("n")
	h.clk.advance(time.Hour)
	if w := h.worker("k"); w.State != view.StateAdmitted {
		t.Fatalf("a reconnect with its snapshot: %s, want admitted", w.State)
	}
	replaced := h.clk.now()
	h.connect("n")
	h.clk.advance(cfg.OfflineGrace - time.Second)
	h.f.Tick()
	if w := h.worker("k"); w.State != view.StateAdmitted {
		t.Fatalf("within the grace of the replacement: %s, want admitted", w.State)
	}
	h.clk.advance(time.Second)
	h.f.Tick()
	w := h.worker("k")
	x, _ := warning(w, wire.CodeAgentOffline)
	if w.State != view.StateStale || !strings.Contains(x.Message, replaced.UTC().Format(time.RFC3339)) {
		t.Fatalf("the grace after the replacement out: %s %+v, want stale since %v", w.State, x, replaced)
	}
	h.clk.advance(cfg.StaleWeightTTL - cfg.OfflineGrace)
	h.f.Tick()
	if w := h.worker("k"); w.State != view.StateOffline {
		t.Fatalf("stale_weight_ttl after the replacement: %s, want offline", w.State)
	}
	h.snapshot("n")
	if w := h.worker("k"); w.State != view.StateAdmitted {
		t.Fatalf("a valid snapshot on the connection: %s, want admitted", w.State)
	}
}
