package fleet

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"heft/shared/health"
	"heft/shared/wire"
)

// Weight is earned. A worker is on probation until an admin admits it, or
// until it was first seen at least Probation ago (by the coordinator's
// clock) and its last two valid measurements agree within probationAgree.
// On probation its weight is at most 1 and its throughput is not counted
// in its model's median, so a new node cannot move the median nor take
// more than a median worker's share by what it says it measured. A name
// released or forgotten loses its workers' records and measurements
// (forget.go), so whoever holds it next starts on probation again.
//
// A node's workers on probation hold together at most MaxNodeShare of a
// model's weight once the model has weighted workers on minNodesForShare
// nodes: a new node listing many engines cannot take nearly all the
// traffic at a weight of 1 each. A worker that has earned its weight is
// not scaled by the share (weights follow physics: an honest fast worker
// may hold most of a model); its node is bounded by what its GPUs can
// deliver instead (nodebound.go).

// probationAgree is how far apart two measurements may be, as a fraction
// of the larger, and still agree.
const probationAgree = 0.25

// minNodesForShare is how many nodes a model needs before one node's
// share is capped: with fewer, a cap of one half would cut real capacity.
const minNodesForShare = 3

// CheckProbation checks the probation period and the node share cap. The
// configuration's validation uses it too.
func CheckProbation(probation time.Duration, share float64) error {
	var errs []error
	if probation < 0 {
		errs = append(errs, fmt.Errorf("probation must be 0 (off) or above zero, got %s", probation))
	}
	if !finite(share) || share < 0 || share >= 1 || (share > 0 && share*minNodesForShare <= 1) {
		errs = append(errs, fmt.Errorf("plausibility.max_node_share must be 0 (off) or within (1/%d, 1), got %g", minNodesForShare, share))
	}
	return errors.Join(errs...)
}

// onProbation reports whether the worker's weight is not yet earned.
func (f *Fleet) onProbation(w *worker, now time.Time) bool {
	if f.cfg.Probation <= 0 || f.decisions[w.id] == DecisionAdmit {
		return false
	}
	if now.Sub(w.firstSeen) < f.cfg.Probation {
		return true
	}
	a, b, ok := f.lastTwoValid(w.id)
	return !ok || !agree(a, b)
}

// lastTwoValid returns the throughputs of the worker's last two valid
// measurements.
func (f *Fleet) lastTwoValid(id string) (a, b float64, ok bool) {
	c := f.cache[id]
	if c == nil {
		return 0, 0, false
	}
	var found []float64
	for i := len(c.history) - 1; i >= 0 && len(found) < 2; i-- {
		if m := c.history[i]; m.Valid() && m.ThroughputTPS > 0 {
			found = append(found, m.ThroughputTPS)
		}
	}
	if len(found) < 2 {
		return 0, 0, false
	}
	return found[0], found[1], true
}

func agree(a, b float64) bool {
	return math.Abs(a-b) <= probationAgree*max(a, b)
}

// probationDue is when a worker on probation is measured again: once the
// period since it was first seen is over, then every period until two
// measurements agree. Ok is false when it is not on probation.
func (f *Fleet) probationDue(w *worker) (time.Time, bool) {
	if !w.probation {
		return time.Time{}, false
	}
	at := w.firstSeen.Add(f.cfg.Probation)
	if next := w.probe.sentAt.Add(f.cfg.Probation); next.After(at) {
		at = next
	}
	return at, true
}

// counted returns the throughputs a model's median is taken over: those
// of its workers not on probation, or, while every one is, all of them.
func counted(ws []*worker, tps func(*worker) float64) []float64 {
	var earned, all []float64
	for _, w := range ws {
		if t := tps(w); t > 0 {
			all = append(all, t)
			if !w.probation {
				earned = append(earned, t)
			}
		}
	}
	if len(earned) > 0 {
		return earned
	}
	return all
}

// capProbation lowers the weight of a worker on probation to 1 (a pin, an
// admin's act, stands) and returns the finding that says so; a finding
// with no code when it is not on probation.
func (f *Fleet) capProbation(w *worker, weight *float64, pins map[string]float64) (*float64, health.Finding) {
	if !w.probation || weight == nil {
		return weight, health.Finding{}
	}
	if _, pinned := pins[w.id]; pinned {
		return weight, health.Finding{}
	}
	x := health.Finding{Code: wire.CodeProbation, Severity: wire.SeverityInfo, Message: f.probationMessage(w)}
	if *weight <= 1 {
		return weight, x
	}
	x.Message = f.loweredMessage(w, *weight, x.Message)
	one := 1.0
	return &one, x
}

// loweredMessage says that w's weight was lowered to 1. The text is kept
// while the weight stays the same, as it does at most weighings of a
// large model, and until the probation text changes.
func (f *Fleet) loweredMessage(w *worker, weight float64, probation string) string {
	c := &w.probationMsg
	if c.lowered == "" || weight != c.loweredWeight {
		c.loweredWeight = weight
		c.lowered = "a weight of " + strconv.FormatFloat(weight, 'g', 3, 64) + " lowered to 1: " + probation
	}
	return c.lowered
}

// probationMessage says until when w is on probation. Every weighing of
// a model asks for it once per worker on probation, so it is formatted
// once for each probation period.
func (f *Fleet) probationMessage(w *worker) string {
	c := &w.probationMsg
	if c.text != "" && c.period == f.cfg.Probation {
		return c.text
	}
	until := w.firstSeen.Add(f.cfg.Probation)
	c.period, c.lowered = f.cfg.Probation, "" // lowered says the old text
	c.text = fmt.Sprintf(
		"on probation: new since %s, its weight is at most 1 and its throughput does not count in its model's median until an admin "+
			"admits it, or until two measurements agreeing within %.0f %% are made after %s (probation %s).",
		w.firstSeen.UTC().Format(time.RFC3339), probationAgree*100, until.UTC().Format(time.RFC3339), f.cfg.Probation)
	return c.text
}

// capNodeShares scales the weights of a node whose workers on probation
// hold more than MaxNodeShare of the model's weight down to that share;
// weight gives a worker's weight field. Earned and pinned weights count
// in the total but are never scaled. It returns the workers it scaled,
// with their node's share before.
func (f *Fleet) capNodeShares(ws []*worker, weight func(*worker) **float64, pins map[string]float64) map[*worker]float64 {
	s := f.cfg.MaxNodeShare
	if s <= 0 {
		return nil
	}
	sums := make(map[string]float64, len(ws)) // by node, weights on probation
	fixed := 0.0                              // earned and pinned weights
	for _, w := range ws {
		p := *weight(w)
		if p == nil {
			continue
		}
		if !unearned(w, pins) {
			fixed += *p
			sums[w.node] += 0 // the node counts among the model's nodes
			continue
		}
		sums[w.node] += *p
	}
	if len(sums) < minNodesForShare || s*float64(len(sums)) <= 1 {
		return nil
	}
	total, largest := fixed, 0.0
	for _, v := range sums {
		total += v
		largest = max(largest, v)
	}
	if largest <= s*total*(1+1e-9) {
		return nil // no node is over its cap, the usual case: no need to sort them
	}
	nodes := make([]string, 0, len(sums))
	for n := range sums {
		nodes = append(nodes, n)
	}
	sort.Slice(nodes, func(i, j int) bool { return sums[nodes[i]] > sums[nodes[j]] })
	// Water-filling: the largest nodes are capped at s of the total the
	// others leave, until no other node is above it.
	capped, rest := 0, total
	for capped < len(nodes) {
		limit := s * rest / (1 - float64(capped)*s)
		if sums[nodes[capped]] <= limit*(1+1e-9) {
			break
		}
		rest -= sums[nodes[capped]]
		capped++
	}
	if capped == 0 {
		return nil
	}
	limit := s * rest / (1 - float64(capped)*s)
	out := map[*worker]float64{}
	for _, n := range nodes[:capped] {
		factor := limit / sums[n]
		for _, w := range ws {
			p := weight(w)
			if w.node != n || *p == nil || !unearned(w, pins) {
				continue
			}
			v := **p * factor
			if !validWeight(v) {
				continue
			}
			*p = &v
			out[w] = sums[n] / total
		}
	}
	return out
}

// unearned reports whether the share cap may scale a worker's weight: it
// is on probation and no admin pinned it.
func unearned(w *worker, pins map[string]float64) bool {
	_, pinned := pins[w.id]
	return w.probation && !pinned
}

// shareFinding says a node's workers' weights were scaled to its cap.
func (f *Fleet) shareFinding(w *worker, model string, before float64) health.Finding {
	return health.Finding{Code: wire.CodeNodeShareCapped, Severity: wire.SeverityWarning, Message: fmt.Sprintf(
		"node %s's workers on probation held %.1f %% of %s's weight; their weights were scaled so that one node's workers on probation "+
			"hold at most %.0f %% (plausibility.max_node_share). The cap ends with their probation, or when an admin admits them.",
		w.node, before*100, model, f.cfg.MaxNodeShare*100)}
}
