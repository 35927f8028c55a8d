package probe

import (
	"context"
	"fmt"
	"time"

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

// Is makes every busyError ErrBusy.
func (busyError) Is(target error) bool {
	_, ok := target.(busyError)
	return ok
}

func busyLoad(l wire.Load) string {
	return fmt.Sprintf("%d running, %d waiting", l.Running, l.Waiting)
}

// onBusy decides what a probe does with an engine found busy (load):
// return a busyError, or wait (after a drain) until it is idle.
func (p *prober) onBusy(ctx context.Context, m *wire.Measurement, load wire.Load) error {
	switch {
	case p.cfg.IdleOnly:
		return busyError{fmt.Sprintf("engine busy (%s); asked to measure it only while idle (its weight follows its pace meanwhile): deferred", busyLoad(load))}
	case p.cfg.Busy == BusyPassiveOnly:
		return busyError{fmt.Sprintf("engine busy (%s) and probe_busy is passive-only: not probed", busyLoad(load))}
	case p.cfg.Busy == BusyWait && p.cfg.RequireIdle:
		return busyError{fmt.Sprintf("engine busy (%s); scheduled probe deferred", busyLoad(load))}
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
	for {
		waited := time.Since(start)
		if waited >= p.cfg.BusyWait {
			m.BusyWaitSeconds = waited.Seconds()
			return busyError{fmt.Sprintf("engine still busy (%s) after waiting %s for it to be idle (probe_busy %s); not probed",
				busyLoad(load), waited.Round(time.Second), p.cfg.Busy)}
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
			// Keep waiting on the last load read: a flaky /metrics is no
			// proof that the engine became idle.
		case l.Running+l.Waiting == 0:
			m.BusyWaitSeconds = time.Since(start).Seconds()
			m.LoadBefore = l
			return nil
		default:
			load = l
		}
	}
}

// readLoad reads the engine's load within ten seconds.
func (p *prober) readLoad(ctx context.Context) (wire.Load, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return p.cfg.Load(lctx)
}

// readGenerated reads the engine's generated-tokens counter, noting once
// in m why it cannot be read.
func (p *prober) readGenerated(ctx context.Context, m *wire.Measurement) (float64, bool) {
	if p.cfg.Counters == nil {
		return 0, false
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := p.cfg.Counters(cctx)
	if err != nil {
		if ctx.Err() == nil {
			m.Problems = append(m.Problems, fmt.Sprintf("other traffic during the burst not checked: %v", err))
		}
		return 0, false
	}
	return v, true
}

// shared judges the engine's own count of generated tokens over a burst
// (the warm-up or the measured one) against what the burst received: more
// means other requests shared the engine, and the burst measured a share.
// A little slack covers a counter that records a step late.
func (p *prober) shared(m *wire.Measurement, phase string, meas burstSummary, before, after float64) error {
	grew := after - before
	if grew < 0 {
		m.Problems = append(m.Problems, fmt.Sprintf("the engine's generated-tokens counter went back from %.0f to %.0f during the burst (restarted?)", before, after))
		return nil
	}
	if phase == "measured burst" {
		m.EngineGeneratedTokens = int64(grew)
	}
	slack := max(2*p.cfg.Concurrency, m.ExpectedTokens/50)
	if int(grew) <= meas.Tokens+slack {
		return nil
	}
	if phase != "measured burst" {
		return busyError{fmt.Sprintf("the engine generated %.0f tokens during the %s, which received %d: other traffic shared the engine; "+
			"the measured burst was not sent", grew, phase, meas.Tokens)}
	}
	return busyError{fmt.Sprintf("the engine generated %.0f tokens during the measured burst, which received %d: other traffic shared the engine; "+
		"the burst's %.1f tok/s measured a share and was discarded", grew, meas.Tokens, meas.TPS)}
}
