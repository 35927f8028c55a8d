// Package grammar says which strings an agent may send that can end up in a
// gateway's configuration: capacity keys (worker IDs, written in comments
// and server names), model names (in file headers, LiteLLM's model_list,
// HAProxy's agent-send), node names (in views, logs and the admin routes'
// paths) and the addresses gateways dial. Each check is a
// fixed alphabet and a length bound rather than an escaping rule, so a
// string that passes is safe verbatim in HAProxy's configuration and
// runtime API, an nginx file, YAML and JSON: no whitespace, no control
// characters, no quotes, no ';', '{', '}', '#', '\\' or '$'.
//
// The coordinator enforces it on receipt of an agent's messages; the
// renderers and heft-sync's drivers check again on their side.
package grammar

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Length bounds.
const (
	// MaxKeyBytes bounds a capacity key. The agent's keys are 16 hex
	// digits; longer ones come from tests and other agents' schemes.
	MaxKeyBytes = 128
	// MaxModelBytes bounds a model name: Hugging Face's org/name is at
	// most 96 bytes, a file path as llama.cpp names its model a little more.
	MaxModelBytes = 256
	// MaxHostBytes bounds a DNS name (RFC 1035).
	MaxHostBytes  = 253
	maxLabelBytes = 63
)

// ErrGrammar wraps every refusal.
var ErrGrammar = errors.New("not in heft's grammar")

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrGrammar, fmt.Sprintf(format, args...))
}

// IdentAlphabet is the alphabet of capacity keys and model names, as said
// in messages.
const IdentAlphabet = "ASCII letters, digits and . _ - : / @ + = |"

// identByte reports whether c may appear in a capacity key or model name.
func identByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("._-:/@+=|", c) >= 0
}

func ident(what, s string, maxLen int) error {
	if s == "" {
		return refuse("%s is empty", what)
	}
	if len(s) > maxLen {
		return refuse("%s is %d bytes, at most %d", what, len(s), maxLen)
	}
	for i := 0; i < len(s); i++ {
		if !identByte(s[i]) {
			return refuse("%s %s holds %s at byte %d: only %s", what, quote(s), quote(s[i:i+1]), i, IdentAlphabet)
		}
	}
	// A leading '-' reads as an option to a command line (haproxy's
	// runtime API, a shell a person pastes into).
	if s[0] == '-' {
		return refuse("%s %s starts with '-'", what, quote(s))
	}
	return nil
}

// NodeRule is the node name grammar, as said in messages.
const NodeRule = "1–253 bytes of ASCII letters, digits and . _ -, not starting with . or -"

// NodeName checks a node name: NodeRule. Host names, Kubernetes pod names
// and FQDNs pass; '/', ':' and '%' are refused so that a name is one
// segment of /api/v1/nodes/{name} as it is, and a leading '.' so that "."
// and ".." name no node.
func NodeName(s string) error {
	bad := func(why string, args ...any) error {
		return refuse("node name %s: a node name is %s", fmt.Sprintf(why, args...), NodeRule)
	}
	switch {
	case s == "":
		return bad("is empty")
	case len(s) > MaxHostBytes:
		return bad("is %d bytes", len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return bad("%s holds %s at byte %d", quote(s), quote(s[i:i+1]), i)
		}
	}
	if s[0] == '-' || s[0] == '.' {
		return bad("%s starts with %s", quote(s), quote(s[:1]))
	}
	return nil
}

// CapacityKey checks a capacity key: 1–128 bytes of IdentAlphabet, not
// starting with '-'.
func CapacityKey(s string) error { return ident("capacity key", s, MaxKeyBytes) }

// Model checks a model name: 1–256 bytes of IdentAlphabet, not starting
// with '-'. Names with spaces or other bytes are refused rather than
// escaped: each gateway escapes differently, and a name refused is one no
// renderer can get wrong.
func Model(s string) error { return ident("model name", s, MaxModelBytes) }

// Host checks a host as a gateway would dial it: an IPv4 literal, an
// IPv6 literal (brackets optional, no zone), or a DNS name of labels of
// letters, digits, '-' and '_' (1–63 bytes each, not starting or ending
// with '-'), at most 253 bytes, an optional final dot, whose last label
// is not a number (inet_aton reads "1.2.3", "0x7f000001" and "017" as
// addresses). The name "unix" is refused: nginx reads "unix:" as a
// socket path.
func Host(host string) error {
	bare := host
	if strings.HasPrefix(bare, "[") && strings.HasSuffix(bare, "]") {
		bare = bare[1 : len(bare)-1]
		if !strings.Contains(bare, ":") {
			return refuse("host %s: brackets hold only an IPv6 address", quote(host))
		}
	}
	if strings.Contains(bare, ":") {
		ip := net.ParseIP(bare)
		if ip == nil || strings.Contains(bare, "%") {
			return refuse("host %s is not an IPv6 address", quote(host))
		}
		return nil
	}
	if bare != host {
		return refuse("host %s: brackets hold only an IPv6 address", quote(host))
	}
	if ip := net.ParseIP(bare); ip != nil && ip.To4() != nil {
		return nil
	}
	return dnsName(host)
}

func dnsName(host string) error {
	if host == "" {
		return refuse("host is empty")
	}
	if len(host) > MaxHostBytes {
		return refuse("host is %d bytes, at most %d", len(host), MaxHostBytes)
	}
	name := strings.TrimSuffix(host, ".")
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" || len(l) > maxLabelBytes {
			return refuse("host %s has a label of %d bytes: want 1–%d", quote(host), len(l), maxLabelBytes)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
			if !ok {
				return refuse("host %s holds %s: a DNS name is letters, digits, '-', '_' and dots", quote(host), quote(l[i:i+1]))
			}
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return refuse("host %s has a label starting or ending with '-'", quote(host))
		}
	}
	if numeric(labels[len(labels)-1]) {
		return refuse("host %s is neither an IP address nor a DNS name (its last label is a number)", quote(host))
	}
	if strings.EqualFold(name, "unix") {
		return refuse(`host %s: nginx reads "unix:" as a socket path`, quote(host))
	}
	return nil
}

// numeric reports whether a label reads as a number to inet_aton:
// decimal, octal, or 0x hexadecimal.
func numeric(l string) bool {
	if rest, ok := strings.CutPrefix(strings.ToLower(l), "0x"); ok {
		return strings.Trim(rest, "0123456789abcdef") == ""
	}
	return strings.Trim(l, "0123456789") == ""
}

// Port checks a port: decimal 1–65535, no sign, no leading zero.
func Port(p string) error {
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 || p[0] < '1' || p[0] > '9' {
		return refuse("port %s is not a number in 1–65535", quote(p))
	}
	return nil
}

// Address checks a host:port as gateways are given it: Host and Port,
// with an IPv6 literal in brackets.
func Address(hostport string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return refuse("address %s is not host:port", quote(hostport))
	}
	if strings.Contains(host, ":") != strings.HasPrefix(hostport, "[") {
		return refuse("address %s: an IPv6 host, and only one, goes in brackets", quote(hostport))
	}
	if err := Host(host); err != nil {
		return err
	}
	return Port(port)
}

// URL checks an engine URL an agent reports (its advertise URL or the URL
// it dials): http or https, no credentials, query or fragment, a path of
// IdentAlphabet bytes, and a host and port that pass Host and Port. It
// returns the host:port a gateway dials (the scheme's default port when
// the URL names none).
func URL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Opaque != "" {
		return "", refuse("url %s is not an http:// or https:// URL", quote(raw))
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(raw, "?#") {
		return "", refuse("url %s must not carry credentials, a query or a fragment", quote(raw))
	}
	for i := 0; i < len(u.Path); i++ {
		if !identByte(u.Path[i]) {
			return "", refuse("url %s: its path holds %s", quote(raw), quote(u.Path[i:i+1]))
		}
	}
	if u.RawPath != "" {
		return "", refuse("url %s: its path is escaped", quote(raw))
	}
	port := u.Port()
	if port == "" {
		if strings.HasSuffix(u.Host, ":") {
			return "", refuse("url %s has an empty port", quote(raw))
		}
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if err := Host(u.Hostname()); err != nil {
		return "", fmt.Errorf("url %s: %w", quote(raw), err)
	}
	if err := Port(port); err != nil {
		return "", fmt.Errorf("url %s: %w", quote(raw), err)
	}
	hp := net.JoinHostPort(u.Hostname(), port)
	if err := Address(hp); err != nil { // the same refusals as a host:port
		return "", err
	}
	return hp, nil
}

// quote shows a string in a message with every unusual byte escaped, cut
// to keep messages (and websocket close reasons) short.
func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strconv.QuoteToASCII(s)
}
