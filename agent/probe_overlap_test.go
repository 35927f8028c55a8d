package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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
	// The proxy reads a request's body before it forwards it. Go's
	// ReverseProxy streams it instead: the Transport copies the declared
	// length to the backend, which answers; writing the answer's header
	// makes the proxy's http.Server drain and close the inbound body; the
	// Transport's last read of it, checking that it was not longer than
	// declared, can land after that close ("invalid Read on closed Body"),
	// and the Transport then closes the backend connection under the
	// answer ("ReverseProxy read error during body copy: use of closed
	// network connection", golang/go#40747). A loaded machine widens that
	// window: once in a few dozen runs a probe's request saw its stream end
	// before [DONE], and the probe failed. A fault of the fixture's hop,
	// which an engine reached directly does not have.
	var backend atomic.Pointer[url.URL]
	backend.Store(mustURL(t, before.URL()))
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(backend.Load()) },
		FlushInterval: -1,
	}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
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
	case <-time.After(2 * time.Minute): // a loaded machine may take long; only a stuck probe takes this
		t.Fatal("the first probe did not end")
	}
	m, err := h.Probe(t.Context(), wire.ProbeRequest{CapacityKey: keyB, Reason: wire.ReasonOnDemand})
	if err != nil || !m.Valid() {
		t.Fatalf("probe of the new key after the first: %v, valid %v, problems %q", err, m.Valid(), m.Problems)
	}
}

// One engine configured under two spellings of its URL (an address and
// a name, a trailing slash) and two capacity keys (a model name given for
// one): its probes share one slot, as they share the engine. A probe
// under the second spelling while the first waits for the busy engine is
// deferred at once; before, each spelling had a slot of its own and the
// two bursts could run together.
func TestProbesOfOneEngineUnderTwoSpellingsNeverOverlap(t *testing.T) {
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorSGLang, Model: "test/model", SingleTPS: 400, Batch16TPS: 3200}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	port := mustURL(t, s.URL()).Port()
	byAddress, byName := "http://127.0.0.1:"+port, "http://localhost:"+port+"/"

	cfg := config.Default()
	cfg.Node.Name = "gpu-test"
	cfg.Engines = []config.Engine{{Kind: wire.EngineSGLang, URL: byAddress}, {Kind: wire.EngineSGLang, URL: byName, Model: "alias/model"}}
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
	var keys []string
	testutil.Eventually(t, "both spellings ready, each with its key", 20*time.Second, func() bool {
		keys = nil
		for _, e := range h.Snapshot(t.Context()).Engines {
			if e.Ready && e.CapacityKey != "" {
				keys = append(keys, e.CapacityKey)
			}
		}
		return len(keys) == 2 && keys[0] != keys[1]
	})

	leave := users(t, s, 1) // the engine is busy: the first probe waits
	testutil.Eventually(t, "the user's request to run", 10*time.Second, func() bool { r, _ := s.InFlight(); return r > 0 })
	first := make(chan error, 1)
	go func() {
		m, err := h.Probe(t.Context(), wire.ProbeRequest{CapacityKey: keys[0], Reason: wire.ReasonOnDemand})
		if err == nil && !m.Valid() {
			err = fmt.Errorf("not valid: %q", m.Problems)
		}
		first <- err
	}()
	testutil.Eventually(t, "the first probe to wait", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), "the probe waits for it to be idle")
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = h.Probe(ctx, wire.ProbeRequest{CapacityKey: keys[1], Reason: wire.ReasonOnDemand})
	if !errors.Is(err, probe.ErrBusy) || !strings.Contains(err.Error(), "another probe of this engine (capacity key "+keys[0]+")") {
		t.Fatalf("a probe of %s beside one of %s: %v; want it deferred (ErrBusy) naming %s", byName, byAddress, err, keys[0])
	}

	leave()
	select {
	case err := <-first:
		if err != nil {
			t.Fatalf("the first probe, once the user left: %v", err)
		}
	case <-time.After(2 * time.Minute): // a loaded machine may take long; only a stuck probe takes this
		t.Fatal("the first probe did not end")
	}
}

// A host name holds the slot of each address it resolves to: a probe of
// the engine by its name and one by its address never run together, and
// the slot is free again once the first ends.
func TestProbeSlotByResolvedName(t *testing.T) {
	h := NewHandler(config.Default(), nil, oneGPU{}, nil, nil)
	h.lookup = func(_ context.Context, host string) ([]net.IPAddr, error) {
		if host == "gpu-a.test" {
			return []net.IPAddr{{IP: net.ParseIP("10.0.0.5")}}, nil
		}
		return nil, errors.New("no such host")
	}
	byName := h.sockets(t.Context(), "http://gpu-a.test:8000")
	if _, busy := h.claim(byName, "key-a"); busy {
		t.Fatal("a free engine's slot is busy")
	}
	byAddress := h.sockets(t.Context(), "http://10.0.0.5:8000/")
	if other, busy := h.claim(byAddress, "key-b"); !busy || other != "key-a" {
		t.Fatalf("the engine by its address beside a probe of it by name: busy %v (%q); want the name's probe, key-a", busy, other)
	}
	if _, busy := h.claim(h.sockets(t.Context(), "http://10.0.0.5:8001"), "key-c"); busy {
		t.Error("another port's engine shares the slot")
	}
	h.release(byName)
	if _, busy := h.claim(byAddress, "key-b"); busy {
		t.Error("the slot stayed taken after the first probe ended")
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
