package probe

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/shared/wire"
	"heft/sim"
)

// SGLang writes its load gauges every 40 decode steps and, once idle,
// only every 30 s: after two users' requests have ended, its /metrics go
// on showing them running for half a minute. The probe reads the load the
// scheduler has now (/v1/loads), so it measures the engine as soon as it
// is idle instead of waiting out the gauges, or giving up.
func TestSimSGLangIdleReadLive(t *testing.T) {
	t.Parallel()
	s, client, counters, _, _ := sharedSim(t, wire.EngineSGLang, 0)
	body := []byte(`{"model":"` + sim.DefaultModel + `","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":100,"min_tokens":100,"ignore_eos":true}`)
	var users sync.WaitGroup
	for range 2 {
		users.Go(func() {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL()+"/v1/chat/completions", bytes.NewReader(body))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	users.Wait()
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	gauges, err := engine.ParseMetrics(wire.EngineSGLang, resp.Body)
	resp.Body.Close()
	if err != nil || gauges.Load.Running != 2 {
		t.Fatalf("the gauges show %+v (%v), want the two ended requests still running", gauges.Load, err)
	}
	if c, err := client.Counters(t.Context()); err != nil || c.Load.Running != 0 {
		t.Errorf("the counters' load %+v (%v), want the scheduler's: none running", c.Load, err)
	}
	start := time.Now()
	m := mustRun(t, Config{URL: s.URL(), Kind: wire.EngineSGLang, Tokens: 64, CapacityKey: "k", Trigger: wire.ReasonOnDemand,
		Load: client.Load, Counters: counters, Busy: BusyWait, BusyWait: 5 * time.Second,
		ReadyTimeout: 10 * time.Second, BurstTimeout: 30 * time.Second, settle: 50 * time.Millisecond})
	if !m.Valid() || m.LoadBefore.Running+m.LoadBefore.Waiting != 0 || m.BusyWaitSeconds != 0 {
		t.Errorf("valid %v, load before %+v, waited %.1f s for an idle engine (%s in all); problems %q",
			m.Valid(), m.LoadBefore, m.BusyWaitSeconds, time.Since(start).Round(time.Second), m.Problems)
	}
}
