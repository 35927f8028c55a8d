package probe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"heft/agent/engine"
	"heft/shared/wire"
)

// What a probe does with an engine that has requests running or waiting
// (the agent's probe_busy). A burst sent into other traffic measures the
// share of the engine it got, not the engine: heft never stores one.
const (
	// BusyWait waits up to Config.BusyWait for the engine to be idle.
	BusyWait = "wait"
	// BusyDrain asks the gateways to stop sending the engine requests
	// (Config.Drain: the coordinator sets its weight to 0), waits for the
	// requests in flight to finish, then probes.
	BusyDrain = "drain"
	// BusyPassiveOnly never probes a busy engine.
	BusyPassiveOnly = "passive-only"
)

// BusyModes lists the probe_busy values, the default first.
var BusyModes = []string{BusyWait, BusyDrain, BusyPassiveOnly}

// DefaultBusyWait bounds the wait for an idle engine (probe_busy_wait).
const DefaultBusyWait = 2 * time.Minute

// busyPoll is how often a waiting probe reads the engine's load.
const busyPoll = time.Second

// IdleSettle is how long an engine must stay idle, its generated-tokens
// counter still, before a probe is sent. An engine found idle at one
// instant may only be between two of a gateway's requests, or restarted
// a moment before the gateway sends it the next: at any load worth
// routing, a request arrives well within two seconds.
const IdleSettle = 2 * time.Second

// StaleLoadAfter is how long a load that reads busy must stand still,
// with the engine's token counters (Config.Stir), before a probe takes it
// for a load the engine stopped updating. vLLM writes its gauges when a
// step ends; once every request is aborted at once no step runs, and they
// keep the last load until the next request (vllm issues #22545 and
// #29928): without this a probe of such an engine waits for nothing. An
// engine with requests running moves its counters at every step, so only
// a prefill that holds them and the load still this long looks the same;
// a burst sent then meets that request, and the counter check discards
// the burst once its tokens show.
const StaleLoadAfter = 30 * time.Second

// settlePoll is how often the engine's load is read while it settles.
const settlePoll = 250 * time.Millisecond

// watchPoll is how often the engine's counter is read during a burst.
const watchPoll = 500 * time.Millisecond

// busyError defers a probe because the engine is busy: it is ErrBusy
// (errors.Is) with a message that says what was found.
type busyError struct{ msg string }

func (e busyError) Error() string {
	if e.msg == "" {
		return "engine is busy; probe deferred"
	}
	return e.msg
}

// Busy reports that the probe was deferred because the engine was busy.
func (busyError) Busy() bool { return true }

// BusyError returns an error that is ErrBusy (errors.Is) with msg: for a
// caller that defers a probe before Run, as the agent does for a second
// probe of an engine already being probed.
func BusyError(msg string) error { return busyError{msg} }

// Is makes every busyError ErrBusy.
func (busyError) Is(target error) bool {
	_, ok := target.(busyError)
	return ok
}

func busyLoad(l wire.Load) string {
	return fmt.Sprintf("%d running, %d waiting", l.Running, l.Waiting)
}

func unreadLoad(err error) string {
	return fmt.Sprintf("its load could not be read: %v", err)
}

// onBusy decides what a probe does with an engine found busy (why says
// how): return a busyError, or wait (after a drain) until it has settled
// idle.
func (p *prober) onBusy(ctx context.Context, m *wire.Measurement, why string) error {
	switch {
	case p.cfg.IdleOnly:
		return busyError{fmt.Sprintf("engine busy (%s); asked to measure it only while idle (its weight follows its pace meanwhile): deferred", why)}
	case p.cfg.Busy == BusyPassiveOnly:
		return busyError{fmt.Sprintf("engine busy (%s) and probe_busy is passive-only: not probed", why)}
	case p.cfg.Busy == BusyWait && p.cfg.RequireIdle:
		return busyError{fmt.Sprintf("engine busy (%s); scheduled probe deferred", why)}
	case p.cfg.Busy == BusyDrain && p.cfg.Drain != nil:
		if err := p.cfg.Drain(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			m.Problems = append(m.Problems, fmt.Sprintf("drain not confirmed: %v", err))
		} else {
			m.Drained = true
		}
	}
	start := time.Now()
	poll := p.cfg.busyPoll
	if poll <= 0 {
		poll = busyPoll
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	// The wait is told as a wait for a ready engine is, so that nobody
	// watches a probe that seems hung: every WaitNoticeEvery, whatever
	// the load.
	notices := &waitNotices{every: WaitNoticeEvery}
	still := p.stillness()
	for {
		waited := time.Since(start)
		if waited >= p.cfg.BusyWait {
			m.BusyWaitSeconds = waited.Seconds()
			return busyError{fmt.Sprintf("engine still busy (%s) after waiting %s for it to be idle (probe_busy %s); not probed",
				why, waited.Round(time.Second), p.cfg.Busy)}
		}
		w := Waiting{URL: p.cfg.URL, Reason: why, Waited: waited, Left: p.cfg.BusyWait - waited, Busy: true}
		p.report(Progress{Phase: PhaseWaitingReady, Elapsed: waited, Waiting: &w})
		if p.cfg.OnWaiting != nil && notices.due(time.Now(), "busy") {
			p.cfg.OnWaiting(w)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		l, err := p.readLoad(ctx)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			// Keep waiting: a flaky /metrics is no proof that the engine
			// became idle.
			why = unreadLoad(err)
		case l.Running+l.Waiting == 0:
			// Drained too: Drain only sent the ask. The coordinator keeps
			// a model's only serving worker, and gateways apply a drain
			// at their next sync; none of that comes back here.
			stirred, err := p.settle(ctx)
			if err != nil {
				return err
			}
			if stirred == "" {
				m.BusyWaitSeconds = time.Since(start).Seconds()
				m.LoadBefore = l
				return nil
			}
			why = stirred
		case still.stale(ctx, l):
			p.noteStale(m, l, time.Since(still.run.Since()))
			m.BusyWaitSeconds = time.Since(start).Seconds()
			return ctx.Err()
		default:
			why = busyLoad(l)
		}
	}
}

// StillLoad follows a load that reads busy together with what moves at
// every step of an engine running requests (engine.Counters.Stir): how
// long both have stood still. A busy engine moves within a step; a load
// the engine stopped updating stands still. The probe's watch and the
// agent's snapshots keep the same rule with it.
type StillLoad struct {
	load  wire.Load
	stir  float64
	since time.Time // zero: no reading to compare with
}

// Observe takes one reading, made at at, and returns how long the load and
// stir have stood still as of it: 0 where either moved, and the run
// starts over from this reading.
func (w *StillLoad) Observe(at time.Time, load wire.Load, stir float64) time.Duration {
	if w.since.IsZero() || stir != w.stir || !load.Same(w.load) {
		*w = StillLoad{load: load, stir: stir, since: at}
		return 0
	}
	return at.Sub(w.since)
}

// Reset ends the run: a reading that proves nothing (an idle load, a
// counter that cannot be read).
func (w *StillLoad) Reset() { *w = StillLoad{} }

// Since is when the current run began; zero after Reset.
func (w *StillLoad) Since() time.Time { return w.since }

// stillness watches a load that reads busy for one the engine stopped
// updating: the load and the engine's counters (Config.Stir) standing
// still for StaleLoadAfter.
type stillness struct {
	read  func(ctx context.Context) (float64, error)
	after time.Duration
	run   StillLoad
}

func (p *prober) stillness() *stillness {
	return &stillness{read: p.cfg.Stir, after: cmp.Or(p.cfg.staleAfter, StaleLoadAfter)}
}

// stale reports whether load, just read, and the counters have stood still
// since the first of an unbroken run of such reads, for s.after or more. A
// counter that cannot be read breaks the run: no proof of stillness.
func (s *stillness) stale(ctx context.Context, load wire.Load) bool {
	if s.read == nil {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	stir, err := s.read(rctx)
	cancel()
	if err != nil {
		s.run.Reset()
		return false
	}
	return s.run.Observe(time.Now(), load, stir) >= s.after
}

// staleLoad watches an engine whose load reads busy until it or its
// counters move (0), or until they have stood still for StaleLoadAfter
// (how long they have). An engine that is busy moves within a step or
// two, so the watch costs a probe of one about a poll; where Stir is not
// set or cannot be read, there is no watch.
func (p *prober) staleLoad(ctx context.Context, load wire.Load) (stillFor time.Duration, err error) {
	still := p.stillness()
	if still.read == nil {
		return 0, nil
	}
	if still.stale(ctx, load); still.run.Since().IsZero() {
		return 0, ctx.Err()
	}
	t := time.NewTicker(cmp.Or(p.cfg.busyPoll, busyPoll))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-t.C:
		}
		l, err := p.readLoad(ctx)
		switch {
		case ctx.Err() != nil:
			return 0, ctx.Err()
		case err != nil || l.Running+l.Waiting == 0:
			return 0, nil
		}
		since := still.run.Since()
		if still.stale(ctx, l) {
			return time.Since(since), nil
		}
		if !still.run.Since().Equal(since) {
			return 0, ctx.Err() // it moved
		}
	}
}

// noteStale records in m the load the probe took for one the engine
// stopped updating, with how long it stood still, and says why it
// probed a busy-looking engine as idle.
func (p *prober) noteStale(m *wire.Measurement, load wire.Load, stillFor time.Duration) {
	m.LoadBefore = load
	m.LoadBefore.StaleSeconds = stillFor.Seconds()
	m.Problems = append(m.Problems, fmt.Sprintf("the engine's load read %s, but it and its token counters stood still for %s: "+
		"taken as a load the engine stopped updating (vLLM keeps its last after every request is aborted), and probed as idle",
		busyLoad(load), stillFor.Round(time.Second)))
}

// settle watches an engine just read idle for the settle time: it
// returns "" when the engine stayed idle with its generated-tokens counter
// still, or what it did instead. A load or counter that cannot be read is
// no proof of traffic: the probe is not held back by a flaky /metrics.
func (p *prober) settle(ctx context.Context) (stirred string, err error) {
	wait := cmp.Or(p.cfg.settle, IdleSettle)
	start := time.Now()
	before, err := p.counter(ctx)
	counted := err == nil
	t := time.NewTicker(min(cmp.Or(p.cfg.busyPoll, settlePoll), settlePoll))
	defer t.Stop()
	for time.Since(start) < wait {
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-t.C:
		}
		l, err := p.readLoad(ctx)
		switch {
		case ctx.Err() != nil:
			return "", ctx.Err()
		case err != nil && !engine.LoadNotServed(err):
			return unreadLoad(err), nil
		case err == nil && l.Running+l.Waiting > 0:
			return busyLoad(l), nil
		}
	}
	if !counted {
		return "", nil
	}
	if after, err := p.counter(ctx); err == nil && after > before {
		return fmt.Sprintf("it generated %.0f tokens in %s while it reported no requests", after-before, time.Since(start).Round(100*time.Millisecond)), nil
	}
	return "", ctx.Err()
}

// phaseName names a burst's phase in a message.
func phaseName(phase string) string {
	if phase == PhaseWarmup {
		return "warm-up"
	}
	return "measured burst"
}

// slack is how far the engine's count of a burst's tokens may run past
// what the burst received: a counter that records a step late or early.
func (p *prober) slack() int {
	return max(2*p.cfg.Concurrency, p.cfg.Concurrency*p.cfg.Tokens/50)
}

// counter reads the engine's generated-tokens counter within ten seconds;
// errNoCounters where the probe has no reader.
func (p *prober) counter(ctx context.Context) (float64, error) {
	r, err := p.read(ctx)
	return r.total, err
}

// reading is one read of the engine's generated-tokens counter.
type reading struct {
	total float64
	// ranks is the counter per rank that total was summed over
	// (engine.Counters.Ranks); nil where the reader does not say.
	ranks map[int]float64
}

// read reads the counter within ten seconds, with the ranks it was summed
// over where the reader says.
func (p *prober) read(ctx context.Context) (reading, error) {
	if p.cfg.Counters == nil {
		return reading{}, errNoCounters
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := p.cfg.Counters(cctx)
	return reading{total: c.Generated, ranks: c.Ranks}, err
}

var errNoCounters = errors.New("no counter reader")

// readLoad reads the engine's load within ten seconds.
func (p *prober) readLoad(ctx context.Context) (wire.Load, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return p.cfg.Load(lctx)
}

// readGenerated reads the engine's generated-tokens counter, noting once
// in m why it cannot be read, and how the burst is checked without it.
func (p *prober) readGenerated(ctx context.Context, m *wire.Measurement) (reading, bool) {
	v, err := p.read(ctx)
	if err != nil {
		note := fmt.Sprintf("other traffic during the burst not checked: %v", err)
		if p.loadWatchable(m) {
			note = fmt.Sprintf("other traffic during the burst checked by the engine's load alone (more requests than the burst's), "+
				"not by its token counters: %v", err)
		}
		if ctx.Err() == nil && p.cfg.Counters != nil && !slices.Contains(m.Problems, note) {
			m.Problems = append(m.Problems, note)
		}
		return reading{}, false
	}
	return v, true
}

// loadWatchable reports whether a burst can be watched by the engine's
// load: it was read, idle, before the probe (not a stale load taken for
// idle, which would show its old requests through the burst).
func (p *prober) loadWatchable(m *wire.Measurement) bool {
	return p.cfg.Load != nil && m.LoadBefore.Known && m.LoadBefore.StaleSeconds == 0
}

// watchFor returns what watches a burst for other traffic: the engine's
// counter and load together where both can be read (base is the counter
// before the burst, counted whether it was read), its load alone where
// only that can, else nil.
func (p *prober) watchFor(m *wire.Measurement, phase string, base reading, counted bool) burstWatch {
	switch {
	case counted && p.cfg.Load != nil:
		return p.counterWatch(phase, base.total)
	case !counted && p.loadWatchable(m):
		return p.loadWatch(phase)
	}
	return nil
}

// stoppedBurst says what became of a burst stopped for other traffic.
func stoppedBurst(phase string) string {
	if phase == PhaseWarmup {
		return "the warm-up was stopped at once and the measured burst was not sent"
	}
	return "the measured burst was stopped at once and discarded"
}

// counterWatch stops a burst whose engine shows other traffic in its
// counter and its load together.
func (p *prober) counterWatch(phase string, base float64) burstWatch {
	return func(ctx context.Context, received, unfinished int) error {
		// Two signs, each of which can mislead alone: a probe slow to
		// read its streams (a loaded host) lags the engine's counter
		// by hundreds of tokens, and a gauge refreshed late can show
		// requests that have ended. Other traffic shows in both: more
		// tokens than the burst received (plus twice the end-of-burst
		// slack) and more requests than the burst has unfinished.
		now, err := p.counter(ctx)
		grew := now - base
		if err != nil || int(grew) <= received+2*p.slack() {
			return nil
		}
		l, err := p.readLoad(ctx)
		if err != nil || !l.Known || l.Running+l.Waiting <= unfinished {
			return nil
		}
		return busyError{fmt.Sprintf("the engine generated %.0f tokens during the %s while the probe received %d, and had %s with %d of the probe's unfinished: other traffic arrived; %s",
			grew, phaseName(phase), received, busyLoad(l), unfinished, stoppedBurst(phase))}
	}
}

// loadWatch stops a burst whose engine's counters cannot be read (SGLang
// without --enable-metrics serves its load at /v1/loads, llama-server
// without --metrics at /slots) once its load shows more requests than the
// burst has: those cannot all be the burst's, however late the load is
// written. Compared with the burst's unfinished requests instead, a late
// gauge that still shows ended ones would stop clean bursts; a foreign
// request is seen all the same while the burst's requests run, nearly the
// whole burst since they are sent together and of one length.
func (p *prober) loadWatch(phase string) burstWatch {
	return func(ctx context.Context, _, _ int) error {
		l, err := p.readLoad(ctx)
		if err != nil || !l.Known || l.Running+l.Waiting <= p.cfg.Concurrency {
			return nil
		}
		return busyError{fmt.Sprintf("the engine had %s during the %s of %d requests (its token counters cannot be read): other traffic arrived; %s",
			busyLoad(l), phaseName(phase), p.cfg.Concurrency, stoppedBurst(phase))}
	}
}

// checkBurst judges a burst (the warm-up or the measured one) by the
// engine's counter read before and after it. Only two readings of one
// counter say what the engine generated in between: summed over the same
// ranks (vLLM's engine label), none of which went back. A rank missing
// from the read after hides all it made, other traffic included; one
// missing from the read before adds all it ever made. A series missing
// from one page is back at the next, so after is read again once. Then:
//   - a counter that still went back is an engine that restarted between
//     the reads: the burst is not of the engine as it now is (a cold one
//     lies, PRODUCT.md), so it is discarded as a shared burst is, and the
//     coordinator asks again later;
//   - still other ranks is a pair that cannot be compared, as a read that
//     fails after the burst: kept with that case's "not checked" note,
//     not a restart (nothing went back), and the engine was idle before
//     the burst and watched through it.
func (p *prober) checkBurst(ctx context.Context, m *wire.Measurement, phase string, b burstSummary, before reading, after *reading) error {
	fault, reads := comparePair(before, *after), "read once"
	if fault != pairOK {
		if again, err := p.read(ctx); err == nil {
			*after, fault, reads = again, comparePair(before, again), "read twice"
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	switch fault {
	case pairWentBack:
		sent := "the measured burst was not sent"
		if phase == PhaseMeasure {
			sent = fmt.Sprintf("the burst's %.1f tok/s is not of the engine as it now is, and was discarded", b.TPS)
		}
		return busyError{fmt.Sprintf("the engine's generated-tokens counter went back during the %s (%s before it, %s after, %s): "+
			"the engine restarted; %s", phaseName(phase), before, *after, reads, sent)}
	case pairOtherRanks:
		// The warm-up's pair only spares the engine's users the measured
		// burst, whose own pair (from after, read again) still decides.
		if phase == PhaseMeasure {
			m.Problems = append(m.Problems, fmt.Sprintf("other traffic during the burst not checked: the engine's generated-tokens counter "+
				"was summed over other ranks before it (%s) and after it (%s, %s), so the two are not one counter (a rank's series missing from /metrics)",
				before, *after, reads))
		}
		return nil
	}
	return p.shared(m, phase, b, before.total, after.total)
}

// pairFault says why two readings of the counter are not one counter.
type pairFault int

const (
	pairOK         pairFault = iota
	pairWentBack             // a rank, or the total where the ranks are not known, went back
	pairOtherRanks           // summed over other ranks
)

// comparePair compares a reading with one before it. A counter that is
// one series (SGLang, llama.cpp: rank 0 alone) is compared as before: it
// went back or it did not.
func comparePair(before, after reading) pairFault {
	if before.ranks == nil || after.ranks == nil {
		if after.total < before.total {
			return pairWentBack
		}
		return pairOK
	}
	same := len(before.ranks) == len(after.ranks)
	for k, v := range before.ranks {
		a, ok := after.ranks[k]
		if ok && a < v {
			return pairWentBack
		}
		same = same && ok
	}
	if !same {
		return pairOtherRanks
	}
	return pairOK
}

// String gives the reading's total, and its ranks where several.
func (r reading) String() string {
	if len(r.ranks) < 2 {
		return fmt.Sprintf("%.0f", r.total)
	}
	parts := make([]string, 0, len(r.ranks))
	for _, k := range slices.Sorted(maps.Keys(r.ranks)) {
		parts = append(parts, fmt.Sprintf("rank %d: %.0f", k, r.ranks[k]))
	}
	return fmt.Sprintf("%.0f (%s)", r.total, strings.Join(parts, ", "))
}

// shared judges the engine's own count of generated tokens over a burst
// (the warm-up or the measured one) against what the burst received: more
// means other requests shared the engine, and the burst measured a share.
// A little slack covers a counter that records a step late. before and
// after are one counter (checkBurst).
func (p *prober) shared(m *wire.Measurement, phase string, meas burstSummary, before, after float64) error {
	grew := after - before
	if phase == PhaseMeasure {
		m.EngineGeneratedTokens = int64(grew)
	}
	if int(grew) <= meas.Tokens+p.slack() {
		return nil
	}
	if phase != PhaseMeasure {
		return busyError{fmt.Sprintf("the engine generated %.0f tokens during the %s, which received %d: other traffic shared the engine; "+
			"the measured burst was not sent", grew, phaseName(phase), meas.Tokens)}
	}
	return busyError{fmt.Sprintf("the engine generated %.0f tokens during the measured burst, which received %d: other traffic shared the engine; "+
		"the burst's %.1f tok/s measured a share and was discarded", grew, meas.Tokens, meas.TPS)}
}
