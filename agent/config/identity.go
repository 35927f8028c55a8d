package config

import (
	"context"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"heft/agent/engine/proc"
)

// localID is the host part of every identity of this host: localhost,
// 127.0.0.1, [::1], 0.0.0.0, its own addresses and its host name all reach
// the same listening sockets.
const localID = "localhost"

// EngineID names the listening socket an engine URL reaches, as far as
// the URL alone says: its host (lower case; an address in its shortest
// form; every name and address of this host one), its port (the scheme's
// default where none is written) and its path, without a trailing slash or
// /v1 (the engine client drops both). Two engines with one EngineID are
// one engine spelled two ways. A URL that does not parse is its own
// identity.
func EngineID(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Host == "" {
		return strings.TrimSpace(raw)
	}
	return socketID(hostID(u.Hostname()), u)
}

// Lookup resolves a host name to its addresses (net.Resolver.LookupIPAddr).
type Lookup func(ctx context.Context, host string) ([]net.IPAddr, error)

// EngineSockets is EngineID with a host name resolved: one identity per
// address the name has, so that a name and its address, or two names of
// one address, come out the same. Two engines whose lists share an entry
// may be one listening socket. A name that does not resolve (ctx ended,
// no such host, lookup nil) keeps EngineID: resolution only ever adds
// matches.
func EngineSockets(ctx context.Context, raw string, lookup Lookup) []string {
	id := EngineID(raw)
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Host == "" || lookup == nil {
		return []string{id}
	}
	host := u.Hostname()
	if net.ParseIP(host) != nil || hostID(host) == localID {
		return []string{id}
	}
	addrs, err := lookup(ctx, host)
	if err != nil || len(addrs) == 0 {
		return []string{id}
	}
	ids := make([]string, 0, len(addrs))
	for _, a := range addrs {
		ids = append(ids, socketID(hostID(a.IP.String()), u))
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// hostID is a URL host as identities hold it.
func hostID(host string) string {
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if proc.IsLocalHost(host) {
		return localID
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.String() // ::ffff:10.0.0.5 is 10.0.0.5; 0:0::a is ::a
	}
	return host
}

// socketID joins a host identity with u's port and path.
func socketID(host string, u *url.URL) string {
	port := u.Port()
	if n, err := strconv.Atoi(port); err == nil {
		port = strconv.Itoa(n) // 08000 is 8000
	}
	if port == "" {
		port = "80"
		if strings.EqualFold(u.Scheme, "https") {
			port = "443"
		}
	}
	path := strings.TrimRight(u.Path, "/")
	path = strings.TrimRight(strings.TrimSuffix(path, "/v1"), "/")
	return net.JoinHostPort(host, port) + path
}
