package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"heft/shared/grammar"
	"heft/shared/wire"
)

// An agent says where gateways should send a worker's requests, and with
// the agents' shared token alone anyone could say any address: the
// coordinator's own, a sink that collects prompts and Authorization
// headers, a loopback name that reaches whatever listens beside the
// gateway. So an address is the node's only when every address its host
// resolves to is the one the node's connection comes from, or is allowed
// for the node by advertise_allow; and it is never the coordinator's own.
// A node on the coordinator's host (it connects over loopback) owns the
// host's addresses and loopback. A worker whose address is not its node's
// is held with address_not_allowed (fleet.SetAddressRefusals).

// AllowRule is one advertise_allow entry: addresses in Prefix may be
// offered by the node named Node, or by any node when Node is empty.
type AllowRule struct {
	Node   string
	Prefix netip.Prefix
}

// ParseAllow reads advertise_allow: each entry a CIDR prefix or an
// address, optionally after "NODE=" to allow it for that node only.
func ParseAllow(entries []string) ([]AllowRule, error) {
	var out []AllowRule
	var errs []error
	for _, e := range entries {
		e = strings.TrimSpace(e)
		node, prefix, scoped := strings.Cut(e, "=")
		if !scoped {
			node, prefix = "", e
		} else if strings.TrimSpace(node) == "" {
			errs = append(errs, fmt.Errorf("advertise_allow: %q names no node before '='", e))
			continue
		}
		p, err := parsePrefix(strings.TrimSpace(prefix))
		if err != nil {
			errs = append(errs, fmt.Errorf("advertise_allow: %q: want CIDR, ADDRESS, NODE=CIDR or NODE=ADDRESS", e))
			continue
		}
		out = append(out, AllowRule{Node: strings.TrimSpace(node), Prefix: p})
	}
	return out, errors.Join(errs...)
}

func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Resolution of advertised names: bounded in time, cached briefly (an
// agent reports every 15 s), and the cache bounded in size.
const (
	resolveTimeout = 2 * time.Second
	resolveTTL     = 30 * time.Second
	resolveCached  = 4096
)

// addrPolicy decides whether an advertised address is its node's.
type addrPolicy struct {
	allow   []AllowRule
	resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	local   []netip.Addr // this host's interface addresses
	now     func() time.Time

	mu    sync.Mutex
	cache map[string]resolved
	// selfPorts are the ports the coordinator serves on (its API as each
	// agent dialled it, the agent-check listener).
	selfPorts map[uint16]bool
}

type resolved struct {
	addrs []netip.Addr
	err   error
	until time.Time
}

func newAddrPolicy(allow []AllowRule) *addrPolicy {
	p := &addrPolicy{allow: allow, now: time.Now, cache: map[string]resolved{}, selfPorts: map[uint16]bool{},
		resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if pfx, err := netip.ParsePrefix(a.String()); err == nil {
				p.local = append(p.local, pfx.Addr().Unmap())
			}
		}
	}
	return p
}

// makeRoom drops the expired answers, else one (p.mu held). Clearing the
// whole cache let one agent that cycles names send every node's lookups
// to the resolver again.
func (p *addrPolicy) makeRoom(now time.Time) {
	for h, r := range p.cache {
		if !now.Before(r.until) {
			delete(p.cache, h)
		}
	}
	for h := range p.cache {
		if len(p.cache) < resolveCached {
			return
		}
		delete(p.cache, h)
	}
}

// serving records a port the coordinator serves on.
func (p *addrPolicy) serving(port uint16) {
	p.mu.Lock()
	p.selfPorts[port] = true
	p.mu.Unlock()
}

// refusals returns, by capacity key, why each engine's address is not
// its node's; nil when every one is.
func (p *addrPolicy) refusals(node string, source netip.Addr, engines []wire.Engine) map[string]string {
	var out map[string]string
	for _, e := range engines {
		if e.CapacityKey == "" {
			continue
		}
		raw := e.AdvertiseURL
		if raw == "" {
			raw = e.URL
		}
		hp, err := grammar.URL(raw) // checked on receipt; kept for a direct caller
		if err == nil {
			err = p.check(node, source, hp)
		}
		if err != nil {
			if out == nil {
				out = map[string]string{}
			}
			out[e.CapacityKey] = err.Error()
		}
	}
	return out
}

// check says why hostport, offered by node connecting from source, is not
// the node's to offer, or nil.
func (p *addrPolicy) check(node string, source netip.Addr, hostport string) error {
	host, portText, err := net.SplitHostPort(hostport)
	if err != nil {
		return err
	}
	var port uint16
	_, _ = fmt.Sscan(portText, &port)
	addrs, err := p.lookup(host)
	if err != nil {
		return fmt.Errorf("%s does not resolve: %v", host, err)
	}
	source = source.Unmap()
	for _, a := range addrs {
		if p.isSelf(a, port) {
			return fmt.Errorf("%s is the coordinator's own address", hostport)
		}
	}
	for _, a := range addrs {
		if p.owns(node, source, a) {
			continue
		}
		what := hostport
		if a.String() != host {
			what = fmt.Sprintf("%s (%s)", hostport, a)
		}
		if a.IsLoopback() || a.IsUnspecified() {
			return fmt.Errorf("%s is a loopback address and the node connects from another host (%s)", what, source)
		}
		return fmt.Errorf("%s is neither the address the node connects from (%s) nor allowed for it in advertise_allow", what, source)
	}
	return nil
}

// owns reports whether node, connecting from source, may offer a.
func (p *addrPolicy) owns(node string, source, a netip.Addr) bool {
	if a == source {
		return true
	}
	if source.IsLoopback() && (a.IsLoopback() || a.IsUnspecified() || slices.Contains(p.local, a)) {
		return true // the node is the coordinator's host
	}
	for _, r := range p.allow {
		if (r.Node == "" || r.Node == node) && r.Prefix.Contains(a) {
			return true
		}
	}
	return false
}

func (p *addrPolicy) isSelf(a netip.Addr, port uint16) bool {
	p.mu.Lock()
	self := p.selfPorts[port]
	p.mu.Unlock()
	return self && (a.IsLoopback() || a.IsUnspecified() || slices.Contains(p.local, a))
}

// lookup resolves host: an address is itself; a name goes to the
// resolver, its answer cached for resolveTTL.
func (p *addrPolicy) lookup(host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	now := p.now()
	p.mu.Lock()
	r, ok := p.cache[host]
	p.mu.Unlock()
	if ok && now.Before(r.until) {
		return r.addrs, r.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	addrs, err := p.resolve(ctx, host)
	cancel()
	if err == nil && len(addrs) == 0 {
		err = errors.New("no addresses")
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	p.mu.Lock()
	if _, known := p.cache[host]; !known && len(p.cache) >= resolveCached {
		p.makeRoom(now)
	}
	p.cache[host] = resolved{addrs: addrs, err: err, until: now.Add(resolveTTL)}
	p.mu.Unlock()
	return addrs, err
}
