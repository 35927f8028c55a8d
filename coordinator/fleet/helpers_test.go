package fleet

import (
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/shared/view"
	"heft/shared/wire"
)

// memStore is an in-memory Store. Setting fail makes every write fail;
// setting adminGate holds every pin or decision write in it, as a slow
// disk would.
type memStore struct {
	mu           sync.Mutex
	st           State
	fail         error
	workerWrites int
	adminGate    func()
}

func newMemStore() *memStore {
	return &memStore{st: State{Pins: map[string]float64{}, PrefillPins: map[string]float64{}, Decisions: map[string]string{},
		Latest: map[string]wire.Measurement{}, History: map[string][]wire.Measurement{}, Workers: map[string]WorkerRecord{},
		KeyTombs: map[string]KeyTomb{}}}
}

func (s *memStore) Load() (State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	hist := map[string][]wire.Measurement{}
	for k, v := range s.st.History {
		hist[k] = slices.Clone(v)
	}
	return State{Pins: maps.Clone(s.st.Pins), PrefillPins: maps.Clone(s.st.PrefillPins), Decisions: maps.Clone(s.st.Decisions), Latest: maps.Clone(s.st.Latest),
		History: hist, Workers: maps.Clone(s.st.Workers), KeyTombs: maps.Clone(s.st.KeyTombs)}, nil
}

func (s *memStore) write(fn func()) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	fn()
	return nil
}

func (s *memStore) setFail(err error) {
	s.mu.Lock()
	s.fail = err
	s.mu.Unlock()
}

func (s *memStore) gate() {
	s.mu.Lock()
	g := s.adminGate
	s.mu.Unlock()
	if g != nil {
		g()
	}
}

func (s *memStore) SavePin(id string, w float64) error {
	s.gate()
	return s.write(func() { s.st.Pins[id] = w })
}
func (s *memStore) DeletePin(id string) error {
	s.gate()
	return s.write(func() { delete(s.st.Pins, id) })
}
func (s *memStore) SavePrefillPin(id string, w float64) error {
	s.gate()
	return s.write(func() { s.st.PrefillPins[id] = w })
}
func (s *memStore) DeletePrefillPin(id string) error {
	s.gate()
	return s.write(func() { delete(s.st.PrefillPins, id) })
}
func (s *memStore) SaveDecision(id, d string) error {
	s.gate()
	return s.write(func() { s.st.Decisions[id] = d })
}
func (s *memStore) DeleteDecision(id string) error {
	s.gate()
	return s.write(func() { delete(s.st.Decisions, id) })
}
func (s *memStore) SaveMeasurement(m wire.Measurement, n int) error {
	return s.write(func() {
		s.st.Latest[m.CapacityKey] = m
		h := append(s.st.History[m.CapacityKey], HistoryEntry(m))
		s.st.History[m.CapacityKey] = h[max(0, len(h)-n):]
	})
}
func (s *memStore) SaveWorker(r WorkerRecord) error {
	return s.write(func() { s.st.Workers[r.ID] = r; s.workerWrites++ })
}
func (s *memStore) DeleteWorker(id string) error {
	return s.write(func() { delete(s.st.Workers, id) })
}
func (s *memStore) DeleteMeasurements(key string) error {
	return s.write(func() { delete(s.st.Latest, key); delete(s.st.History, key) })
}

func (s *memStore) SaveKeyTomb(key string, t KeyTomb) error {
	return s.write(func() { s.st.KeyTombs[key] = t })
}
func (s *memStore) DeleteKeyTomb(key string) error {
	return s.write(func() { delete(s.st.KeyTombs, key) })
}

func (s *memStore) state() State {
	st, _ := s.Load()
	return st
}

var errDisk = errors.New("disk full")

// clock is a fake clock tests move by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// harness is a fleet over a memStore with a fake clock.
type harness struct {
	t       *testing.T
	f       *Fleet
	st      *memStore
	clk     *clock
	conns   map[string]uint64
	seq     uint64
	engines map[string][]wire.Engine // what each node's agent lists
	gpus    map[string][]wire.GPU    // what each node's agent reports of its GPUs
}

func newHarness(t *testing.T) *harness {
	return newHarnessWith(t, testConfig(), newMemStore(), &clock{t: t0})
}

// testConfig is DefaultConfig without probation and the node share cap,
// so the tests of the other weighing rules see weights as measured;
// probation_test.go turns them on.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Probation, cfg.MaxNodeShare = 0, 0
	return cfg
}

func newHarnessWith(t *testing.T, cfg Config, st *memStore, clk *clock) *harness {
	t.Helper()
	f, err := New(cfg, st, clk.now, hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug}))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &harness{t: t, f: f, st: st, clk: clk, conns: map[string]uint64{}, engines: map[string][]wire.Engine{}, gpus: map[string][]wire.GPU{}}
}

// restart builds a new fleet over the same store and clock.
func (h *harness) restart() *harness {
	n := newHarnessWith(h.t, h.f.cfg, h.st, h.clk)
	n.engines, n.gpus = h.engines, h.gpus
	return n
}

func (h *harness) connect(node string) []Action {
	h.seq++
	h.conns[node] = h.seq
	return h.f.Connect(node, h.seq, wire.Hello{Node: node, AgentVersion: "test"})
}

func (h *harness) disconnect(node string) {
	h.f.Disconnect(node, h.conns[node])
}

// snapshot sends what the node's agent lists now.
func (h *harness) snapshot(node string) []Action {
	return h.f.Snapshot(node, wire.Snapshot{Node: node, At: h.clk.now(), GPUs: h.gpus[node], Engines: h.engines[node]})
}

// put lists e on node (replacing the engine at its URL) and sends a snapshot.
func (h *harness) put(node string, e wire.Engine) []Action {
	list := h.engines[node]
	i := slices.IndexFunc(list, func(x wire.Engine) bool { return x.URL == e.URL })
	if i < 0 {
		list = append(list, e)
	} else {
		list[i] = e
	}
	h.engines[node] = list
	return h.snapshot(node)
}

// result answers the worker's current probe request with m, as its agent
// would.
func (h *harness) result(node string, m wire.Measurement) {
	h.t.Helper()
	if _, err := h.f.ProbeResult(node, wire.ProbeResult{RequestID: h.requestID(m.CapacityKey), Measurement: m}); err != nil {
		h.t.Fatalf("ProbeResult: %v", err)
	}
}

// requestID is the ID of the worker's current probe request, "" if none.
func (h *harness) requestID(key string) string {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if w := h.f.workers[key]; w != nil {
		return w.probe.reqID
	}
	return ""
}

// admit brings a worker from nothing to admitted with throughput tps.
func (h *harness) admit(node string, e wire.Engine, tps float64) {
	h.t.Helper()
	h.connectOnce(node)
	h.put(node, e)
	h.result(node, measured(e.CapacityKey, tps, h.clk.now()))
	if w := h.worker(e.CapacityKey); w.State != view.StateAdmitted {
		h.t.Fatalf("%s: state %s, want admitted; warnings %+v", e.CapacityKey, w.State, w.Warnings)
	}
}

func (h *harness) connectOnce(node string) {
	if _, ok := h.conns[node]; !ok {
		h.connect(node)
	}
}

func (h *harness) worker(id string) view.Worker {
	h.t.Helper()
	w, ok := h.f.Worker(id)
	if !ok {
		h.t.Fatalf("no worker %q", id)
	}
	return w
}

func (h *harness) weights(model string) map[string]float64 {
	h.t.Helper()
	wt, ok := h.f.Weights(model)
	if !ok {
		h.t.Fatalf("unknown model %q", model)
	}
	out := map[string]float64{}
	for _, e := range wt.Workers {
		out[e.ID] = e.Weight
	}
	return out
}

func engine(key, url, model string, pools ...int64) wire.Engine {
	e := wire.Engine{Kind: wire.EngineVLLM, URL: url, Model: model, Ready: true, CapacityKey: key, LaunchArgs: []string{"--max-num-seqs=64"}}
	for i, p := range pools {
		e.Ranks = append(e.Ranks, wire.Rank{DPRank: i, KVTokens: p})
	}
	return e
}

func measured(key string, tps float64, at time.Time) wire.Measurement {
	wall := 0.0
	if tps > 0 {
		wall = 2048 / tps
	}
	return wire.Measurement{CapacityKey: key, EngineKind: wire.EngineVLLM, ThroughputTPS: tps, WarmupTPS: max(tps*0.95, 0),
		OutputTokens: 2048, ExpectedTokens: 2048, WallSeconds: wall, Requests: 16, Concurrency: 16, TokensPerReq: 128,
		Complete: true, Trigger: wire.ReasonRegistration, StartedAt: at.Add(-5 * time.Second), FinishedAt: at}
}

func warning(w view.Worker, code string) (view.Warning, bool) {
	for _, x := range w.Warnings {
		if x.Code == code {
			return x, true
		}
	}
	return view.Warning{}, false
}

// requests returns the probe requests among acts, for one key or all ("").
func requests(acts []Action, key string) []*wire.ProbeRequest {
	var out []*wire.ProbeRequest
	for _, a := range acts {
		if r, ok := a.Message.(*wire.ProbeRequest); ok && (key == "" || r.CapacityKey == key) {
			out = append(out, r)
		}
	}
	return out
}

func cachedMsgs(acts []Action, key string) []*wire.CachedMeasurement {
	var out []*wire.CachedMeasurement
	for _, a := range acts {
		if c, ok := a.Message.(*wire.CachedMeasurement); ok && (key == "" || c.Measurement.CapacityKey == key) {
			out = append(out, c)
		}
	}
	return out
}

func near(a, b float64) bool {
	d := a - b
	return d < 1e-9 && d > -1e-9
}
