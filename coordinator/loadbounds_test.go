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

// A load a little past a full pool is shown as sent; a kv_usage that is
// no fraction of a pool (a percentage) refuses the snapshot with a reason
// that names it, and loses nothing stored before: the worker, its
// measurement and its pin are still there, also after a restart.
func TestAbsurdKVUsageRefusedNothingLost(t *testing.T) {
	cfg := testConfig(t)
	r := start(t, cfg)
	a, key := oneEngine(t, r)
	var req *wire.ProbeRequest
	for req == nil {
		if env := a.read(); env.Type == wire.TypeProbeRequest {
			req = env.ProbeRequest
		}
	}
	a.send(&wire.ProbeResult{RequestID: req.RequestID, Measurement: measured(key, "gpu-a", 992, time.Now())})
	if status, body := r.do(t, "POST", "/api/v1/workers/"+key+"/pin", adminToken, `{"weight":1.5}`); status != http.StatusOK {
		t.Fatalf("pin: %d %s", status, body)
	}
	worker := func(r *running) view.Worker {
		t.Helper()
		var w view.Worker
		status, body := r.do(t, "GET", "/api/v1/workers/"+key, "", "")
		if status != http.StatusOK || json.Unmarshal(body, &w) != nil {
			t.Fatalf("worker: %d %s", status, body)
		}
		return w
	}
	kept := func(w view.Worker, when string) {
		t.Helper()
		if w.Throughput == nil || *w.Throughput != 992 || w.PinnedWeight == nil || *w.PinnedWeight != 1.5 {
			t.Fatalf("%s: throughput %v pin %v, want 992 and 1.5", when, w.Throughput, w.PinnedWeight)
		}
	}

	e := engine(key, 8000)
	e.Load = wire.Load{Known: true, Running: 60, Waiting: 4, KVUsage: 1.02, Ranks: []wire.RankLoad{{Running: 60, Waiting: 4, KVUsage: 1.02}}}
	s := snapshot("gpu-a", time.Now(), e)
	a.send(&s)
	testutil.Eventually(t, "the load past a full pool shown as sent", 10*time.Second, func() bool {
		return worker(r).Load.KVUsage == 1.02
	})

	// wire.Encode refuses it too, so the message is built by hand.
	e.Load.KVUsage, e.Load.Ranks[0].KVUsage = 85, 85
	data, err := json.Marshal(wire.Envelope{Version: wire.ProtocolVersion, Type: wire.TypeSnapshot, Snapshot: new(snapshot("gpu-a", time.Now(), e))})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.c.Write(t.Context(), websocket.MessageText, data); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := a.next()
		if err == nil {
			continue
		}
		if websocket.CloseStatus(err) != websocket.StatusPolicyViolation || !strings.Contains(err.Error(), "load.kv_usage is 85, above 2") {
			t.Fatalf("connection ended with %v, want a policy violation naming load.kv_usage", err)
		}
		break
	}
	w := worker(r)
	kept(w, "after the refused snapshot")
	if w.Load.KVUsage != 1.02 {
		t.Errorf("after the refused snapshot the load reads %v, want the last accepted 1.02", w.Load.KVUsage)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	kept(worker(start(t, cfg)), "after a restart")
}
