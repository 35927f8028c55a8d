package fleet

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"heft/shared/health"
	"heft/shared/view"
	"heft/shared/wire"
)

// Workers returns every worker, sorted by model, node and URL. The caller
// may keep the values; History is shared with other callers and must not
// be modified.
func (f *Fleet) Workers() []view.Worker {
	ws, _ := f.Find(Query{})
	return ws
}

// Query selects workers for Find. An empty field matches every worker.
type Query struct {
	Model, Node, State string
	Warning            string // a warning code the worker carries now
	// Limit > 0 asks for one page: at most Limit workers whose IDs sort
	// after After, in ID order, the only order that stays stable while
	// workers come and go. Limit 0 asks for every match, in Workers' order.
	Limit int
	After string
}

// Find returns the workers q selects and, for a page, whether more follow.
// Only the selected workers are rendered, so a page or a node's workers
// cost little however large the fleet is.
func (f *Fleet) Find(q Query) (ws []view.Worker, more bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var from map[string]*worker
	switch {
	case q.Node != "":
		if n := f.nodes[q.Node]; n != nil {
			from = n.workers
		}
	case q.Model != "":
		from = f.byModel[q.Model]
	default:
		from = f.workers
	}
	sel := make([]*worker, 0, len(from))
	for _, w := range from {
		if q.matches(w) && (q.Limit <= 0 || w.id > q.After) {
			sel = append(sel, w)
		}
	}
	if q.Limit > 0 {
		sort.Slice(sel, func(i, j int) bool { return sel[i].id < sel[j].id })
		if len(sel) > q.Limit {
			sel, more = sel[:q.Limit], true
		}
	} else {
		sort.Slice(sel, func(i, j int) bool { return less(sel[i], sel[j]) })
	}
	out := make([]view.Worker, len(sel))
	for i, w := range sel {
		out[i] = f.view(w)
	}
	return out, more
}

func (q Query) matches(w *worker) bool {
	if (q.Model != "" && w.eng.Model != q.Model) || (q.Node != "" && w.node != q.Node) || (q.State != "" && w.state != q.State) {
		return false
	}
	if q.Warning == "" {
		return true
	}
	for _, x := range w.findings {
		if x.Code == q.Warning {
			return true
		}
	}
	return false
}

func less(a, b *worker) bool {
	if c := strings.Compare(a.eng.Model, b.eng.Model); c != 0 {
		return c < 0
	}
	if c := strings.Compare(a.node, b.node); c != 0 {
		return c < 0
	}
	if c := strings.Compare(a.eng.URL, b.eng.URL); c != 0 {
		return c < 0
	}
	return a.id < b.id
}

// Delta is what changed in the fleet after a sequence number, for a live
// stream: a subscriber keeps the Seq it has seen and asks for what came
// after, so its backlog is one number, never a queue of messages.
type Delta struct {
	Seq uint64 // the sequence number this delta brings the subscriber to
	// Full: Workers is the whole fleet (the subscriber starts, or fell so
	// far behind that removals were forgotten); Removed is empty.
	Full    bool
	Workers []view.Worker // changed or new workers, sorted as Workers sorts them
	Removed []string      // IDs of workers that left the fleet
}

// Since returns what changed after seq; Since(0) is the whole fleet (the
// fleet's own sequence numbers start at 1).
func (f *Fleet) Since(seq uint64) Delta {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := Delta{Seq: f.seq, Full: seq == 0 || seq < f.tombsFloor || seq > f.seq}
	var ws []*worker
	for _, w := range f.workers {
		if d.Full || w.rev > seq {
			ws = append(ws, w)
		}
	}
	sort.Slice(ws, func(i, j int) bool { return less(ws[i], ws[j]) })
	d.Workers = make([]view.Worker, len(ws))
	for i, w := range ws {
		d.Workers[i] = f.view(w)
	}
	if d.Full {
		return d
	}
	seen := map[string]bool{}
	for i := len(f.tombs) - 1; i >= 0 && f.tombs[i].seq > seq; i-- {
		id := f.tombs[i].id
		if f.workers[id] == nil && !seen[id] {
			seen[id] = true
			d.Removed = append(d.Removed, id)
		}
	}
	slices.Sort(d.Removed)
	return d
}

// Worker returns one worker.
func (f *Fleet) Worker(id string) (view.Worker, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.workers[id]
	if w == nil {
		return view.Worker{}, false
	}
	return f.view(w), true
}

// Weights returns a model's weight table: its serving workers (admitted,
// and stale ones, each entry with its state) with their weights, sorted by
// node and URL. ok is false for a model no worker
// serves; a known model with no admitted worker has an empty table.
func (f *Fleet) Weights(model string) (view.Weights, bool) {
	w, ok, _ := f.WeightsOf(model, view.WeightDecode)
	return w, ok
}

// WeightsOf returns a model's table of one kind of weight: view.WeightDecode
// (as Weights) or view.WeightPrefill, the serving workers with a valid
// prefill measurement and their prefill weights. An unknown kind is an
// error wrapping ErrInvalid.
func (f *Fleet) WeightsOf(model, kind string) (view.Weights, bool, error) {
	if kind != view.WeightDecode && kind != view.WeightPrefill {
		return view.Weights{}, false, fmt.Errorf("%w: weight kind %q is not %q or %q", ErrInvalid, kind, view.WeightDecode, view.WeightPrefill)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ws := f.byModel[model]
	if model == "" || len(ws) == 0 {
		return view.Weights{}, false, nil
	}
	prefill := kind == view.WeightPrefill
	weightOf := func(w *worker) *float64 {
		if prefill {
			return w.prefill.weight
		}
		return w.weight
	}
	out := view.Weights{Model: model, Kind: kind, Workers: []view.WeightEntry{}}
	var in []*worker
	for _, w := range ws {
		if weightOf(w) != nil && !f.drained(w) {
			in = append(in, w)
		}
	}
	sort.Slice(in, func(i, j int) bool { return less(in[i], in[j]) })
	pins := f.pinsOf(kind)
	for _, w := range in {
		_, pinned := pins[w.id]
		e := view.WeightEntry{ID: w.id, Node: w.node, URL: w.eng.URL, Address: Address(w.eng), Weight: *weightOf(w), Pinned: pinned,
			State: w.state, MaxConcurrency: MaxConcurrency(w.eng.MaxRunning, weightOf(w)), MaxContextTokens: maxContext(w.pools())}
		if w.eng.MaxRunning > 0 {
			n := w.eng.MaxRunning
			e.MaxRunning = &n
		}
		if m := f.newest(w.id); m != nil {
			tps, at := m.ThroughputTPS, m.FinishedAt
			if prefill {
				tps = prefillTPS(*m)
			}
			e.Throughput, e.MeasuredAt = &tps, &at
		}
		out.Workers = append(out.Workers, e)
	}
	return out, true, nil
}

// maxContext is what the worker can hold, nil while unknown.
func maxContext(e wire.Engine) *int64 {
	if n := e.MaxContextTokens(); n > 0 {
		return &n
	}
	return nil
}

// Models returns the models workers serve, sorted.
func (f *Fleet) Models() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.byModel))
	for m := range f.byModel {
		if m != "" {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}

// Stats is a summary for Prometheus.
type Stats struct {
	WorkersByState  map[string]int // every state, zeros included
	WarningsByCode  map[string]int // workers carrying each code, every known code included
	ConnectedAgents int
	Workers         []WorkerStats  // sorted by ID
	ProbeRequests   map[string]int // requests made since the fleet was built, by reason, every reason included

	// Bounds on what agents send: counts since the fleet was built, and
	// what is held now.
	ClaimsRefused   int // capacity keys another node listed, refused
	KeysEvicted     int // capacity keys forgotten because their node had too many
	ResultsRefused  int // probe results that answered no request of this fleet, or came too late
	MeasurementsCut int // measurements whose texts or lists were cut to size
	// HandedOver counts the measurements agents offered in their hellos,
	// by outcome (OfferOutcomes, every one included).
	HandedOver   map[string]int
	Nodes        int // nodes remembered (connected, or with workers)
	CapacityKeys int // capacity keys remembered (workers and cached measurements)
}

// WorkerStats is one worker's numbers.
type WorkerStats struct {
	ID, Model, Node, State string
	Weight                 *float64 // nil when not in the weight table
	Throughput             *float64 // of the newest measurement; nil when it is not valid
	// MeasuredAt is when the newest valid measurement finished; nil
	// without one.
	MeasuredAt *time.Time
	Ranks      []wire.Rank    // KV pools as the agent last reported them
	Warnings   []WarningStats // the warnings shown now, by code
	// PoolsWhole is false while a rank the engine runs has no pool in
	// Ranks (pools_incomplete): no balance may be computed from them.
	PoolsWhole bool

	PrefillWeight    *float64 // nil when not in the prefill weight table
	MaxConcurrency   *int     // as view.Worker's; nil while unknown
	MaxContextTokens *int64   // nil while unknown
	Pinned           bool     // the decode weight is pinned
	PrefillPinned    bool     // the prefill weight is pinned
	HoldReason       string   // one of HoldReasons while held, else ""
}

// WarningStats is one warning a worker carries.
type WarningStats struct{ Code, Severity string }

// WarningCodes lists every code a worker can carry.
var WarningCodes = []string{wire.CodeDPPoolImbalance, wire.CodeGPUClockLow, wire.CodeGPUThrottled,
	wire.CodeForeignGPUProcess, wire.CodeProbeIncompleteOutput, wire.CodeProbeFailed,
	wire.CodeEngineUnreachable, wire.CodeAgentOffline, wire.CodeWeightClamped,
	wire.CodePoolsIncomplete, wire.CodePoolsUnknown, wire.CodePoolsDisagree, wire.CodeNotRoutable, wire.CodeImplausibleMeasurement,
	wire.CodeContextExceedsPool, wire.CodePrefillFailed, wire.CodeDeployment, wire.CodeDeploymentMismatch, wire.CodeAddressNotAllowed,
	wire.CodeProbation, wire.CodeNodeShareCapped, wire.CodeNodeCapacityCapped, wire.CodeProbeDeferred}

// ProbeReasons lists every reason a probe is requested for.
var ProbeReasons = []string{wire.ReasonRegistration, wire.ReasonScheduled, wire.ReasonOnDemand}

// States lists every worker state.
var States = []string{view.StatePending, view.StateMeasuring, view.StateAdmitted, view.StateStale, view.StateHeld, view.StateOffline}

// Stats counts workers by state and warning, and lists each worker's
// weight and throughput.
func (f *Fleet) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := Stats{WorkersByState: map[string]int{}, WarningsByCode: map[string]int{}, Workers: make([]WorkerStats, 0, len(f.workers)),
		ProbeRequests: map[string]int{}, HandedOver: map[string]int{}}
	for _, r := range ProbeReasons {
		s.ProbeRequests[r] = f.probeRequests[r]
	}
	for _, o := range OfferOutcomes {
		s.HandedOver[o] = f.handedOver[o]
	}
	for _, st := range States {
		s.WorkersByState[st] = 0
	}
	for _, c := range WarningCodes {
		s.WarningsByCode[c] = 0
	}
	for _, n := range f.nodes {
		if n.connected {
			s.ConnectedAgents++
		}
	}
	s.ClaimsRefused, s.KeysEvicted, s.ResultsRefused, s.MeasurementsCut = f.claimsRefused, f.keysEvicted, f.resultsRefused, f.measurementsCut
	s.Nodes, s.CapacityKeys = len(f.nodes), len(f.owner)
	for _, w := range f.workers {
		s.WorkersByState[w.state]++
		for c := range w.since {
			s.WarningsByCode[c]++
		}
		ws := WorkerStats{ID: w.id, Model: w.eng.Model, Node: w.node, State: w.state, Weight: clonePtr(w.weight),
			Ranks: slices.Clone(w.pools().Ranks), Warnings: make([]WarningStats, len(w.findings)), PoolsWhole: health.Whole(w.pools()),
			PrefillWeight: clonePtr(w.prefill.weight), MaxConcurrency: MaxConcurrency(w.eng.MaxRunning, w.weight),
			MaxContextTokens: maxContext(w.pools()), HoldReason: f.holdReason(w)}
		_, ws.Pinned = f.pins[w.id]
		_, ws.PrefillPinned = f.prefillPins[w.id]
		for i, x := range w.findings {
			ws.Warnings[i] = WarningStats{Code: x.Code, Severity: x.Severity}
		}
		if c := f.cache[w.id]; c != nil && !w.placeholder {
			if m := c.latest; m != nil && m.Valid() {
				tps := m.ThroughputTPS
				ws.Throughput = &tps
			}
			ws.MeasuredAt = c.lastValidAt()
		}
		s.Workers = append(s.Workers, ws)
	}
	sort.Slice(s.Workers, func(i, j int) bool { return s.Workers[i].ID < s.Workers[j].ID })
	return s
}

// RecomputeWeights recomputes every model's weights from its admitted
// workers' throughputs: a median per model and a clamp per worker. The
// fleet does this itself for the model a change touched; it is exported so
// a benchmark can time the whole fleet's worth.
func (f *Fleet) RecomputeWeights() {
	f.mu.Lock()
	defer f.mu.Unlock()
	now, changed := f.now(), false
	for model := range f.byModel {
		if f.reweigh(model, now) {
			changed = true
		}
	}
	if changed {
		f.notify()
	}
}

// Reevaluate re-derives every worker's state, warnings and weight from
// scratch, as a coordinator restart does; exported for benchmarks.
func (f *Fleet) Reevaluate() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refreshAll(f.now()) {
		f.notify()
	}
}

func (f *Fleet) view(w *worker) view.Worker {
	v := view.Worker{
		ID: w.id, Node: w.node, Model: w.eng.Model, Engine: w.eng.Kind, URL: w.eng.URL, State: w.state,
		Weight: clonePtr(w.weight), ComputedWeight: clonePtr(w.computed),
		Ranks: make([]view.Rank, len(w.pools().Ranks)), Warnings: make([]view.Warning, len(w.findings)),
		EngineVersion: w.eng.Version, AdminDecision: publicDecision(f.decisions[w.id]), LaunchArgs: slices.Clone(w.eng.LaunchArgs),
		GPUs: append([]wire.GPU{}, w.shownGPUs...), Load: w.eng.Load, History: []view.MeasurementPoint{},
		AgentConnected: f.connected(w), ProbeStatus: w.probe.status,
		Address: Address(w.eng), MaxConcurrency: MaxConcurrency(w.eng.MaxRunning, w.weight),
		MaxRunningSource: w.eng.MaxRunningSource, AdvertiseSource: w.eng.AdvertiseSource,
		BelowFloor: f.decisions[w.id] == DecisionHoldBelowFloor,
	}
	if w.eng.MaxRunning > 0 {
		n := w.eng.MaxRunning
		v.MaxRunning = &n
	}
	v.Load.Ranks = slices.Clone(v.Load.Ranks)
	if p, ok := f.pins[w.id]; ok {
		v.PinnedWeight = &p
	}
	if p, ok := f.prefillPins[w.id]; ok {
		v.PinnedPrefillWeight = &p
	}
	v.PrefillWeight, v.ComputedPrefillWeight = clonePtr(w.prefill.weight), clonePtr(w.prefill.computed)
	if p := w.eng.Passive; p != nil {
		pc := *p
		v.Passive = &pc
	}
	if p := w.eng.Pace; p != nil {
		pc := *p
		v.Pace = &pc
	}
	if m := f.newest(w.id); m != nil && m.Valid() && w.tps > 0 {
		_, v.WeightSource = w.capacity(m)
		switch v.WeightSource {
		case SourceRescaled:
			v.PaceFactor, v.PaceTentative = w.pace.factor, w.pace.tentative
		case SourceClock:
			v.ClockFactor = w.clockFactor(m)
		}
	}
	if f.drained(w) {
		zero := 0.0
		v.Draining, v.Weight = true, &zero
		if v.PrefillWeight != nil {
			v.PrefillWeight = &zero
		}
	}
	v.MaxContextTokens = maxContext(w.pools())
	if n := w.eng.MaxModelLen; n > 0 {
		v.MaxModelLen = &n
	}
	for i, r := range w.pools().Ranks {
		v.Ranks[i] = view.Rank{DPRank: r.DPRank, KVTokens: r.KVTokens}
	}
	for i, x := range w.findings {
		v.Warnings[i] = view.Warning{Code: x.Code, Severity: x.Severity, Message: x.Message, Since: w.since[x.Code]}
	}
	if ratio, ok := health.EnginePoolRatio(w.pools()); ok {
		v.PoolRatio = &ratio
	}
	if p := w.pools(); p.Complete != nil {
		complete, expected := *p.Complete, p.ExpectedRanks
		v.Complete, v.ExpectedRanks, v.MissingRanks = &complete, &expected, slices.Clone(p.MissingRanks)
	}
	if l := w.eng.LogSource; l != nil {
		lc := *l
		v.LogSource = &lc
	}
	v.Deployment = f.deploymentView(w)
	if !w.lastSeen.IsZero() {
		t := w.lastSeen
		v.LastSeen = &t
	}
	if c := f.cache[w.id]; c != nil && !w.placeholder {
		if m := c.latest; m != nil {
			mc := cloneMeasurement(*m)
			mc.Problems = clipProblems(mc.Problems)
			if mc.Prefill != nil {
				mc.Prefill.Problems = clipProblems(mc.Prefill.Problems)
			}
			at := m.FinishedAt
			v.Measurement, v.MeasuredAt = &mc, &at
			if m.Valid() {
				tps, warm := m.ThroughputTPS, m.WarmupTPS
				v.Throughput, v.WarmupTPS = &tps, &warm
			}
			if m.PrefillValid() {
				tps := m.Prefill.ThroughputTPS
				v.PrefillTPS = &tps
			}
		}
		if c.points != nil {
			v.History = c.points
		}
	}
	return v
}

// lastValidAt is when the newest valid measurement finished, or nil.
func (c *cached) lastValidAt() *time.Time {
	var at time.Time
	if m := c.latest; m != nil && m.Valid() {
		at = m.FinishedAt
	}
	for i := len(c.points) - 1; i >= 0; i-- {
		if p := c.points[i]; p.Valid {
			if p.At.After(at) {
				at = p.At
			}
			break
		}
	}
	if at.IsZero() {
		return nil
	}
	return &at
}

func clonePtr(p *float64) *float64 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// View limits on a measurement's problems: the views go to every dashboard
// on every change, the whole record stays in the store.
const (
	viewProblems     = 8
	viewProblemBytes = 512
)

// clipProblems keeps the first few problems, each cut short, and says how
// many were left out.
func clipProblems(ps []string) []string {
	if len(ps) == 0 {
		return ps
	}
	out := make([]string, 0, min(len(ps), viewProblems+1))
	for i, p := range ps {
		if i == viewProblems {
			out = append(out, fmt.Sprintf("(%d more)", len(ps)-viewProblems))
			break
		}
		out = append(out, wire.Clip(p, viewProblemBytes))
	}
	return out
}
