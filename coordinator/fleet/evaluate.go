package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"heft/shared/health"
	"heft/shared/view"
	"heft/shared/wire"
)

// verdict is a worker's freshly derived state.
type verdict struct {
	state      string
	findings   []health.Finding
	tps        float64 // valid throughput of an admitted worker, else 0
	prefillTPS float64 // valid prefill throughput of an admitted worker, else 0
	probation  bool    // its weight is not yet earned (probation.go)
}

// refresh re-derives the given workers and publishes what changed. A model
// is re-weighed only when the throughputs of its admitted workers changed
// (or an event marked it in f.dirty), so an ordinary snapshot costs work
// in proportion to the node's workers, not the model's. It reports whether
// anything shown changed.
func (f *Fleet) refresh(now time.Time, ws ...*worker) bool {
	changed := false
	ws = f.withDeployments(ws)
	for _, w := range ws {
		v := f.evaluate(w, now)
		counts := v.tps > 0 || w.tps > 0 || v.prefillTPS > 0 || w.prefill.tps > 0
		if v.tps != w.tps || v.prefillTPS != w.prefill.tps || (v.probation != w.probation && counts) {
			f.dirty[w.eng.Model] = true
		}
		tpsMoved := v.tps != w.tps
		if w.outlierHeld() && view.Serving(v.state) {
			v.state = view.StateHeld // until the model is weighed again
		}
		if v.state != w.state {
			changed = true
		}
		w.state, w.base, w.tps, w.prefill.tps, w.probation = v.state, v.findings, v.tps, v.prefillTPS, v.probation
		if tpsMoved {
			f.markNodeModels(w.node) // its node's bound (nodebound.go)
		}
		f.touch(w)
	}
	for _, w := range ws {
		if !f.dirty[w.eng.Model] && f.publish(w, now) {
			changed = true
		}
	}
	for model := range f.dirty {
		if f.reweigh(model, now) {
			changed = true
		}
	}
	for _, w := range ws {
		if f.dirty[w.eng.Model] {
			f.schedule(w, now) // reweigh schedules only the workers whose state it moved
		}
	}
	clear(f.dirty)
	return changed
}

// refreshAll re-derives every worker and every model's weights.
func (f *Fleet) refreshAll(now time.Time) bool {
	ws := make([]*worker, 0, len(f.workers))
	for _, w := range f.workers {
		ws = append(ws, w)
	}
	for model := range f.byModel {
		f.dirty[model] = true
	}
	return f.refresh(now, ws...)
}

func (f *Fleet) refreshNode(n *node, now time.Time) bool {
	ws := make([]*worker, 0, len(n.workers))
	for _, w := range n.workers {
		ws = append(ws, w)
	}
	return f.refresh(now, ws...)
}

// reweigh sets the weights of a model's workers from the median throughput
// of its admitted workers, found by sorting that model's throughputs only,
// and the prefill weights from the median prefill throughput of those with
// a valid prefill part, and publishes every worker of the model. Weights
// move no deadline, so it schedules only the workers whose state it moved
// (refresh schedules those it was given): at ten thousand workers the
// others' deadlines were a third of its cost (bench area 5).
func (f *Fleet) reweigh(model string, now time.Time) bool {
	ws := make([]*worker, 0, len(f.byModel[model]))
	for _, w := range f.byModel[model] {
		ws = append(ws, w)
	}
	tps := counted(ws, func(w *worker) float64 { return w.tps }) // workers on probation are not counted
	med := median(tps)
	wasHeld := make([]bool, len(ws))
	before := make([]string, len(ws))
	for i, w := range ws {
		wasHeld[i] = w.state == view.StateHeld && w.outlierHeld()
		before[i] = w.state
		f.weigh(w, model, med, len(tps))
		switch {
		case w.outlierHeld() && view.Serving(w.state):
			w.state = view.StateHeld
		case !w.outlierHeld() && wasHeld[i]:
			w.state = f.servingState(w, now) // its model's median caught up with it, or an admin admitted it
		}
		f.bindNode(w) // a node's workers weigh at most what its GPUs deliver
	}
	shares := f.capNodeShares(ws, func(w *worker) **float64 { return &w.weight }, f.pins)
	// The prefill median counts the workers the decode rules leave in the
	// weight table.
	prefill := counted(ws, func(w *worker) float64 {
		if w.outlierHeld() {
			return 0
		}
		return w.prefill.tps
	})
	prefillMed := median(prefill)
	for _, w := range ws {
		w.shareNote = nil
		if before, ok := shares[w]; ok {
			x := f.shareFinding(w, model, before)
			w.shareNote = &x
		}
		f.weighPrefill(w, model, prefillMed, len(prefill))
	}
	f.capNodeShares(ws, func(w *worker) **float64 { return &w.prefill.weight }, f.prefillPins)
	changed := false
	for i, w := range ws {
		if f.assemble(w, now) || wasHeld[i] != w.outlierHeld() {
			changed = true
			f.touch(w)
		}
		if w.state != before[i] {
			f.schedule(w, now)
		}
	}
	return changed
}

// evaluate derives a worker's state and warnings from its facts, its
// newest measurement and the admin's decision, in the order doc.go gives.
func (f *Fleet) evaluate(w *worker, now time.Time) verdict {
	th := f.cfg.Thresholds
	var fs []health.Finding
	eng, deployment := f.joined(w, now) // a multi-node deployment's ranks are judged as one set
	w.judged = nil
	if len(deployment) > 0 {
		w.judged = &eng
	}
	fs = append(fs, health.Engine(eng, w.gpus, th)...)
	if f.cfg.SingleHost {
		fs = slices.DeleteFunc(fs, func(x health.Finding) bool { return x.Code == wire.CodeNotRoutable })
	}
	fs = append(fs, deployment...)
	m := f.newest(w.id)
	if w.placeholder {
		m = nil
	}
	if m != nil {
		fs = append(fs, health.Measurement(*m, th)...)
	}
	if w.probe.failure != "" && !hasCode(fs, wire.CodeProbeFailed) {
		fs = append(fs, health.Finding{Code: wire.CodeProbeFailed, Severity: wire.SeverityWarning, Message: fmt.Sprintf(
			"the last probe request could not run: %s. heft asks again every %s until a probe succeeds.", w.probe.failure, f.cfg.FailRetry)})
	}
	if x := f.deferredFinding(w, m); x != nil {
		fs = append(fs, *x)
	}
	decision := f.decisions[w.id]
	implausible := m != nil && m.Valid() && m.Implausible != ""
	if implausible {
		fs = append(fs, implausibleFinding(*m, decision == DecisionAdmit))
	}
	poolHold := false
	for i := range fs {
		if fs[i].Code == wire.CodeDPPoolImbalance && fs[i].Severity == wire.SeverityCritical {
			poolHold = true
			if decision == DecisionAdmit {
				fs[i].Message += " An admin has admitted it anyway."
			}
		}
	}
	badAddr := f.addressRefused(w)
	if badAddr != "" {
		fs = append(fs, addressFinding(w, badAddr))
	}
	v := verdict{findings: fs}
	switch {
	case isHold(decision), badAddr != "":
		v.state = view.StateHeld
	case w.placeholder || !w.eng.Ready || w.eng.Error != "":
		v.state = view.StatePending
	case m == nil:
		v.state = view.StateMeasuring
	case !m.Valid():
		v.state = view.StateHeld
	case (poolHold || implausible) && decision != DecisionAdmit:
		v.state = view.StateHeld
	default:
		v.state = view.StateAdmitted
		v.tps, _ = w.capacity(m)
		v.prefillTPS = prefillTPS(*m)
		v.probation = f.onProbation(w, now)
	}
	if f.offline(w, now) {
		f.away(w, &v, now)
	}
	return v
}

// away turns the verdict of a worker whose agent has been gone past the
// grace into stale or offline. The agent being gone says nothing about
// the engine: a worker that was serving keeps its weight (stale) until
// StaleWeightTTL after the disconnect. One whose agent last said the
// engine was not ready, or that was not serving, is offline.
func (f *Fleet) away(w *worker, v *verdict, now time.Time) {
	until := f.staleUntil(w)
	if v.state == view.StateAdmitted && now.Before(until) {
		v.state = view.StateStale
		v.findings = append(v.findings, f.staleFinding(w, until))
		return
	}
	expired := v.state == view.StateAdmitted
	v.state, v.tps, v.prefillTPS = view.StateOffline, 0, 0
	v.findings = append(v.findings, f.offlineFinding(w, expired, until))
}

// servingState is what a worker the weights serve shows: stale while its
// agent is away past the grace, else admitted.
func (f *Fleet) servingState(w *worker, now time.Time) string {
	if f.offline(w, now) {
		return view.StateStale
	}
	return view.StateAdmitted
}

// implausibleHolds reports whether the worker's measurement is held as
// implausible, stored or against its model's median.
func (f *Fleet) implausibleHolds(w *worker) bool {
	if w.outlier != nil {
		return true
	}
	m := f.newest(w.id)
	return m != nil && m.Valid() && m.Implausible != ""
}

// poolHolds reports whether the worker's pools alone would hold it.
func (f *Fleet) poolHolds(w *worker) bool {
	return health.PoolsHold(w.eng, f.cfg.Thresholds)
}

func (f *Fleet) staleFinding(w *worker, until time.Time) health.Finding {
	msg := fmt.Sprintf("%s (last heard from %s). Nothing said its engine stopped, "+
		"so the worker keeps its last weight until %s (stale_weight_ttl %s after the disconnect), or until its agent %s. "+
		"The gateways' own health checks still take a dead engine out.",
		f.awayText(w, until.Add(-f.cfg.staleTTL())), w.lastSeen.UTC().Format(time.RFC3339),
		until.UTC().Format(time.RFC3339), f.cfg.staleTTL(), f.backText(w))
	return health.Finding{Code: wire.CodeAgentOffline, Severity: wire.SeverityWarning, Message: msg}
}

// awayText says the worker's agent has been away since left: not
// connected, or connected again without a valid snapshot (node.present).
func (f *Fleet) awayText(w *worker, left time.Time) string {
	if f.connected(w) {
		return fmt.Sprintf("the agent on node %s left at %s and has sent no snapshot the coordinator accepted since "+
			"(it is connected again, but a hello alone does not bring it back)", w.node, left.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("the agent on node %s is not connected since %s", w.node, left.UTC().Format(time.RFC3339))
}

// backText is what brings the worker's agent back.
func (f *Fleet) backText(w *worker) string {
	if f.connected(w) {
		return "says how the engine is in a snapshot the coordinator accepts"
	}
	return "reconnects and says how the engine is"
}

// offlineFinding says why a worker whose agent is gone is out of the
// weight table: expired when it served until its stale weight ran out at
// until, else because it was not serving when its agent left (its engine
// not ready, held, unmeasured).
func (f *Fleet) offlineFinding(w *worker, expired bool, until time.Time) health.Finding {
	gone := fmt.Sprintf("the agent on node %s is not connected", w.node)
	if n := f.nodes[w.node]; n != nil && n.connected {
		gone = f.awayText(w, n.since)
	}
	msg := fmt.Sprintf("%s (last heard from %s); the worker is out of the weight table until its agent %s.",
		gone, w.lastSeen.UTC().Format(time.RFC3339), f.backText(w))
	if expired {
		msg += fmt.Sprintf(" Its last weight counted until %s (stale_weight_ttl %s after the disconnect).", until.UTC().Format(time.RFC3339), f.cfg.staleTTL())
	}
	if m := f.newest(w.id); m != nil && m.Valid() && !w.placeholder {
		msg += fmt.Sprintf(" Its measurement of %s stays cached until %s, so a reconnect before then costs no burst.",
			m.FinishedAt.UTC().Format(time.RFC3339), m.FinishedAt.Add(f.cfg.CacheTTL).UTC().Format(time.RFC3339))
	}
	return health.Finding{Code: wire.CodeAgentOffline, Severity: wire.SeverityCritical, Message: msg}
}

// outlierHeld reports whether weigh holds the worker as an outlier.
func (w *worker) outlierHeld() bool {
	return w.outlier != nil && w.outlier.Severity == wire.SeverityCritical
}

// weigh sets a worker's weight from its model's median throughput. A
// worker far above the median is an outlier: held, without a weight,
// unless an admin admitted it.
func (f *Fleet) weigh(w *worker, model string, med float64, n int) {
	prev := w.note
	w.computed, w.weight, w.clamp, w.outlier, w.note = nil, nil, nil, nil, nil
	if w.tps <= 0 || med <= 0 {
		return
	}
	if o := f.outlierFinding(w, model, med, n); o != nil {
		if f.decisions[w.id] != DecisionAdmit {
			w.outlier = o
			return
		}
		o.Severity = wire.SeverityWarning
		o.Message += " An admin has admitted it anyway."
		w.outlier = o
	}
	w.computed, w.weight, w.clamp = f.scale(w.id, model, "", w.tps, med, n, f.pins)
	var note health.Finding
	if w.weight, note = f.capProbation(w, w.weight, f.pins); note.Code != "" {
		if prev == nil || *prev != note {
			prev = &note
		}
		w.note = prev // the same finding as at the last weighing, as it is at most
	}
}

// scale turns a throughput into a weight against its model's median of n
// workers: clamped to [WeightMin, WeightMax] (with a weight_clamped
// finding), or the worker's pin from pins. kind is "" for the decode
// weight, "prefill" for the prefill weight. Nil weights when the result is
// not a finite number above zero, which validated input cannot give.
func (f *Fleet) scale(id, model, kind string, tps, med float64, n int, pins map[string]float64) (computed, weight *float64, clamp *health.Finding) {
	raw := tps / med
	c := min(max(raw, f.cfg.WeightMin), f.cfg.WeightMax)
	wt := c
	if pin, ok := pins[id]; ok {
		wt = pin
	} else if c != raw {
		cf := clampFinding(model, kind, tps, med, n, raw, c, f.cfg.WeightMin, f.cfg.WeightMax)
		clamp = &cf
	}
	if !validWeight(wt) || !validWeight(c) {
		f.log.Error("refusing a weight that is not a finite number above zero", "worker", id, "kind", kind, "weight", wt, "computed", c)
		return nil, nil, nil
	}
	return &c, &wt, clamp
}

// publish assembles a worker's warnings and weights and schedules its
// next deadline. It reports whether its warnings or weight changed.
func (f *Fleet) publish(w *worker, now time.Time) bool {
	changed := f.assemble(w, now)
	f.schedule(w, now)
	return changed
}

// assemble sets the warnings and weights a worker shows, stamping each
// new warning code, and reports whether they changed.
// The list is built in the fleet's scratch slice and copied only when it
// changed: a large model's weighing changes few workers' warnings.
func (f *Fleet) assemble(w *worker, now time.Time) bool {
	fs := append(f.scratch[:0], w.base...)
	if c := clampFindings(w.clamp, w.prefill.clamp); c != nil {
		fs = append(fs, *c)
	}
	if w.outlier != nil {
		fs = append(fs, *w.outlier)
	}
	for _, x := range [...]*health.Finding{w.note, w.shareNote, w.boundNote} {
		if x != nil {
			fs = append(fs, *x)
		}
	}
	health.Sort(fs)
	f.scratch = fs
	same := slices.Equal(fs, w.findings)
	changed := !same || !sameFloat(w.weight, w.shownWeight) || !sameFloat(w.prefill.weight, w.shownPrefill)
	w.shownWeight, w.shownPrefill = w.weight, w.prefill.weight
	if !same {
		w.findings = slices.Clone(fs)
		stamp(w, now)
	}
	return changed
}

func clampFinding(model, kind string, tps, med float64, n int, raw, clamped, lo, hi float64) health.Finding {
	what := "lowered to %g so that one worker cannot take nearly all of the model's traffic"
	if clamped > raw {
		what = "raised to %g so that it keeps some traffic; if it is really this slow, consider holding it"
	}
	measured, workers := "measured %.0f tok/s", "admitted workers of"
	if kind == "prefill" {
		measured, workers = "prefill weight: measured %.0f prompt tok/s", "admitted workers with a prefill measurement of"
	}
	msg := fmt.Sprintf(measured+" against a median of %.0f tok/s over the %d "+workers+" %s, a weight of %.3g; it was "+what+
		" (weights stay within [%g, %g]). Check the measurement, and pin a weight if the gap is real.",
		tps, med, n, model, raw, clamped, lo, hi)
	return health.Finding{Code: wire.CodeWeightClamped, Severity: wire.SeverityWarning, Message: msg}
}

// weighPrefill sets a worker's prefill weight from its model's median
// prefill throughput, as weigh sets the decode weight: clamped to the same
// range, replaced by a prefill pin.
func (f *Fleet) weighPrefill(w *worker, model string, med float64, n int) {
	p := &w.prefill
	p.computed, p.weight, p.clamp = nil, nil, nil
	if p.tps <= 0 || med <= 0 || w.outlierHeld() {
		return
	}
	p.computed, p.weight, p.clamp = f.scale(w.id, model, "prefill", p.tps, med, n, f.prefillPins)
	p.weight, _ = f.capProbation(w, p.weight, f.prefillPins)
}

// clampFindings is the worker's weight_clamped warning: the decode
// weight's, the prefill weight's, or both in one.
func clampFindings(decode, prefill *health.Finding) *health.Finding {
	switch {
	case decode == nil:
		return prefill
	case prefill == nil:
		return decode
	}
	both := *decode
	both.Message = "decode weight: " + decode.Message + " " + strings.ToUpper(prefill.Message[:1]) + prefill.Message[1:]
	return &both
}

// stamp keeps, for each warning code, the time it was first seen on the
// worker without a break.
func stamp(w *worker, now time.Time) {
	same := len(w.since) == len(w.findings)
	for _, x := range w.findings {
		if _, ok := w.since[x.Code]; !ok {
			same = false
			break
		}
	}
	if same {
		return
	}
	next := make(map[string]time.Time, len(w.findings))
	for _, x := range w.findings {
		if t, ok := w.since[x.Code]; ok {
			next[x.Code] = t
		} else {
			next[x.Code] = now
		}
	}
	w.since = next
}

// schedule lowers nextDue to this worker's next deadline.
func (f *Fleet) schedule(w *worker, now time.Time) {
	if n := f.nodes[w.node]; n != nil && !n.present() {
		if off := n.since.Add(f.cfg.OfflineGrace); now.Before(off) {
			f.due(off)
		} else if until := f.staleUntil(w); w.state == view.StateStale && now.Before(until) {
			f.due(until)
		} else {
			f.due(w.lastSeen.Add(f.cfg.ForgetAfter))
		}
	}
	if at, _, ok := f.probeDue(w); ok {
		f.due(at)
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	mid := len(s) / 2
	if len(s)%2 == 1 {
		return s[mid]
	}
	return (s[mid-1] + s[mid]) / 2
}

func hasCode(fs []health.Finding, code string) bool {
	return slices.ContainsFunc(fs, func(x health.Finding) bool { return x.Code == code })
}

func sameFloat(a, b *float64) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
