package coordinator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

// until reads messages until one of type typ comes, and returns it.
func (a *agent) until(typ string) *wire.Envelope {
	a.t.Helper()
	for {
		if env := a.read(); env.Type == typ {
			return env
		}
	}
}

// A coordinator restarted on an empty state takes the measurement the
// agent held from the last one, over the real websocket, into its real
// store: the worker serves its weight and no probe is asked. The offers
// it cannot trust are refused and their workers probed.
func TestEmptyCoordinatorTakesAgentsMeasurement(t *testing.T) {
	r1 := start(t, testConfig(t))
	a, key := oneEngine(t, r1)
	req := a.until(wire.TypeProbeRequest).ProbeRequest
	a.send(&wire.ProbeResult{RequestID: req.RequestID, Measurement: measured(key, "gpu-a", 992, time.Now())})
	kept := *a.until(wire.TypeCached).Cached // what the agent keeps
	if kept.Measurement.ThroughputTPS != 992 || !kept.ExpiresAt.After(time.Now()) {
		t.Fatalf("the agent was handed %+v", kept)
	}
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(t) // a new, empty state dir
	r2 := start(t, cfg)
	a2 := connectAgent(t, r2, "gpu-a", kept)
	s := snapshot("gpu-a", time.Now(), engine(key, 8000))
	a2.send(&s)
	if env := a2.read(); env.Type != wire.TypeCached || env.Cached.Measurement.ThroughputTPS != 992 {
		t.Fatalf("after the snapshot: %s %+v, want the taken measurement handed back, and no probe request", env.Type, env)
	}
	path := "/api/v1/models/" + strings.ReplaceAll(testModel, "/", "%2F") + "/weights"
	var wt view.Weights
	testutil.Eventually(t, "the worker in the weight table", 10*time.Second, func() bool {
		status, body := r2.do(t, "GET", path, "", "")
		return status == http.StatusOK && json.Unmarshal(body, &wt) == nil && len(wt.Workers) == 1
	})
	if e := wt.Workers[0]; e.ID != key || e.Throughput == nil || *e.Throughput != 992 {
		t.Fatalf("weights %+v", wt)
	}
	for _, line := range []string{
		`heft_measurements_handed_over_total{outcome="taken"} 1`,
		`heft_measurements_handed_over_total{outcome="refused"} 0`,
		`heft_probe_requests_total{reason="registration"} 0`,
	} {
		if !r2.exposes(t, line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}

	// Two more nodes offer what cannot be taken: an expired measurement,
	// and one of another model. Each is measured instead.
	old := measured("gpu-b|vllm|"+testModel+"|--port=8001", "gpu-b", 900, time.Now().Add(-7*time.Hour))
	other := measured("gpu-c|vllm|"+testModel+"|--port=8002", "gpu-c", 900, time.Now())
	other.Model = "another/model"
	for _, o := range []struct {
		node string
		m    wire.Measurement
		port int
	}{{"gpu-b", old, 8001}, {"gpu-c", other, 8002}} {
		b := connectAgent(t, r2, o.node, wire.CachedMeasurement{Measurement: o.m, ExpiresAt: time.Now().Add(time.Hour)})
		s := snapshot(o.node, time.Now(), engine(o.m.CapacityKey, o.port))
		b.send(&s)
		if req := b.until(wire.TypeProbeRequest).ProbeRequest; req.CapacityKey != o.m.CapacityKey || req.Reason != wire.ReasonRegistration {
			t.Errorf("%s: probe request %+v, want a registration probe", o.node, req)
		}
	}
	if !r2.exposes(t, `heft_measurements_handed_over_total{outcome="refused"} 2`) {
		t.Error("/metrics does not count the two refused offers")
	}

	// The taken measurement is in the store: a restart on that state
	// serves it with no agent at all.
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
	r3 := start(t, cfg)
	var w view.Worker
	status, body := r3.do(t, "GET", "/api/v1/workers/"+key, "", "")
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.Measurement == nil || w.Measurement.ThroughputTPS != 992 {
		t.Fatalf("after a restart on the new state: %d %s", status, body)
	}
}
