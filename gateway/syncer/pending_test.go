package syncer

import (
	"strings"
	"testing"
	"time"

	"heft/gateway/gwtest"
	"heft/gateway/target"
	htest "heft/shared/testutil"
	"heft/shared/view"
)

// nodeOf is the node gwtest.Worker gives the worker at addr.
func nodeOf(addr string) string { return "node-" + addr }

func keptBy(kept []Kept) map[string]string {
	out := map[string]string{}
	for _, k := range kept {
		out[k.Address] = k.Reason
	}
	return out
}

// applyPending offers m at now with the named nodes pending, as the
// syncer does, and makes the result the state last offered.
func applyPending(f Floor, st *floorState, m target.Model, now time.Time, pending ...string) (target.Model, []Kept) {
	p := map[string]bool{}
	for _, n := range pending {
		p[n] = true
	}
	out, kept := f.apply(st, m, now, never, p)
	st.last = &out
	return out, kept
}

// A coordinator restarted on an empty state holds every node for
// approval and lists none of their workers. A worker heft-sync routed
// whose node waits is kept at its last weight past keep_unlisted, for as
// long as its node waits; approved, it serves by the coordinator's weight
// again; rejected (no longer pending), the keep_unlisted countdown starts
// and then lets it go.
func TestFloorKeepsPendingNodesWorkers(t *testing.T) {
	f := Floor{MinServing: 1, KeepUnlisted: time.Minute}
	var st floorState
	t0 := time.Unix(1000, 0)
	step := func(m target.Model, at time.Duration, pending ...string) (target.Model, []Kept) {
		return applyPending(f, &st, m, t0.Add(at), pending...)
	}
	step(fleet3(), 0)
	// Only c's node was approved again; a's and b's wait.
	onlyC := model(gwtest.Worker("m", c, view.StateAdmitted, 0.6))
	for _, at := range []time.Duration{time.Second, 5 * time.Minute, time.Hour} {
		out, kept := step(onlyC, at, nodeOf(a), nodeOf(b))
		if got := serving(out); len(got) != 3 || got[a] != 1.5 || got[b] != 1.0 || got[c] != 0.6 {
			t.Fatalf("at %s: serving %v, want a and b at their last weights, c at its new one", at, got)
		}
		if r := keptBy(kept); len(r) != 2 || r[a] != KeptPending || r[b] != KeptPending {
			t.Fatalf("at %s: kept %v", at, kept)
		}
		if !strings.Contains(kept[0].String(), "node-10.0.0.1:8000 waits for an admin's approval") {
			t.Errorf("kept says %q", kept[0])
		}
	}
	// a's node approved: its agent is back and a is measured again.
	aBack := model(gwtest.Worker("m", a, view.StateAdmitted, 1.4), gwtest.Worker("m", c, view.StateAdmitted, 0.6))
	out, kept := step(aBack, time.Hour+10*time.Second, nodeOf(b))
	if got := serving(out); got[a] != 1.4 || got[b] != 1.0 || len(kept) != 1 || kept[0].Address != b {
		t.Fatalf("a approved: serving %v kept %v", got, kept)
	}
	// b's node rejected: kept as unlisted for keep_unlisted from then.
	out, kept = step(aBack, time.Hour+50*time.Second)
	if got := serving(out); got[b] != 1.0 || len(kept) != 1 || kept[0].Reason != KeptUnlisted {
		t.Fatalf("b rejected, within keep_unlisted: serving %v kept %v", got, kept)
	}
	out, kept = step(aBack, time.Hour+71*time.Second)
	if got := serving(out); len(got) != 2 || got[b] != 0 || len(kept) != 0 {
		t.Fatalf("b rejected, past keep_unlisted: serving %v kept %v", got, kept)
	}
}

// A pending node gains nothing: a worker heft-sync was not routing (not
// serving, or never seen) stays out however its node waits, and an
// admin's hold is no control-plane fault.
func TestFloorPendingNodeGainsNothing(t *testing.T) {
	f := Floor{MinServing: 1, KeepUnlisted: time.Minute}
	var st floorState
	d := "10.0.0.4:8000"
	first := model(gwtest.Worker("m", a, view.StateAdmitted, 1.5), gwtest.Worker("m", b, view.StateMeasuring, 0),
		gwtest.Worker("m", c, view.StateAdmitted, 0.5))
	out, _ := f.apply(&st, first, time.Unix(0, 0), never, nil)
	st.last = &out
	// Every node but c's waits, d's new; a is held by an admin.
	next := model(gwtest.Worker("m", a, view.StateHeld, 0), gwtest.Worker("m", c, view.StateAdmitted, 0.5))
	pending := map[string]bool{nodeOf(a): true, nodeOf(b): true, nodeOf(d): true}
	out, kept := f.apply(&st, next, time.Unix(1, 0), never, pending)
	if got := serving(out); len(got) != 1 || got[c] != 0.5 {
		t.Fatalf("serving %v (kept %v), want c alone", got, kept)
	}
	if len(kept) != 0 {
		t.Fatalf("kept %v", kept)
	}
	for _, bk := range out.Backends {
		if bk.Address == b || bk.Address == d {
			t.Errorf("a worker heft-sync never routed is in the desired state: %+v", bk)
		}
	}
}

// The syncer learns the pending nodes from the follower, weighs the last
// state again with each list (so a countdown ends on time without a new
// state), and reports what it keeps.
func TestSyncerKeepsPendingNodesWorkers(t *testing.T) {
	f := &fake{}
	s, m := run(t, f, time.Hour)
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now } // Update and the hooks run on this goroutine only
	s.SetFloor(Floor{MinServing: 1, KeepUnlisted: time.Minute})
	h := s.Hooks()
	h.Connected(true)
	s.Update(snap(gwtest.Worker("m", a, view.StateAdmitted, 1.5), gwtest.Worker("m", b, view.StateAdmitted, 1)))
	s.Update(snap(gwtest.Worker("m", b, view.StateAdmitted, 1)))
	offered := func() map[string]float64 {
		r := s.runners[0]
		r.mu.Lock()
		defer r.mu.Unlock()
		return serving(*r.offered)
	}
	kept := func() string {
		t.Helper()
		k := s.Status().Targets[0].Kept
		if len(k) > 1 {
			t.Fatalf("kept %q", k)
		}
		return strings.Join(k, "")
	}
	h.Pending([]string{nodeOf(a)})
	now = now.Add(2 * time.Minute)
	h.Pending([]string{nodeOf(a)})
	if got := offered(); got[a] != 1.5 || !strings.Contains(kept(), "approval") {
		t.Fatalf("past keep_unlisted, its node waiting: offered %v, kept %q", got, kept())
	}
	if v := value(t, m, "heft_sync_kept_workers", "reason", KeptPending); v != 1 {
		t.Errorf("heft_sync_kept_workers{reason=node_pending} = %v, want 1", v)
	}
	htest.Eventually(t, "a applied", 5*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		// Nothing may be applied yet on a loaded machine.
		return len(f.applied) > 0 && serving(f.applied[len(f.applied)-1])[a] == 1.5
	})
	// Rejected: keep_unlisted counts from now, with no new state.
	h.Pending(nil)
	if got := offered(); got[a] != 1.5 || !strings.Contains(kept(), "no longer lists") {
		t.Fatalf("just rejected: offered %v, kept %q", got, kept())
	}
	now = now.Add(61 * time.Second)
	h.Pending(nil)
	if got := offered(); len(got) != 1 || kept() != "" {
		t.Fatalf("rejected, past keep_unlisted: offered %v, kept %q", got, kept())
	}
	if v := value(t, m, "heft_sync_kept_workers", "reason", KeptPending); v != 0 {
		t.Errorf("heft_sync_kept_workers{reason=node_pending} = %v, want 0", v)
	}
	// Away from the coordinator, nothing is weighed again.
	s.Update(snap(gwtest.Worker("m", a, view.StateAdmitted, 1.5), gwtest.Worker("m", b, view.StateAdmitted, 1)))
	s.Update(snap(gwtest.Worker("m", b, view.StateAdmitted, 1)))
	h.Connected(false)
	now = now.Add(time.Hour)
	s.SetPending(nil)
	if got := offered(); got[a] != 1.5 {
		t.Errorf("weighed while disconnected: offered %v", got)
	}
}

// heft-sync restarted while a coordinator restarted on an empty state
// holds every node for approval: the servers it reads from the gateway
// have no worker listed at them, so no node to match. They are kept while
// any node waits, since they may be those nodes' workers; once none waits,
// keep_unlisted counts from then, and the floor keeps the heaviest.
func TestFloorKeepsSeedsWhileNodesWait(t *testing.T) {
	f := Floor{MinServing: 1, KeepUnlisted: time.Minute}
	var st floorState
	t0 := time.Unix(1000, 0)
	nothing := target.Model{Name: "m"}
	st.start([]target.Served{{Address: a, Weight: 60, Owned: true}, {Address: b, Weight: 40, Owned: true}}, nothing)
	step := func(at time.Duration, pending ...string) (target.Model, []Kept) {
		return applyPending(f, &st, nothing, t0.Add(at), pending...)
	}
	for _, at := range []time.Duration{0, 5 * time.Minute, time.Hour} {
		out, kept := step(at, "gpu-a", "gpu-b")
		if got := serving(out); len(got) != 2 || got[a] != 60 || got[b] != 40 {
			t.Fatalf("at %s: serving %v, want both servers as the gateway had them", at, got)
		}
		if r := keptBy(kept); len(r) != 2 || r[a] != KeptPending || r[b] != KeptPending || !kept[0].Seeded {
			t.Fatalf("at %s: kept %v", at, kept)
		}
		if !strings.Contains(kept[0].String(), "no worker is listed at this address yet") {
			t.Errorf("kept says %q", kept[0])
		}
	}
	// No node waits any more, and no worker is listed at either server:
	// keep_unlisted from then, then the floor's heaviest alone.
	if out, kept := step(time.Hour + 30*time.Second); len(serving(out)) != 2 || keptBy(kept)[a] != KeptUnlisted {
		t.Fatalf("within keep_unlisted: serving %v kept %v", serving(out), kept)
	}
	out, kept := step(time.Hour + 91*time.Second)
	if got := serving(out); len(got) != 1 || got[a] != 60 || len(kept) != 1 || kept[0].Reason != KeptFloor {
		t.Fatalf("past keep_unlisted: serving %v kept %v, want a alone, kept by the floor", got, kept)
	}
}
