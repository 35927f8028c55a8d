// Package syncer drives heft-sync's targets: each fleet state read from
// the coordinator becomes each target's desired state, which a goroutine
// per target applies at once when it changes, and again every resync
// interval so a gateway restarted or reloaded with its file's defaults is
// put back in step. Nothing is applied before the first state arrives, and
// while the coordinator is away the last state keeps being held.
package syncer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/coord"
	"heft/gateway/target"
)

// Checker is a target that can check, before anything is applied, that
// its gateway is there (HAProxy's socket answers and the backend exists).
type Checker interface {
	Check(ctx context.Context) error
}

// Watcher is a target that can tell, sooner than a resync would, that its
// gateway lost what heft-sync set (an HAProxy reload or restart): Watch
// calls lost each time, until ctx ends.
type Watcher interface {
	Watch(ctx context.Context, lost func())
}

// Reader is a target that can say what its gateway sends new requests to
// now. Before heft-sync has applied anything, the floor starts from it:
// a heft-sync that starts, or restarts, while the coordinator lists
// workers the gateway serves as not measured yet keeps them as the gateway
// had them, instead of taking them out.
type Reader interface {
	Served(ctx context.Context) ([]target.Served, error)
}

// seedTimeout bounds a read of a gateway's servers before the first apply.
// It is made without Syncer.evalMu (readFirst), which every weighing of a
// state waits on.
const seedTimeout = 5 * time.Second

const (
	resultUnchanged = "unchanged"
	resultChanged   = "changed"
	resultFailed    = "failed"
)

// Syncer runs the targets.
type Syncer struct {
	runners []*runner
	m       *Metrics
	log     hclog.Logger
	resync  time.Duration
	timeout time.Duration
	floor   Floor
	now     func() time.Time

	mu        sync.Mutex
	connected bool
	lastSnap  time.Time

	// evalMu orders the weighings of a state: a new state and a new list
	// of pending nodes come from different goroutines.
	evalMu  sync.Mutex
	workers []coord.Worker  // the last state, nil before the first
	pending map[string]bool // the nodes the coordinator holds for approval
}

// New returns a Syncer of targets. resync is how often each target is
// applied again without a change (default 5 s). Every model keeps
// DefaultFloor until SetFloor.
func New(targets []target.Target, m *Metrics, resync time.Duration, logger hclog.Logger) *Syncer {
	if resync <= 0 {
		resync = 5 * time.Second
	}
	s := &Syncer{m: m, log: logger.Named("sync"), resync: resync, timeout: time.Minute, floor: DefaultFloor(), now: time.Now}
	for _, t := range targets {
		s.runners = append(s.runners, &runner{t: t, s: s, wake: make(chan struct{}, 1),
			log: logger.Named("sync").With("target", t.Name(), "model", t.Model())})
	}
	return s
}

// SetFloor sets every model's floor; call it before Run.
func (s *Syncer) SetFloor(f Floor) { s.floor = f }

// Hooks are the follower hooks that feed the Syncer (metrics included).
func (s *Syncer) Hooks() coord.Hooks {
	return s.m.CoordinatorHooks(coord.Hooks{
		Snapshot:  s.Update,
		Connected: func(c bool) { s.mu.Lock(); s.connected = c; s.mu.Unlock() },
		Pending:   s.SetPending,
	})
}

// Update hands a fleet state to every target whose desired state it
// changes.
func (s *Syncer) Update(snap coord.Snapshot) {
	s.mu.Lock()
	s.lastSnap = snap.At
	s.mu.Unlock()
	workers := snap.Workers
	if workers == nil {
		workers = []coord.Worker{}
	}
	s.readFirst(workers)
	s.evalMu.Lock()
	defer s.evalMu.Unlock()
	s.workers = workers
	s.weigh()
}

// SetPending sets the nodes the coordinator holds for an admin's
// approval (the follower reads them every few seconds), and weighs the
// last state again with them: a worker heft-sync routed whose node waits
// is kept, and keep_unlisted's countdowns end on time in a quiet fleet.
func (s *Syncer) SetPending(nodes []string) {
	s.evalMu.Lock()
	defer s.evalMu.Unlock()
	next := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		next[n] = true
	}
	if !maps.Equal(next, s.pending) && (len(next) > 0 || len(s.pending) > 0) {
		list := strings.Join(nodes, ", ")
		if list == "" {
			list = "none"
		}
		s.log.Info("nodes waiting for an admin's approval changed", "nodes", list)
	}
	s.pending = next
	s.mu.Lock()
	connected := s.connected
	s.mu.Unlock()
	// Only while connected: a coordinator that is away changes nothing.
	if connected && s.workers != nil {
		s.weigh()
	}
}

// weigh offers the last state to every target (s.evalMu held).
func (s *Syncer) weigh() {
	for _, r := range s.runners {
		s.weighFor(r)
	}
}

// weighFor offers the last state to r (s.evalMu held).
func (s *Syncer) weighFor(r *runner) {
	var models []string
	for _, w := range s.workers {
		if !slices.Contains(models, w.Model) {
			models = append(models, w.Model)
		}
	}
	m, problems := target.ForSelection(r.t.Model(), target.SelectionOf(r.t), s.workers)
	s.m.workers.WithLabelValues(r.t.Name()).Set(float64(len(m.Backends)))
	s.m.setAside.WithLabelValues(r.t.Name()).Set(float64(len(problems)))
	r.offer(m, problems, models, s.now(), belowFloor(s.workers), s.pending)
}

// retrySeed reads what r's gateway serves again, and offers the last
// state to r, while r waits for that read: a quiet coordinator offers
// nothing new.
func (s *Syncer) retrySeed(r *runner) {
	s.evalMu.Lock()
	workers, waiting := s.workers, !r.seedFailing.IsZero() && !r.seeded
	s.evalMu.Unlock()
	if !waiting || workers == nil {
		return
	}
	s.readFor(r, workers)
	s.evalMu.Lock()
	defer s.evalMu.Unlock()
	if !r.seeded && s.workers != nil {
		s.weighFor(r)
	}
}

// readFirst reads, for each target that has applied nothing yet, what its
// gateway serves, where its offer of workers needs that read. (SetPending
// weighs the workers of the last Update, which read already: a read that
// failed is retried by retrySeed.)
func (s *Syncer) readFirst(workers []coord.Worker) {
	for _, r := range s.runners {
		s.readFor(r, workers)
	}
}

// readFor reads what r's gateway serves, when r's offer of workers needs
// it and a read is due, and leaves it in r.read for offer. The read takes
// up to seedTimeout, so it is made without s.evalMu: held, it stalled every
// other weighing (the coordinator's next state, the pending nodes) while
// the gateway did not answer.
func (s *Syncer) readFor(r *runner, workers []coord.Worker) {
	rd, ok := target.As[Reader](r.t)
	if !ok {
		return
	}
	s.evalMu.Lock()
	due, m := false, target.Model{}
	if !r.seeded && r.read == nil {
		m, _ = target.ForSelection(r.t.Model(), target.SelectionOf(r.t), workers)
		due = len(m.Backends) > 0 && r.seedDue(s.now())
	}
	s.evalMu.Unlock()
	if !due {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(seedTimeout, s.timeout))
	seed, err := rd.Served(ctx)
	cancel()
	if err == nil {
		// Each server's address as the coordinator writes it where they
		// resolve alike; these lookups, slow while DNS is, are made
		// without the lock too.
		ctx, cancel := context.WithTimeout(context.Background(), min(seedTimeout, s.timeout))
		names := addressesOf(ctx, m)
		for i := range seed {
			seed[i].Address = names.of(ctx, seed[i].Address)
		}
		cancel()
	}
	s.evalMu.Lock()
	r.read = &seedRead{seed: seed, err: err}
	s.evalMu.Unlock()
}

// seedRead is what a read of a gateway's servers gave.
type seedRead struct {
	seed []target.Served
	err  error
}

// Run runs every target until ctx ends.
func (s *Syncer) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range s.runners {
		wg.Go(func() { r.run(ctx) })
	}
	wg.Wait()
}

// TargetStatus is one target's health, for /healthz.
type TargetStatus struct {
	Name        string     `json:"name"`
	Model       string     `json:"model"`
	Healthy     bool       `json:"healthy"`
	Applied     bool       `json:"applied"` // a state was applied at least once
	LastError   string     `json:"last_error,omitempty"`
	LastSuccess *time.Time `json:"last_success,omitempty"`
	// Kept lists the workers heft-sync keeps serving against the
	// coordinator's state, and why (a warning for operators).
	Kept []string `json:"kept,omitempty"`
}

// Status is heft-sync's health, for /healthz.
type Status struct {
	Status       string         `json:"status"` // "ok" or "degraded"
	Coordinator  bool           `json:"coordinator_connected"`
	LastSnapshot *time.Time     `json:"last_snapshot,omitempty"`
	Targets      []TargetStatus `json:"targets"`
}

// Status reports the coordinator connection and every target.
func (s *Syncer) Status() Status {
	s.mu.Lock()
	st := Status{Status: "ok", Coordinator: s.connected, Targets: []TargetStatus{}}
	if !s.lastSnap.IsZero() {
		t := s.lastSnap
		st.LastSnapshot = &t
	}
	s.mu.Unlock()
	if !st.Coordinator {
		st.Status = "degraded"
	}
	for _, r := range s.runners {
		ts := r.status()
		if !ts.Healthy {
			st.Status = "degraded"
		}
		st.Targets = append(st.Targets, ts)
	}
	return st
}

// runner applies one target.
type runner struct {
	t   target.Target
	s   *Syncer
	log hclog.Logger

	wake    chan struct{}
	dropped map[string]bool // the workers the last apply left out (run's goroutine only)
	// seeded: the gateway's servers were read, or need not be; while a
	// read fails, seedFailing is when the first failed and seedTried the
	// last try (s.evalMu held, all three).
	seeded                 bool
	seedFailing, seedTried time.Time
	read                   *seedRead // made by readFor, for the next offer (s.evalMu held)

	mu          sync.Mutex
	pending     *target.Model // the newest desired state, not yet taken
	offered     *target.Model // the last desired state offered
	problems    string        // the last problems logged, to log a change once
	floor       floorState
	kept        []Kept // what the floor keeps now
	emptyLogged bool
	healthy     bool
	applied     bool
	lastErr     string
	lastSuccess time.Time
}

func (r *runner) offer(m target.Model, problems []string, models []string, now time.Time, mayDrop func(string) bool, pending map[string]bool) {
	// The first state with a worker of the model is the first offer the
	// floor sees, so nothing has been applied yet: read the gateway then.
	var seed []target.Served
	haveSeed := false
	if len(m.Backends) > 0 && !r.seeded {
		var err error
		if seed, haveSeed, err = r.readSeed(); err == nil {
			r.seeded = true
		} else if r.waitForSeed(m, now, err) {
			return
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := strings.Join(problems, "; "); p != r.problems {
		r.problems = p
		if p != "" {
			r.log.Warn("workers left out or drained", "problems", p)
		}
	}
	if len(m.Backends) == 0 {
		// A model the coordinator lists no worker of is most likely a typo
		// in the config, or a coordinator that lost its state: either way
		// not a reason to empty a gateway.
		if !r.emptyLogged {
			r.emptyLogged = true
			r.log.Warn("the coordinator lists no worker of this model; the gateway keeps its state", "models_known", strings.Join(models, ", "))
		}
		return
	}
	r.emptyLogged = false
	if haveSeed {
		r.floor.start(seed, m)
	}
	m = r.keep(m, now, mayDrop, pending)
	if r.offered != nil && r.offered.Equal(m) {
		return
	}
	r.offered, r.pending = &m, &m
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// readSeed takes what readFor read of what the gateway serves now, each
// server's address written as the coordinator writes it where they
// resolve alike. ok is false for a target that cannot say (the floor then
// starts from the coordinator's state alone); err, for one whose read
// failed, or that was not read again yet (errSeedLater): a failed read is
// tried again about every resync interval.
func (r *runner) readSeed() (seed []target.Served, ok bool, err error) {
	if _, is := target.As[Reader](r.t); !is {
		return nil, false, nil
	}
	read := r.read
	r.read = nil
	if read == nil {
		return nil, false, errSeedLater
	}
	if seed, err = read.seed, read.err; err != nil {
		return nil, false, err
	}
	if !r.seedFailing.IsZero() {
		r.log.Info("read what the gateway serves; heft-sync applies the coordinator's state from now on")
		r.seedFailing = time.Time{}
	}
	if len(seed) > 0 {
		r.log.Info("read what the gateway serves before heft-sync's first change", "servers", len(seed))
	}
	return seed, true, nil
}

// seedDue says whether a read of what the gateway serves is due, and then
// notes it as tried (s.evalMu held). Half a resync: the ticks that retry it
// come a resync apart, give or take, and must not skip every other one.
func (r *runner) seedDue(now time.Time) bool {
	if !r.seedTried.IsZero() && now.Sub(r.seedTried) < r.s.resync/2 {
		return false
	}
	r.seedTried = now
	return true
}

// unanswered reports a gateway that did not answer a read.
func unanswered(err error) bool {
	return target.Reason(err) == target.ReasonUnreachable || errors.Is(err, context.DeadlineExceeded)
}

// errSeedLater is a read of the gateway's servers not tried yet again.
var errSeedLater = errors.New("not tried again yet")

// waitForSeed says whether m must wait, the gateway left as it is,
// because what it serves could not be read. Without that read the floor
// knows nothing of what the gateway serves, so m could take out servers a
// restarted coordinator lists as not measured yet. While the gateway does
// not answer (HAProxy's socket away for a restart, a read that timed out),
// m waits: for good while it serves nothing (applying it could only take
// traffic away), else for keep_unlisted (what the floor would have kept
// them for). A gateway that answered with what cannot be read (a file
// heft-sync writes again) does not wait. Either way m is then applied
// with the floor starting from the coordinator's state.
func (r *runner) waitForSeed(m target.Model, now time.Time, err error) bool {
	if !errors.Is(err, errSeedLater) && !unanswered(err) {
		r.log.Warn("could not read what the gateway serves now; a worker it serves that the coordinator has not measured yet is taken out of it", "error", err)
		r.seeded = true
		return false
	}
	if r.seedFailing.IsZero() {
		r.seedFailing = now
		r.log.Warn("cannot read what the gateway serves; until it can, heft-sync changes nothing in it that could take a worker out",
			"error", err, "for_at_most", r.s.floor.KeepUnlisted.String())
	}
	if !errors.Is(err, errSeedLater) {
		r.fail(fmt.Errorf("reading what the gateway serves before the first change: %w", err))
	}
	if len(m.Serving()) == 0 || now.Sub(r.seedFailing) < r.s.floor.KeepUnlisted {
		return true
	}
	r.log.Warn("still cannot read what the gateway serves; applying the coordinator's state, the floor starting from it",
		"since", r.seedFailing.Format(time.RFC3339), "error", err)
	r.seeded = true
	return false
}

// workerAddresses are m's worker addresses as written, and each one's
// resolved form, looked up once (HAProxy shows an IP where the
// coordinator may have a name).
type workerAddresses struct {
	written  map[string]bool
	resolved map[netip.AddrPort]string
}

// resolveAddr resolves a worker's address; a test makes it slow.
var resolveAddr = target.Resolve

func addressesOf(ctx context.Context, m target.Model) workerAddresses {
	w := workerAddresses{written: map[string]bool{}, resolved: map[netip.AddrPort]string{}}
	for _, b := range m.Backends {
		w.written[b.Address] = true
		if a, err := resolveAddr(ctx, b.Address); err == nil {
			w.resolved[a] = b.Address
		}
	}
	return w
}

// of is the address of m's worker at addr: the same text, or one that
// resolves alike; else addr.
func (w workerAddresses) of(ctx context.Context, addr string) string {
	if w.written[addr] {
		return addr
	}
	if a, err := resolveAddr(ctx, addr); err == nil {
		if name, ok := w.resolved[a]; ok {
			return name
		}
	}
	return addr
}

func (r *runner) run(ctx context.Context) {
	name := r.t.Name()
	checker, hasCheck := target.As[Checker](r.t)
	checked := !hasCheck
	check := func() {
		cctx, cancel := context.WithTimeout(ctx, r.s.timeout)
		defer cancel()
		if err := checker.Check(cctx); err != nil {
			r.fail(err)
			return
		}
		checked = true
		r.mu.Lock()
		r.healthy = true
		r.mu.Unlock()
		r.s.m.healthy.WithLabelValues(name).Set(1)
	}
	if hasCheck {
		check()
	}
	lost := make(chan struct{}, 1)
	if w, ok := target.As[Watcher](r.t); ok {
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() {
			w.Watch(ctx, func() {
				select {
				case lost <- struct{}{}:
				default:
				}
			})
		})
	}
	tick := time.NewTicker(r.s.resync)
	defer tick.Stop()
	var want *target.Model
	for {
		select {
		case <-ctx.Done():
			return
		case <-lost:
			if want != nil {
				r.apply(ctx, *want, true)
			}
		case <-r.wake:
			r.mu.Lock()
			want, r.pending = r.pending, nil
			r.mu.Unlock()
			if want != nil {
				r.apply(ctx, *want, false)
			}
		case <-tick.C:
			switch {
			case want != nil:
				r.apply(ctx, *want, true)
			case !checked:
				check()
			default:
				r.s.retrySeed(r)
			}
		}
	}
}

func (r *runner) apply(ctx context.Context, m target.Model, resync bool) {
	name := r.t.Name()
	actx, cancel := context.WithTimeout(ctx, r.s.timeout)
	res, err := r.applyOrRecover(actx, m)
	cancel()
	if ctx.Err() != nil {
		return
	}
	mt := r.s.m
	mt.rounding.WithLabelValues(name).Set(res.RoundingError)
	mt.serving.WithLabelValues(name).Set(float64(res.Serving))
	r.noteDropped(res.Dropped)
	if len(res.Changes) > 0 {
		if resync {
			mt.drift.WithLabelValues(name).Inc()
			r.log.Warn("the gateway had changed behind heft-sync (a restart or reload?); put heft's state back",
				"changes", strings.Join(res.Changes, "; "), "serving", res.Serving)
		} else {
			r.log.Info("applied", "changes", strings.Join(res.Changes, "; "), "serving", res.Serving,
				"rounding_error", roundPct(res.RoundingError))
		}
		if res.Serving == 0 {
			r.log.Warn("no worker of this model is admitted: the gateway has nowhere to send new requests")
		}
	}
	if err != nil {
		mt.applies.WithLabelValues(name, resultFailed).Inc()
		r.fail(err)
		return
	}
	if len(res.Changes) > 0 {
		mt.applies.WithLabelValues(name, resultChanged).Inc()
	} else {
		mt.applies.WithLabelValues(name, resultUnchanged).Inc()
	}
	now := time.Now()
	mt.lastSuccess.WithLabelValues(name).Set(unix(now))
	mt.healthy.WithLabelValues(name).Set(1)
	r.mu.Lock()
	if r.lastErr != "" {
		r.log.Info("the gateway is in step again")
	}
	r.healthy, r.applied, r.lastErr, r.lastSuccess = true, true, "", now
	r.mu.Unlock()
}

// applyOrRecover applies m, a panic in the target's code becoming its
// failure: one target's bug must not stop heft-sync's others, nor have
// systemd restart it into the same state again and again.
func (r *runner) applyOrRecover(ctx context.Context, m target.Model) (res target.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("the target's apply panicked; the gateway keeps what it had", "panic", p, "stack", string(debug.Stack()))
			res, err = target.Result{}, target.Failf(target.ReasonOther, "apply panicked: %v", p)
		}
	}()
	return r.t.Apply(ctx, m)
}

// noteDropped counts and logs the workers an apply left out: each once
// when it starts being left out, the gauge always.
func (r *runner) noteDropped(dropped []string) {
	mt, name := r.s.m, r.t.Name()
	mt.dropped.WithLabelValues(name).Set(float64(len(dropped)))
	now := make(map[string]bool, len(dropped))
	for _, d := range dropped {
		// The line's "worker ID left out:" prefix names the worker; the
		// rest (how long ago, why) changes from apply to apply.
		key, _, _ := strings.Cut(d, " left out:")
		now[key] = true
		if !r.dropped[key] {
			mt.drops.WithLabelValues(name).Inc()
			r.log.Warn("a worker is left out of the gateway, which could not take it; the others are applied", "worker", d)
		}
	}
	r.dropped = now
}

// fail counts and logs a failure; the same error again is logged at debug
// level, so a gateway that stays down does not flood the log.
func (r *runner) fail(err error) {
	name := r.t.Name()
	for _, reason := range reasons(err) {
		r.s.m.failures.WithLabelValues(name, reason).Inc()
	}
	r.s.m.healthy.WithLabelValues(name).Set(0)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.healthy = false
	if msg := err.Error(); msg != r.lastErr {
		r.lastErr = msg
		r.log.Error("apply failed; the gateway keeps what it had", "reason", strings.Join(reasons(err), ","), "error", err)
	} else {
		r.log.Debug("apply failed again", "error", err)
	}
}

func (r *runner) status() TargetStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := TargetStatus{Name: r.t.Name(), Model: r.t.Model(), Healthy: r.healthy, Applied: r.applied, LastError: r.lastErr}
	if !r.lastSuccess.IsZero() {
		t := r.lastSuccess
		ts.LastSuccess = &t
	}
	for _, k := range r.kept {
		ts.Kept = append(ts.Kept, k.String())
	}
	return ts
}

// reasons lists the distinct failure reasons in err's tree.
func reasons(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if te, ok := e.(*target.Error); ok {
			if !slices.Contains(out, te.Reason) {
				out = append(out, te.Reason)
			}
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		if u := errors.Unwrap(e); u != nil {
			walk(u)
		}
	}
	walk(err)
	if len(out) == 0 {
		out = []string{target.ReasonOther}
	}
	return out
}

func roundPct(x float64) string { return strconv.FormatFloat(x*100, 'f', 2, 64) + "%" }
