package fleet

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"heft/shared/wire"
)

// Connect records that conn is now node's agent connection. Probe requests
// sent on an earlier connection are forgotten. It returns no actions today:
// the agent's first snapshot decides what to send.
func (f *Fleet) Connect(node string, conn uint64, hello wire.Hello) []Action {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	n := f.nodeFor(node)
	f.connSeq++
	n.conn, n.connected, n.order, n.since, n.hello = conn, true, f.connSeq, now, hello
	for _, w := range n.workers {
		w.probe.outstanding, w.probe.status = false, ""
	}
	f.log.Debug("agent connected", "node", node, "conn", conn)
	f.refreshNode(n, now)
	f.notify()
	return nil
}

// Disconnect records that node's connection conn has ended. A conn that is
// no longer the node's current connection is ignored.
func (f *Fleet) Disconnect(node string, conn uint64) {
	f.mu.Lock()
	defer f.writeRecords()
	defer f.mu.Unlock()
	n := f.nodes[node]
	if n == nil || !n.connected || n.conn != conn {
		f.log.Debug("ignoring disconnect of a replaced connection", "node", node, "conn", conn)
		return
	}
	now := f.now()
	n.connected, n.since = false, now
	for _, w := range sortedWorkers(n.workers) {
		w.probe.outstanding, w.probe.status = false, ""
		f.saveWorker(w, now, true)
	}
	f.log.Debug("agent disconnected", "node", node, "conn", conn)
	f.refreshNode(n, now)
	f.notify()
}

// Snapshot applies an agent's view of its node: it creates and updates the
// node's workers, drops those no longer listed, and returns what to send:
// a CachedMeasurement for each worker with a fresh valid measurement, the
// first time it is seen on a connection, and a ProbeRequest for each ready
// worker that needs one.
func (f *Fleet) Snapshot(nodeName string, s wire.Snapshot) []Action {
	if err := s.Validate(); err != nil {
		f.log.Warn("ignoring invalid snapshot", "node", nodeName, "error", err)
		return nil
	}
	f.mu.Lock()
	defer f.writeRecords()
	defer f.mu.Unlock()
	now := f.now()
	n := f.nodeFor(nodeName)
	seen := map[string]bool{}
	for _, e := range s.Engines {
		if e.CapacityKey == "" {
			f.applyKeyless(n, e, s.GPUs, now, seen)
			continue
		}
		w := f.workers[e.CapacityKey]
		if w != nil && w.node != nodeName {
			if owner := f.nodes[w.node]; owner != nil && owner.connected && owner.order > n.order {
				f.log.Debug("capacity key claimed by an older connection; keeping the newer", "capacity_key", w.id, "node", nodeName, "owner", w.node)
				continue
			}
			f.log.Info("capacity key moved to another node", "capacity_key", w.id, "from", w.node, "to", nodeName)
			if owner := f.nodes[w.node]; owner != nil {
				delete(owner.workers, w.id)
			}
			w.node, w.greeted = nodeName, 0
			n.workers[w.id] = w
		}
		if w == nil {
			w = &worker{id: e.CapacityKey, node: nodeName, firstSeen: now, eng: e}
			f.add(w)
			f.log.Info("new worker", "worker", w.id, "node", nodeName, "url", e.URL, "model", e.Model)
		}
		f.setEngine(w, e)
		w.gpus = engineGPUs(e, s.GPUs)
		w.lastSeen = now
		seen[w.id] = true
		f.saveWorker(w, now, false)
	}
	for _, w := range sortedWorkers(n.workers) {
		if !seen[w.id] {
			f.log.Info("worker no longer listed by its agent", "worker", w.id, "node", nodeName)
			f.drop(w)
		}
	}
	var acts []Action
	if n.connected {
		for _, w := range sortedWorkers(n.workers) {
			acts = append(acts, f.greet(w, n, now)...)
			acts = append(acts, f.probeIfDue(w, now)...)
		}
	}
	f.refreshNode(n, now)
	f.notify()
	return acts
}

// applyKeyless applies an engine listed without a capacity key: to the
// node's worker at the same URL when there is one, otherwise to a
// placeholder worker.
func (f *Fleet) applyKeyless(n *node, e wire.Engine, gpus []wire.GPU, now time.Time, seen map[string]bool) {
	var match *worker
	for _, w := range n.workers {
		if !w.placeholder && w.eng.URL == e.URL && !seen[w.id] && (match == nil || w.lastSeen.After(match.lastSeen)) {
			match = w
		}
	}
	if match != nil {
		// Keep what identifies the worker; take what says how it is now.
		match.eng.Ready, match.eng.Error, match.eng.Load = e.Ready, e.Error, e.Load
		if e.Version != "" {
			match.eng.Version = e.Version
		}
		match.lastSeen = now
		seen[match.id] = true
		return
	}
	id := "unkeyed:" + n.name + ":" + e.URL
	w := f.workers[id]
	if w == nil {
		w = &worker{id: id, placeholder: true, node: n.name, firstSeen: now, eng: e}
		f.add(w)
	}
	f.setEngine(w, e)
	w.gpus = engineGPUs(e, gpus)
	w.lastSeen = now
	seen[id] = true
}

// setEngine replaces a worker's engine facts, keeping the model index.
func (f *Fleet) setEngine(w *worker, e wire.Engine) {
	if w.eng.Model != e.Model {
		f.unindex(w, w.eng.Model)
		f.index(w, e.Model)
		f.dirty[w.eng.Model], f.dirty[e.Model] = true, true
	}
	w.eng = cloneEngine(e)
}

// engineGPUs returns the GPUs an engine uses (all of them when the agent
// could not tell).
func engineGPUs(e wire.Engine, gpus []wire.GPU) []wire.GPU {
	var out []wire.GPU
	for _, g := range gpus {
		if len(e.GPUUUIDs) == 0 || slices.Contains(e.GPUUUIDs, g.UUID) {
			out = append(out, g)
		}
	}
	return out
}

func cloneEngine(e wire.Engine) wire.Engine {
	e.Models = slices.Clone(e.Models)
	e.LaunchArgs = slices.Clone(e.LaunchArgs)
	e.GPUUUIDs = slices.Clone(e.GPUUUIDs)
	e.ForeignProcesses = slices.Clone(e.ForeignProcesses)
	e.Ranks = slices.Clone(e.Ranks)
	e.Load.Ranks = slices.Clone(e.Load.Ranks)
	return e
}

// greet sends a worker its fresh cached measurement once per connection.
func (f *Fleet) greet(w *worker, n *node, now time.Time) []Action {
	if w.placeholder || w.greeted == n.order {
		return nil
	}
	w.greeted = n.order
	m := f.newest(w.id)
	if m == nil || !m.Valid() || now.Sub(m.FinishedAt) >= f.cfg.CacheTTL {
		return nil
	}
	return []Action{{Node: n.name, Message: &wire.CachedMeasurement{Measurement: cloneMeasurement(*m), ExpiresAt: m.FinishedAt.Add(f.cfg.CacheTTL)}}}
}

// probeDue says when the worker should next be sent a probe request, and
// why; ok is false when it should not be probed now at all.
func (f *Fleet) probeDue(w *worker) (at time.Time, reason string, ok bool) {
	// Only workers the agent has listed on its current connection: facts
	// from before a restart or reconnect may no longer hold.
	if w.placeholder || !f.connected(w) || w.greeted != f.nodes[w.node].order || !w.eng.Ready || w.eng.Error != "" {
		return time.Time{}, "", false
	}
	p := w.probe
	m := f.newest(w.id)
	reason = f.neededReason(w)
	switch {
	case p.outstanding:
		return p.sentAt.Add(f.cfg.ProbeTimeout), p.reason, true
	case !p.retryAt.IsZero():
		return p.retryAt, reason, true
	case reason == wire.ReasonScheduled:
		return m.FinishedAt.Add(f.cfg.RemeasureEvery), reason, true
	default:
		return time.Time{}, reason, true // now
	}
}

// neededReason: a worker without a valid measurement needs one to be
// admitted; one with a valid measurement is only refreshed.
func (f *Fleet) neededReason(w *worker) string {
	if m := f.newest(w.id); m != nil && m.Valid() {
		return wire.ReasonScheduled
	}
	return wire.ReasonRegistration
}

func (f *Fleet) probeIfDue(w *worker, now time.Time) []Action {
	at, reason, ok := f.probeDue(w)
	if !ok || now.Before(at) {
		return nil
	}
	return []Action{f.sendProbe(w, reason, now)}
}

func (f *Fleet) sendProbe(w *worker, reason string, now time.Time) Action {
	f.reqSeq++
	f.probeRequests[reason]++
	id := f.reqPrefix + "-" + strconv.FormatUint(f.reqSeq, 10)
	w.probe.reqID, w.probe.reason, w.probe.outstanding, w.probe.sentAt = id, reason, true, now
	w.probe.status, w.probe.retryAt = "", time.Time{}
	f.due(now.Add(f.cfg.ProbeTimeout))
	f.log.Debug("requesting probe", "worker", w.id, "reason", reason, "request_id", id)
	return Action{Node: w.node, Message: &wire.ProbeRequest{RequestID: id, CapacityKey: w.id, Reason: reason}}
}

// ProbeResult stores a measurement from node's agent. It validates the
// measurement again and checks that it belongs to a worker of that node;
// errors wrap ErrInvalid or ErrNotFound, or are the store's, and leave the
// fleet unchanged.
func (f *Fleet) ProbeResult(nodeName string, r wire.ProbeResult) ([]Action, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("%w: probe result from %s: %w", ErrInvalid, nodeName, err)
	}
	m := cloneMeasurement(r.Measurement)
	f.mu.Lock()
	now := f.now()
	w := f.workers[m.CapacityKey]
	switch {
	case w == nil || w.placeholder:
		f.mu.Unlock()
		return nil, fmt.Errorf("%w: probe result from %s for unknown capacity key %q", ErrNotFound, nodeName, m.CapacityKey)
	case w.node != nodeName:
		f.mu.Unlock()
		return nil, fmt.Errorf("%w: probe result from %s for %q, which belongs to node %s", ErrInvalid, nodeName, m.CapacityKey, w.node)
	case m.Node != "" && m.Node != nodeName:
		f.mu.Unlock()
		return nil, fmt.Errorf("%w: probe result from %s claims node %q", ErrInvalid, nodeName, m.Node)
	case m.Model != "" && w.eng.Model != "" && m.Model != w.eng.Model:
		f.mu.Unlock()
		return nil, fmt.Errorf("%w: probe result for %q measured model %q, the worker serves %q", ErrInvalid, m.CapacityKey, m.Model, w.eng.Model)
	}
	m.Node = nodeName
	if m.FinishedAt.IsZero() || m.FinishedAt.Sub(now).Abs() > clockSkew {
		dur := m.FinishedAt.Sub(m.StartedAt)
		if m.StartedAt.IsZero() || dur < 0 || dur > clockSkew {
			dur = 0
		}
		if !m.FinishedAt.IsZero() {
			f.log.Warn("measurement time is far from the coordinator's clock; using the coordinator's", "worker", w.id, "finished_at", m.FinishedAt)
		}
		m.FinishedAt, m.StartedAt = now, now.Add(-dur)
	}
	f.mu.Unlock()
	// The write syncs to disk: outside the lock, so other agents are not
	// held up, and before the fleet shows the measurement, so what the API
	// shows survives a crash. Concurrent writes share one commit.
	if err := f.st.SaveMeasurement(m, f.cfg.HistoryLen); err != nil {
		return nil, fmt.Errorf("fleet: store measurement for %q: %w", m.CapacityKey, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if w = f.workers[m.CapacityKey]; w == nil {
		// Forgotten meanwhile; the measurement stays cached in the store.
		return nil, nil
	}
	c := f.entry(m.CapacityKey)
	c.latest = &m
	c.appendHistory(m, f.cfg.HistoryLen)
	if r.RequestID == "" || r.RequestID == w.probe.reqID {
		w.probe.outstanding, w.probe.status = false, ""
	}
	if m.Valid() {
		w.probe.retryAt, w.probe.failure = time.Time{}, ""
		f.log.Info("measured", "worker", w.id, "throughput_tps", m.ThroughputTPS, "trigger", m.Trigger)
	} else {
		w.probe.retryAt = now.Add(f.cfg.FailRetry)
		f.log.Warn("measurement not valid", "worker", w.id, "failure", m.Failure, "problems", m.Problems)
	}
	f.refresh(now, w)
	f.notify()
	return nil, nil
}

// ProbeStatus applies what became of a probe request: running,
// deferred_busy (asked again BusyRetry later) or failed (FailRetry later).
// A status for an older request than the current one is ignored.
func (f *Fleet) ProbeStatus(nodeName string, s wire.ProbeStatus) []Action {
	if err := s.Validate(); err != nil {
		f.log.Warn("ignoring invalid probe status", "node", nodeName, "error", err)
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	w := f.workers[s.CapacityKey]
	if w == nil || w.placeholder || w.node != nodeName {
		f.log.Warn("ignoring probe status for a worker not on this node", "node", nodeName, "capacity_key", s.CapacityKey)
		return nil
	}
	p := &w.probe
	if s.RequestID != "" && p.reqID != "" && s.RequestID != p.reqID {
		f.log.Debug("ignoring status of an earlier probe request", "worker", w.id, "request_id", s.RequestID)
		return nil
	}
	p.status = s.State
	switch s.State {
	case wire.ProbeRunning:
		if !p.outstanding {
			// A probe this fleet did not ask for (or asked on an earlier
			// connection): time it out like our own.
			p.outstanding, p.sentAt, p.reason = true, now, f.neededReason(w)
		}
	case wire.ProbeDeferredBusy:
		p.outstanding, p.retryAt = false, now.Add(f.cfg.BusyRetry)
		f.log.Debug("probe deferred, engine busy", "worker", w.id, "retry_at", p.retryAt)
	case wire.ProbeFailed:
		p.outstanding, p.retryAt = false, now.Add(f.cfg.FailRetry)
		p.failure = s.Message
		if p.failure == "" {
			p.failure = "the agent gave no reason"
		}
		f.log.Warn("probe failed", "worker", w.id, "message", s.Message, "retry_at", p.retryAt)
	}
	f.refresh(now, w)
	f.notify()
	return nil
}

// Tick does what is due: workers go offline after the grace, are
// forgotten after ForgetAfter, and are sent scheduled probes, retries and
// re-sent requests. It returns at once when nothing is due, and otherwise
// re-derives only the workers whose agents are away or that were probed.
func (f *Fleet) Tick() []Action {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	if now.Before(f.nextDue) {
		return nil
	}
	f.nextDue = now.Add(f.cfg.ForgetAfter)
	var away, probe []*worker
	for _, w := range f.workers {
		if !f.connected(w) {
			if f.offline(w, now) && now.Sub(w.lastSeen) >= f.cfg.ForgetAfter {
				f.log.Info("forgetting worker", "worker", w.id, "last_seen", w.lastSeen)
				f.drop(w)
				continue
			}
			away = append(away, w)
		} else if at, _, ok := f.probeDue(w); ok && !now.Before(at) {
			probe = append(probe, w)
			continue // scheduled when published, after the request is sent
		}
		f.schedule(w, now)
	}
	slices.SortFunc(probe, func(a, b *worker) int { return strings.Compare(a.id, b.id) })
	var acts []Action
	for _, w := range probe {
		acts = append(acts, f.probeIfDue(w, now)...)
	}
	if f.refresh(now, append(away, probe...)...) || len(acts) > 0 {
		f.notify()
	}
	return acts
}

// saveWorker writes a worker's record when its facts changed, when force
// is set, or every recordEvery. A failed write is logged and retried at
// the next opportunity.
func (f *Fleet) saveWorker(w *worker, now time.Time, force bool) {
	if w.placeholder {
		return
	}
	r := WorkerRecord{ID: w.id, Node: w.node, Model: w.eng.Model, Engine: w.eng.Kind, URL: w.eng.URL,
		EngineVersion: w.eng.Version, LaunchArgs: w.eng.LaunchArgs, Ranks: w.eng.Ranks, FirstSeen: w.firstSeen, LastSeen: w.lastSeen,
		ExpectedRanks: w.eng.ExpectedRanks, Complete: w.eng.Complete, MissingRanks: w.eng.MissingRanks}
	if !force && sameRecord(r, w.saved) && now.Sub(w.savedAt) < recordEvery {
		return
	}
	r.LaunchArgs, r.Ranks, r.MissingRanks = slices.Clone(r.LaunchArgs), slices.Clone(r.Ranks), slices.Clone(r.MissingRanks)
	if r.Complete != nil {
		c := *r.Complete
		r.Complete = &c
	}
	f.records = append(f.records, r)
	w.saved, w.savedAt = r, now
}

// writeRecords writes the worker records queued under the lock, after it
// was released. Records are best effort: one that fails is logged and
// written again on a later snapshot.
func (f *Fleet) writeRecords() {
	f.mu.Lock()
	rs := f.records
	f.records = nil
	f.mu.Unlock()
	for _, r := range rs {
		if err := f.st.SaveWorker(r); err != nil {
			f.log.Warn("could not save worker record", "worker", r.ID, "error", err)
			f.mu.Lock()
			if w := f.workers[r.ID]; w != nil {
				w.savedAt = time.Time{} // try again at the next snapshot
			}
			f.mu.Unlock()
		}
	}
}

func sameRecord(a, b WorkerRecord) bool {
	return a.ID == b.ID && a.Node == b.Node && a.Model == b.Model && a.Engine == b.Engine && a.URL == b.URL &&
		a.EngineVersion == b.EngineVersion && slices.Equal(a.LaunchArgs, b.LaunchArgs) && slices.Equal(a.Ranks, b.Ranks) &&
		a.ExpectedRanks == b.ExpectedRanks && (a.Complete == nil) == (b.Complete == nil) && (a.Complete == nil || *a.Complete == *b.Complete) &&
		slices.Equal(a.MissingRanks, b.MissingRanks) && a.FirstSeen.Equal(b.FirstSeen)
}

func cloneMeasurement(m wire.Measurement) wire.Measurement {
	m.Problems = slices.Clone(m.Problems)
	m.ClockEventReasons = slices.Clone(m.ClockEventReasons)
	m.LoadBefore.Ranks = slices.Clone(m.LoadBefore.Ranks)
	return m
}
