package engine

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"time"

	"heft/agent/engine/proc"
	"heft/shared/address"
	"heft/shared/wire"
)

// The address a gateway dials for an engine is not always the one the
// agent dials: an agent beside its engine reads it at 127.0.0.1. advertise
// decides what to offer, in this order:
//
//  1. the configured advertise_url, as it is (a loopback one is reported
//     not_routable by shared/health, not refused: a gateway on this node
//     can use it);
//  2. the engine URL itself when its host is not this node's loopback or
//     unspecified address (http://10.0.0.5:8000, http://gpu-a:8000);
//  3. for a loopback URL, the engine's listening sockets on its port: one
//     bound to every interface (0.0.0.0 or ::) is offered at this node's
//     primary address; one bound to a single routable address, at that
//     address;
//  4. nothing: the engine listens on loopback only, or its sockets could
//     not be seen. The coordinator then falls back to the URL and warns.
//
// The URL's scheme, port and path are kept; only the host changes.

// advertiseInput is what advertise decides from.
type advertiseInput struct {
	configured string
	url        *url.URL
	// listen are the engine's listening sockets on the URL's port; nil
	// when they could not be read.
	listen []netip.AddrPort
	// primary returns this node's primary address, IPv4 only when v4.
	primary func(v4 bool) (netip.Addr, error)
}

// advertise returns the URL to offer gateways and how it was chosen; ""
// when there is none.
func advertise(in advertiseInput) (string, string) {
	if in.configured != "" {
		return in.configured, wire.AdvertiseConfig
	}
	if in.url == nil {
		return "", ""
	}
	host := in.url.Hostname()
	if !address.IsLoopback(host) && !isUnspecified(host) {
		return in.url.String(), wire.AdvertiseURLHost
	}
	var specific []netip.Addr
	anyV4, anyV6 := false, false
	for _, a := range in.listen {
		ip := a.Addr()
		switch {
		case ip.IsUnspecified() && ip.Is4():
			anyV4 = true
		case ip.IsUnspecified():
			anyV6 = true
		case !ip.IsLoopback() && !ip.IsLinkLocalUnicast():
			specific = append(specific, ip)
		}
	}
	if (anyV4 || anyV6) && in.primary != nil {
		// A socket on :: takes IPv4 too unless the kernel says v6only;
		// offer IPv4 first either way, which every gateway takes.
		if ip, err := in.primary(!anyV6); err == nil {
			return withHost(in.url, ip), wire.AdvertiseNodeAddress
		}
	}
	if len(specific) > 0 {
		slices.SortFunc(specific, func(a, b netip.Addr) int {
			if a.Is4() != b.Is4() {
				if a.Is4() {
					return -1
				}
				return 1
			}
			return a.Compare(b)
		})
		return withHost(in.url, specific[0]), wire.AdvertiseListenAddress
	}
	return "", ""
}

func isUnspecified(host string) bool {
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsUnspecified()
}

// withHost is u with its host replaced by ip, its port kept.
func withHost(u *url.URL, ip netip.Addr) string {
	v := *u
	port := u.Port()
	if port == "" {
		v.Host = ip.String()
		if ip.Is6() {
			v.Host = "[" + v.Host + "]"
		}
	} else {
		v.Host = net.JoinHostPort(ip.String(), port)
	}
	return v.String()
}

// PrimaryAddress returns the address this node is known by on its network.
// It is the source address the kernel picks for the default route, found
// by connecting a UDP socket to a documentation address (a connect sends
// nothing): other hosts reach this node at that address, whatever bridges
// (docker0, CNI) it also has. Without a default route it is the first
// global unicast address of an interface that is up, IPv4 first, in the
// kernel's interface order. v4 asks for an IPv4 address only.
func PrimaryAddress(v4 bool) (netip.Addr, error) {
	probes := []string{"udp4:192.0.2.1:9"}
	if !v4 {
		probes = append(probes, "udp6:[2001:db8::1]:9")
	}
	for _, p := range probes {
		network, addr := p[:4], p[5:]
		if ip, ok := routeSource(network, addr); ok {
			return ip, nil
		}
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return netip.Addr{}, err
	}
	var v6 netip.Addr
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok || !ip.Unmap().IsGlobalUnicast() {
				continue
			}
			if ip = ip.Unmap(); ip.Is4() {
				return ip, nil
			}
			if !v4 && !v6.IsValid() {
				v6 = ip
			}
		}
	}
	if v6.IsValid() {
		return v6, nil
	}
	return netip.Addr{}, errors.New("this node has no default route and no global unicast address")
}

// routeSource is the local address the kernel would send from to addr.
func routeSource(network, addr string) (netip.Addr, bool) {
	c, err := net.Dial(network, addr)
	if err != nil {
		return netip.Addr{}, false
	}
	defer c.Close()
	ua, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	ip, ok := netip.AddrFromSlice(ua.IP)
	if !ok || !ip.Unmap().IsGlobalUnicast() {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

// listenRecheck is how long the engine's listening sockets are trusted:
// they change only when the engine restarts.
const listenRecheck = proc.Recheck

// advertised fills e's advertise URL and listening addresses. down says
// the engine did not answer: its sockets are looked at again next time.
func (c *Client) advertised(ctx context.Context, e *wire.Engine, down bool) {
	var listen []netip.AddrPort
	if c.local {
		listen = c.listening(ctx, down)
		for _, a := range listen {
			if len(e.Listen) < wire.MaxListItems {
				e.Listen = append(e.Listen, a.String())
			}
		}
	}
	u, _ := url.Parse(c.url)
	e.AdvertiseURL, e.AdvertiseSource = advertise(advertiseInput{configured: c.cfg.AdvertiseURL, url: u,
		listen: listen, primary: c.primary})
	if len(e.AdvertiseURL) > wire.MaxStringBytes {
		e.AdvertiseURL, e.AdvertiseSource = "", ""
	}
}

// listening returns the engine's sockets on its port, looked up at most
// every listenRecheck; nil when they cannot be read.
func (c *Client) listening(ctx context.Context, down bool) []netip.AddrPort {
	c.mu.Lock()
	fresh := !c.listenAt.IsZero() && time.Since(c.listenAt) < listenRecheck && !down && len(c.listen) > 0
	cached := c.listen
	c.mu.Unlock()
	if fresh {
		return cached
	}
	addrs, err := proc.ListenAddrs(ctx, c.port)
	if err != nil {
		c.warnOnce("listen:"+err.Error(), "cannot see where the engine listens; gateways get its URL", "port", strconv.Itoa(c.port), "error", err)
		addrs = nil
	}
	c.mu.Lock()
	c.listen, c.listenAt = addrs, time.Now()
	c.mu.Unlock()
	return addrs
}
