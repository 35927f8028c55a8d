package server

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"heft/coordinator/fleet"
	"heft/shared/view"
	"heft/shared/wire"
)

// fakeFleet is a small stand-in for *fleet.Fleet: it keeps one worker per
// snapshot engine, honours connection ids the way the real one must, and
// records what the server told it.
type fakeFleet struct {
	mu      sync.Mutex
	current map[string]uint64 // node → connection the fleet believes in
	workers map[string]*view.Worker
	calls   []string
	results []wire.ProbeResult
	subs    map[chan struct{}]struct{}
	onSnap  func(node string, s wire.Snapshot) []fleet.Action // optional
	// onConnect, if set, runs in Connect, after the hub has registered
	// the connection and before it goes on.
	onConnect func(node string)
	probeSeq  int
	// seq numbers changes for Since: every notify marks every worker
	// changed, which is all a server test needs of it.
	seq  uint64
	revs map[string]uint64
	gone map[string]uint64
	// refusals are the address refusals the server last set, by node.
	refusals map[string]map[string]string
}

func newFakeFleet() *fakeFleet {
	return &fakeFleet{current: map[string]uint64{}, workers: map[string]*view.Worker{}, subs: map[chan struct{}]struct{}{},
		revs: map[string]uint64{}, gone: map[string]uint64{}, seq: 1}
}

func (f *fakeFleet) record(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeFleet) notify() {
	f.seq++
	for id := range f.workers {
		f.revs[id] = f.seq
	}
	for id := range f.revs {
		if f.workers[id] == nil {
			delete(f.revs, id)
			f.gone[id] = f.seq
		}
	}
	for ch := range f.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (f *fakeFleet) Connect(node string, conn uint64, hello wire.Hello) []fleet.Action {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("connect %s %d", node, conn)
	if f.onConnect != nil {
		f.onConnect(node)
	}
	f.current[node] = conn
	for _, w := range f.workers {
		if w.Node == node {
			w.AgentConnected = true
		}
	}
	f.notify()
	return nil
}

func (f *fakeFleet) Disconnect(node string, conn uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("disconnect %s %d", node, conn)
	if f.current[node] != conn {
		return // a superseded connection: the node is still here
	}
	delete(f.current, node)
	for _, w := range f.workers {
		if w.Node == node {
			w.AgentConnected = false
			w.State = view.StateOffline
		}
	}
	f.notify()
}

func (f *fakeFleet) Snapshot(node string, s wire.Snapshot) []fleet.Action {
	f.mu.Lock()
	f.record("snapshot %s %d", node, len(s.Engines))
	for _, e := range s.Engines {
		id := e.CapacityKey
		w, ok := f.workers[id]
		if !ok {
			w = &view.Worker{ID: id, State: view.StatePending, Warnings: []view.Warning{}}
			f.workers[id] = w
		}
		w.Node, w.Model, w.Engine, w.URL, w.AgentConnected = node, e.Model, e.Kind, e.URL, true
		w.Ranks = nil
		for _, r := range e.Ranks {
			w.Ranks = append(w.Ranks, view.Rank{DPRank: r.DPRank, KVTokens: r.KVTokens})
		}
	}
	f.notify()
	hook := f.onSnap
	f.mu.Unlock()
	if hook != nil {
		return hook(node, s)
	}
	return nil
}

func (f *fakeFleet) ProbeResult(node string, r wire.ProbeResult) ([]fleet.Action, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("probe_result %s %s", node, r.Measurement.CapacityKey)
	w, ok := f.workers[r.Measurement.CapacityKey]
	if !ok || w.Node != node {
		return nil, fmt.Errorf("%w: no worker %q on node %q", fleet.ErrInvalid, r.Measurement.CapacityKey, node)
	}
	f.results = append(f.results, r)
	tps := r.Measurement.ThroughputTPS
	one := 1.0
	w.Throughput, w.Weight, w.State = &tps, &one, view.StateAdmitted
	f.notify()
	return nil, nil
}

func (f *fakeFleet) ProbeStatus(node string, s wire.ProbeStatus) []fleet.Action {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("probe_status %s %s %s", node, s.CapacityKey, s.State)
	return nil
}

func (f *fakeFleet) Tick() []fleet.Action { return nil }

func (f *fakeFleet) Pin(id string, weight float64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workers[id]
	if !ok {
		return fmt.Errorf("%w: %s", fleet.ErrNotFound, id)
	}
	switch weight { // lets tests see how a refusal and a failure are answered
	case 7.5:
		return fmt.Errorf("%w: the fake fleet refuses 7.5", fleet.ErrInvalid)
	case 6.25:
		return errors.New("the fake store is full")
	}
	w.PinnedWeight, w.Weight = &weight, &weight
	f.notify()
	return nil
}

func (f *fakeFleet) Unpin(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workers[id]
	if !ok {
		return fleet.ErrNotFound
	}
	w.PinnedWeight = nil
	return nil
}

func (f *fakeFleet) PinKind(id, kind string, weight float64) error {
	if kind == view.WeightDecode {
		return f.Pin(id, weight)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workers[id]
	if !ok {
		return fmt.Errorf("%w: %s", fleet.ErrNotFound, id)
	}
	f.record("pin %s %s %g", kind, id, weight)
	w.PinnedPrefillWeight, w.PrefillWeight = &weight, &weight
	f.notify()
	return nil
}

func (f *fakeFleet) UnpinKind(id, kind string) error {
	if kind == view.WeightDecode {
		return f.Unpin(id)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workers[id]
	if !ok {
		return fleet.ErrNotFound
	}
	f.record("unpin %s %s", kind, id)
	w.PinnedPrefillWeight = nil
	return nil
}

func (f *fakeFleet) WeightsOf(model, kind string) (view.Weights, bool, error) {
	if kind == view.WeightDecode {
		wt, ok := f.Weights(model)
		wt.Kind = kind
		return wt, ok, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := view.Weights{Model: model, Kind: kind}
	found := false
	for _, w := range f.workers {
		if w.Model != model {
			continue
		}
		found = true
		if w.State == view.StateAdmitted && w.PrefillWeight != nil {
			out.Workers = append(out.Workers, view.WeightEntry{ID: w.ID, Node: w.Node, URL: w.URL, Weight: *w.PrefillWeight, State: w.State,
				Throughput: w.PrefillTPS, MaxContextTokens: w.MaxContextTokens})
		}
	}
	return out, found, nil
}

func (f *fakeFleet) setDecision(id, d, state string, belowFloor ...bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workers[id]
	if !ok {
		return fleet.ErrNotFound
	}
	w.AdminDecision, w.State, w.BelowFloor = d, state, len(belowFloor) > 0 && belowFloor[0]
	return nil
}

func (f *fakeFleet) Admit(id string) error { return f.setDecision(id, "admit", view.StateAdmitted) }
func (f *fakeFleet) Hold(id string) error  { return f.setDecision(id, "hold", view.StateHeld) }
func (f *fakeFleet) HoldBelowFloor(id string) error {
	return f.setDecision(id, "hold", view.StateHeld, true)
}

func (f *fakeFleet) Probe(id string) ([]fleet.Action, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workers[id]
	if !ok {
		return nil, fleet.ErrNotFound
	}
	f.probeSeq++
	w.ProbeStatus = wire.ProbeRunning
	return []fleet.Action{{Node: w.Node, Message: &wire.ProbeRequest{
		RequestID: fmt.Sprintf("req-%d", f.probeSeq), CapacityKey: id, Reason: wire.ReasonOnDemand}}}, nil
}

func (f *fakeFleet) Workers() []view.Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]view.Worker, 0, len(f.workers))
	for _, w := range f.workers {
		out = append(out, *w)
	}
	slices.SortFunc(out, func(a, b view.Worker) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Find filters and pages as the real fleet documents it (fleet.Query).
func (f *fakeFleet) Find(q fleet.Query) ([]view.Worker, bool) {
	var out []view.Worker
	for _, w := range f.Workers() { // in ID order
		if (q.Model != "" && w.Model != q.Model) || (q.Node != "" && w.Node != q.Node) || (q.State != "" && w.State != q.State) ||
			(q.Warning != "" && !slices.ContainsFunc(w.Warnings, func(x view.Warning) bool { return x.Code == q.Warning })) ||
			(q.Limit > 0 && w.ID <= q.After) {
			continue
		}
		out = append(out, w)
	}
	if q.Limit > 0 && len(out) > q.Limit {
		return out[:q.Limit], true
	}
	return out, false
}

func (f *fakeFleet) Worker(id string) (view.Worker, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workers[id]
	if !ok {
		return view.Worker{}, false
	}
	return *w, true
}

func (f *fakeFleet) Weights(model string) (view.Weights, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := view.Weights{Model: model}
	found := false
	for _, w := range f.workers {
		if w.Model != model {
			continue
		}
		found = true
		if w.State == view.StateAdmitted && w.Weight != nil {
			out.Workers = append(out.Workers, view.WeightEntry{ID: w.ID, Node: w.Node, URL: w.URL, Weight: *w.Weight, State: w.State})
		}
	}
	return out, found
}

func (f *fakeFleet) Models() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ms []string
	for _, w := range f.workers {
		if !slices.Contains(ms, w.Model) {
			ms = append(ms, w.Model)
		}
	}
	slices.Sort(ms)
	return ms
}

func (f *fakeFleet) Changes() (<-chan struct{}, func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{}, 1)
	f.subs[ch] = struct{}{}
	return ch, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.subs, ch)
	}
}

func (f *fakeFleet) Since(seq uint64) fleet.Delta {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := fleet.Delta{Seq: f.seq, Full: seq == 0}
	for _, w := range f.workers {
		if d.Full || f.revs[w.ID] > seq {
			d.Workers = append(d.Workers, *w)
		}
	}
	slices.SortFunc(d.Workers, func(a, b view.Worker) int { return strings.Compare(a.ID, b.ID) })
	if !d.Full {
		for id, at := range f.gone {
			if at > seq && f.workers[id] == nil {
				d.Removed = append(d.Removed, id)
			}
		}
		slices.Sort(d.Removed)
	}
	return d
}

// update changes a worker as the real fleet's rules might (a warning, a
// state), for tests of how the server shows it; an unknown id fails.
func (f *fakeFleet) update(id string, change func(w *view.Worker)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.workers[id]
	if !ok {
		panic("fakeFleet.update: no worker " + id)
	}
	change(w)
	f.notify()
}

// setOnConnect makes Connect run hook first.
func (f *fakeFleet) setOnConnect(hook func(node string)) {
	f.mu.Lock()
	f.onConnect = hook
	f.mu.Unlock()
}

// setOnSnapshot makes Snapshot return what hook returns.
func (f *fakeFleet) setOnSnapshot(hook func(node string, s wire.Snapshot) []fleet.Action) {
	f.mu.Lock()
	f.onSnap = hook
	f.mu.Unlock()
}

// probeResults returns the probe results the fleet accepted.
func (f *fakeFleet) probeResults() []wire.ProbeResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.results)
}

func (f *fakeFleet) callLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// connects counts the fleet's Connect calls for node.
func (f *fakeFleet) connects(node string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if strings.HasPrefix(c, "connect "+node+" ") {
			n++
		}
	}
	return n
}

func (f *fakeFleet) currentConn(node string) (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.current[node]
	return c, ok
}

func (f *fakeFleet) Stats() fleet.Stats {
	st := fleet.Stats{WorkersByState: map[string]int{}, WarningsByCode: map[string]int{}, ProbeRequests: map[string]int{}}
	for _, r := range fleet.ProbeReasons {
		st.ProbeRequests[r] = 0
	}
	f.mu.Lock()
	st.ProbeRequests[wire.ReasonOnDemand] = f.probeSeq
	f.mu.Unlock()
	for _, s := range fleet.States {
		st.WorkersByState[s] = 0
	}
	for _, c := range fleet.WarningCodes {
		st.WarningsByCode[c] = 0
	}
	for _, w := range f.Workers() {
		st.WorkersByState[w.State]++
		for _, warn := range w.Warnings {
			st.WarningsByCode[warn.Code]++
		}
		var weight *float64
		if w.State == view.StateAdmitted {
			weight = w.Weight
		}
		ws := fleet.WorkerStats{ID: w.ID, Model: w.Model, Node: w.Node, State: w.State,
			Weight: weight, Throughput: w.Throughput, MeasuredAt: w.MeasuredAt}
		for _, r := range w.Ranks {
			ws.Ranks = append(ws.Ranks, wire.Rank{DPRank: r.DPRank, KVTokens: r.KVTokens})
		}
		for _, x := range w.Warnings {
			ws.Warnings = append(ws.Warnings, fleet.WarningStats{Code: x.Code, Severity: x.Severity})
		}
		st.Workers = append(st.Workers, ws)
	}
	return st
}

func (f *fakeFleet) SetAddressRefusals(node string, refused map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refusals == nil {
		f.refusals = map[string]map[string]string{}
	}
	f.refusals[node] = refused
}

// addressRefusals is what the server last said of node's addresses.
func (f *fakeFleet) addressRefusals(node string) map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refusals[node]
}

func (f *fakeFleet) ForgetNode(node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("forget_node %s", node)
	for id, w := range f.workers {
		if w.Node == node {
			delete(f.workers, id)
		}
	}
	return nil
}

func (f *fakeFleet) Held(node string) fleet.Held {
	f.mu.Lock()
	defer f.mu.Unlock()
	var h fleet.Held
	for _, w := range f.workers {
		if w.Node == node {
			h.Workers++
		}
	}
	return h
}
