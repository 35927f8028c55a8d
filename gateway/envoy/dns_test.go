package envoy_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"heft/gateway/gwtest"
	"heft/gateway/target"
	"heft/shared/view"
)

// A DNS outage on the gateway host is no evidence about any engine: the
// cluster keeps every endpoint at its last good address, in what Envoy
// gets and in the state file, and the failed lookups are still reported.
func TestDNSOutageKeepsEndpoints(t *testing.T) {
	dns := gwtest.NewDNS(map[string]string{"gpu-a.heft.test": "10.0.0.1", "gpu-b.heft.test": "10.0.0.2"})
	s := startServer(t)
	c := s.Cluster(model, "qwen").KeepingState(filepath.Join(t.TempDir(), "qwen.json")).UseLookup(dns.Lookup)
	m := desired(
		gwtest.Worker(model, "gpu-a.heft.test:8000", view.StateAdmitted, 1),
		gwtest.Worker(model, "gpu-b.heft.test:8000", view.StateAdmitted, 1))
	if res, err := c.Apply(context.Background(), m); err != nil || res.Serving != 2 {
		t.Fatalf("before the outage: %+v %v", res, err)
	}
	dns.SetDown(true)
	res, err := c.Apply(context.Background(), m)
	if target.Reason(err) != target.ReasonResolve || res.Serving != 2 || len(res.Changes) != 0 {
		t.Fatalf("during the outage: %+v %v; want both endpoints, no change and the resolve error", res, err)
	}
	if w := firstAssignment(t, s.Addr(), "qwen"); len(w) != 2 || w["10.0.0.1:8000"] == 0 || w["10.0.0.2:8000"] == 0 {
		t.Fatalf("Envoy got %v", w)
	}
	if got, err := c.Served(context.Background()); err != nil || len(got) != 2 {
		t.Fatalf("the state file holds %v, %v", got, err)
	}
	// Evidence about an engine still acts: held, b leaves its last good address.
	res, err = c.Apply(context.Background(), desired(
		gwtest.Worker(model, "gpu-a.heft.test:8000", view.StateAdmitted, 1),
		gwtest.Worker(model, "gpu-b.heft.test:8000", view.StateHeld, 0)))
	if target.Reason(err) != target.ReasonResolve || res.Serving != 1 {
		t.Fatalf("b held during the outage: %+v %v; want only a", res, err)
	}
}

// A restarted heft-sync during a DNS outage knows no address for the
// names: the endpoints it published before, as its state file keeps them,
// stay, while a worker the coordinator holds still goes.
func TestDNSOutageAfterRestartKeepsEndpoints(t *testing.T) {
	dns := gwtest.NewDNS(map[string]string{"gpu-a.heft.test": "10.0.0.1", "gpu-b.heft.test": "10.0.0.2"})
	state := filepath.Join(t.TempDir(), "qwen.json")
	named := func(host string) view.Worker {
		return gwtest.Worker(model, host+":8000", view.StateAdmitted, 1)
	}
	before := startServer(t).Cluster(model, "qwen").KeepingState(state).UseLookup(dns.Lookup)
	if res, err := before.Apply(context.Background(), desired(named("gpu-a.heft.test"), named("gpu-b.heft.test"),
		gwtest.Worker(model, "10.0.0.3:8000", view.StateAdmitted, 1))); err != nil || res.Serving != 3 {
		t.Fatalf("before the outage: %+v %v", res, err)
	}

	dns.SetDown(true)
	s := startServer(t)
	after := s.Cluster(model, "qwen").KeepingState(state).UseLookup(dns.Lookup)
	res, err := after.Apply(context.Background(), desired(named("gpu-a.heft.test"), named("gpu-b.heft.test"),
		gwtest.Worker(model, "10.0.0.3:8000", view.StateHeld, 0)))
	if target.Reason(err) != target.ReasonResolve {
		t.Fatalf("apply: %v, want the resolve error", err)
	}
	w := firstAssignment(t, s.Addr(), "qwen")
	if res.Serving != 2 || len(w) != 2 || w["10.0.0.1:8000"] == 0 || w["10.0.0.2:8000"] == 0 {
		t.Fatalf("serving %d, Envoy got %v: want the two named workers and not the held one", res.Serving, w)
	}
	if got, err := after.Served(context.Background()); err != nil || len(got) != 2 {
		t.Fatalf("the state file holds %v, %v", got, err)
	}
}

// Two serving workers whose addresses resolve to one IP:port are one
// endpoint, never two: the smaller worker ID's, the other reported.
func TestResolvedCollisionIsOneEndpoint(t *testing.T) {
	dns := gwtest.NewDNS(map[string]string{"localhost": "127.0.0.1"})
	s := startServer(t)
	c := s.Cluster(model, "qwen").UseLookup(dns.Lookup)
	res, err := c.Apply(context.Background(), desired(
		gwtest.Worker(model, "127.0.0.1:8000", view.StateAdmitted, 1),
		gwtest.Worker(model, "localhost:8000", view.StateAdmitted, 3)))
	if err != nil {
		t.Fatal(err)
	}
	if w := firstAssignment(t, s.Addr(), "qwen"); res.Serving != 1 || len(w) != 1 || w["127.0.0.1:8000"] == 0 {
		t.Fatalf("serving %d, Envoy got %v: want one endpoint", res.Serving, w)
	}
	if len(res.Dropped) != 1 || !strings.HasPrefix(res.Dropped[0], "worker w-localhost:8000 left out:") {
		t.Fatalf("dropped %q", res.Dropped)
	}
}

// A worker whose DNS answer changes leaves its old endpoint even while
// another worker's name has never resolved since heft-sync started: the
// unresolved worker's endpoint, as last published, stays, but the moved
// worker's old one is its own, not one the unresolved worker may be at.
// Before, every endpoint no worker's current address claimed was kept
// while a name was unresolved, so the moved worker was published at both
// addresses and Envoy went on sending part of its share to the old one.
func TestMovedNameLeavesItsOldEndpointWhileAnotherIsUnresolved(t *testing.T) {
	for _, state := range []string{view.StateAdmitted, view.StateHeld} {
		t.Run(state, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "qwen.json")
			named := func(host, state string) view.Worker {
				return gwtest.Worker(model, host+":8000", state, 1)
			}
			// Before a restart, x resolved and was published at 10.0.0.7.
			before := startServer(t).Cluster(model, "qwen").KeepingState(path).UseLookup(gwtest.NewDNS(map[string]string{
				"gpu-a.heft.test": "10.0.0.1", "gpu-b.heft.test": "10.0.0.2", "gpu-x.heft.test": "10.0.0.7"}).Lookup)
			if res, err := before.Apply(context.Background(), desired(named("gpu-a.heft.test", view.StateAdmitted),
				named("gpu-b.heft.test", view.StateAdmitted), named("gpu-x.heft.test", view.StateAdmitted))); err != nil || res.Serving != 3 {
				t.Fatalf("before the restart: %+v %v", res, err)
			}

			// Restarted, x's name no longer resolves: its endpoint stays.
			dns := gwtest.NewDNS(map[string]string{"gpu-a.heft.test": "10.0.0.1", "gpu-b.heft.test": "10.0.0.2"})
			s := startServer(t)
			after := s.Cluster(model, "qwen").KeepingState(path).UseLookup(dns.Lookup)
			res, err := after.Apply(context.Background(), desired(named("gpu-a.heft.test", view.StateAdmitted),
				named("gpu-b.heft.test", view.StateAdmitted), named("gpu-x.heft.test", view.StateAdmitted)))
			if w := firstAssignment(t, s.Addr(), "qwen"); target.Reason(err) != target.ReasonResolve || len(w) != 3 ||
				w["10.0.0.1:8000"] == 0 || w["10.0.0.2:8000"] == 0 || w["10.0.0.7:8000"] == 0 {
				t.Fatalf("x unresolved (%+v, %v): Envoy got %v, want a, b and x's last endpoint", res, err, w)
			}

			// b moves (and is held in the second case) while x is still
			// unresolved.
			dns.Set("gpu-b.heft.test", "10.0.0.9")
			res, err = after.Apply(context.Background(), desired(named("gpu-a.heft.test", view.StateAdmitted),
				named("gpu-b.heft.test", state), named("gpu-x.heft.test", view.StateAdmitted)))
			if target.Reason(err) != target.ReasonResolve || !strings.Contains(err.Error(), "gpu-x") {
				t.Fatalf("apply after the move: %v, want x's resolve error", err)
			}
			want := map[string]bool{"10.0.0.1:8000": true, "10.0.0.7:8000": true}
			if state == view.StateAdmitted {
				want["10.0.0.9:8000"] = true
			}
			w := firstAssignment(t, s.Addr(), "qwen")
			if len(w) != len(want) || res.Serving != len(want) {
				t.Fatalf("after the move (%+v): Envoy got %v, want %v", res, w, want)
			}
			for a := range want {
				if w[a] == 0 {
					t.Fatalf("after the move (%+v): Envoy got %v, want %v", res, w, want)
				}
			}
			saved, err := after.Served(context.Background())
			if err != nil || len(saved) != len(want) {
				t.Fatalf("the state file holds %v, %v; want %v", saved, err, want)
			}
			for _, e := range saved {
				if !want[e.Address] {
					t.Fatalf("the state file holds %v; want %v", saved, want)
				}
			}
		})
	}
}
