package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"heft/agent/config"
	"heft/agent/engine"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

const token = "s3cret"

// fakeCoordinator accepts agents on 127.0.0.1 and hands the test each
// connection's decoded messages.
type fakeCoordinator struct {
	url   string
	conns chan *fakeConn
}

type fakeConn struct {
	c    *websocket.Conn
	msgs chan *wire.Envelope
	done chan struct{}
	err  error
}

func newFakeCoordinator(t *testing.T) *fakeCoordinator {
	f := &fakeCoordinator{conns: make(chan *fakeConn, 10)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.SetReadLimit(wire.MaxMessageBytes)
		fc := &fakeConn{c: c, msgs: make(chan *wire.Envelope, 1000), done: make(chan struct{})}
		f.conns <- fc
		defer close(fc.done)
		for {
			_, data, err := c.Read(context.Background())
			if err != nil {
				fc.err = err
				return
			}
			env, err := wire.Decode(data)
			if err != nil {
				t.Errorf("agent sent an invalid message: %v", err)
				fc.err = err
				return
			}
			select {
			case fc.msgs <- env:
			default: // heartbeats nobody waits for
			}
		}
	}))
	t.Cleanup(srv.Close)
	f.url = "ws" + strings.TrimPrefix(srv.URL, "http") + "/api/v1/agent"
	return f
}

func (fc *fakeConn) next(t *testing.T, typ string) *wire.Envelope {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case env := <-fc.msgs:
			if env.Type == typ {
				return env
			}
		case <-fc.done:
			t.Fatalf("connection ended while waiting for %s: %v", typ, fc.err)
		case <-deadline:
			t.Fatalf("no %s from the agent", typ)
		}
	}
}

func (fc *fakeConn) send(t *testing.T, payload any) {
	t.Helper()
	data, err := wire.Encode(payload)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := fc.c.Write(ctx, websocket.MessageText, data); err != nil {
		t.Fatal(err)
	}
}

// oneGPU is a host with one idle GPU.
type oneGPU struct{}

func (oneGPU) Devices(context.Context) ([]wire.GPU, error) {
	return []wire.GPU{{Index: 0, UUID: "GPU-test", Name: "NVIDIA L4", MemoryTotal: 23 << 30, MemoryFree: 20 << 30}}, nil
}
func (oneGPU) Close() error { return nil }

// Run assembles the whole agent: the injected GPUs reach the snapshots,
// the engine is read, a probe request is measured through the Handler
// (and the hook sees it), every part names its own logger under the
// root's, and the link closes cleanly when ctx ends.
func TestRunAssemblesTheAgent(t *testing.T) {
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorVLLM, Model: "test/model", SingleTPS: 400, Batch16TPS: 3200}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	coord := newFakeCoordinator(t)

	cfg := config.Default()
	cfg.Coordinator.URL, cfg.Coordinator.Token = coord.url, token
	cfg.Node.Name = "gpu-test"
	cfg.Engines = []config.Engine{{Kind: "vllm", URL: s.URL()}}
	cfg.Probe.Concurrency, cfg.Probe.Tokens = 4, 16
	cfg.SnapshotInterval, cfg.PollInterval = 50*time.Millisecond, 20*time.Millisecond

	var mu sync.Mutex
	var hooked []wire.ProbeRequest
	hook := WithProbeHook(func(req wire.ProbeRequest) {
		mu.Lock()
		hooked = append(hooked, req)
		mu.Unlock()
	})
	logs := &testutil.SyncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Name: "heft-agent", Output: logs, Level: hclog.Debug})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, logger, WithGPUs(oneGPU{}), hook) }()
	defer func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	}()

	var fc *fakeConn
	select {
	case fc = <-coord.conns:
	case err := <-done:
		t.Fatalf("Run returned %v before connecting", err)
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not connect")
	}
	var snap *wire.Snapshot
	for snap == nil || snap.Engines[0].CapacityKey == "" || !snap.Engines[0].Ready {
		snap = fc.next(t, wire.TypeSnapshot).Snapshot
	}
	if len(snap.GPUs) != 1 || snap.GPUs[0].UUID != "GPU-test" || snap.GPUError != "" {
		t.Errorf("GPUs %+v (error %q), want the injected one", snap.GPUs, snap.GPUError)
	}
	key := snap.Engines[0].CapacityKey

	req := wire.ProbeRequest{RequestID: "r1", CapacityKey: key, Reason: wire.ReasonOnDemand}
	fc.send(t, &req)
	res := fc.next(t, wire.TypeProbeResult).ProbeResult
	if m := res.Measurement; res.RequestID != "r1" || !m.Valid() || m.OutputTokens != 64 || m.Model != "test/model" || m.Node != "gpu-test" {
		t.Errorf("result %+v", res)
	}
	mu.Lock()
	if len(hooked) != 1 || hooked[0] != req {
		t.Errorf("hook saw %+v, want the one request", hooked)
	}
	mu.Unlock()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v after cancel, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	<-fc.done
	if code := websocket.CloseStatus(fc.err); code != websocket.StatusGoingAway {
		t.Errorf("close code %v, want going away", code)
	}
	for _, name := range []string{"heft-agent.link:", "heft-agent.collect.engine:"} {
		if !strings.Contains(logs.String(), name) {
			t.Errorf("no log line from %s", strings.TrimSuffix(name, ":"))
		}
	}
}

func TestRunRefusesABadConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Engines = []config.Engine{{Kind: "no-such-engine", URL: "http://127.0.0.1:1"}}
	err := Run(context.Background(), cfg, nil, WithGPUs(oneGPU{}))
	if err == nil || !strings.Contains(err.Error(), "no coordinator URL") || !strings.Contains(err.Error(), `unknown kind "no-such-engine"`) {
		t.Errorf("Run = %v, want every problem named", err)
	}
}

func TestEngines(t *testing.T) {
	cfg := config.Default()
	cfg.Node.Name = "n1"
	cfg.Engines = []config.Engine{{Kind: "ollama", URL: "http://127.0.0.1:11434", Model: "qwen3:8b"}, {Kind: "vllm", URL: "http://h:8000", Log: "/var/log/vllm.log"}}
	want := []engine.Config{
		{Kind: "ollama", URL: "http://127.0.0.1:11434", Model: "qwen3:8b", Node: "n1"},
		{Kind: "vllm", URL: "http://h:8000", Log: "/var/log/vllm.log", Node: "n1"},
	}
	got := Engines(cfg)
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Engines = %+v, want %+v", got, want)
	}
}
