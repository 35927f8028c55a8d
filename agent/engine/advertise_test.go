package engine

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"testing"

	"heft/shared/wire"
)

func TestAdvertiseRules(t *testing.T) {
	node := netip.MustParseAddr("192.0.2.10")
	node6 := netip.MustParseAddr("2001:db8::10")
	primary := func(v4 bool) (netip.Addr, error) {
		if v4 {
			return node, nil
		}
		return node6, nil
	}
	noPrimary := func(bool) (netip.Addr, error) { return netip.Addr{}, errors.New("no route") }
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name       string
		configured string
		url        string
		listen     []netip.AddrPort
		primary    func(bool) (netip.Addr, error)
		want, src  string
	}{
		{"configured wins", "http://10.9.9.9:9000", "http://127.0.0.1:8000", []netip.AddrPort{ap("0.0.0.0:8000")}, primary,
			"http://10.9.9.9:9000", wire.AdvertiseConfig},
		{"configured loopback is kept (and warned about)", "http://127.0.0.1:8000", "http://127.0.0.1:8000", nil, primary,
			"http://127.0.0.1:8000", wire.AdvertiseConfig},
		{"routable URL", "", "http://10.0.0.5:8000", nil, primary, "http://10.0.0.5:8000", wire.AdvertiseURLHost},
		{"host name URL", "", "https://gpu-a.example/v1", nil, primary, "https://gpu-a.example/v1", wire.AdvertiseURLHost},
		{"every IPv4 interface", "", "http://127.0.0.1:8000", []netip.AddrPort{ap("0.0.0.0:8000")}, primary,
			"http://192.0.2.10:8000", wire.AdvertiseNodeAddress},
		{"every interface on ::", "", "http://localhost:8000/v1", []netip.AddrPort{ap("[::]:8000")}, primary,
			"http://[2001:db8::10]:8000/v1", wire.AdvertiseNodeAddress},
		{"unspecified URL host", "", "http://0.0.0.0:8000", []netip.AddrPort{ap("0.0.0.0:8000")}, primary,
			"http://192.0.2.10:8000", wire.AdvertiseNodeAddress},
		{"one routable address", "", "http://127.0.0.1:8000", []netip.AddrPort{ap("127.0.0.1:8000"), ap("10.0.0.5:8000")}, primary,
			"http://10.0.0.5:8000", wire.AdvertiseListenAddress},
		{"IPv4 before IPv6", "", "http://127.0.0.1:8000", []netip.AddrPort{ap("[fd00::5]:8000"), ap("10.0.0.5:8000")}, primary,
			"http://10.0.0.5:8000", wire.AdvertiseListenAddress},
		{"every interface, no primary address: a specific one", "", "http://127.0.0.1:8000",
			[]netip.AddrPort{ap("0.0.0.0:8000"), ap("10.0.0.5:8000")}, noPrimary, "http://10.0.0.5:8000", wire.AdvertiseListenAddress},
		{"loopback only", "", "http://127.0.0.1:8000", []netip.AddrPort{ap("127.0.0.1:8000"), ap("[::1]:8000")}, primary, "", ""},
		{"link-local is not offered", "", "http://127.0.0.1:8000", []netip.AddrPort{ap("[fe80::1]:8000")}, primary, "", ""},
		{"sockets unknown", "", "http://127.0.0.1:8000", nil, primary, "", ""},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		got, src := advertise(advertiseInput{configured: tc.configured, url: u, listen: tc.listen, primary: tc.primary})
		if got != tc.want || src != tc.src {
			t.Errorf("%s: %q (%s), want %q (%s)", tc.name, got, src, tc.want, tc.src)
		}
	}
}

// An engine on this host: the agent reads where it listens, and offers
// the node's address only when it listens on every interface.
func TestAdvertiseFromTheListeningSocket(t *testing.T) {
	primary := func(bool) (netip.Addr, error) { return netip.MustParseAddr("192.0.2.10"), nil }

	loop := startFake(t, "vllm", nil) // httptest listens on 127.0.0.1
	c := newClient(t, "vllm", loop.URL, nil)
	c.primary = primary
	e := c.Facts(t.Context(), nil, nil)
	checkWire(t, e)
	if e.AdvertiseURL != "" || e.AdvertiseSource != "" || len(e.Listen) != 1 || e.Listen[0] != loop.Listener.Addr().String() {
		t.Errorf("loopback engine: advertise %q (%s), listen %v", e.AdvertiseURL, e.AdvertiseSource, e.Listen)
	}

	cfgd := newClient(t, "vllm", loop.URL, func(c *Config) { c.AdvertiseURL = "http://10.0.0.5:8000" })
	if e := cfgd.Facts(t.Context(), nil, nil); e.AdvertiseURL != "http://10.0.0.5:8000" || e.AdvertiseSource != wire.AdvertiseConfig {
		t.Errorf("configured: %q (%s)", e.AdvertiseURL, e.AdvertiseSource)
	}

	// Bound to every IPv4 interface; the test dials it at 127.0.0.1 only.
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: fakeEngine("vllm", nil)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	c = newClient(t, "vllm", "http://127.0.0.1:"+port, nil)
	c.primary = primary
	e = c.Facts(t.Context(), nil, nil)
	checkWire(t, e)
	if e.AdvertiseURL != "http://192.0.2.10:"+port || e.AdvertiseSource != wire.AdvertiseNodeAddress || len(e.Listen) != 1 || e.Listen[0] != "0.0.0.0:"+port {
		t.Errorf("engine on 0.0.0.0: advertise %q (%s), listen %v", e.AdvertiseURL, e.AdvertiseSource, e.Listen)
	}
}

func TestPrimaryAddress(t *testing.T) {
	ip, err := PrimaryAddress(true)
	if err != nil {
		t.Skipf("this host has no routable address: %v", err)
	}
	if !ip.Is4() || ip.IsLoopback() || !ip.IsGlobalUnicast() {
		t.Errorf("PrimaryAddress(v4) = %s, want a global unicast IPv4 address", ip)
	}
	t.Logf("primary address: %s", ip)
}
