package swarm

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/shared/wire"
)

// fakeCoordinator speaks just enough of the coordinator's side: it checks
// the token, wants hello then a snapshot, asks for a probe, keeps the
// result, and drops each node's first connection once measured so the
// swarm must reconnect. GET /api/v1/workers/{id} shows the latest load.
type fakeCoordinator struct {
	t        *testing.T
	mu       sync.Mutex
	results  map[string]wire.Measurement
	running  map[string]int
	conns    map[string]int
	badToken atomic.Int64
}

func (f *fakeCoordinator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, ok := strings.CutPrefix(r.URL.Path, "/api/v1/workers/"); ok {
		f.mu.Lock()
		n, known := f.running[id]
		f.mu.Unlock()
		if !known {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "load": map[string]int{"running": n}})
		return
	}
	if r.Header.Get("Authorization") != "Bearer tok" {
		f.badToken.Add(1)
		http.Error(w, "bad token", http.StatusUnauthorized)
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := r.Context()
	read := func() *wire.Envelope {
		_, data, err := c.Read(ctx)
		if err != nil {
			return nil
		}
		env, err := wire.Decode(data)
		if err != nil {
			f.t.Errorf("swarm sent an invalid message: %v", err)
			return nil
		}
		return env
	}
	hello := read()
	if hello == nil || hello.Type != wire.TypeHello {
		f.t.Errorf("first message is not hello: %+v", hello)
		return
	}
	node := hello.Hello.Node
	f.mu.Lock()
	f.conns[node]++
	first := f.conns[node] == 1
	f.mu.Unlock()
	for {
		env := read()
		if env == nil {
			return
		}
		switch env.Type {
		case wire.TypeSnapshot:
			e := env.Snapshot.Engines[0]
			f.mu.Lock()
			f.running[e.CapacityKey] = e.Load.Running
			_, measured := f.results[e.CapacityKey]
			f.mu.Unlock()
			if !measured {
				msg, _ := wire.Encode(&wire.ProbeRequest{RequestID: "r-" + node, CapacityKey: e.CapacityKey, Reason: wire.ReasonRegistration})
				if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
					return
				}
			}
		case wire.TypeProbeResult:
			m := env.ProbeResult.Measurement
			if env.ProbeResult.RequestID != "r-"+node || !m.Valid() || m.Node != node {
				f.t.Errorf("bad probe result from %s: %+v", node, env.ProbeResult)
			}
			f.mu.Lock()
			f.results[m.CapacityKey] = m
			f.mu.Unlock()
			if first {
				return // drop the connection: the agent must come back
			}
		default:
			f.t.Errorf("unexpected %s from %s", env.Type, node)
		}
	}
}

func TestSwarmAgainstFakeCoordinator(t *testing.T) {
	f := &fakeCoordinator{t: t, results: map[string]wire.Measurement{}, running: map[string]int{}, conns: map[string]int{}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 8
	s, err := Start(ctx, Config{URL: "ws" + strings.TrimPrefix(srv.URL, "http"), API: srv.URL, Token: "tok",
		Agents: n, Models: 3, SnapshotEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.WaitMeasured(ctx); err != nil {
		t.Fatal(err)
	}
	// Every agent is dropped once after its measurement and must reconnect.
	for {
		st := s.Stats()
		if st.Reconnects == n && st.Open == n {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("agents did not all reconnect: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	st := s.Stats()
	if st.Dropped != n || st.Measured != n || st.ProbeRequests != n {
		t.Errorf("stats %+v: want %d dropped, measured and probe requests", st, n)
	}
	f.mu.Lock()
	models := map[string]bool{}
	for _, m := range f.results {
		models[m.Model] = true
	}
	f.mu.Unlock()
	if len(models) != 3 {
		t.Errorf("measurements cover %d models, want 3", len(models))
	}

	ds, timeouts, err := s.Visibility(ctx, 5, 0, time.Millisecond, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 5 || timeouts != 0 {
		t.Errorf("visibility: %d samples, %d timeouts; want 5 and 0", len(ds), timeouts)
	}
	if f.badToken.Load() != 0 {
		t.Errorf("%d connections without the token", f.badToken.Load())
	}
}

func TestStartRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no agents": {URL: "ws://127.0.0.1:1/", API: "http://127.0.0.1:1", Token: "t"},
		"no token":  {URL: "ws://127.0.0.1:1/", API: "http://127.0.0.1:1", Agents: 1},
		"bad url":   {URL: "::", API: "http://127.0.0.1:1", Token: "t", Agents: 1},
	} {
		if _, err := Start(context.Background(), cfg); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

func TestMessagesAreValid(t *testing.T) {
	for i, m := range Messages(8, 3) {
		if _, err := wire.Encode(&m.Hello); err != nil {
			t.Errorf("agent %d hello: %v", i, err)
		}
		if _, err := wire.Encode(&m.Snapshot); err != nil {
			t.Errorf("agent %d snapshot: %v", i, err)
		}
		res := m.Result(&wire.ProbeRequest{RequestID: "x", CapacityKey: m.Snapshot.Engines[0].CapacityKey, Reason: wire.ReasonRegistration})
		if _, err := wire.Encode(&res); err != nil || !res.Measurement.Valid() {
			t.Errorf("agent %d result: %v (valid %v)", i, err, res.Measurement.Valid())
		}
	}
}
