package haproxy_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"

	"heft/gateway/gwtest"
	"heft/gateway/haproxy"
	"heft/gateway/target"
	"heft/shared/view"
)

// A backend of slots only: every worker is one of heft's.
const cfgSlots = `global
    stats socket {{socket}} level admin
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend fe
    bind {{front}}
    default_backend qwen
backend qwen
    balance roundrobin
    server-template heft 1-3 127.0.0.1:9 disabled
`

func port(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

// A DNS outage on the gateway host is a control-plane fault, not evidence
// about any engine: the workers named by DNS keep their servers, at their
// last good addresses, and the failed lookups are still reported.
func TestDNSOutageKeepsServers(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	dns := gwtest.NewDNS(map[string]string{"gpu-a.heft.test": "127.0.0.1", "gpu-b.heft.test": "127.0.0.1"})
	hx := gwtest.StartHAProxy(t, cfgSlots)
	h := newTarget(t, haproxy.Config{Socket: hx.Socket, Backend: "qwen"})
	h.UseLookup(dns.Lookup)
	m := desired(
		gwtest.Worker(model, "gpu-a.heft.test:"+port(a.Addr), view.StateAdmitted, 1),
		gwtest.Worker(model, "gpu-b.heft.test:"+port(b.Addr), view.StateAdmitted, 1))
	apply(t, h, m)
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 20); split["a"] != 10 || split["b"] != 10 {
		t.Fatalf("before the outage: %v", split)
	}

	dns.SetDown(true)
	res, err := h.Apply(context.Background(), m) // a resync: the same desired state
	if target.Reason(err) != target.ReasonResolve || len(res.Changes) != 0 {
		t.Fatalf("during the outage: changes %v, error %v; want no change and the resolve error", res.Changes, err)
	}
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 20); split["a"] != 10 || split["b"] != 10 {
		t.Fatalf("a DNS outage (engines healthy) cost requests: %v", split)
	}
	// Evidence about an engine still acts: held, b leaves its last good address.
	_, err = h.Apply(context.Background(), desired(
		gwtest.Worker(model, "gpu-a.heft.test:"+port(a.Addr), view.StateAdmitted, 1),
		gwtest.Worker(model, "gpu-b.heft.test:"+port(b.Addr), view.StateHeld, 0)))
	if target.Reason(err) != target.ReasonResolve {
		t.Fatalf("apply: %v", err)
	}
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 10); split["a"] != 10 {
		t.Fatalf("held during the outage, b still serves: %v", split)
	}
}

// A restarted heft-sync during a DNS outage knows no address for the
// names: the servers no resolved worker claims are left as they are, while
// a worker the coordinator holds is still drained.
func TestDNSOutageAfterRestartLeavesServers(t *testing.T) {
	a, b, c := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b"), gwtest.NewUpstream(t, "c")
	dns := gwtest.NewDNS(map[string]string{"gpu-a.heft.test": "127.0.0.1", "gpu-b.heft.test": "127.0.0.1"})
	hx := gwtest.StartHAProxy(t, cfgSlots)
	named := func(c string) view.Worker {
		return gwtest.Worker(model, "gpu-"+c+".heft.test:"+port(map[string]string{"a": a.Addr, "b": b.Addr}[c]), view.StateAdmitted, 1)
	}
	before := newTarget(t, haproxy.Config{Socket: hx.Socket, Backend: "qwen"})
	before.UseLookup(dns.Lookup)
	apply(t, before, desired(named("a"), named("b"), gwtest.Worker(model, c.Addr, view.StateAdmitted, 1)))
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 30); split["a"] != 10 || split["b"] != 10 || split["c"] != 10 {
		t.Fatalf("before the outage: %v", split)
	}

	dns.SetDown(true)
	after := newTarget(t, haproxy.Config{Socket: hx.Socket, Backend: "qwen"}) // nothing resolved yet
	after.UseLookup(dns.Lookup)
	res, err := after.Apply(context.Background(), desired(named("a"), named("b"), gwtest.Worker(model, c.Addr, view.StateHeld, 0)))
	if target.Reason(err) != target.ReasonResolve {
		t.Fatalf("apply: %v, want the resolve error", err)
	}
	t.Logf("changes %v, serving %d", res.Changes, res.Serving)
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 20); split["a"] != 10 || split["b"] != 10 {
		t.Fatalf("a DNS outage took out workers: %v", split)
	}
	if res.Serving != 2 {
		t.Errorf("serving %d, want 2", res.Serving)
	}
}

// A worker whose DNS answer changes moves off its old address even while
// another worker's name has never resolved and no slot is free: it keeps
// the slot it had, re-addressed (or drained there, when the coordinator
// holds it). That slot was left as it was, since it could have carried the
// unresolved worker, so the moved worker stayed at its old address.
func TestMovedNameLeavesItsOldAddressWhileAnotherIsUnresolved(t *testing.T) {
	for _, state := range []string{view.StateAdmitted, view.StateHeld} {
		t.Run(state, func(t *testing.T) {
			f := threeWithBNamed(t)
			a, b, c, dns, hx, h, named := f.a, f.b, f.c, f.dns, f.hx, f.h, f.named
			moved := gwtest.NewUpstreamAt(t, "b-moved", "127.0.0.2:"+port(b.Addr))
			if split := gwtest.Split(t, "http://"+hx.Front+"/", 30); split["b"] != 10 {
				t.Fatalf("before the move: %v", split)
			}

			dns.Set("gpu-b.heft.test", "127.0.0.2")
			res, err := h.Apply(context.Background(), desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1),
				gwtest.Worker(model, named, state, 1), gwtest.Worker(model, c.Addr, view.StateAdmitted, 1),
				gwtest.Worker(model, "gpu-x.heft.test:8000", view.StateAdmitted, 1))) // never resolves
			if target.Reason(err) != target.ReasonResolve || strings.Contains(err.Error(), "has no server") {
				t.Fatalf("apply (changes %v): %v, want only the unresolved name's error", res.Changes, err)
			}
			split := gwtest.Split(t, "http://"+hx.Front+"/", 30)
			if split["b"] != 0 || split["a"] == 0 || split["c"] == 0 {
				t.Fatalf("after the move (changes %v): %v, want none at b's old address", res.Changes, split)
			}
			if serving := state == view.StateAdmitted; (split["b-moved"] > 0) != serving || moved.Hits() > 0 != serving {
				t.Fatalf("after the move (changes %v): %v, want b at its new address only if it serves", res.Changes, split)
			}
		})
	}
}

// A worker that does not serve needs no server: one whose DNS answer
// changed (its engine restarted elsewhere, held or offline meanwhile) does
// not keep the slot at its old address, drained at an address its engine
// left, nor take it from a serving worker that needs a slot. With every
// name resolved, that slot goes to maintenance, or to that worker, as it
// did before heft-sync remembered old addresses.
func TestMovedHeldWorkerKeepsNoSlot(t *testing.T) {
	f := threeWithBNamed(t)
	a, b, c, dns, hx, h, named := f.a, f.b, f.c, f.dns, f.hx, f.h, f.named
	d := gwtest.NewUpstream(t, "d")
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 30); split["b"] != 10 {
		t.Fatalf("before the move: %v", split)
	}

	// b's engine restarts at another address, held meanwhile.
	dns.Set("gpu-b.heft.test", "127.0.0.2")
	held := gwtest.Worker(model, named, view.StateHeld, 1)
	res := apply(t, h, desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), held, gwtest.Worker(model, c.Addr, view.StateAdmitted, 1)))
	// Fields of "show servers state": srv_name 4, srv_addr 5,
	// srv_admin_state 7 (bit 0x01: forced maintenance), srv_port 19.
	for _, line := range strings.Split(hx.Run("show servers state qwen"), "\n") {
		f := strings.Fields(line)
		if len(f) < 19 || strings.HasPrefix(line, "#") || f[4]+":"+f[18] != b.Addr {
			continue
		}
		if admin, _ := strconv.Atoi(f[6]); admin&1 == 0 {
			t.Errorf("after the move (changes %v): server %s is left at b's old address %s, admin state %d, not in maintenance", res.Changes, f[3], b.Addr, admin)
		}
	}

	// A new worker serves: the slot b no longer needs is its.
	res = apply(t, h, desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), held, gwtest.Worker(model, c.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, d.Addr, view.StateAdmitted, 1)))
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 30); split["d"] != 10 || split["a"] != 10 || split["c"] != 10 {
		t.Fatalf("with d (changes %v): %v, want d served in the slot b no longer needs", res.Changes, split)
	}
}

// Two workers whose address texts differ but resolve to one IP:port share
// one server: the admitted one keeps it, whether the other is an old
// offline worker of the same engine (by name, and a smaller worker ID) or
// a held worker whose DNS name starts to resolve there.
func TestResolvedCollisionKeepsServing(t *testing.T) {
	a := gwtest.NewUpstream(t, "a")
	dns := gwtest.NewDNS(map[string]string{"0-old.heft.test": "127.0.0.1", "zz.evil.test": "10.66.0.9"})
	hx := gwtest.StartHAProxy(t, cfgSlots)
	h := newTarget(t, haproxy.Config{Socket: hx.Socket, Backend: "qwen"})
	h.UseLookup(dns.Lookup)
	m := desired(
		gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), // 127.0.0.1:P
		gwtest.Worker(model, "0-old.heft.test:"+port(a.Addr), view.StateOffline, 0),
		gwtest.Worker(model, "zz.evil.test:"+port(a.Addr), view.StateHeld, 0))
	for i, step := range []func(){func() {}, func() {}, func() { dns.Set("zz.evil.test", "127.0.0.1") }} {
		step()
		res, err := h.Apply(context.Background(), m)
		if err != nil {
			t.Fatalf("apply %d: %v", i, err)
		}
		if !strings.Contains(strings.Join(res.Dropped, "\n"), "worker w-0-old.heft.test:"+port(a.Addr)+" left out") {
			t.Errorf("apply %d: dropped %q, want the offline worker", i, res.Dropped)
		}
		if split := gwtest.Split(t, "http://"+hx.Front+"/", 10); split["a"] != 10 {
			t.Fatalf("apply %d (changes %v): the admitted worker got %v", i, res.Changes, split)
		}
	}
}

// A held worker whose DNS answer moved, its old slot put in maintenance
// while every name resolved, does not take that slot back (drained at an
// address its engine left) when another name is unresolved later: the
// slot carries nothing, so a new serving worker gets it rather than no
// slot.
func TestMovedHeldWorkerLeavesItsSlotInMaintenanceWhileAnotherIsUnresolved(t *testing.T) {
	f := threeWithBNamed(t)
	a, c, dns, hx, h, named := f.a, f.c, f.dns, f.hx, f.h, f.named
	d := gwtest.NewUpstream(t, "d")
	wa, wc := gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), gwtest.Worker(model, c.Addr, view.StateAdmitted, 1)

	dns.Set("gpu-b.heft.test", "127.0.0.2") // b restarts elsewhere, held: its old slot goes to maintenance
	held := gwtest.Worker(model, named, view.StateHeld, 1)
	apply(t, h, desired(wa, held, wc))

	res, err := h.Apply(context.Background(), desired(wa, held, wc,
		gwtest.Worker(model, "gpu-x.heft.test:8000", view.StateAdmitted, 1), // never resolves
		gwtest.Worker(model, d.Addr, view.StateAdmitted, 1)))
	if target.Reason(err) != target.ReasonResolve || strings.Contains(err.Error(), "has no server") {
		t.Fatalf("apply (changes %v): %v, want only the unresolved name's error", res.Changes, err)
	}
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 30); split["d"] != 10 || split["a"] != 10 || split["c"] != 10 {
		t.Fatalf("changes %v: %v, want d served in the slot b left", res.Changes, split)
	}
}

// threeWithB is a 3-slot HAProxy serving a, b and c, b by a DNS name
// (named) that resolves to its loopback address until the test moves it.
type threeWithB struct {
	a, b, c *gwtest.Upstream
	dns     *gwtest.DNS
	hx      *gwtest.HAProxy
	h       *haproxy.HAProxy
	named   string
}

func threeWithBNamed(t *testing.T) threeWithB { return threeWithBNamedKeeping(t, "") }

// threeWithBNamedKeeping is threeWithBNamed with the target's state_file.
func threeWithBNamedKeeping(t *testing.T, stateFile string) threeWithB {
	f := threeWithB{a: gwtest.NewUpstream(t, "a"), b: gwtest.NewUpstream(t, "b"), c: gwtest.NewUpstream(t, "c"),
		dns: gwtest.NewDNS(map[string]string{"gpu-b.heft.test": "127.0.0.1"}), hx: gwtest.StartHAProxy(t, cfgSlots)}
	f.h = newTarget(t, haproxy.Config{Socket: f.hx.Socket, Backend: "qwen", StateFile: stateFile})
	f.h.UseLookup(f.dns.Lookup)
	f.named = "gpu-b.heft.test:" + port(f.b.Addr)
	apply(t, f.h, desired(gwtest.Worker(model, f.a.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, f.named, view.StateAdmitted, 1), gwtest.Worker(model, f.c.Addr, view.StateAdmitted, 1)))
	return f
}
