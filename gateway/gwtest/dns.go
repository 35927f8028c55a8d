package gwtest

import (
	"context"
	"net"
	"net/netip"
	"sync"
)

// DNS is a fake resolver for a gateway driver's lookups (its Lookup is a
// target.LookupFunc): names map to addresses, and SetDown makes every
// lookup fail as an unreachable resolver does.
type DNS struct {
	mu    sync.Mutex
	names map[string]netip.Addr
	down  bool
}

// NewDNS answers each name of names with its address.
func NewDNS(names map[string]string) *DNS {
	d := &DNS{names: map[string]netip.Addr{}}
	for n, a := range names {
		d.Set(n, a)
	}
	return d
}

// Set makes name resolve to addr from now on.
func (d *DNS) Set(name, addr string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.names[name] = netip.MustParseAddr(addr)
}

// SetDown makes every lookup fail (down) or answer again.
func (d *DNS) SetDown(down bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down = down
}

// Lookup answers host as the names say.
func (d *DNS) Lookup(_ context.Context, host string) ([]netip.Addr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return nil, &net.DNSError{Err: "fake resolver unreachable", Name: host, IsTimeout: true}
	}
	a, ok := d.names[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return []netip.Addr{a}, nil
}
