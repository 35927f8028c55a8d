package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/collect"
	"heft/agent/config"
	"heft/agent/metrics"
	"heft/agent/probe"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

// One engine, two capacity keys: a probe waits for the busy engine under
// its first key, the engine comes back with other arguments (a new key,
// busy too), and a probe under the new key is deferred at once with a
// reason, rather than left to start its burst beside the first one's
// when the engine goes idle. The first, which then measures the
// relaunched engine, is discarded; after it the new key is measured.
func TestProbesOfOneEngineNeverOverlap(t *testing.T) {
	start := func(maxRunning int) *sim.Server {
		s, err := sim.Start(sim.Config{Flavor: sim.FlavorSGLang, Model: "test/model", SingleTPS: 400, Batch16TPS: 3200, MaxRunning: maxRunning}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	// The same model, launched with other arguments: another key.
	before, after := start(0), start(64)
	// The engine's URL is a proxy, so that what serves it can change
	// under the agent, as an engine restarted with other arguments does.
	var backend atomic.Pointer[url.URL]
	backend.Store(mustURL(t, before.URL()))
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(backend.Load()) },
		FlushInterval: -1,
	})
	t.Cleanup(proxy.Close)

	cfg := config.Default()
	cfg.Node.Name = "gpu-test"
	cfg.Engines = []config.Engine{{Kind: wire.EngineSGLang, URL: proxy.URL}}
	cfg.Probe.Concurrency, cfg.Probe.Tokens, cfg.Probe.Prefill = 4, 16, false
	cfg.Probe.Busy, cfg.Probe.BusyWait = "wait", time.Minute
	col, err := collect.New(collect.Config{Node: cfg.Node.Name, Engines: Engines(cfg)}, oneGPU{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testutil.SyncBuffer{}
	h := NewHandler(cfg, col, oneGPU{}, nil, hclog.New(&hclog.LoggerOptions{Output: logs}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	})
	// key waits for the engine's capacity key other than not.
	key := func(not string) string {
		t.Helper()
		var k string
		testutil.Eventually(t, "a new capacity key", 20*time.Second, func() bool {
			e := h.Snapshot(t.Context()).Engines[0]
			k = e.CapacityKey
			return e.Ready && k != "" && k != not
		})
		return k
	}
	keyA := key("")

	// Users keep the engine busy, before the change and after it: the
	// first probe waits all along.
	userCtx, leave := context.WithCancel(t.Context())
	var users sync.WaitGroup
	t.Cleanup(func() { leave(); users.Wait() })
	for _, s := range []*sim.Server{before, after} {
		users.Go(func() {
			body := []byte(`{"model":"` + s.Config().Model + `","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5000,"ignore_eos":true}`)
			req, _ := http.NewRequestWithContext(userCtx, http.MethodPost, s.URL()+"/v1/chat/completions", bytes.NewReader(body))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body) // until they leave
				resp.Body.Close()
			}
		})
		testutil.Eventually(t, "the user's request to run", 10*time.Second, func() bool { r, _ := s.InFlight(); return r > 0 })
	}
	first := make(chan error, 1)
	go func() {
		_, err := h.Probe(t.Context(), wire.ProbeRequest{CapacityKey: keyA, Reason: wire.ReasonOnDemand})
		first <- err
	}()
	testutil.Eventually(t, "the first probe to wait", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), "the probe waits for it to be idle")
	})

	backend.Store(mustURL(t, after.URL()))
	keyB := key(keyA)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = h.Probe(ctx, wire.ProbeRequest{CapacityKey: keyB, Reason: wire.ReasonOnDemand})
	if !errors.Is(err, probe.ErrBusy) || !strings.Contains(err.Error(), "another probe of this engine (capacity key "+keyA+")") {
		t.Fatalf("a probe beside another one's: %v; want it deferred (ErrBusy) naming %s", err, keyA)
	}
	if got := h.probeCounts(proxy.URL)[metrics.OutcomeBusy]; got != 1 {
		t.Errorf("busy count %d, want 1", got)
	}

	// The users leave; the first probe measures the engine it finds, which
	// is not its key's: discarded. The engine is free again for the new key.
	leave()
	select {
	case err := <-first:
		if err == nil || !strings.Contains(err.Error(), "capacity key changed from "+keyA+" to "+keyB) {
			t.Fatalf("the first probe, which ended on the relaunched engine: %v; want it discarded", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first probe did not end")
	}
	m, err := h.Probe(t.Context(), wire.ProbeRequest{CapacityKey: keyB, Reason: wire.ReasonOnDemand})
	if err != nil || !m.Valid() {
		t.Fatalf("probe of the new key after the first: %v, valid %v, problems %q", err, m.Valid(), m.Problems)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
