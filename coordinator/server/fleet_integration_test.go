package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/coordinator/fleet"
	"heft/coordinator/store"
	"heft/coordinator/view"
	"heft/shared/wire"
)

// startReal runs a server over the real fleet and a bbolt store in dir.
func startReal(t *testing.T, dir string) (*testServer, *store.Bolt) {
	t.Helper()
	logger := hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug})
	st, err := store.Open(dir, logger)
	if err != nil {
		t.Fatalf("store: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() }) // after the server's own cleanup
	f, err := fleet.New(fleet.DefaultConfig(), st, nil, logger)
	if err != nil {
		t.Fatalf("fleet: %v", err)
	}
	s, err := New(testConfig(), f, logger)
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	return runServer(t, s, "http"), st
}

// The whole path with the real fleet and store: an agent registers an
// engine, is asked for a probe, answers, and the weight appears; a pin
// survives a restart of the coordinator.
func TestRealFleetEndToEnd(t *testing.T) {
	dir := t.TempDir()
	ts, st := startReal(t, dir)
	const model = "Qwen/Qwen3-8B"
	key := "gpu-a|vllm|" + model + "|--max-num-seqs=64"

	a := connectAgent(t, ts, "gpu-a")
	a.send(&wire.Snapshot{Node: "gpu-a", At: time.Now(), Host: wire.Host{Hostname: "gpu-a"}, Engines: []wire.Engine{{
		Kind: wire.EngineVLLM, URL: "http://127.0.0.1:8000", Model: model, Ready: true, CapacityKey: key,
		LaunchArgs: []string{"--max-num-seqs=64"},
	}}})
	var req *wire.ProbeRequest
	for req == nil {
		if env := a.read(); env.Type == wire.TypeProbeRequest {
			req = env.ProbeRequest
		}
	}
	if req.CapacityKey != key || req.Reason != wire.ReasonRegistration {
		t.Fatalf("probe request %+v", req)
	}
	now := time.Now()
	a.send(&wire.ProbeResult{RequestID: req.RequestID, Measurement: wire.Measurement{
		CapacityKey: key, Node: "gpu-a", EngineKind: wire.EngineVLLM, EngineURL: "http://127.0.0.1:8000", Model: model,
		ThroughputTPS: 992, WarmupTPS: 640, OutputTokens: 2048, ExpectedTokens: 2048, WallSeconds: 2.06,
		Requests: 16, Concurrency: 16, TokensPerReq: 128, Complete: true, Trigger: wire.ReasonRegistration,
		StartedAt: now.Add(-3 * time.Second), FinishedAt: now,
	}})

	path := "/api/v1/models/" + strings.ReplaceAll(model, "/", "%2F") + "/weights"
	var wt view.Weights
	waitFor(t, "the worker in the weight table", func() bool {
		status, body, _ := ts.do(t, "GET", path, "", nil)
		return status == http.StatusOK && json.Unmarshal(body, &wt) == nil && len(wt.Workers) == 1
	})
	if wt.Workers[0].ID != key || wt.Workers[0].Weight != 1 || wt.Workers[0].Throughput == nil || *wt.Workers[0].Throughput != 992 {
		t.Fatalf("weights %+v", wt)
	}

	status, body, _ := ts.do(t, "POST", "/api/v1/workers/"+key+"/pin", adminToken, strings.NewReader(`{"weight":1.5}`))
	var w view.Worker
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.PinnedWeight == nil || *w.PinnedWeight != 1.5 {
		t.Fatalf("pin: %d %s", status, body)
	}
	status, body, _ = ts.do(t, "POST", "/api/v1/workers/"+key+"/pin", adminToken, strings.NewReader(`{"weight":1000}`))
	if status != http.StatusBadRequest {
		t.Errorf("pin out of range: %d %s", status, body)
	}
	mfs := ts.scrape(t, "")
	if v, ok := metricValue(mfs, "heft_worker_weight", map[string]string{"id": key, "model": model, "node": "gpu-a"}); !ok || v != 1.5 {
		t.Errorf("heft_worker_weight = %g (%t)", v, ok)
	}
	if v, _ := metricValue(mfs, "heft_workers", map[string]string{"state": view.StateAdmitted}); v != 1 {
		t.Errorf("admitted workers = %g", v)
	}

	// Restart the coordinator on the same state.
	ts.stop()
	if ce := closeOf(t, a.c); ce.Code != 1012 {
		t.Errorf("agent closed with %d %q", ce.Code, ce.Reason)
	}
	if err := <-ts.runErr; err != nil {
		t.Fatal(err)
	}
	ts.runErr <- nil
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	ts2, _ := startReal(t, dir)
	status, body, _ = ts2.do(t, "GET", "/api/v1/workers/"+key, "", nil)
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.PinnedWeight == nil || *w.PinnedWeight != 1.5 {
		t.Fatalf("after restart: %d %s", status, body)
	}
}
