package coordinator

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"heft/coordinator/fleet"
	"heft/shared/testutil"
)

// A worker away for a day is forgotten, but its capacity key stays its
// node's over a coordinator restart on the real store: another node that
// lists the key first is refused. An admin's decommission of the owner
// releases the key, in the state too, and the other node may then take it.
func TestForgottenKeyStaysItsNodesOverARestart(t *testing.T) {
	clk := newClock()
	cfg := testConfig(t)
	r := start(t, cfg, WithClock(clk.now))
	key := "gpu-a|vllm|" + testModel + "|--port=8000"
	a := admitted(t, r, clk, "gpu-a", key)
	_ = a.c.CloseNow()
	testutil.Eventually(t, "the agent seen gone", 10*time.Second, func() bool {
		ws, _ := r.Fleet().Find(fleet.Query{})
		return len(ws) == 1 && !ws[0].AgentConnected
	})
	clk.add(cfg.Fleet.ForgetAfter + cfg.Fleet.CacheTTL)
	r.Fleet().Tick()
	if _, ok := r.Fleet().Worker(key); ok {
		t.Fatal("the worker was not forgotten")
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	r = start(t, cfg, WithClock(clk.now))
	st, err := r.st.Load()
	if err != nil || st.KeyTombs[key].Node != "gpu-a" {
		t.Fatalf("stored former owner of the key: %+v %v, want gpu-a", st.KeyTombs, err)
	}
	b := connectAgent(t, r, "gpu-b")
	s := snapshot("gpu-b", clk.now(), engine(key, 8000))
	b.send(&s)
	testutil.Eventually(t, "gpu-b's claim refused", 10*time.Second, func() bool { return r.Fleet().Stats().ClaimsRefused == 1 })
	if _, ok := r.Fleet().Worker(key); ok {
		t.Fatal("gpu-b took gpu-a's forgotten key")
	}

	if status, body := r.do(t, "DELETE", "/api/v1/nodes/gpu-a?forget=workers", adminToken, ""); status != http.StatusNoContent {
		t.Fatalf("decommission gpu-a: %d %s", status, body)
	}
	if st, err := r.st.Load(); err != nil || len(st.KeyTombs) != 0 {
		t.Errorf("stored former owners after the decommission: %+v %v", st.KeyTombs, err)
	}
	s.At = clk.now().Add(time.Second)
	b.send(&s)
	testutil.Eventually(t, "gpu-b's worker", 10*time.Second, func() bool {
		w, ok := r.Fleet().Worker(key)
		return ok && w.Node == "gpu-b"
	})
}

// A tomb can outlive its node's record (here: the record gone from the
// state file, the tomb kept, as when a tomb's deletion failed and a
// restart brought it back). An admin's release of the name then frees
// the tombs and says so, where it answered 404 and left the key refused
// to every other node for up to 30 days.
func TestReleaseFreesTombsWithoutARecord(t *testing.T) {
	clk := newClock()
	cfg := testConfig(t)
	r := start(t, cfg, WithClock(clk.now))
	key := "gpu-a|vllm|" + testModel + "|--port=8000"
	a := admitted(t, r, clk, "gpu-a", key)
	_ = a.c.CloseNow()
	testutil.Eventually(t, "the agent seen gone", 10*time.Second, func() bool {
		ws, _ := r.Fleet().Find(fleet.Query{})
		return len(ws) == 1 && !ws[0].AgentConnected
	})
	clk.add(cfg.Fleet.ForgetAfter + cfg.Fleet.CacheTTL)
	r.Fleet().Tick()
	if err := r.st.DeleteNode("gpu-a"); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	r = start(t, cfg, WithClock(clk.now))
	if status, _ := r.do(t, "GET", "/api/v1/nodes/gpu-a", adminToken, ""); status != http.StatusNotFound {
		t.Fatalf("gpu-a's record after the restart: %d, want 404", status)
	}
	if held := r.Fleet().Held("gpu-a"); held.KeyTombs != 1 {
		t.Fatalf("gpu-a's tombs after the restart: %+v, want 1", held)
	}

	status, body := r.do(t, "DELETE", "/api/v1/nodes/gpu-a?forget=workers", adminToken, "")
	var got struct {
		Node   string     `json:"node"`
		Record bool       `json:"record"`
		Freed  fleet.Held `json:"freed"`
	}
	if status != http.StatusOK || json.Unmarshal(body, &got) != nil || got.Node != "gpu-a" || got.Record || got.Freed.KeyTombs != 1 {
		t.Fatalf("decommission of gpu-a's tombs: %d %s, want 200 with 1 key tomb freed", status, body)
	}
	if st, err := r.st.Load(); err != nil || len(st.KeyTombs) != 0 {
		t.Errorf("stored tombs after the release: %+v %v", st.KeyTombs, err)
	}
	if status, body := r.do(t, "DELETE", "/api/v1/nodes/gpu-a", adminToken, ""); status != http.StatusNotFound {
		t.Errorf("a second release: %d %s, want 404 (nothing left)", status, body)
	}
	b := connectAgent(t, r, "gpu-b")
	s := snapshot("gpu-b", clk.now(), engine(key, 8000))
	b.send(&s)
	testutil.Eventually(t, "gpu-b's worker", 10*time.Second, func() bool {
		w, ok := r.Fleet().Worker(key)
		return ok && w.Node == "gpu-b"
	})
}
