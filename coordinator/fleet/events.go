package fleet

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"heft/shared/wire"
)

// Connect records that conn is now node's agent connection. Probe requests
// sent on an earlier connection are forgotten. It returns no actions today:
// the agent's first snapshot decides what to send. The agent is not back
// until that snapshot comes (Snapshot): the time it left, and with it the
// grace and the stale weight's TTL, run on from its last present connection.
func (f *Fleet) Connect(node string, conn uint64, hello wire.Hello) []Action {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	n := f.nodeFor(node)
	f.connSeq++
	n.leave(now) // a connection it replaces is over
	n.conn, n.connected, n.order = conn, true, f.connSeq
	f.noteOffers(n, hello.Measurements)
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
	n.leave(now)
	n.connected = false
	for _, w := range sortedWorkers(n.workers) {
		w.probe.outstanding, w.probe.status = false, ""
		f.saveWorker(w, now, true)
	}
	f.log.Debug("agent disconnected", "node", node, "conn", conn)
	f.refreshNode(n, now)
	if len(n.workers) == 0 {
		delete(f.nodes, node) // nothing left to remember of it
	}
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
	if n.connected && !n.reported {
		n.reported, n.since = true, now // back: the first valid word since it left
	}
	s.GPUs = distinctGPUs(s.GPUs) // gpus.go
	if g := len(s.GPUs); !n.gpusKnown || g != n.gpus {
		n.gpus, n.gpusKnown = g, true
		f.markNodeModels(nodeName)
	}
	seen := map[string]bool{}
	listed := map[string]bool{}
	for _, e := range s.Engines {
		listed[e.CapacityKey] = true
	}
	for _, e := range s.Engines {
		e.GPUUUIDs = reportedUUIDs(e.GPUUUIDs, s.GPUs)
		if e.CapacityKey == "" {
			f.applyKeyless(n, e, s.GPUs, len(s.Engines), now, seen)
			continue
		}
		if t, ok := f.keyTomb(e.CapacityKey, now); ok && t.Node != nodeName {
			f.claimsRefused++
			f.log.Warn("refusing a capacity key a node owned until it was forgotten: it stays that node's until the date given, or until an admin releases that node (DELETE /api/v1/nodes/{owner})",
				"capacity_key", e.CapacityKey, "node", nodeName, "owner", t.Node, "forgotten", t.Forgotten, "until", t.Forgotten.Add(f.cfg.KeyTombTTL), "url", e.URL)
			continue
		}
		if owner, ok := f.keyOwner(e.CapacityKey); ok && owner != nodeName {
			// A capacity key names one node's engine; another node listing
			// it is either misconfigured or posing as that engine.
			f.claimsRefused++
			f.log.Warn("refusing a capacity key another node owns", "capacity_key", e.CapacityKey, "node", nodeName, "owner", owner, "url", e.URL)
			continue
		}
		if _, ok := f.owner[e.CapacityKey]; !ok {
			f.makeRoom(nodeName, listed)
		}
		f.claim(e.CapacityKey, nodeName, now)
		w := f.workers[e.CapacityKey]
		if w == nil {
			w = &worker{id: e.CapacityKey, node: nodeName, firstSeen: now, eng: e}
			f.add(w)
			f.log.Info("new worker", "worker", w.id, "node", nodeName, "url", e.URL, "model", e.Model)
		}
		f.setEngine(w, e)
		w.gpus = engineGPUs(e, s.GPUs, len(s.Engines))
		f.noteThrottle(w, now)
		f.noteMemory(w, s.GPUs, now)
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
	showGPUs(n)
	var acts []Action
	if n.connected {
		for _, w := range sortedWorkers(n.workers) {
			f.takeOffer(w, n, now)
			acts = append(acts, f.greet(w, n, now)...)
			acts = append(acts, f.probeIfDue(w, now)...)
		}
		f.refuseOffers(n)
	}
	f.refreshNode(n, now)
	f.notify()
	return acts
}

// keyOwner is the node a capacity key belongs to: its owner, else the
// node of a worker by that ID (a keyless engine's placeholder, which is
// never claimed: "unkeyed:" + node + ":" + URL passes the key grammar).
func (f *Fleet) keyOwner(key string) (string, bool) {
	if owner, ok := f.owner[key]; ok {
		return owner, true
	}
	if w := f.workers[key]; w != nil {
		return w.node, true
	}
	return "", false
}

// applyKeyless applies an engine listed without a capacity key: to the
// node's worker at the same URL when there is one, otherwise to a
// placeholder worker.
func (f *Fleet) applyKeyless(n *node, e wire.Engine, gpus []wire.GPU, engines int, now time.Time, seen map[string]bool) {
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
	w.gpus = engineGPUs(e, gpus, engines)
	w.lastSeen = now
	seen[id] = true
}

// makeRoom forgets, when node already has MaxKeysPerNode capacity keys,
// the one it listed least recently among those not listed now, so that a
// node cycling through keys holds a bounded number of them.
func (f *Fleet) makeRoom(node string, listed map[string]bool) {
	ks := f.keys[node]
	for len(ks) >= f.cfg.MaxKeysPerNode {
		victim, oldest := "", time.Time{}
		for k, at := range ks {
			if !listed[k] && (victim == "" || at.Before(oldest) || (at.Equal(oldest) && k < victim)) {
				victim, oldest = k, at
			}
		}
		if victim == "" {
			return // cannot happen: a snapshot lists at most wire.MaxEngines < MaxKeysPerNode
		}
		if w := f.workers[victim]; w != nil {
			f.drop(w)
		}
		f.release(victim)
		f.forgets = append(f.forgets, forget{key: victim, worker: true})
		f.keysEvicted++
		// Once a minute at most: a node cycling keys would fill the log.
		if now := f.now(); now.Sub(f.evictionLogged) >= time.Minute {
			f.evictionLogged = now
			f.log.Warn("node has too many capacity keys; forgetting the least recently listed (logged once a minute; heft_capacity_keys_evicted_total counts them)",
				"node", node, "capacity_key", victim, "last_listed", oldest, "max_keys_per_node", f.cfg.MaxKeysPerNode, "evicted_so_far", f.keysEvicted)
		}
	}
}

// setEngine replaces a worker's engine facts, keeping the model index.
func (f *Fleet) setEngine(w *worker, e wire.Engine) {
	if w.eng.Model != e.Model {
		f.unindex(w, w.eng.Model)
		f.index(w, e.Model)
		f.dirty[w.eng.Model], f.dirty[e.Model] = true, true
	}
	f.noteChange(w, e)
	w.eng = cloneEngine(e)
}

// engineGPUs returns the GPUs an engine uses. When the agent could not
// tell, the host's GPUs are the engine's only if it is the host's one
// engine; otherwise none are shown, rather than every GPU once per engine.
func engineGPUs(e wire.Engine, gpus []wire.GPU, engines int) []wire.GPU {
	if len(e.GPUUUIDs) == 0 {
		if engines == 1 {
			return slices.Clone(gpus)
		}
		return nil
	}
	var out []wire.GPU
	for _, g := range gpus {
		if slices.Contains(e.GPUUUIDs, g.UUID) {
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
	e.GPUMemory = slices.Clone(e.GPUMemory)
	e.Ranks = slices.Clone(e.Ranks)
	e.Load.Ranks = slices.Clone(e.Load.Ranks)
	if e.Passive != nil {
		p := *e.Passive
		e.Passive = &p
	}
	if e.Pace != nil {
		p := *e.Pace
		e.Pace = &p
	}
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
	return []Action{f.cachedFor(n.name, *m)}
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
	reason = neededReason(m)
	switch {
	case p.outstanding:
		return p.sentAt.Add(f.cfg.ProbeTimeout), p.reason, true
	case !p.retryAt.IsZero():
		if w.remeasure != "" && reason == wire.ReasonScheduled {
			reason = wire.ReasonOnDemand
		}
		return p.retryAt, reason, true
	case w.remeasure != "" && reason == wire.ReasonScheduled:
		return time.Time{}, wire.ReasonOnDemand, true // now, whatever the engine does
	case reason == wire.ReasonScheduled:
		at := m.FinishedAt.Add(f.cfg.RemeasureEvery)
		if p, ok := f.probationDue(w); ok && p.Before(at) {
			at = p // a second measurement may end its probation
		}
		return at, reason, true
	default:
		return time.Time{}, reason, true // now
	}
}

// neededReason: a worker without a valid measurement needs one to be
// admitted; one with a valid measurement is only refreshed.
func neededReason(m *wire.Measurement) string {
	if m != nil && m.Valid() {
		return wire.ReasonScheduled
	}
	return wire.ReasonRegistration
}

func (f *Fleet) probeIfDue(w *worker, now time.Time) []Action {
	at, reason, ok := f.probeDue(w)
	if !ok || now.Before(at) {
		return nil
	}
	return []Action{f.sendProbe(w, reason, now, f.idleOnly(w, now))}
}

// sendProbe asks w's agent to measure it; idle (wire.ProbeRequest.IdleOnly)
// measures only an idle engine.
func (f *Fleet) sendProbe(w *worker, reason string, now time.Time, idle bool) Action {
	f.reqSeq++
	f.probeRequests[reason]++
	id := f.reqPrefix + "-" + strconv.FormatUint(f.reqSeq, 10)
	w.probe.reqID, w.probe.reason, w.probe.outstanding, w.probe.sentAt, w.probe.idleOnly = id, reason, true, now, idle
	w.probe.status, w.probe.retryAt = "", time.Time{}
	w.probe.issued[1], w.probe.issued[0] = w.probe.issued[0], issued{id: id, node: w.node, at: now}
	f.due(now.Add(f.cfg.ProbeTimeout))
	f.log.Debug("requesting probe", "worker", w.id, "reason", reason, "request_id", id, "idle_only", idle)
	return Action{Node: w.node, Message: &wire.ProbeRequest{RequestID: id, CapacityKey: w.id, Reason: reason, Cause: w.remeasure, IdleOnly: idle}}
}

// idleOnly says whether w's due probe should measure its engine only
// while idle: the re-measurement was asked for by its pace, which keeps the
// weight on what the engine delivers meanwhile (rescaled, or agreeing
// again), so draining a busy engine would take capacity from its users
// for nothing they lack. Once the measurement is due anyway
// (RemeasureEvery), the probe is what probe_busy says again.
func (f *Fleet) idleOnly(w *worker, now time.Time) bool {
	if !strings.HasPrefix(w.remeasure, CausePaceSlower) {
		return false
	}
	m := f.newest(w.id)
	return m != nil && m.Valid() && now.Sub(m.FinishedAt) < f.cfg.RemeasureEvery
}

// ProbeResult stores a measurement from node's agent. It is taken only as
// the answer to a probe request this fleet sent to that node for that
// worker, once, within ProbeTimeout of the request: an agent cannot report
// for another node's worker, nor a number nobody asked for. It validates
// the measurement again, cuts its texts to size, and judges whether its
// numbers are plausible; errors wrap ErrInvalid or ErrNotFound, or are the
// store's, and leave the fleet unchanged.
func (f *Fleet) ProbeResult(nodeName string, r wire.ProbeResult) ([]Action, error) {
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("%w: probe result from %s: %w", ErrInvalid, nodeName, err)
	}
	m := cloneMeasurement(r.Measurement)
	f.mu.Lock()
	now := f.now()
	w := f.workers[m.CapacityKey]
	var req *issued
	if w != nil {
		req = w.probe.request(r.RequestID)
	}
	refuse := func(err error) ([]Action, error) {
		f.resultsRefused++
		f.mu.Unlock()
		return nil, err
	}
	switch {
	case w == nil || w.placeholder:
		return refuse(fmt.Errorf("%w: probe result from %s for unknown capacity key %q", ErrNotFound, nodeName, m.CapacityKey))
	case w.node != nodeName:
		return refuse(fmt.Errorf("%w: probe result from %s for %q, which belongs to node %s", ErrInvalid, nodeName, m.CapacityKey, w.node))
	case req == nil || req.node != nodeName:
		return refuse(fmt.Errorf("%w: probe result from %s for %q answers no request this coordinator sent (request id %q)",
			ErrInvalid, nodeName, m.CapacityKey, r.RequestID))
	case req.answered:
		return refuse(fmt.Errorf("%w: probe request %s for %q was already answered", ErrInvalid, r.RequestID, m.CapacityKey))
	case now.Sub(req.at) > f.cfg.ProbeTimeout:
		return refuse(fmt.Errorf("%w: probe result for %q came %s after its request, past probe_timeout %s",
			ErrInvalid, m.CapacityKey, now.Sub(req.at).Round(time.Second), f.cfg.ProbeTimeout))
	case m.Node != "" && m.Node != nodeName:
		return refuse(fmt.Errorf("%w: probe result from %s claims node %q", ErrInvalid, nodeName, m.Node))
	case m.Model != "" && w.eng.Model != "" && m.Model != w.eng.Model:
		return refuse(fmt.Errorf("%w: probe result for %q measured model %q, the worker serves %q", ErrInvalid, m.CapacityKey, m.Model, w.eng.Model))
	}
	req.answered = true
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
	if cutMeasurement(&m) {
		f.measurementsCut++
	}
	if m.Valid() {
		m.Implausible = f.implausible(w, m)
	}
	f.mu.Unlock()
	// The write syncs to disk: outside the lock, so other agents are not
	// held up, and before the fleet shows the measurement, so what the API
	// shows survives a crash. Concurrent writes share one commit.
	if err := f.st.SaveMeasurement(m, f.cfg.HistoryLen); err != nil {
		f.mu.Lock()
		req.answered = false
		f.mu.Unlock()
		return nil, fmt.Errorf("fleet: store measurement for %q: %w", m.CapacityKey, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if w = f.workers[m.CapacityKey]; w == nil || w.node != nodeName {
		// Forgotten meanwhile; the measurement stays cached in the store
		// until the sweep drops it with the key.
		return nil, nil
	}
	c := f.entry(m.CapacityKey)
	c.latest = &m
	c.appendHistory(HistoryEntry(m), f.cfg.HistoryLen)
	var acts []Action
	if r.RequestID == w.probe.reqID {
		w.probe.outstanding, w.probe.status = false, ""
	}
	switch {
	case m.Valid() && m.Implausible != "":
		w.probe.retryAt, w.probe.failure = time.Time{}, ""
		f.log.Warn("implausible measurement; the worker is held until an admin admits it", "worker", w.id, "node", nodeName,
			"throughput_tps", m.ThroughputTPS, "why", m.Implausible)
	case m.Valid():
		w.probe.retryAt, w.probe.failure, w.remeasure = time.Time{}, "", ""
		w.probe.busy, w.probe.busyMsg = 0, ""
		f.log.Info("measured", "worker", w.id, "throughput_tps", m.ThroughputTPS, "prefill_tps", prefillTPS(m), "trigger", m.Trigger)
		// The agent keeps it, and offers it to a coordinator that lost it.
		acts = append(acts, f.cachedFor(nodeName, m))
	default:
		w.probe.retryAt = now.Add(f.cfg.FailRetry)
		f.log.Warn("measurement not valid", "worker", w.id, "failure", m.Failure, "problems", m.Problems)
	}
	f.refresh(now, w)
	f.notify()
	return acts, nil
}

// request finds a request this fleet issued by its ID; nil for an ID it
// did not issue (or issued so long ago it is no longer kept).
func (p *probeState) request(id string) *issued {
	if id == "" {
		return nil
	}
	for i := range p.issued {
		if p.issued[i].id == id {
			return &p.issued[i]
		}
	}
	return nil
}

// ProbeStatus applies what became of a probe request: running,
// draining (the gateways send the worker nothing until the probe ends,
// see drained), deferred_busy (asked again BusyRetry later) or failed
// (FailRetry later).
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
	if s.RequestID == "" || s.RequestID != p.reqID {
		f.log.Debug("ignoring the status of a probe request that is not the worker's current one", "worker", w.id, "request_id", s.RequestID)
		return nil
	}
	p.status = s.State
	switch s.State {
	case wire.ProbeRunning:
		if !p.outstanding {
			// Our request, from before a reconnect, still running: time it
			// out like a new one rather than send another.
			p.outstanding, p.sentAt = true, now
		}
	case wire.ProbeDraining:
		if !p.outstanding {
			p.outstanding, p.sentAt = true, now
		}
		f.log.Info("engine busy; drained at the gateways while its agent measures it", "worker", w.id, "drained", f.drained(w))
	case wire.ProbeDeferredBusy:
		p.busy++
		p.busyMsg = s.Message
		p.outstanding, p.retryAt = false, now.Add(f.busyRetry(p.busy))
		f.log.Info("probe deferred, engine busy; asking again later", "worker", w.id, "in_a_row", p.busy, "retry_at", p.retryAt, "message", s.Message)
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
	defer f.writeRecords()
	defer f.mu.Unlock()
	now := f.now()
	if !now.Before(f.nextSweep) {
		f.sweep(now)
		f.nextSweep = now.Add(sweepEvery)
	}
	if now.Before(f.nextDue) {
		return nil
	}
	f.nextDue = now.Add(f.cfg.ForgetAfter)
	var away, probe []*worker
	for _, w := range f.workers {
		if !f.present(w) {
			if f.offline(w, now) && now.Sub(w.lastSeen) >= f.cfg.ForgetAfter {
				f.log.Info("forgetting worker", "worker", w.id, "last_seen", w.lastSeen)
				f.drop(w)
				if !w.placeholder {
					f.forgets = append(f.forgets, forget{key: w.id, worker: true})
					if m := f.newest(w.id); m != nil && now.Sub(m.FinishedAt) >= f.cfg.CacheTTL {
						f.lapse(w.id) // too old to spare a burst
					}
				}
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

// sweepEvery is how often Tick looks for capacity keys and nodes to forget.
const sweepEvery = time.Minute

// sweep forgets what is no longer worth keeping: cached measurements of
// capacity keys no agent lists any more, once too old to spare a burst;
// keys with neither a worker nor a measurement; nodes with neither a
// worker nor a connection.
func (f *Fleet) sweep(now time.Time) {
	for key, c := range f.cache {
		if f.workers[key] == nil && (c.latest == nil || now.Sub(c.latest.FinishedAt) >= f.cfg.CacheTTL) {
			f.log.Debug("forgetting the measurements of a capacity key no agent lists", "capacity_key", key)
			f.lapse(key)
		}
	}
	for key := range f.owner {
		if f.workers[key] == nil && f.cache[key] == nil {
			f.lapse(key)
		}
	}
	for name, n := range f.nodes {
		if !n.connected && len(n.workers) == 0 {
			delete(f.nodes, name)
		}
	}
	f.sweepTombs(now)
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
		ExpectedRanks: w.eng.ExpectedRanks, Complete: w.eng.Complete, MissingRanks: w.eng.MissingRanks, MaxModelLen: w.eng.MaxModelLen,
		EngineDown: !w.eng.Ready || w.eng.Error != "", Pace: w.pace.record()}
	if n := f.nodes[w.node]; n != nil && !n.present() {
		gone := n.since
		r.AgentGone = &gone
	}
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
	rs, fs, ms, ts := f.records, f.forgets, f.adopted, f.tombWrites
	f.records, f.forgets, f.adopted, f.tombWrites = nil, nil, nil, nil
	f.mu.Unlock()
	f.writeTombs(ts)
	for _, m := range ms {
		// Shown before it is stored: one lost here is offered again by
		// the agent after the next restart.
		if err := f.st.SaveMeasurement(m, f.cfg.HistoryLen); err != nil {
			f.log.Warn("could not store the measurement an agent handed over; it serves from memory", "capacity_key", m.CapacityKey, "error", err)
		}
	}
	for _, x := range fs {
		var err error
		if x.worker {
			err = f.st.DeleteWorker(x.key)
		}
		if x.measurements {
			err = errors.Join(err, f.st.DeleteMeasurements(x.key))
		}
		if err != nil {
			// Loaded again at the next start, and forgotten again then.
			f.log.Warn("could not delete a forgotten capacity key's stored records", "capacity_key", x.key, "error", err)
		}
	}
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
		slices.Equal(a.MissingRanks, b.MissingRanks) && a.MaxModelLen == b.MaxModelLen && a.FirstSeen.Equal(b.FirstSeen) &&
		a.EngineDown == b.EngineDown && (a.AgentGone == nil) == (b.AgentGone == nil) && (a.AgentGone == nil || a.AgentGone.Equal(*b.AgentGone)) &&
		samePace(a.Pace, b.Pace)
}

func cloneMeasurement(m wire.Measurement) wire.Measurement {
	m.Problems = slices.Clone(m.Problems)
	m.ClockEventReasons = slices.Clone(m.ClockEventReasons)
	m.GPUMemory = slices.Clone(m.GPUMemory)
	m.LoadBefore.Ranks = slices.Clone(m.LoadBefore.Ranks)
	if m.Prefill != nil {
		p := *m.Prefill
		p.Problems = slices.Clone(p.Problems)
		m.Prefill = &p
	}
	return m
}
