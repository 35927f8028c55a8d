package syncer

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"heft/gateway/coord"
	"heft/gateway/target"
	"heft/shared/view"
)

// Floor is what control-plane signals may not take a model below: workers
// that vanish from the coordinator's list or come back unmeasured (a
// coordinator restarted on an empty or partial state), agents that go
// offline, a flood of holds. heft-sync keeps, at their last weights, the
// workers it last sent traffic to that it would otherwise drop, and says
// so. Evidence about an engine itself is the gateway's own health check:
// a kept engine that is really down gets no request from it.
type Floor struct {
	// MinServing is the fewest workers a model serves on (default 1:
	// never none).
	MinServing int
	// MinCapacity is the smallest share (0–1) of the capacity last sent
	// traffic (the sum of the serving workers' weights) a model keeps.
	MinCapacity float64
	// KeepUnlisted is how long a serving worker the coordinator no longer
	// lists, or lists as not measured yet, keeps its last weight while the
	// coordinator relearns its fleet, floor or not. 0: only the floor keeps it.
	KeepUnlisted time.Duration
}

// Defaults of Floor.
const (
	DefaultMinServing   = 1
	DefaultKeepUnlisted = 10 * time.Minute
)

// DefaultFloor never takes a model to zero, and keeps unlisted workers
// DefaultKeepUnlisted.
func DefaultFloor() Floor {
	return Floor{MinServing: DefaultMinServing, KeepUnlisted: DefaultKeepUnlisted}
}

// Why a worker is kept, the label of heft_sync_kept_workers.
const (
	KeptUnlisted = "unlisted"     // the coordinator lists it no more, or as unmeasured
	KeptFloor    = "floor"        // dropping it would take the model below its floor
	KeptPending  = "node_pending" // its node waits for an admin's approval
)

// keptReasons are every reason, for the metric's series.
var keptReasons = []string{KeptUnlisted, KeptFloor, KeptPending}

// Kept is one worker heft-sync keeps serving against the coordinator's
// state.
type Kept struct {
	Address, WorkerID, Node, State, Reason string
	Weight                                 float64
	// Seeded: kept as the gateway served it before heft-sync's first
	// change, its weight converted into the coordinator's units.
	Seeded bool
}

func (k Kept) String() string {
	return fmt.Sprintf("%s (%s) kept at weight %.3g: %s", k.WorkerID, k.Address, k.Weight, k.explain())
}

func (k Kept) explain() string {
	if k.Seeded {
		return k.reason() + "; the gateway served it before heft-sync's first change"
	}
	return k.reason()
}

func (k Kept) reason() string {
	if k.Reason == KeptPending && k.Node == "" {
		return "the coordinator holds nodes for an admin's approval (a coordinator restarted on an empty state?), and no worker " +
			"is listed at this address yet to say which node it is on: kept while any node waits, then for keep_unlisted"
	}
	if k.Reason == KeptPending {
		return "its node " + k.Node + " waits for an admin's approval (a coordinator restarted on an empty state?): " +
			"kept until it is approved, or for keep_unlisted once it is rejected or released"
	}
	if k.Reason == KeptUnlisted {
		if k.State == "" {
			return "the coordinator no longer lists it"
		}
		return "the coordinator lists it as " + k.State + " (not measured since it restarted?)"
	}
	why := "the coordinator says " + k.State + ", and dropping it would take the model below its floor"
	if k.State == view.StateHeld {
		why += " (an admin's hold goes below it only with below_floor=true)"
	}
	return why
}

// floorState is what a runner remembers between offers.
type floorState struct {
	last     *target.Model        // the desired state last offered, kept workers included
	unlisted map[string]time.Time // address → when a serving worker was first seen unlisted
	// seed is what the gateway served before heft-sync first offered
	// anything (address → weight in the gateway's units), and seedKept the
	// addresses of it still kept at that weight, converted into the
	// coordinator's units at each offer (seedScale).
	seed     map[string]float64
	seedKept map[string]bool
}

// start makes what the gateway serves now the state last offered, so a
// server the coordinator does not list as serving yet is kept the way one
// heft-sync was serving would be. A server heft-sync does not own counts
// only while a worker of m is at its address.
func (st *floorState) start(seed []target.Served, m target.Model) {
	listed := map[string]target.Backend{}
	scheme := "http" // a server no worker is at yet: as the model's others
	for _, b := range m.Backends {
		listed[b.Address] = b
		scheme = b.Scheme
	}
	last := target.Model{Name: m.Name}
	st.seed, st.seedKept = map[string]float64{}, map[string]bool{}
	for _, s := range seed {
		b, ok := listed[s.Address]
		if !(s.Weight > 0) || math.IsInf(s.Weight, 0) || (!s.Owned && !ok) || st.seed[s.Address] > 0 {
			continue
		}
		if !ok {
			b = target.Backend{Address: s.Address, Scheme: scheme, State: KeptUnlisted}
		}
		b.Serving, b.Weight = true, s.Weight
		st.seed[s.Address], st.seedKept[s.Address] = s.Weight, true
		last.Backends = append(last.Backends, b)
	}
	slices.SortFunc(last.Backends, func(a, b target.Backend) int { return cmp.Compare(a.Address, b.Address) })
	st.last = &last
}

// seedScale converts the seed's weights into the coordinator's units: the
// ratio of their sums over the workers both have serving, else of their
// means (a worker not measured yet counts as an average one), else 1.
func seedScale(seed map[string]float64, m target.Model) float64 {
	var both, bothSeed, all float64
	n := 0
	for _, b := range m.Serving() {
		all += b.Weight
		n++
		if w, ok := seed[b.Address]; ok {
			both += b.Weight
			bothSeed += w
		}
	}
	if bothSeed > 0 {
		return both / bothSeed
	}
	var seedSum float64
	for _, w := range seed {
		seedSum += w
	}
	if n == 0 || seedSum == 0 {
		return 1
	}
	return (all / float64(n)) / (seedSum / float64(len(seed)))
}

// apply returns m with the workers the floor keeps, and which they are.
// mayDrop says a worker an admin explicitly let go below the floor;
// pending holds the nodes the coordinator says wait for approval.
func (f Floor) apply(st *floorState, m target.Model, now time.Time, mayDrop func(workerID string) bool, pending map[string]bool) (target.Model, []Kept) {
	if st.unlisted == nil {
		st.unlisted = map[string]time.Time{}
	}
	if st.last == nil {
		return m, nil
	}
	last := *st.last
	if len(st.seedKept) > 0 {
		k := seedScale(st.seed, m)
		last.Backends = slices.Clone(last.Backends)
		for i, b := range last.Backends {
			if st.seedKept[b.Address] {
				last.Backends[i].Weight = st.seed[b.Address] * k
			}
		}
	}
	out := target.Model{Name: m.Name, Backends: slices.Clone(m.Backends)}
	byAddr := map[string]int{}
	for i, b := range out.Backends {
		byAddr[b.Address] = i
	}
	var kept []Kept
	keep := func(prev target.Backend, state, reason string) {
		kept = append(kept, Kept{Address: prev.Address, WorkerID: prev.WorkerID, Node: prev.Node, State: state, Reason: reason, Weight: prev.Weight})
		if i, ok := byAddr[prev.Address]; ok {
			out.Backends[i] = prev
			return
		}
		byAddr[prev.Address] = len(out.Backends)
		out.Backends = append(out.Backends, prev)
	}

	// Serving workers the coordinator no longer lists, or lists as not
	// measured: kept for KeepUnlisted.
	type drop struct {
		b     target.Backend // as last offered
		state string         // what the coordinator says now
	}
	var dropped []drop
	seen := map[string]bool{}
	for _, prev := range last.Serving() {
		i, listed := byAddr[prev.Address]
		state, node := "", prev.Node
		if listed {
			state, node = out.Backends[i].State, out.Backends[i].Node
			if out.Backends[i].Serving || mayDrop(out.Backends[i].WorkerID) {
				continue
			}
		}
		// A server kept from the gateway's own state since before
		// heft-sync's first change, with no worker listed at it yet, has
		// no node to match: while the coordinator holds any node for
		// approval, it may be one of theirs.
		unknownSeed := node == "" && st.seedKept[prev.Address] && len(pending) > 0
		if (pending[node] || unknownSeed) && state != view.StateHeld {
			// A coordinator on an empty state holds every node for
			// approval, and lists none of their workers: a control-plane
			// fault, not the engine's. Kept at its last weight while its
			// node waits (only a worker that was serving: the node gains
			// nothing); keep_unlisted counts from when it stops waiting.
			seen[prev.Address] = true
			st.unlisted[prev.Address] = now
			keep(prev, state, KeptPending)
			continue
		}
		if !listed || state == view.StateMeasuring {
			seen[prev.Address] = true
			since, ok := st.unlisted[prev.Address]
			if !ok {
				since = now
				st.unlisted[prev.Address] = now
			}
			if now.Sub(since) < f.KeepUnlisted {
				keep(prev, state, KeptUnlisted)
				continue
			}
		}
		dropped = append(dropped, drop{prev, state})
	}
	for a := range st.unlisted {
		if !seen[a] {
			delete(st.unlisted, a)
		}
	}

	// The floor: the heaviest dropped workers back until it holds.
	lastCap := capacity(last)
	slices.SortStableFunc(dropped, func(a, b drop) int {
		return cmp.Or(cmp.Compare(b.b.Weight, a.b.Weight), cmp.Compare(a.b.Address, b.b.Address))
	})
	for _, d := range dropped {
		if len(out.Serving()) >= f.MinServing && capacity(out) >= f.MinCapacity*lastCap {
			break
		}
		keep(d.b, d.state, KeptFloor)
	}
	slices.SortFunc(out.Backends, func(a, b target.Backend) int { return cmp.Compare(a.Address, b.Address) })
	for a := range st.seedKept {
		if !slices.ContainsFunc(kept, func(k Kept) bool { return k.Address == a }) {
			delete(st.seedKept, a) // the coordinator's weight, or let go: the seed's is done
		}
	}
	for i := range kept {
		kept[i].Seeded = st.seedKept[kept[i].Address]
	}
	return out, kept
}

// capacity is the sum of the serving workers' weights.
func capacity(m target.Model) float64 {
	var c float64
	for _, b := range m.Serving() {
		c += b.Weight
	}
	return c
}

// keep applies the floor to m (r.mu held), and logs and counts a change
// of what it keeps.
func (r *runner) keep(m target.Model, now time.Time, mayDrop func(string) bool, pending map[string]bool) target.Model {
	out, kept := r.s.floor.apply(&r.floor, m, now, mayDrop, pending)
	r.floor.last = &out
	if !slices.Equal(kept, r.kept) {
		was := map[string]Kept{}
		for _, k := range r.kept {
			was[k.Address] = k
		}
		counts := map[string]int{}
		for _, k := range kept {
			counts[k.Reason]++
			if old, ok := was[k.Address]; !ok || old.Reason != k.Reason {
				r.log.Warn("kept serving against the coordinator's state", "worker", k.WorkerID, "address", k.Address,
					"weight", k.Weight, "reason", k.Reason, "why", k.explain())
			}
			delete(was, k.Address)
		}
		for _, k := range was {
			r.log.Info("no longer kept: the coordinator's state applies again", "worker", k.WorkerID, "address", k.Address)
		}
		for _, reason := range keptReasons {
			r.s.m.kept.WithLabelValues(r.t.Name(), reason).Set(float64(counts[reason]))
		}
		r.kept = kept
	}
	return out
}

// belowFloor says which workers an admin held saying the hold may go
// below the floor (POST .../hold?below_floor=true): heft-sync lets them
// go even when that leaves their model fewer than MinServing workers.
func belowFloor(ws []coord.Worker) func(workerID string) bool {
	ids := map[string]bool{}
	for _, w := range ws {
		if w.BelowFloor && w.AdminDecision == "hold" {
			ids[w.ID] = true
		}
	}
	return func(id string) bool { return ids[id] }
}
