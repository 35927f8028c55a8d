package syncer

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/coord"
	"heft/gateway/gwtest"
	"heft/gateway/target"
	htest "heft/shared/testutil"
	"heft/shared/view"
)

func TestMain(m *testing.M) { htest.VerifyNoLeaks(m) }

// fake records what it was asked to apply and fails on demand.
type fake struct {
	mu      sync.Mutex
	applied []target.Model
	fail    error
}

func (f *fake) Name() string  { return "fake:qwen" }
func (f *fake) Model() string { return "m" }
func (f *fake) Apply(_ context.Context, m target.Model) (target.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = append(f.applied, m)
	return target.Result{Serving: len(m.Serving())}, f.fail
}
func (f *fake) count() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.applied) }

func run(t *testing.T, f *fake, resync time.Duration) (*Syncer, *Metrics) {
	m := NewMetrics([]string{f.Name()})
	s := New([]target.Target{f}, m, resync, hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, m
}

func snap(ws ...coord.Worker) coord.Snapshot { return coord.Snapshot{Workers: ws, At: time.Now()} }

func TestNothingBeforeAStateAndNothingForAnEmptyModel(t *testing.T) {
	f := &fake{}
	s, m := run(t, f, 20*time.Millisecond)
	// A state without a worker of the model is not offered: the runner
	// has nothing to apply, now or at a resync.
	s.Update(snap(gwtest.Worker("other-model", "10.0.0.1:8000", view.StateAdmitted, 1)))
	s.Update(snap())
	r := s.runners[0]
	r.mu.Lock()
	offered := r.offered != nil || r.pending != nil
	r.mu.Unlock()
	if offered || f.count() != 0 {
		t.Fatalf("a state without a worker of the model was offered (applied %d times)", f.count())
	}
	if v := value(t, m, "heft_sync_model_workers", "target", "fake:qwen"); v != 0 {
		t.Fatalf("model workers = %v", v)
	}
	s.Update(snap(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 1)))
	htest.Eventually(t, "the first apply", 5*time.Second, func() bool { return f.count() >= 1 })
	// Resyncs apply the same state again.
	htest.Eventually(t, "resyncs", 5*time.Second, func() bool { return f.count() >= 3 })
	f.mu.Lock()
	for _, a := range f.applied {
		if len(a.Serving()) != 1 {
			t.Fatalf("applied %+v", a)
		}
	}
	f.mu.Unlock()
}

func TestFailuresAreCountedByReason(t *testing.T) {
	f := &fake{fail: errors.Join(target.Failf(target.ReasonNoSlot, "x"), target.Failf(target.ReasonRejected, "y"))}
	s, m := run(t, f, time.Hour)
	s.Update(snap(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 1)))
	htest.Eventually(t, "the failure to be counted", 5*time.Second, func() bool {
		return value(t, m, "heft_sync_apply_failures_total", "reason", target.ReasonNoSlot) == 1 &&
			value(t, m, "heft_sync_apply_failures_total", "reason", target.ReasonRejected) == 1
	})
	st := s.Status()
	if st.Status != "degraded" || st.Targets[0].Healthy || !strings.Contains(st.Targets[0].LastError, "x") {
		t.Fatalf("status %+v", st)
	}
}

// panicking is a target whose apply panics, as an index out of range in a
// driver would.
type panicking struct {
	fake
	calls atomic.Int32
}

func (p *panicking) Name() string { return "panicking:qwen" }
func (p *panicking) Apply(context.Context, target.Model) (target.Result, error) {
	p.calls.Add(1)
	var none []int
	_ = none[0]
	return target.Result{}, nil
}

// A target whose apply panics fails alone, and is tried again; the other
// targets go on.
func TestAPanickingTargetFailsAlone(t *testing.T) {
	bad, good := &panicking{}, &fake{}
	m := NewMetrics([]string{bad.Name(), good.Name()})
	s := New([]target.Target{bad, good}, m, 20*time.Millisecond, hclog.NewNullLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	s.Update(snap(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 1)))
	htest.Eventually(t, "the other target's resyncs", 5*time.Second, func() bool { return good.count() >= 3 })
	htest.Eventually(t, "the panicking target tried again", 5*time.Second, func() bool { return bad.calls.Load() >= 3 })
	st := s.Status()
	if st.Targets[0].Healthy || !strings.Contains(st.Targets[0].LastError, "panicked: runtime error: index out of range") || !st.Targets[1].Healthy {
		t.Fatalf("status %+v", st)
	}
}

func TestReasons(t *testing.T) {
	err := errors.Join(target.Failf(target.ReasonNoSlot, "a"), errors.New("plain"), target.Failf(target.ReasonNoSlot, "b"))
	if got := reasons(err); len(got) != 1 || got[0] != target.ReasonNoSlot {
		t.Fatalf("reasons = %v", got)
	}
	if got := reasons(errors.New("plain")); len(got) != 1 || got[0] != target.ReasonOther {
		t.Fatalf("reasons = %v", got)
	}
}

// value reads one sample from the registry: the first series of name
// with the label set to val.
func value(t *testing.T, m *Metrics, name, label, val string) float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.Metric {
			for _, l := range s.Label {
				if l.GetName() == label && l.GetValue() == val {
					if s.Counter != nil {
						return s.Counter.GetValue()
					}
					return s.Gauge.GetValue()
				}
			}
		}
	}
	return -1
}

// A target told to apply the prefill weight gets the prefill weights.
func TestPrefillTargetGetsPrefillWeights(t *testing.T) {
	f := &fake{}
	m := NewMetrics([]string{f.Name()})
	s := New([]target.Target{target.WithSelection(f, target.Selection{Kind: view.WeightPrefill})}, m, time.Hour, hclog.NewNullLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	w := coord.Worker{ID: "a", Model: "m", URL: "http://10.0.0.1:8000", State: view.StateAdmitted}
	one, pre := 1.0, 1.8
	w.Weight, w.PrefillWeight = &one, &pre
	s.Update(snap(w))
	htest.Eventually(t, "the prefill weight applied", 5*time.Second, func() bool { return f.count() > 0 })
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := f.applied[0].Serving(); len(got) != 1 || got[0].Weight != 1.8 {
		t.Errorf("applied %+v, want the prefill weight 1.8", got)
	}
}

// reading is a fake whose gateway serves some servers already.
type reading struct {
	fake
	served []target.Served
	err    error
	reads  int
}

func (r *reading) Served(context.Context) ([]target.Served, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads++
	return r.served, r.err
}

// The first state lists every worker as measuring: with a gateway that
// says what it serves, the first apply keeps those workers serving, and
// the gateway is read once.
func TestFirstApplyKeepsWhatTheGatewayServes(t *testing.T) {
	const a, b = "10.0.0.1:8000", "10.0.0.2:8000"
	g := &reading{served: []target.Served{{Address: a, Weight: 30, Owned: true}, {Address: b, Weight: 10, Owned: true}}}
	s := runReading(t, g, time.Hour, DefaultFloor())
	s.Update(snap(gwtest.Worker("m", a, view.StateMeasuring, 0), gwtest.Worker("m", b, view.StateMeasuring, 0)))
	htest.Eventually(t, "the first apply", 5*time.Second, func() bool { return g.count() >= 1 })
	g.mu.Lock()
	applied, reads := g.applied[0], g.reads
	g.mu.Unlock()
	if got := serving(applied); len(got) != 2 || got[a] != 3*got[b] {
		t.Fatalf("first apply serves %v, want both servers as the gateway had them", got)
	}
	s.Update(snap(gwtest.Worker("m", a, view.StateAdmitted, 1), gwtest.Worker("m", b, view.StateMeasuring, 0)))
	g.mu.Lock()
	reads = g.reads - reads
	g.mu.Unlock()
	if reads != 0 {
		t.Fatalf("the gateway was read %d more times after the first state", reads)
	}
}

// While the gateway does not answer the read of what it serves (HAProxy's
// socket away for a restart), heft-sync, which then knows nothing of it,
// changes nothing that could take a worker out: a state that serves
// nothing waits for the read, tried again every resync, and one that
// serves a worker waits for keep_unlisted. Applying either at once emptied
// or shrank the gateway. A gateway that answers with what cannot be read
// (a file heft-sync writes again) is applied at once, as before.
func TestNothingTakenOutBeforeTheGatewayIsRead(t *testing.T) {
	const a, b = "10.0.0.1:8000", "10.0.0.2:8000"
	measuring := snap(gwtest.Worker("m", a, view.StateMeasuring, 0), gwtest.Worker("m", b, view.StateMeasuring, 0))
	served := []target.Served{{Address: a, Weight: 30, Owned: true}, {Address: b, Weight: 10, Owned: true}}
	gone := target.Fail(target.ReasonUnreachable, errors.New("socket gone"))

	t.Run("until it is read", func(t *testing.T) {
		g := &reading{served: served, err: gone}
		s := runReading(t, g, 50*time.Millisecond, DefaultFloor())
		s.Update(measuring)
		htest.Eventually(t, "reads tried again", 5*time.Second, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.reads >= 3 })
		if n := g.count(); n != 0 {
			t.Fatalf("%d applies while the gateway could not be read, want none", n)
		}
		if st := s.Status(); st.Status != "degraded" || !strings.Contains(st.Targets[0].LastError, "socket gone") {
			t.Fatalf("status %+v, want degraded with the read's error", st)
		}
		g.mu.Lock()
		g.err = nil // the socket is back; the coordinator says nothing new
		g.mu.Unlock()
		htest.Eventually(t, "the first apply", 5*time.Second, func() bool { return g.count() >= 1 })
		g.mu.Lock()
		applied := g.applied[0]
		g.mu.Unlock()
		if got := serving(applied); len(got) != 2 || got[a] != 3*got[b] {
			t.Fatalf("first apply serves %v, want both servers as the gateway had them", got)
		}
	})

	t.Run("a state that serves a worker waits for keep_unlisted", func(t *testing.T) {
		g := &reading{served: served, err: gone}
		s := runReading(t, g, 50*time.Millisecond, Floor{MinServing: 1, KeepUnlisted: 700 * time.Millisecond})
		begin := time.Now()
		s.Update(snap(gwtest.Worker("m", a, view.StateAdmitted, 1), gwtest.Worker("m", b, view.StateMeasuring, 0)))
		htest.Eventually(t, "an apply once keep_unlisted passed", 15*time.Second, func() bool { return g.count() >= 1 })
		if waited := time.Since(begin); waited < 700*time.Millisecond {
			t.Fatalf("applied after %s, want keep_unlisted (700ms) first", waited)
		}
		g.mu.Lock()
		applied := g.applied[0]
		g.mu.Unlock()
		if got := serving(applied); len(got) != 1 || got[a] == 0 {
			t.Fatalf("the apply serves %v, want the admitted worker", got)
		}
	})

	t.Run("a state that serves nothing waits for good", func(t *testing.T) {
		g := &reading{served: served, err: gone}
		s := runReading(t, g, 50*time.Millisecond, Floor{MinServing: 1, KeepUnlisted: 100 * time.Millisecond})
		s.Update(measuring)
		htest.Eventually(t, "reads tried again past keep_unlisted", 5*time.Second, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return g.reads >= 6 })
		if n := g.count(); n != 0 {
			t.Fatalf("%d applies of a state that serves nothing, with the gateway unread", n)
		}
	})
}

// stalling is a gateway that does not answer a read of what it serves (an
// HAProxy socket that accepts and says nothing) until the test lets one
// read go on.
type stalling struct {
	reading
	entered chan struct{} // a read began
	release chan struct{} // one read goes on per value; closed, all do
}

func (g *stalling) Served(ctx context.Context) ([]target.Served, error) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.release:
		return g.reading.Served(ctx)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// A read of what the gateway serves that gets no answer takes up to
// seedTimeout (5 s). Neither the first read nor its retries, every resync,
// hold the lock every weighing of a state waits on: they stalled the
// coordinator's next state and the pending nodes for as long.
func TestUnansweredReadStallsNothing(t *testing.T) {
	const a, b = "10.0.0.1:8000", "10.0.0.2:8000"
	measuring := snap(gwtest.Worker("m", a, view.StateMeasuring, 0), gwtest.Worker("m", b, view.StateMeasuring, 0))
	g := &stalling{reading: reading{err: target.Fail(target.ReasonUnreachable, errors.New("socket gone"))},
		entered: make(chan struct{}, 8), release: make(chan struct{})}
	s := runReading(t, g, 50*time.Millisecond, DefaultFloor())
	defer close(g.release)
	soon := func(what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { f(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Second):
			t.Errorf("%s waited for the gateway's unanswered read", what)
		}
	}

	first := make(chan struct{})
	go func() { s.Update(measuring); close(first) }()
	<-g.entered
	soon("pending nodes during the first read", func() { s.SetPending([]string{"node-x"}) })
	g.release <- struct{}{} // the first read fails: the gateway is away
	<-first

	<-g.entered // a retry, a resync later
	soon("pending nodes during a retry", func() { s.SetPending(nil) })
	soon("the next state during a retry", func() { s.Update(measuring) })
	if n := g.count(); n != 0 {
		t.Fatalf("%d applies while the gateway could not be read, want none", n)
	}
}

// A gateway that answers what cannot be read (an nginx file without the
// upstream, before heft-sync's first write) is applied at once.
func TestUnreadableGatewayIsAppliedAtOnce(t *testing.T) {
	const a = "10.0.0.1:8000"
	g := &reading{err: errors.New(`no upstream "qwen" in the file`)}
	s := runReading(t, g, time.Hour, DefaultFloor())
	s.Update(snap(gwtest.Worker("m", a, view.StateAdmitted, 1)))
	htest.Eventually(t, "the first apply", 5*time.Second, func() bool { return g.count() >= 1 })
}

func runReading(t *testing.T, g target.Target, resync time.Duration, f Floor) *Syncer {
	m := NewMetrics([]string{g.Name()})
	s := New([]target.Target{g}, m, resync, hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug}))
	s.SetFloor(f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// The lookups that match the servers read to the workers' names are slow
// while DNS is; they too are made without the lock every weighing takes.
func TestSlowLookupsAfterTheReadStallNothing(t *testing.T) {
	entered, release := make(chan struct{}, 8), make(chan struct{})
	resolveAddr = func(ctx context.Context, addr string) (netip.AddrPort, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return target.Resolve(ctx, addr)
	}
	t.Cleanup(func() { resolveAddr = target.Resolve })
	const a = "gpu-a.example:8000"
	g := &reading{served: []target.Served{{Address: "10.0.0.1:8000", Weight: 1}}}
	s := runReading(t, g, time.Hour, DefaultFloor())
	first := make(chan struct{})
	go func() { s.Update(snap(gwtest.Worker("m", a, view.StateAdmitted, 1))); close(first) }()
	<-entered
	done := make(chan struct{})
	go func() { s.SetPending([]string{"node-x"}); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Error("pending nodes waited for the lookups after the gateway's read")
	}
	close(release)
	<-first
	<-done
}
