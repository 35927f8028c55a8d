package server

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"heft/shared/testutil"
	"heft/shared/wire"
)

func TestParseAllow(t *testing.T) {
	rules, err := ParseAllow([]string{"10.0.0.0/8", " 192.168.1.7 ", "gpu-a=172.16.0.0/12", "gpu-b = 2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}
	want := []AllowRule{{"", netip.MustParsePrefix("10.0.0.0/8")}, {"", netip.MustParsePrefix("192.168.1.7/32")},
		{"gpu-a", netip.MustParsePrefix("172.16.0.0/12")}, {"gpu-b", netip.MustParsePrefix("2001:db8::/32")}}
	if len(rules) != len(want) {
		t.Fatalf("rules = %v", rules)
	}
	for i := range want {
		if rules[i] != want[i] {
			t.Errorf("rule %d = %v, want %v", i, rules[i], want[i])
		}
	}
	for _, bad := range []string{"", "gpu-a", "=10.0.0.0/8", "gpu-a=", "10.0.0.0/33", "gpu-a=sink.example"} {
		if _, err := ParseAllow([]string{bad}); err == nil {
			t.Errorf("ParseAllow(%q) took it", bad)
		}
	}
}

// Issue 25: HAProxy slots were set to the coordinator's own address, to a
// sink, and to a localhost name, and user requests with their
// Authorization headers and prompts reached the sink. An address is now
// the node's only when it resolves to the node's connection address or
// advertise_allow allows it, and never the coordinator's own.
func TestAddressBoundToTheNode(t *testing.T) {
	allow, err := ParseAllow([]string{"gpu-a=10.0.1.0/24", "10.0.9.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	p := newAddrPolicy(allow)
	p.local = []netip.Addr{netip.MustParseAddr("10.0.0.1")} // the coordinator's host
	p.serving(7070)
	names := map[string][]string{
		"localhost":      {"127.0.0.1", "::1"},
		"gpu-a.internal": {"10.0.0.5"},
		"sink.example":   {"10.6.6.6"},
		"split.example":  {"10.0.0.5", "10.6.6.6"},
	}
	lookups := 0
	p.resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
		lookups++
		var out []netip.Addr
		for _, a := range names[host] {
			out = append(out, netip.MustParseAddr(a))
		}
		if out == nil {
			return nil, errors.New("no such host")
		}
		return out, nil
	}
	remote, local := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("127.0.0.1")
	for _, tc := range []struct {
		node   string
		source netip.Addr
		addr   string
		refuse string // "" allowed, else a part of the reason
	}{
		{"gpu-a", remote, "10.0.0.5:8000", ""},
		{"gpu-a", remote, "gpu-a.internal:8000", ""},
		{"gpu-a", remote, "10.0.1.9:8000", ""},           // allowed for gpu-a
		{"gpu-b", remote, "10.0.1.9:8000", "neither"},    // but not for gpu-b
		{"gpu-b", remote, "10.0.9.9:8000", ""},           // allowed for every node
		{"gpu-a", remote, "10.6.6.6:80", "neither"},      // a sink
		{"gpu-a", remote, "sink.example:80", "10.6.6.6"}, // a sink by name
		{"gpu-a", remote, "split.example:80", "10.6.6.6"},
		{"gpu-a", remote, "127.0.0.1:8000", "loopback"},
		{"gpu-a", remote, "localhost:8000", "loopback"},
		{"gpu-a", remote, "[::1]:8000", "loopback"},
		{"gpu-a", remote, "0.0.0.0:8000", "loopback"},
		{"gpu-a", remote, "10.0.0.1:7070", "coordinator's own"},
		{"gpu-a", remote, "nowhere.example:80", "does not resolve"},
		{"gpu-l", local, "127.0.0.1:8000", ""}, // a node on the coordinator's host
		{"gpu-l", local, "localhost:8000", ""},
		{"gpu-l", local, "10.0.0.1:8000", ""},
		{"gpu-l", local, "127.0.0.1:7070", "coordinator's own"},
		{"gpu-l", local, "localhost:7070", "coordinator's own"},
		{"gpu-l", local, "10.0.0.1:7070", "coordinator's own"},
	} {
		err := p.check(tc.node, tc.source, tc.addr)
		switch {
		case tc.refuse == "" && err != nil:
			t.Errorf("%s from %s offering %s: refused (%v), want allowed", tc.node, tc.source, tc.addr, err)
		case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse)):
			t.Errorf("%s from %s offering %s: %v, want a refusal naming %q", tc.node, tc.source, tc.addr, err, tc.refuse)
		}
	}
	before := lookups
	_ = p.check("gpu-a", remote, "gpu-a.internal:8000")
	if lookups != before {
		t.Errorf("a name looked up again within %s", resolveTTL)
	}
}

// Through the hub: an agent connecting over loopback offers its engine at
// the coordinator's own address, at another host's and at its own; the
// fleet is told the first two are refused, before it sees the snapshot.
func TestHubRefusesAddressesNotTheNodes(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	self := strings.TrimPrefix(ts.base, "http://")
	s := &wire.Snapshot{Node: "gpu-a", At: time.Now(), Engines: []wire.Engine{
		{Kind: wire.EngineVLLM, URL: "http://127.0.0.1:8000", Model: "m", Ready: true, CapacityKey: "gpu-a/own"},
		{Kind: wire.EngineVLLM, URL: "http://127.0.0.1:8001", AdvertiseURL: "http://" + self, Model: "m", Ready: true, CapacityKey: "gpu-a/self"},
		{Kind: wire.EngineVLLM, URL: "http://127.0.0.1:8002", AdvertiseURL: "http://10.6.6.6:80", Model: "m", Ready: true, CapacityKey: "gpu-a/sink"},
	}}
	a.send(s)
	testutil.Eventually(t, "the snapshot", 10*time.Second, func() bool { return len(ts.fleet.Workers()) == 3 })
	got := ts.fleet.addressRefusals("gpu-a")
	if len(got) != 2 || !strings.Contains(got["gpu-a/self"], "coordinator's own") || !strings.Contains(got["gpu-a/sink"], "10.6.6.6") {
		t.Errorf("refusals = %v, want gpu-a/self (the coordinator's own) and gpu-a/sink", got)
	}
}

// The cache of answers is bounded without being cleared whole: one agent
// cycling names past the bound evicts one answer per new name, not every
// node's (before, every cached name was looked up again).
func TestResolveCacheEvictsOneAtATime(t *testing.T) {
	p := newAddrPolicy(nil)
	lookups := 0
	p.resolve = func(context.Context, string) ([]netip.Addr, error) {
		lookups++
		return []netip.Addr{netip.MustParseAddr("10.0.0.5")}, nil
	}
	name := func(i int) string { return fmt.Sprintf("n%d.example", i) }
	for i := range resolveCached {
		if _, err := p.lookup(name(i)); err != nil {
			t.Fatal(err)
		}
	}
	const cycled = 100
	for i := range cycled {
		p.lookup(fmt.Sprintf("cycled-%d.example", i))
	}
	lookups = 0
	for i := range resolveCached {
		p.lookup(name(i))
	}
	t.Logf("%d of %d names looked up again after %d new ones", lookups, resolveCached, cycled)
	if lookups > resolveCached/4 || len(p.cache) > resolveCached {
		t.Fatalf("%d of %d names looked up again after %d new ones; %d cached (bound %d)", lookups, resolveCached, cycled, len(p.cache), resolveCached)
	}
}
