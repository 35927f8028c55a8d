package syncer

import (
	"context"
	"strings"
	"testing"
	"time"

	"heft/gateway/coord"
	"heft/gateway/gwtest"
	"heft/gateway/target"
	htest "heft/shared/testutil"
	"heft/shared/view"
)

func model(ws ...coord.Worker) target.Model {
	m, _ := target.ForModel("m", ws)
	return m
}

func serving(m target.Model) map[string]float64 {
	out := map[string]float64{}
	for _, b := range m.Serving() {
		out[b.Address] = b.Weight
	}
	return out
}

func never(string) bool { return false }

const (
	a = "10.0.0.1:8000"
	b = "10.0.0.2:8000"
	c = "10.0.0.3:8000"
)

func fleet3() target.Model {
	return model(gwtest.Worker("m", a, view.StateAdmitted, 1.5),
		gwtest.Worker("m", b, view.StateAdmitted, 1.0), gwtest.Worker("m", c, view.StateAdmitted, 0.5))
}

// A coordinator restarted on an empty state lists nobody, then each worker
// as it is measured again: nothing is drained meanwhile, and the kept
// workers go back to the coordinator's hands once it lists them again or
// KeepUnlisted runs out.
func TestFloorKeepsUnlistedWorkers(t *testing.T) {
	f := Floor{MinServing: 1, KeepUnlisted: time.Minute}
	var st floorState
	t0 := time.Unix(1000, 0)
	out, kept := f.apply(&st, fleet3(), t0, never, nil)
	st.last = &out
	if len(kept) != 0 || len(serving(out)) != 3 {
		t.Fatalf("first state: kept %v, serving %v", kept, serving(out))
	}
	// Back with a and b unmeasured, c not listed.
	partial := model(gwtest.Worker("m", a, view.StateMeasuring, 0), gwtest.Worker("m", b, view.StateAdmitted, 0.8))
	out, kept = f.apply(&st, partial, t0.Add(time.Second), never, nil)
	st.last = &out
	if got := serving(out); len(got) != 3 || got[a] != 1.5 || got[b] != 0.8 || got[c] != 0.5 {
		t.Fatalf("serving %v, want a and c at their last weights and b at its new one", got)
	}
	if len(kept) != 2 || kept[0].Reason != KeptUnlisted || !strings.Contains(kept[0].String(), "measuring") {
		t.Fatalf("kept %v", kept)
	}
	// a is measured again: it serves by the coordinator's weight.
	again := model(gwtest.Worker("m", a, view.StateAdmitted, 1.2), gwtest.Worker("m", b, view.StateAdmitted, 0.8))
	out, kept = f.apply(&st, again, t0.Add(30*time.Second), never, nil)
	st.last = &out
	if got := serving(out); got[a] != 1.2 || got[c] != 0.5 || len(kept) != 1 {
		t.Fatalf("serving %v kept %v", got, kept)
	}
	// c is still unlisted a minute after it was first missed: let go.
	out, kept = f.apply(&st, again, t0.Add(62*time.Second), never, nil)
	if got := serving(out); len(got) != 2 || len(kept) != 0 {
		t.Fatalf("after keep_unlisted: serving %v kept %v", got, kept)
	}
}

// Holds, offline agents and the like never take a model below its
// floor: the heaviest dropped workers stay, at their last weights.
func TestFloorStopsADrain(t *testing.T) {
	all := func(state string) target.Model {
		return model(gwtest.Worker("m", a, state, 0), gwtest.Worker("m", b, state, 0), gwtest.Worker("m", c, state, 0))
	}
	cases := []struct {
		name  string
		floor Floor
		next  target.Model
		want  []string // addresses serving
	}{
		{"every worker held, default floor", DefaultFloor(), all(view.StateHeld), []string{a}},
		{"every agent offline, two workers", Floor{MinServing: 2}, all(view.StateOffline), []string{a, b}},
		{"capacity: 60% of 3.0 needs a and b", Floor{MinServing: 1, MinCapacity: 0.6}, all(view.StateOffline), []string{a, b}},
		{"one held leaves enough", Floor{MinServing: 1, MinCapacity: 0.5},
			model(gwtest.Worker("m", a, view.StateAdmitted, 1.5), gwtest.Worker("m", b, view.StateHeld, 0), gwtest.Worker("m", c, view.StateAdmitted, 0.5)),
			[]string{a, c}},
		{"floor off", Floor{}, all(view.StateHeld), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var st floorState
			first, _ := tc.floor.apply(&st, fleet3(), time.Unix(0, 0), never, nil)
			st.last = &first
			out, kept := tc.floor.apply(&st, tc.next, time.Unix(1, 0), never, nil)
			got := serving(out)
			if len(got) != len(tc.want) {
				t.Fatalf("serving %v, want %v (kept %v)", got, tc.want, kept)
			}
			for _, addr := range tc.want {
				if _, ok := got[addr]; !ok {
					t.Fatalf("serving %v, want %v", got, tc.want)
				}
			}
			for _, k := range kept {
				if k.Reason != KeptFloor || !strings.Contains(k.String(), "below its floor") {
					t.Errorf("kept %v", k)
				}
			}
			if len(out.Backends) != 3 {
				t.Errorf("every worker stays listed: %+v", out.Backends)
			}
		})
	}
}

// An admin's hold goes under the floor only when the admin said so
// (below_floor, as the coordinator shows it): the last worker of a model
// held below the floor leaves the gateway; held without it, the floor
// keeps it and says how to let it go.
func TestFloorAdminMayGoBelow(t *testing.T) {
	held := func(addr string, below bool) coord.Worker {
		w := gwtest.Worker("m", addr, view.StateHeld, 0)
		w.AdminDecision, w.BelowFloor = "hold", below
		return w
	}
	offline := func(addr string) coord.Worker {
		w := gwtest.Worker("m", addr, view.StateOffline, 0)
		w.BelowFloor = true
		return w
	}
	for _, tc := range []struct {
		name    string
		next    []coord.Worker
		serving []string
		kept    string
	}{
		{"every worker held below the floor", []coord.Worker{held(a, true), held(b, true)}, nil, ""},
		{"every worker held", []coord.Worker{held(a, false), held(b, false)}, []string{a}, "below_floor=true"},
		{"one below, one not: the floor keeps the other", []coord.Worker{held(a, true), held(b, false)}, []string{b}, "below_floor=true"},
		{"the mark without a hold is no admin's word", []coord.Worker{offline(a), gwtest.Worker("m", b, view.StateOffline, 0)}, []string{a}, "offline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{}
			s, _ := run(t, f, time.Hour)
			s.Update(snap(gwtest.Worker("m", a, view.StateAdmitted, 1.5), gwtest.Worker("m", b, view.StateAdmitted, 1)))
			s.Update(snap(tc.next...))
			var got target.Model
			htest.Eventually(t, "the second state applied", 5*time.Second, func() bool {
				f.mu.Lock()
				defer f.mu.Unlock()
				if len(f.applied) > 0 {
					got = f.applied[len(f.applied)-1]
				}
				return len(f.applied) > 0 && len(got.Serving()) == len(tc.serving)
			})
			for _, addr := range tc.serving {
				if _, ok := serving(got)[addr]; !ok {
					t.Errorf("serving %v, want %v", serving(got), tc.serving)
				}
			}
			kept := s.Status().Targets[0].Kept
			if (tc.kept == "") != (len(kept) == 0) || (tc.kept != "" && !strings.Contains(kept[0], tc.kept)) {
				t.Errorf("kept %q, want one saying %q", kept, tc.kept)
			}
		})
	}
}

// The syncer says what it keeps: a metric, and the target's status.
func TestFloorIsReported(t *testing.T) {
	f := &fake{}
	s, m := run(t, f, time.Hour)
	s.Update(snap(gwtest.Worker("m", a, view.StateAdmitted, 1), gwtest.Worker("m", b, view.StateAdmitted, 1)))
	s.Update(snap(gwtest.Worker("m", a, view.StateOffline, 0), gwtest.Worker("m", b, view.StateOffline, 0)))
	if v := value(t, m, "heft_sync_kept_workers", "reason", KeptFloor); v != 1 {
		t.Fatalf("heft_sync_kept_workers{reason=floor} = %v, want 1", v)
	}
	st := s.Status()
	if len(st.Targets[0].Kept) != 1 || !strings.Contains(st.Targets[0].Kept[0], "offline") {
		t.Fatalf("status %+v", st.Targets[0])
	}
	s.Update(snap(gwtest.Worker("m", a, view.StateAdmitted, 1), gwtest.Worker("m", b, view.StateOffline, 0)))
	if v := value(t, m, "heft_sync_kept_workers", "reason", KeptFloor); v != 0 {
		t.Fatalf("heft_sync_kept_workers{reason=floor} = %v after a came back, want 0", v)
	}
}

// heft-sync starts while the coordinator lists every worker as not
// measured yet: the workers the gateway serves stay as it had them, their
// weights brought into the coordinator's units as workers are measured,
// until the coordinator's own weights cover them all.
func TestFloorStartsFromWhatTheGatewayServes(t *testing.T) {
	f := Floor{MinServing: 1, KeepUnlisted: time.Minute}
	var st floorState
	t0 := time.Unix(1000, 0)
	measuring := model(gwtest.Worker("m", a, view.StateMeasuring, 0),
		gwtest.Worker("m", b, view.StateMeasuring, 0), gwtest.Worker("m", c, view.StateMeasuring, 0))
	const d, e = "10.0.0.4:8000", "10.0.0.5:8000"
	st.start([]target.Served{
		{Address: a, Weight: 50, Owned: true}, {Address: b, Weight: 50, Owned: true}, {Address: c, Weight: 100, Owned: true},
		{Address: d, Weight: 50, Owned: false}, // the operator's, and no worker is there: not heft's
		{Address: e, Weight: 20, Owned: true},  // heft's, and no worker is there (yet)
	}, measuring)
	out, kept := f.apply(&st, measuring, t0, never, nil)
	st.last = &out
	if got := serving(out); len(got) != 4 || got[a] != 50 || got[c] != 100 || got[e] != 20 || got[d] != 0 {
		t.Fatalf("every worker measuring: serving %v, want a, b, c and e as the gateway had them", got)
	}
	if len(kept) != 4 || !kept[0].Seeded || !strings.Contains(kept[0].String(), "before heft-sync's first change") {
		t.Fatalf("kept %v", kept)
	}
	// a is measured at 2.0: the gateway's 50 is worth 2.0, so b is kept
	// at 2.0, c at 4.0, e at 0.8.
	one := model(gwtest.Worker("m", a, view.StateAdmitted, 2.0),
		gwtest.Worker("m", b, view.StateMeasuring, 0), gwtest.Worker("m", c, view.StateMeasuring, 0))
	out, _ = f.apply(&st, one, t0.Add(10*time.Second), never, nil)
	st.last = &out
	if got := serving(out); !near(got[a], 2) || !near(got[b], 2) || !near(got[c], 4) || !near(got[e], 0.8) {
		t.Fatalf("a measured: serving %v", got)
	}
	// b is measured at 1.0: 50+50 is worth 3.0, so c (100) is 3.0.
	two := model(gwtest.Worker("m", a, view.StateAdmitted, 2.0),
		gwtest.Worker("m", b, view.StateAdmitted, 1.0), gwtest.Worker("m", c, view.StateMeasuring, 0))
	out, _ = f.apply(&st, two, t0.Add(20*time.Second), never, nil)
	st.last = &out
	if got := serving(out); !near(got[a], 2) || !near(got[b], 1) || !near(got[c], 3) {
		t.Fatalf("a and b measured: serving %v", got)
	}
	// c is measured; e, never listed, goes after KeepUnlisted.
	all := model(gwtest.Worker("m", a, view.StateAdmitted, 2.0),
		gwtest.Worker("m", b, view.StateAdmitted, 1.0), gwtest.Worker("m", c, view.StateAdmitted, 0.5))
	out, kept = f.apply(&st, all, t0.Add(30*time.Second), never, nil)
	st.last = &out
	if got := serving(out); got[c] != 0.5 || len(kept) != 1 || kept[0].Address != e {
		t.Fatalf("all measured: serving %v kept %v", got, kept)
	}
	out, kept = f.apply(&st, all, t0.Add(61*time.Second), never, nil)
	if got := serving(out); len(got) != 3 || len(kept) != 0 || len(st.seedKept) != 0 {
		t.Fatalf("after keep_unlisted: serving %v kept %v seed kept %v", got, kept, st.seedKept)
	}
}

// A server the operator listed (not heft's) is kept only while a worker
// of the coordinator is at its address, and a worker the coordinator
// holds is drained as it would be without a seed.
func TestFloorSeedRespectsOwnershipAndHolds(t *testing.T) {
	f := Floor{MinServing: 1, KeepUnlisted: time.Minute}
	var st floorState
	m := model(gwtest.Worker("m", a, view.StateMeasuring, 0), gwtest.Worker("m", b, view.StateHeld, 1), gwtest.Worker("m", c, view.StateAdmitted, 1))
	st.start([]target.Served{{Address: a, Weight: 5}, {Address: b, Weight: 5, Owned: true}, {Address: "10.0.0.9:8000", Weight: 5}}, m)
	out, kept := f.apply(&st, m, time.Unix(1000, 0), never, nil)
	// a counts as an average worker: the seed's mean (5) is worth c's 1.
	if got := serving(out); len(got) != 2 || !near(got[a], 1) || got[c] != 1 || len(kept) != 1 {
		t.Fatalf("serving %v kept %v: want the operator's a kept (a worker is there) at 1, held b drained", got, kept)
	}
}

func near(x, want float64) bool { return x > want*0.999 && x < want*1.001 }

// HAProxy shows the IP of a server the coordinator names by host.
func TestSeedAddressesMatchByResolving(t *testing.T) {
	m := model(gwtest.Worker("m", "localhost:8000", view.StateMeasuring, 0), gwtest.Worker("m", a, view.StateMeasuring, 0))
	names := addressesOf(context.Background(), m)
	for in, want := range map[string]string{"127.0.0.1:8000": "localhost:8000", a: a, "10.0.0.7:8000": "10.0.0.7:8000"} {
		if got := names.of(context.Background(), in); got != want {
			t.Errorf("of(%s) = %s, want %s", in, got, want)
		}
	}
}
