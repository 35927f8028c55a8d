package fleet

import (
	"fmt"
	"time"

	"heft/shared/wire"
)

// An agent keeps the fresh measurements a coordinator hands it
// (wire.CachedMeasurement) and offers them in its next hello
// (wire.Hello.Measurements). A coordinator that restarted on an empty
// state would otherwise send every worker a registration burst, onto
// engines the gateways still route to (heft-sync's keep_unlisted), where
// the burst is shared with users and discarded, again and again.
//
// An offer is the agent's word, and earns nothing a burst it reported
// could not: it is taken only where the fleet would ask for a
// registration or scheduled probe anyway (no valid measurement of its
// own younger than CacheTTL, and none newer than the offer), once per
// connection, for a worker the agent lists on that connection; it is
// validated, cut and judged for plausibility as a fresh result is, and
// counted once in probation like one. Its time is never re-stamped: an
// offer older than CacheTTL by the coordinator's clock, or past the
// expiry it was handed with, is refused, so replaying one cannot make it
// young. Any refusal is logged with its reason and the worker is probed
// as before.

// offerSkew is how far after the coordinator's now an offered
// measurement may have finished (another coordinator's clock); it is then
// taken as finished now.
const offerSkew = time.Minute

// Outcomes of an offered measurement, for Stats.HandedOver.
const (
	OfferTaken   = "taken"
	OfferRefused = "refused"
)

// OfferOutcomes lists them.
var OfferOutcomes = []string{OfferTaken, OfferRefused}

// noteOffers keeps what a hello offers until the connection's first
// snapshot says which workers the agent lists.
func (f *Fleet) noteOffers(n *node, offers []wire.CachedMeasurement) {
	n.offers = nil
	for _, o := range offers {
		key := o.Measurement.CapacityKey
		if n.offers == nil {
			n.offers = map[string]wire.CachedMeasurement{}
		}
		if _, dup := n.offers[key]; dup {
			f.refuseOffer(n, key, "the hello offers this capacity key twice")
			continue
		}
		n.offers[key] = o
	}
}

// takeOffer takes, or refuses, the measurement the node's agent offered
// for w. It is called for each worker a snapshot lists.
func (f *Fleet) takeOffer(w *worker, n *node, now time.Time) {
	o, ok := n.offers[w.id]
	if !ok || w.placeholder {
		return
	}
	delete(n.offers, w.id)
	if own := f.newest(w.id); own != nil && own.Valid() && now.Sub(own.FinishedAt) < f.cfg.CacheTTL {
		return // the fleet's own fresh measurement serves; nothing is asked
	}
	m, why := f.judgeOffer(w, n, o, now)
	if why != "" {
		f.refuseOffer(n, w.id, why)
		return
	}
	c := f.entry(w.id)
	c.latest = &m
	c.appendHistory(HistoryEntry(m), f.cfg.HistoryLen)
	f.adopted = append(f.adopted, m)
	w.probe.retryAt, w.probe.failure, w.probe.busy = time.Time{}, "", 0
	f.handedOver[OfferTaken]++
	if m.Implausible != "" {
		f.log.Warn("took the measurement the agent held, and it is implausible; the worker is held until an admin admits it",
			"worker", w.id, "node", n.name, "throughput_tps", m.ThroughputTPS, "why", m.Implausible)
		return
	}
	f.log.Info("took the measurement the agent held from a coordinator; no burst sent", "worker", w.id, "node", n.name,
		"throughput_tps", m.ThroughputTPS, "finished_at", m.FinishedAt)
}

// refuseOffers refuses what the node offered for capacity keys its
// snapshot did not list.
func (f *Fleet) refuseOffers(n *node) {
	for key := range n.offers {
		f.refuseOffer(n, key, "the agent lists no engine with this capacity key (its model or launch arguments changed, or another node owns it)")
	}
	n.offers = nil
}

func (f *Fleet) refuseOffer(n *node, key, why string) {
	f.handedOver[OfferRefused]++
	f.log.Warn("refusing the measurement the agent offered; the worker is measured instead", "node", n.name, "capacity_key", key, "why", why)
}

// judgeOffer returns the offered measurement as the fleet would store it,
// or why it is refused.
func (f *Fleet) judgeOffer(w *worker, n *node, o wire.CachedMeasurement, now time.Time) (wire.Measurement, string) {
	m := cloneMeasurement(o.Measurement)
	if err := m.Validate(); err != nil {
		return m, err.Error()
	}
	own := f.newest(w.id)
	switch {
	case !m.Valid():
		return m, fmt.Sprintf("it is not a valid measurement (failure %q, %.4g tok/s)", m.Failure, m.ThroughputTPS)
	case m.Node != "" && m.Node != n.name:
		return m, fmt.Sprintf("it was measured for node %q", m.Node)
	case m.EngineKind != "" && m.EngineKind != w.eng.Kind:
		return m, fmt.Sprintf("it measured a %s engine, the worker is %s", m.EngineKind, w.eng.Kind)
	case m.Model != "" && w.eng.Model != "" && m.Model != w.eng.Model:
		return m, fmt.Sprintf("it measured model %q, the worker serves %q", m.Model, w.eng.Model)
	case m.Implausible != "":
		return m, "it was judged implausible: " + m.Implausible
	case m.FinishedAt.IsZero() || o.ExpiresAt.IsZero():
		return m, "it carries no finish time or no expiry"
	case m.FinishedAt.After(now.Add(offerSkew)):
		return m, fmt.Sprintf("it finished at %s, %s after the coordinator's clock", m.FinishedAt.Format(time.RFC3339), m.FinishedAt.Sub(now).Round(time.Second))
	case now.Sub(m.FinishedAt) >= f.cfg.CacheTTL:
		return m, fmt.Sprintf("it expired: measured %s ago, cache_ttl is %s", now.Sub(m.FinishedAt).Round(time.Second), f.cfg.CacheTTL)
	case !o.ExpiresAt.After(now):
		return m, fmt.Sprintf("it expired at %s", o.ExpiresAt.Format(time.RFC3339))
	case own != nil && !own.FinishedAt.Before(m.FinishedAt):
		return m, fmt.Sprintf("the coordinator holds a measurement of its own from %s, not older", own.FinishedAt.Format(time.RFC3339))
	}
	if m.FinishedAt.After(now) {
		dur := max(0, m.FinishedAt.Sub(m.StartedAt))
		m.FinishedAt, m.StartedAt = now, now.Add(-dur)
	}
	m.Node = n.name
	if cutMeasurement(&m) {
		f.measurementsCut++
	}
	m.Implausible = f.implausible(w, m)
	return m, ""
}

// cachedFor is the message that hands node's agent its fresh valid
// measurement m.
func (f *Fleet) cachedFor(node string, m wire.Measurement) Action {
	return Action{Node: node, Message: &wire.CachedMeasurement{Measurement: cloneMeasurement(m), ExpiresAt: m.FinishedAt.Add(f.cfg.CacheTTL)}}
}
