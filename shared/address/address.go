// Package address holds the checks every heft binary makes of the URLs and
// hosts it is given, so that they accept and refuse the same things.
package address

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// CheckURL parses raw, a URL named what in messages ("coordinator URL"),
// and refuses one without a scheme from schemes, without a host, with a
// bad port, or carrying credentials, a query or a fragment (which would
// end up in logs or be silently dropped).
func CheckURL(what, raw string, schemes ...string) (*url.URL, error) {
	want := strings.Join(schemes, ":// or ") + "://"
	if strings.TrimSpace(raw) == "" {
		return nil, fmt.Errorf("%s is empty: want %s", what, want)
	}
	if !strings.Contains(raw, "://") {
		return nil, fmt.Errorf("%s %q has no scheme: want %s, e.g. %s%s", what, raw, want, schemes[0]+"://", raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", what, raw, err)
	}
	if !slices.Contains(schemes, u.Scheme) {
		return nil, fmt.Errorf("%s %q: scheme must be %s", what, raw, want)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("%s %q has no host", what, raw)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%s %q: port %s is not 1..65535", what, raw, p)
		}
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%s %q must not carry credentials, a query or a fragment", what, raw)
	}
	return u, nil
}

// IsLoopback reports whether host, a name or an IP address as found in a
// URL or a host:port (brackets allowed), stays on this machine: localhost,
// any name under .localhost (RFC 6761), or a loopback address. An empty
// host, as in ":7070", means every interface and is not loopback.
func IsLoopback(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// HostPort returns the host:port a URL names, with its scheme's default
// port (80 for http and ws, 443 for https and wss) when it names none:
// what a gateway dials for an engine URL.
func HostPort(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("url %q: %w", raw, err)
	}
	if u.Hostname() == "" {
		return "", fmt.Errorf("url %q has no host", raw)
	}
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "http", "ws":
			port = "80"
		case "https", "wss":
			port = "443"
		default:
			return "", fmt.Errorf("url %q has no port and its scheme has no default", raw)
		}
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// WebsocketURL checks a websocket URL that people often write as the
// server's address instead: an http:// or https:// URL becomes ws:// or
// wss://, and one without a path gets defaultPath. It returns the URL to
// dial and, when that differs from raw, a note saying what changed.
func WebsocketURL(what, raw, defaultPath string) (string, string, error) {
	u, err := CheckURL(what, strings.TrimSpace(raw), "ws", "wss", "http", "https")
	if err != nil {
		return "", "", err
	}
	var changes []string
	switch u.Scheme {
	case "http", "https":
		ws := map[string]string{"http": "ws", "https": "wss"}[u.Scheme]
		changes = append(changes, fmt.Sprintf("scheme %s:// becomes %s://", u.Scheme, ws))
		u.Scheme = ws
	}
	if u.Path == "" || u.Path == "/" {
		changes = append(changes, "path "+defaultPath+" added")
		u.Path, u.RawPath = defaultPath, ""
	}
	if len(changes) == 0 {
		return u.String(), "", nil
	}
	return u.String(), fmt.Sprintf("%s %s: %s; dialling %s", what, raw, strings.Join(changes, ", "), u), nil
}
