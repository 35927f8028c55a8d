package fleet

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/shared/health"
	"heft/shared/view"
	"heft/shared/wire"
)

// Errors callers map to responses.
var (
	// ErrNotFound: no worker (or pin) with that ID.
	ErrNotFound = errors.New("no such worker")
	// ErrInvalid: the input was rejected; the fleet is unchanged.
	ErrInvalid = errors.New("invalid input")
	// ErrNotConnected: the worker's agent is not connected, so nothing can
	// be sent to it.
	ErrNotConnected = errors.New("the worker's agent is not connected")
)

// Config holds the fleet's timings and limits.
type Config struct {
	CacheTTL       time.Duration // a fresh valid measurement makes a reconnect or restart cost no burst
	RemeasureEvery time.Duration // scheduled (idle-only) re-measurement
	OfflineGrace   time.Duration // an agent gone this long makes its workers stale (still routed) or offline
	// StaleWeightTTL is how long a worker whose agent is gone keeps its
	// last weight (state stale) when nothing said its engine was down;
	// counted from the disconnect. Zero: CacheTTL.
	StaleWeightTTL time.Duration
	BusyRetry      time.Duration // ask again this long after deferred_busy
	FailRetry      time.Duration // ask again this long after a failed or invalid probe
	ProbeTimeout   time.Duration // a request with no answer is re-sent after this long
	ForgetAfter    time.Duration // an offline worker unseen this long is dropped from the fleet
	WeightMin      float64
	WeightMax      float64
	HistoryLen     int // measurements kept per capacity key
	Thresholds     health.Thresholds

	// Plausibility: a measurement beyond these is held with
	// implausible_measurement until an admin admits its worker. Zero
	// turns a check off.
	ImplausibleFactor float64 // × the model's median throughput, with at least 3 workers measured
	MaxTPSPerGPU      float64 // tok/s per GPU of the engine (one when it lists none)
	MaxStreamTPS      float64 // tok/s of one request's stream

	// Probation: a worker first seen less than this long ago, or whose
	// last two valid measurements disagree by more than probationAgree,
	// gets a weight of at most 1 and is not counted in its model's median
	// until an admin admits it (probation.go). Zero turns it off.
	Probation time.Duration
	// MaxNodeShare caps the share of a model's weight one node's workers
	// hold, once the model has weighted workers on minNodesForShare
	// nodes (probation.go). Zero turns it off.
	MaxNodeShare float64

	// MaxKeysPerNode bounds the capacity keys the fleet remembers for one
	// node (its workers and cached measurements); past it the one listed
	// least recently is forgotten.
	MaxKeysPerNode int
	// KeyTombTTL is how long a forgotten capacity key stays its node's
	// (keytombs.go), and MaxKeyTombs bounds how many are kept; zero turns
	// them off.
	KeyTombTTL  time.Duration
	MaxKeyTombs int

	// SingleHost says every gateway runs on the coordinator's host (a
	// one-host fleet, such as the demo): an engine offered at a loopback
	// address is then reachable, so not_routable is not raised.
	SingleHost bool
}

// Defaults of the key tombs: as long as the coordinator keeps an unseen
// node's name (nodes.DefaultForgetAfter), and a few per node of a large
// fleet.
const (
	DefaultKeyTombTTL  = 30 * 24 * time.Hour
	DefaultMaxKeyTombs = 50000
)

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		CacheTTL:       6 * time.Hour,
		RemeasureEvery: 6 * time.Hour,
		OfflineGrace:   30 * time.Second,
		BusyRetry:      30 * time.Second,
		FailRetry:      2 * time.Minute,
		ProbeTimeout:   10 * time.Minute,
		ForgetAfter:    24 * time.Hour,
		WeightMin:      0.25,
		WeightMax:      8,
		HistoryLen:     50,
		Thresholds:     health.DefaultThresholds(),

		ImplausibleFactor: 4,
		MaxTPSPerGPU:      100000,
		MaxStreamTPS:      5000,
		Probation:         time.Hour,
		MaxNodeShare:      0.5,
		MaxKeysPerNode:    2 * wire.MaxEngines,
		KeyTombTTL:        DefaultKeyTombTTL,
		MaxKeyTombs:       DefaultMaxKeyTombs,
	}
}

// Validate returns every problem with a Config; the error wraps
// ErrInvalid.
func (c Config) Validate() error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"cache_ttl", c.CacheTTL}, {"remeasure_every", c.RemeasureEvery}, {"offline_grace", c.OfflineGrace},
		{"busy_retry", c.BusyRetry}, {"fail_retry", c.FailRetry}, {"probe_timeout", c.ProbeTimeout}, {"forget_after", c.ForgetAfter}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("fleet %s must be above zero, is %s", d.name, d.v))
		}
	}
	if c.StaleWeightTTL < 0 {
		errs = append(errs, fmt.Errorf("fleet stale_weight_ttl must not be negative (0: cache_ttl), is %s", c.StaleWeightTTL))
	}
	if c.HistoryLen < 1 {
		errs = append(errs, fmt.Errorf("history length %d, need at least 1", c.HistoryLen))
	}
	if c.KeyTombTTL < 0 || c.MaxKeyTombs < 0 {
		errs = append(errs, fmt.Errorf("fleet key_tomb_ttl and max_key_tombs must not be negative (0: off), are %s and %d", c.KeyTombTTL, c.MaxKeyTombs))
	}
	if c.MaxKeysPerNode < wire.MaxEngines {
		errs = append(errs, fmt.Errorf("max_keys_per_node must be at least %d (the engines one snapshot may list), is %d", wire.MaxEngines, c.MaxKeysPerNode))
	}
	errs = append(errs, CheckPlausibility(c.ImplausibleFactor, c.MaxTPSPerGPU, c.MaxStreamTPS))
	errs = append(errs, CheckProbation(c.Probation, c.MaxNodeShare))
	errs = append(errs, CheckWeightRange(c.WeightMin, c.WeightMax), CheckThresholds(c.Thresholds))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// CheckWeightRange checks the range computed weights are clamped to. A
// weight of 1 is the median worker, so the range must hold it. The
// configuration's validation uses it too.
func CheckWeightRange(lo, hi float64) error {
	if !finite(lo) || !finite(hi) || lo <= 0 || lo > 1 || hi < 1 {
		return fmt.Errorf("need 0 < weight_min <= 1 <= weight_max, got weight_min=%g weight_max=%g", lo, hi)
	}
	return nil
}

// CheckPlausibility checks the plausibility limits: each 0 (off) or a
// finite number; a factor, when on, above 1 (the median itself must pass).
// The configuration's validation uses it too.
func CheckPlausibility(factor, perGPU, perStream float64) error {
	var errs []error
	if !finite(factor) || (factor != 0 && factor <= 1) {
		errs = append(errs, fmt.Errorf("plausibility.factor must be 0 (off) or above 1, got %g", factor))
	}
	for _, v := range []struct {
		key string
		v   float64
	}{{"plausibility.max_tps_per_gpu", perGPU}, {"plausibility.max_stream_tps", perStream}} {
		if !finite(v.v) || v.v < 0 {
			errs = append(errs, fmt.Errorf("%s must be 0 (off) or above zero, got %g", v.key, v.v))
		}
	}
	return errors.Join(errs...)
}

// CheckThresholds returns every problem with the warning thresholds:
// fractions, where 0 turns a warning off, and a pool ratio that holds a
// worker must not be above the one that only warns. The configuration's
// validation uses it too.
func CheckThresholds(th health.Thresholds) error {
	inUnit := func(v float64) bool { return finite(v) && v >= 0 && v <= 1 }
	var errs []error
	if !inUnit(th.PoolHold) || !inUnit(th.PoolWarn) || th.PoolHold > th.PoolWarn {
		errs = append(errs, fmt.Errorf("thresholds: need 0 <= pool_hold <= pool_warn <= 1, got pool_hold=%g pool_warn=%g",
			th.PoolHold, th.PoolWarn))
	}
	if !inUnit(th.ClockLow) {
		errs = append(errs, fmt.Errorf("thresholds.clock_low must be within [0, 1], got %g", th.ClockLow))
	}
	return errors.Join(errs...)
}

// Action is a message for one node's agent: a *wire.ProbeRequest or a
// *wire.CachedMeasurement.
type Action struct {
	Node    string
	Message any
}

// recordEvery is how often a seen worker's record is rewritten even when
// nothing but its last-seen time changed.
const recordEvery = 5 * time.Minute

// clockSkew is how far a measurement's time may be from the coordinator's
// before it is re-stamped.
const clockSkew = time.Hour

// Fleet is the coordinator's set of workers.
type Fleet struct {
	cfg Config
	st  Store
	now func() time.Time
	log hclog.Logger

	// adminMu orders admin actions (pins, decisions) among themselves; it
	// is taken before mu and held across their store writes. See admin.go.
	adminMu sync.Mutex

	mu      sync.Mutex
	dpBound *bindings // [[dp_deployment]] bindings in force; nil for none (dpbind.go)
	workers map[string]*worker
	byModel map[string]map[string]*worker
	nodes   map[string]*node
	cache   map[string]*cached
	pins    map[string]float64
	// prefillPins are the prefill weight's pins, apart from pins.
	prefillPins map[string]float64
	decisions   map[string]string
	connSeq     uint64
	reqSeq      uint64
	// probeRequests counts the requests made, by reason: each asks an
	// agent for a burst on its engine.
	probeRequests map[string]int
	reqPrefix     string
	nextDue       time.Time
	dirty         map[string]bool // models to re-weigh at the next refresh
	// records are worker records waiting to be written once the lock is
	// released: a disk sync under the lock would stall every agent.
	records []WorkerRecord
	// forgets are capacity keys whose stored worker record, or stored
	// measurements, are to be deleted once the lock is released.
	forgets []forget
	// adopted are measurements taken from agents' offers (offer.go), to
	// be stored once the lock is released.
	adopted []wire.Measurement
	// owner is the node each remembered capacity key belongs to: the node
	// that first listed it. Another node's claim is refused until the key
	// is forgotten. keys is the same, by node, with when each was listed.
	owner map[string]string
	keys  map[string]map[string]time.Time
	// keyTombs are the owners of forgotten keys (keytombs.go), and
	// tombWrites their store writes once the lock is released.
	keyTombs   map[string]KeyTomb
	tombsOf    map[string]map[string]bool // keyTombs' keys by node
	tombAge    tombQueue                  // keyTombs' keys, oldest first
	tombWrites []tombWrite
	nextSweep  time.Time
	// evictionLogged is when a key eviction was last logged.
	evictionLogged time.Time
	// counters for /metrics
	claimsRefused   int
	keysEvicted     int
	resultsRefused  int
	measurementsCut int
	handedOver      map[string]int // offered measurements, by outcome (offer.go)

	// seq numbers changes: each worker carries the seq of its last
	// change, and removed workers leave a tombstone, so that a subscriber
	// can ask for what changed since the seq it has seen.
	seq        uint64
	tombs      []tomb
	tombsFloor uint64 // changes at or below this may have lost their tombstones

	// scratch is where assemble builds a worker's warnings.
	scratch []health.Finding

	subMu  sync.Mutex
	subs   map[uint64]chan struct{}
	subSeq uint64
}

// node is one agent's connection state.
type node struct {
	name      string
	conn      uint64
	connected bool
	order     uint64 // fleet-wide order of connections: a higher one is newer
	// reported: a valid snapshot came on the current connection. Only
	// then is the agent back (present): a hello alone says nothing of
	// the engine, and an agent whose snapshots are all refused is as
	// away as one that never reconnects.
	reported bool
	// since is when the agent came back (its connection's first valid
	// snapshot) or, while it is not present, when it left: its last
	// present connection ended or was replaced. A hello does not move it.
	since   time.Time
	workers map[string]*worker
	// badAddr holds, by capacity key, why the server refused the address
	// the node's engine offers gateways (see SetAddressRefusals).
	badAddr map[string]string
	// gpus is how many distinct GPUs its last snapshot reported, known
	// once one came since the coordinator started (nodebound.go).
	gpus      int
	gpusKnown bool
	// tps is its workers' throughputs together while tpsStale is false
	// (nodebound.go).
	tps      float64
	tpsStale bool
	// offers are the measurements its agent's hello offered, by capacity
	// key, until the connection's first snapshot judges them (offer.go).
	offers map[string]wire.CachedMeasurement
}

// forget is a stored record to delete: a worker record, or all of a
// capacity key's measurements.
type forget struct {
	key          string
	worker       bool
	measurements bool
}

// tomb records that a worker left the fleet at seq.
type tomb struct {
	id  string
	seq uint64
}

// cached is what is known about one capacity key's measurements.
type cached struct {
	latest  *wire.Measurement
	history []wire.Measurement // oldest first
	// points is history as the view shows it. It is rebuilt, never
	// changed in place, so views can share it.
	points []view.MeasurementPoint
}

type probeState struct {
	reqID       string
	reason      string
	outstanding bool
	idleOnly    bool // the current request measures only an idle engine
	sentAt      time.Time
	status      string // the agent's last word on the current attempt
	retryAt     time.Time
	failure     string // the last failed status's message, until a valid result
	// busy counts the deferred_busy answers in a row since the last valid
	// measurement; each doubles the wait before the next request
	// (busyRetry), and the worker says so (probe_deferred).
	busy    int
	busyMsg string // the last deferred_busy message
	// issued are the last requests sent, newest first: a result is taken
	// only for one of them, once, within ProbeTimeout of its sending.
	issued [2]issued
}

type issued struct {
	id       string
	node     string
	at       time.Time
	answered bool
}

type worker struct {
	id          string
	placeholder bool
	node        string
	eng         wire.Engine
	gpus        []wire.GPU
	shownGPUs   []wire.GPU   // what its view shows of gpus (gpus.go)
	judged      *wire.Engine // the pools it is judged on, when a multi-node deployment's differ from eng's (deployment.go)
	firstSeen   time.Time
	lastSeen    time.Time
	saved       WorkerRecord
	savedAt     time.Time
	greeted     uint64 // node.order of the connection this worker was greeted on
	probe       probeState
	// remeasure names why its engine must be measured again now (it
	// restarted, its GPUs changed; remeasure.go); "" once measured.
	remeasure string
	// passiveLow counts passive readings in a row below its measurement.
	passiveLow int
	// pace is its pace reference and rescale (pace.go).
	pace paceState
	// throttledSince is when its GPUs began to report a slowdown reason
	// (zero: they do not); throttleAsked, that this spell asked for a
	// re-measurement; throttleReadings, the pace readings whose windows
	// began in the spell (throttle.go). pacedAt is when the newest pace
	// reading was counted, on the coordinator's clock.
	throttledSince   time.Time
	throttleAsked    bool
	throttleReadings int
	pacedAt          time.Time
	// memoryShortSince is when the memory its measured burst held stopped
	// fitting on its GPUs (zero: it fits); memoryShortAsked, that this
	// spell asked for a re-measurement (memory.go).
	memoryShortSince time.Time
	memoryShortAsked bool

	// Derived by evaluate, weigh and publish.
	state       string
	base        []health.Finding // from facts and measurement
	tps         float64          // throughput counted in the model's median: admitted and valid, else 0
	computed    *float64         // clamped throughput / median, before a pin
	weight      *float64         // what the weight table shows
	clamp       *health.Finding  // weight_clamped, when the clamp set the weight
	findings    []health.Finding // published: base + clamp, sorted
	shownWeight *float64         // the weight when findings were published
	since       map[string]time.Time
	// outlier is set by weigh for an admitted worker measured at more than
	// ImplausibleFactor × its model's median: it is held.
	outlier *health.Finding
	rev     uint64 // f.seq of its last change
	// probation: its weight is not yet earned (probation.go); note is the
	// finding that says so, shareNote the one saying its node's share of
	// the model's weight was capped.
	probation bool
	note      *health.Finding
	shareNote *health.Finding
	// boundNote says its weight was scaled down because its node's
	// workers together measure more than the node's GPUs deliver
	// (nodebound.go).
	boundNote *health.Finding
	// probationMsg caches the text of its probation finding for a
	// probation period (probation.go): its first-seen time never changes.
	// lowered is that text with its weight lowered to 1, for the weight
	// loweredWeight. It sits with the fields weigh reads: a large model's
	// weighing is bound by memory reads.
	probationMsg struct {
		period        time.Duration
		text          string
		lowered       string
		loweredWeight float64
	}
	// The prefill weight, derived the same way from the prefill
	// throughput of an admitted worker with a valid prefill part.
	prefill      weighed
	shownPrefill *float64
}

// weighed is one weight of a worker: what it is counted with in its
// model's median, and what that made of it.
type weighed struct {
	tps      float64         // counted in the model's median: admitted and valid, else 0
	computed *float64        // clamped tps / median, before a pin
	weight   *float64        // what the weight table shows
	clamp    *health.Finding // weight_clamped, when the clamp set the weight
}

// New builds a fleet from what st holds: pins, decisions, cached
// measurements, and the workers last seen within ForgetAfter, which start
// as if their agents had just disconnected.
func New(cfg Config, st Store, now func() time.Time, logger hclog.Logger) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if st == nil {
		return nil, errors.New("fleet: no store")
	}
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	state, err := st.Load()
	if err != nil {
		return nil, fmt.Errorf("fleet: load state: %w", err)
	}
	start := now()
	f := &Fleet{
		cfg: cfg, st: st, now: now, log: logger.Named("fleet"),
		workers: map[string]*worker{}, byModel: map[string]map[string]*worker{}, nodes: map[string]*node{},
		cache: map[string]*cached{}, pins: map[string]float64{}, prefillPins: map[string]float64{},
		decisions: map[string]string{}, dirty: map[string]bool{},
		probeRequests: map[string]int{}, handedOver: map[string]int{},
		owner: map[string]string{}, keys: map[string]map[string]time.Time{}, keyTombs: map[string]KeyTomb{}, tombsOf: map[string]map[string]bool{},
		seq:       1, // 0 is a subscriber that has seen nothing
		reqPrefix: strconv.FormatInt(start.UnixNano(), 36),
		subs:      map[uint64]chan struct{}{},
	}
	f.restore(state, start)
	f.refreshAll(start)
	f.writeRecords()
	f.log.Info("fleet loaded", "workers", len(f.workers), "pins", len(f.pins), "prefill_pins", len(f.prefillPins),
		"decisions", len(f.decisions), "cached_measurements", len(state.Latest))
	return f, nil
}

// restore takes what a store held, skipping (with a warning) what no
// longer validates. Workers come first: the node of a worker record owns
// its capacity key, and a measurement another node sent for that key is
// not served.
func (f *Fleet) restore(state State, start time.Time) {
	for id, w := range state.Pins {
		if validWeight(w) {
			f.pins[id] = w
		} else {
			f.log.Warn("ignoring stored pin", "worker", id, "weight", w)
		}
	}
	for id, w := range state.PrefillPins {
		if validWeight(w) {
			f.prefillPins[id] = w
		} else {
			f.log.Warn("ignoring stored prefill pin", "worker", id, "weight", w)
		}
	}
	for id, d := range state.Decisions {
		if validDecision(d) {
			f.decisions[id] = d
		} else {
			f.log.Warn("ignoring stored decision", "worker", id, "decision", d)
		}
	}
	f.restoreWorkers(state.Workers, start)
	f.restoreMeasurements(state.Latest, state.History)
	f.restoreTombs(state.KeyTombs, start)
}

func (f *Fleet) restoreMeasurements(latest map[string]wire.Measurement, history map[string][]wire.Measurement) {
	// ours reports whether a stored measurement may be served for key: it
	// validates, and no other node than the key's owner sent it.
	ours := func(key string, m wire.Measurement) bool {
		if m.Validate() != nil || m.CapacityKey != key {
			return false
		}
		owner := f.owner[key]
		return owner == "" || m.Node == "" || m.Node == owner
	}
	for key, m := range latest {
		if !ours(key, m) {
			f.log.Warn("ignoring stored measurement: invalid, or sent by another node than the key's", "capacity_key", key, "node", m.Node)
			continue
		}
		m := m
		f.entry(key).latest = &m
		if m.Node != "" && f.owner[key] == "" {
			f.claim(key, m.Node, m.FinishedAt)
		}
	}
	for key, list := range history {
		var ok []wire.Measurement
		for _, m := range list {
			if ours(key, m) {
				ok = append(ok, HistoryEntry(m))
			}
		}
		if len(ok) > 0 {
			f.entry(key).setHistory(ok, f.cfg.HistoryLen)
			if n := ok[len(ok)-1].Node; n != "" && f.owner[key] == "" {
				f.claim(key, n, ok[len(ok)-1].FinishedAt)
			}
		}
	}
}

// restoreWorkers brings back the workers seen within ForgetAfter, as if
// their agents had disconnected at start, or when they did if that was
// before, as the engine was when last heard of: an engine known down stays
// out of the weights and a worker past its stale TTL stays offline. Older
// records are deleted.
func (f *Fleet) restoreWorkers(records map[string]WorkerRecord, start time.Time) {
	// One endpoint may have several records (it was restarted with other
	// launch arguments); only the one seen last is still there.
	latestAt := map[[2]string]WorkerRecord{}
	for _, r := range records {
		k := [2]string{r.Node, r.URL}
		if old, ok := latestAt[k]; !ok || r.LastSeen.After(old.LastSeen) || (r.LastSeen.Equal(old.LastSeen) && r.ID > old.ID) {
			latestAt[k] = r
		}
	}
	for id, r := range records {
		if id == "" || r.ID != id || wire.CheckRanks(r.Ranks) != nil || r.Node == "" {
			f.log.Warn("ignoring stored worker", "worker", id)
			continue
		}
		if start.Sub(r.LastSeen) >= f.cfg.ForgetAfter {
			f.forgets = append(f.forgets, forget{key: id, worker: true})
			if forgotten := r.LastSeen.Add(f.cfg.ForgetAfter); start.Sub(forgotten) < f.cfg.KeyTombTTL {
				f.bury(id, r.Node, forgotten) // as Tick would have, had it run
			}
			continue
		}
		f.claim(id, r.Node, r.LastSeen)
		if latestAt[[2]string{r.Node, r.URL}].ID != id {
			continue
		}
		n := f.nodeFor(r.Node)
		if n.since.IsZero() {
			n.since = start
		}
		if r.AgentGone != nil && r.AgentGone.Before(n.since) {
			n.since = *r.AgentGone // gone before the restart: the grace and the stale TTL run on
		}
		eng := wire.Engine{Kind: r.Engine, URL: r.URL, Model: r.Model, Version: r.EngineVersion, Ready: !r.EngineDown,
			CapacityKey: id, LaunchArgs: r.LaunchArgs, Ranks: r.Ranks,
			ExpectedRanks: r.ExpectedRanks, Complete: r.Complete, MissingRanks: r.MissingRanks, MaxModelLen: max(r.MaxModelLen, 0)}
		if wire.CheckCompleteness(eng.Ranks, eng.ExpectedRanks, eng.Complete, eng.MissingRanks) != nil {
			// Say nothing of completeness rather than something wrong.
			eng.ExpectedRanks, eng.Complete, eng.MissingRanks = 0, nil, nil
		}
		w := &worker{id: id, node: r.Node, firstSeen: r.FirstSeen, lastSeen: r.LastSeen, saved: r, savedAt: start, eng: eng}
		if r.Pace != nil {
			if err := r.Pace.check(); err != nil {
				// The reference is learned again from the measurement.
				f.log.Warn("ignoring stored pace reference", "worker", id, "error", err)
			} else {
				w.pace = r.Pace.state()
			}
		}
		f.add(w)
	}
	// A record written while its agent was connected now says when the
	// agent was last known gone: at this start.
	for _, w := range sortedWorkers(f.workers) {
		f.saveWorker(w, start, false)
	}
}

// claim makes node the owner of key, listed at the latest at.
func (f *Fleet) claim(key, node string, at time.Time) {
	f.unbury(key)
	f.owner[key] = node
	ks := f.keys[node]
	if ks == nil {
		ks = map[string]time.Time{}
		f.keys[node] = ks
	}
	if at.After(ks[key]) {
		ks[key] = at
	}
}

// lapse forgets what the fleet keeps of a capacity key no agent lists:
// its cached measurements, and its owner unless an admin pinned it or
// decided on it. A pinned key stays its node's, so that no other node
// can claim it and inherit the pin, and the pin goes when that node's
// name is released or forgotten (ForgetNode).
func (f *Fleet) lapse(key string) {
	_, pin := f.pins[key]
	_, prefillPin := f.prefillPins[key]
	_, decision := f.decisions[key]
	if !pin && !prefillPin && !decision {
		node := f.owner[key]
		f.release(key)
		f.bury(key, node, f.now())
		return
	}
	if _, ok := f.cache[key]; ok {
		delete(f.cache, key)
		f.forgets = append(f.forgets, forget{key: key, measurements: true})
	}
}

// release forgets a capacity key: its owner and its cached measurements,
// here and (after the lock is released) in the store. Its worker, if any,
// must already be gone. Pins and decisions stay, as for a forgotten worker.
func (f *Fleet) release(key string) {
	node := f.owner[key]
	delete(f.owner, key)
	if ks := f.keys[node]; ks != nil {
		delete(ks, key)
		if len(ks) == 0 {
			delete(f.keys, node)
		}
	}
	if _, ok := f.cache[key]; ok {
		delete(f.cache, key)
		f.forgets = append(f.forgets, forget{key: key, measurements: true})
	}
}

func (f *Fleet) entry(key string) *cached {
	c := f.cache[key]
	if c == nil {
		c = &cached{}
		f.cache[key] = c
	}
	return c
}

func (c *cached) appendHistory(m wire.Measurement, limit int) {
	c.setHistory(append(c.history, m), limit)
}

func (c *cached) setHistory(list []wire.Measurement, limit int) {
	c.history = list
	if over := len(c.history) - limit; over > 0 {
		c.history = append([]wire.Measurement(nil), c.history[over:]...)
	}
	c.points = make([]view.MeasurementPoint, len(c.history))
	for i, h := range c.history {
		c.points[i] = view.MeasurementPoint{At: h.FinishedAt, ThroughputTPS: h.ThroughputTPS, WarmupTPS: h.WarmupTPS, Valid: h.Valid(),
			PrefillTPS: prefillTPS(h), Trigger: h.Trigger, Cause: h.Cause}
	}
}

func (f *Fleet) newest(id string) *wire.Measurement {
	if c := f.cache[id]; c != nil {
		return c.latest
	}
	return nil
}

func (f *Fleet) nodeFor(name string) *node {
	n := f.nodes[name]
	if n == nil {
		n = &node{name: name, workers: map[string]*worker{}}
		f.nodes[name] = n
	}
	return n
}

// add indexes a new worker. Its model is not weighed again for it: a
// worker without a throughput changes no other worker's weight, and
// refresh marks the model once it has one. Weighing a model of N workers
// for each new one made admitting a fleet cost N² weighings.
func (f *Fleet) add(w *worker) {
	f.touch(w)
	f.workers[w.id] = w
	n := f.nodeFor(w.node)
	n.workers[w.id] = w
	n.tpsStale = true
	f.index(w, w.eng.Model)
}

func (f *Fleet) index(w *worker, model string) {
	m := f.byModel[model]
	if m == nil {
		m = map[string]*worker{}
		f.byModel[model] = m
	}
	m[w.id] = w
}

func (f *Fleet) unindex(w *worker, model string) {
	if m := f.byModel[model]; m != nil {
		delete(m, w.id)
		if len(m) == 0 {
			delete(f.byModel, model)
		}
	}
}

// drop removes a worker from the fleet; its cached measurements stay (and
// with them its key's owner) until they are too old to reuse. A node left
// without workers and without a connection is forgotten.
func (f *Fleet) drop(w *worker) {
	if w.tps > 0 {
		f.markNodeModels(w.node) // its node's bound no longer counts it
	}
	delete(f.workers, w.id)
	if n := f.nodes[w.node]; n != nil {
		delete(n.workers, w.id)
		n.tpsStale = true
		if len(n.workers) == 0 && !n.connected {
			delete(f.nodes, n.name)
		}
	}
	f.unindex(w, w.eng.Model)
	f.dirty[w.eng.Model] = true
	f.seq++
	f.tombs = append(f.tombs, tomb{id: w.id, seq: f.seq})
	if over := len(f.tombs) - maxTombs; over > 0 {
		f.tombsFloor = f.tombs[over-1].seq
		f.tombs = append([]tomb(nil), f.tombs[over:]...)
	}
	if w.placeholder {
		return
	}
	if _, cached := f.cache[w.id]; !cached {
		f.lapse(w.id)
	}
}

// maxTombs bounds the removals remembered for subscribers; one that has
// fallen further behind gets the whole fleet again.
const maxTombs = 4096

// touch marks a worker changed.
func (f *Fleet) touch(w *worker) {
	f.seq++
	w.rev = f.seq
}

// present reports whether the node's agent is back: connected, and a
// valid snapshot came on that connection.
func (n *node) present() bool { return n.connected && n.reported }

// leave records that the node's agent is no longer present from now (its
// connection ended or was replaced); the time it left stays that of its
// last present connection.
func (n *node) leave(now time.Time) {
	if n.present() {
		n.since = now
	}
	n.reported = false
}

// offline reports whether the worker's agent has been away past the grace.
func (f *Fleet) offline(w *worker, now time.Time) bool {
	n := f.nodes[w.node]
	return n == nil || (!n.present() && !now.Before(n.since.Add(f.cfg.OfflineGrace)))
}

// staleTTL is how long after its agent left a worker keeps its weight.
func (c Config) staleTTL() time.Duration {
	if c.StaleWeightTTL > 0 {
		return c.StaleWeightTTL
	}
	return c.CacheTTL
}

// staleUntil is when the worker's last weight stops counting, its agent
// being away; zero while the agent is present or unknown.
func (f *Fleet) staleUntil(w *worker) time.Time {
	n := f.nodes[w.node]
	if n == nil || n.present() {
		return time.Time{}
	}
	return n.since.Add(f.cfg.staleTTL())
}

func (f *Fleet) connected(w *worker) bool {
	n := f.nodes[w.node]
	return n != nil && n.connected
}

// present reports whether the worker's agent is back (node.present).
func (f *Fleet) present(w *worker) bool {
	n := f.nodes[w.node]
	return n != nil && n.present()
}

// due lowers the next time Tick has work to do.
func (f *Fleet) due(t time.Time) {
	if t.Before(f.nextDue) {
		f.nextDue = t
	}
}

// Changes subscribes to change notifications. The channel receives after
// every change, coalesced: a slow reader gets one wake-up for many changes,
// and the fleet never waits for it. The returned func unsubscribes and
// closes the channel.
func (f *Fleet) Changes() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	f.subMu.Lock()
	f.subSeq++
	id := f.subSeq
	f.subs[id] = ch
	f.subMu.Unlock()
	return ch, sync.OnceFunc(func() {
		f.subMu.Lock()
		delete(f.subs, id)
		close(ch)
		f.subMu.Unlock()
	})
}

func (f *Fleet) notify() {
	f.subMu.Lock()
	defer f.subMu.Unlock()
	for _, ch := range f.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// prefillTPS is a measurement's prefill throughput where it may be used
// for a prefill weight, else 0.
func prefillTPS(m wire.Measurement) float64 {
	if !m.PrefillValid() {
		return 0
	}
	return m.Prefill.ThroughputTPS
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func validWeight(w float64) bool { return finite(w) && w > 0 }

// sortedWorkers returns ws ordered by ID, for deterministic actions.
func sortedWorkers(ws map[string]*worker) []*worker {
	out := make([]*worker, 0, len(ws))
	for _, w := range ws {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}
