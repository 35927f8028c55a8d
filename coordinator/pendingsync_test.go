package coordinator

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/gateway/coord"
	"heft/gateway/syncer"
	"heft/gateway/target"
	"heft/shared/testutil"
	"heft/shared/wire"
)

// recTarget is a gateway that records what heft-sync applies.
type recTarget struct {
	mu   sync.Mutex
	last target.Model
}

func (r *recTarget) Name() string  { return "test:qwen" }
func (r *recTarget) Model() string { return testModel }
func (r *recTarget) Apply(_ context.Context, m target.Model) (target.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = m
	return target.Result{Serving: len(m.Serving())}, nil
}

func (r *recTarget) serving() map[string]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]float64{}
	for _, b := range r.last.Serving() {
		out[b.Address] = b.Weight
	}
	return out
}

// A coordinator restarted on a new, empty state file holds every node for
// approval (approve_new_nodes) and lists none of their workers. heft-sync,
// following it over real HTTP, keeps the worker it routed whose node
// waits, past keep_unlisted (0 here), at its last weight; once an admin
// rejects the node, it lets the worker go.
func TestHeftSyncKeepsAPendingNodesWorkers(t *testing.T) {
	r1 := start(t, testConfig(t))
	type node struct {
		name, key string
		port      int
		tps       float64
		kept      wire.CachedMeasurement
	}
	nodes := []*node{{name: "gpu-a", port: 8000, tps: 992}, {name: "gpu-b", port: 8001, tps: 500}}
	for _, n := range nodes {
		n.key = n.name + "|vllm|" + testModel + "|--port=" + strconv.Itoa(n.port)
		a := connectAgent(t, r1, n.name)
		s := snapshot(n.name, time.Now(), engine(n.key, n.port))
		a.send(&s)
		req := a.until(wire.TypeProbeRequest).ProbeRequest
		m := measured(n.key, n.name, n.tps, time.Now())
		m.EngineURL = "http://127.0.0.1:" + strconv.Itoa(n.port)
		a.send(&wire.ProbeResult{RequestID: req.RequestID, Measurement: m})
		n.kept = *a.until(wire.TypeCached).Cached
	}
	addrA, addrB := "127.0.0.1:8000", "127.0.0.1:8001"

	// heft-sync, as gateway/app wires it, keep_unlisted 0: an unlisted
	// worker whose node does not wait goes at once.
	gw := &recTarget{}
	sy := syncer.New([]target.Target{gw}, syncer.NewMetrics([]string{gw.Name()}), time.Hour, testLogger(t))
	sy.SetFloor(syncer.Floor{MinServing: 1})
	hooks := sy.Hooks()
	var mu sync.Mutex
	var pending []string // the last list heft-sync was handed
	setPending := hooks.Pending
	hooks.Pending = func(names []string) {
		setPending(names)
		mu.Lock()
		pending = names
		mu.Unlock()
	}
	client := &http.Client{}
	f, err := coord.New(coord.Config{URL: r1.base, Client: client, PendingEvery: 20 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}, hooks, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { sy.Run(ctx) })
	wg.Go(func() { f.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait(); client.CloseIdleConnections() })
	testutil.Eventually(t, "both workers routed", 20*time.Second, func() bool { return len(gw.serving()) == 2 })
	before := gw.serving()

	// The coordinator comes back on the same address with a new, empty
	// state; both agents come back and are held for approval.
	addr := strings.TrimPrefix(r1.base, "http://")
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Nodes.ApproveNew = true
	r2 := startOn(t, addr, cfg)
	creds := map[string]string{}
	for _, n := range nodes {
		a, w := dialAgent(t, r2, wire.Hello{Node: n.name, KeepsCredential: true, Measurements: []wire.CachedMeasurement{n.kept}})
		creds[n.name] = w.NodeCredential
		if _, err := a.next(); websocket.CloseStatus(err) != websocket.StatusCode(wire.CloseNodePending) {
			t.Fatalf("%s: %v, want closed as pending", n.name, err)
		}
	}
	testutil.Eventually(t, "heft-sync knows both nodes wait", 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Equal(pending, []string{"gpu-a", "gpu-b"})
	})

	// gpu-b is approved and comes back with its measurement: the model is
	// listed again, without gpu-a's worker. gpu-a's is kept as it was.
	if status, body := r2.do(t, "POST", "/api/v1/nodes/gpu-b/approve", adminToken, ""); status != http.StatusOK {
		t.Fatalf("approve gpu-b: %d %s", status, body)
	}
	b, _ := dialAgent(t, r2, wire.Hello{Node: "gpu-b", NodeCredential: creds["gpu-b"], KeepsCredential: true,
		Measurements: []wire.CachedMeasurement{nodes[1].kept}})
	s := snapshot("gpu-b", time.Now(), engine(nodes[1].key, nodes[1].port))
	b.send(&s)
	testutil.Eventually(t, "gpu-b by the new coordinator's weight, gpu-a kept", 20*time.Second, func() bool {
		got := gw.serving()
		return len(got) == 2 && got[addrA] == before[addrA] && got[addrB] > 0 && got[addrB] != before[addrB]
	})
	if kept := sy.Status().Targets[0].Kept; len(kept) != 1 || !strings.Contains(kept[0], "gpu-a waits for an admin's approval") {
		t.Errorf("kept %q", kept)
	}

	// Rejected: keep_unlisted (0) applies, and gpu-b alone serves.
	if status, body := r2.do(t, "POST", "/api/v1/nodes/gpu-a/reject", adminToken, ""); status != http.StatusOK {
		t.Fatalf("reject gpu-a: %d %s", status, body)
	}
	testutil.Eventually(t, "gpu-a let go once rejected", 20*time.Second, func() bool {
		got := gw.serving()
		return len(got) == 1 && got[addrB] > 0
	})
}
