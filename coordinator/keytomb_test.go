package coordinator

import (
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
