package target

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// The gateway side's own check of what it writes into a gateway. The
// coordinator checks every agent string on receipt; heft-sync and the
// renderings check again here, so that nothing an agent said becomes a
// gateway directive even when it got past the coordinator (an older one,
// a bug, a hand-edited state file).

// MaxAddress bounds a worker's host:port: a DNS name (253) and a port.
const MaxAddress = 253 + 1 + 5

// CheckAddress reports why addr is not a host:port a gateway may dial:
// the host must be an IP literal (IPv6 in brackets, no zone, not the
// unspecified address or a multicast one) or a DNS name of letters,
// digits, '-' and '_' in dot-separated labels, and the port a number in
// 1–65535. It refuses, among others, nginx's "unix:" socket prefix, any
// whitespace, quote, ';', '{', '}', '#' or control character, and a name
// that a resolver would read as a number ("2130706433", "0x7f.1").
func CheckAddress(addr string) error {
	if addr == "" {
		return errors.New("address is empty")
	}
	if len(addr) > MaxAddress {
		return fmt.Errorf("address of %d bytes is longer than %d", len(addr), MaxAddress)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q is not host:port", addr)
	}
	if err := checkPort(port); err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if strings.Contains(addr, "[") {
		// Brackets only around an IPv6 literal, as net.JoinHostPort writes it.
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.Is6() || "["+host+"]:"+port != addr {
			return fmt.Errorf("address %q: brackets hold only an IPv6 address", addr)
		}
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if err := checkIP(ip); err != nil {
			return fmt.Errorf("address %q: %w", addr, err)
		}
		if ip.Is6() && !strings.HasPrefix(addr, "[") {
			return fmt.Errorf("address %q: an IPv6 address goes in brackets", addr)
		}
		return nil
	}
	if err := checkHostName(host); err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	return nil
}

func checkPort(port string) error {
	if port == "" || len(port) > 5 {
		return fmt.Errorf("port %q is not a number in 1-65535", port)
	}
	for _, r := range port {
		if r < '0' || r > '9' {
			return fmt.Errorf("port %q is not a number in 1-65535", port)
		}
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number in 1-65535", port)
	}
	return nil
}

// checkIP refuses addresses no worker listens on.
func checkIP(ip netip.Addr) error {
	switch {
	case ip.Zone() != "":
		return errors.New("an IPv6 zone is not taken")
	case ip.Unmap().IsUnspecified():
		return fmt.Errorf("%s is the unspecified address", ip)
	case ip.Unmap().IsMulticast():
		return fmt.Errorf("%s is a multicast address", ip)
	case ip.Unmap() == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return errors.New("255.255.255.255 is the broadcast address")
	}
	return nil
}

func checkHostName(host string) error {
	if host == "" || len(host) > 253 {
		return fmt.Errorf("host name of %d bytes: want 1-253", len(host))
	}
	if strings.EqualFold(host, "unix") {
		return errors.New(`host "unix" is nginx's unix-socket prefix`)
	}
	labels := strings.Split(host, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("host %q: a label is empty or longer than 63", host)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("host %q: a label starts or ends with '-'", host)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("host %q: %q is not a letter, digit, '-' or '_'", host, rune(c))
			}
		}
	}
	if last := labels[len(labels)-1]; isNumeric(last) {
		return fmt.Errorf("host %q: a name whose last label is a number reads as an IP address", host)
	}
	return nil
}

// isNumeric reports whether s reads as a number to inet_aton: decimal,
// or hex with 0x.
func isNumeric(s string) bool {
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	if t == "" {
		return s != ""
	}
	hex := t != s
	for _, c := range t {
		if !(c >= '0' && c <= '9' || hex && (c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F')) {
			return false
		}
	}
	return true
}

// maxCount bounds max_concurrency and max_context_tokens as written: far
// above any engine's, and within every gateway's integer range.
const maxCount = 1 << 30

// CheckBackend reports why b cannot be written into a gateway as given.
func CheckBackend(b Backend) error {
	if err := CheckAddress(b.Address); err != nil {
		return err
	}
	if b.Scheme != "http" && b.Scheme != "https" {
		return fmt.Errorf("scheme %q is not http or https", b.Scheme)
	}
	if b.Serving && !(b.Weight > 0 && !math.IsInf(b.Weight, 0)) {
		return fmt.Errorf("weight %g is not a positive number", b.Weight)
	}
	return nil
}

// Clean returns m with only the backends a gateway may be given, one per
// address, and why each other one is left out. Counts a gateway cannot
// take (a negative or absurd max_concurrency) are dropped to "unknown".
func Clean(m Model) (Model, []string) {
	out := Model{Name: m.Name, Backends: make([]Backend, 0, len(m.Backends))}
	var leftOut []string
	seen := map[string]bool{}
	for _, b := range m.Backends {
		if err := CheckBackend(b); err != nil {
			leftOut = append(leftOut, fmt.Sprintf("worker %s left out: %v", Printable(b.WorkerID), err))
			continue
		}
		if seen[b.Address] {
			leftOut = append(leftOut, fmt.Sprintf("worker %s left out: a second worker at %s", Printable(b.WorkerID), b.Address))
			continue
		}
		seen[b.Address] = true
		if b.MaxConcurrency < 0 || b.MaxConcurrency > maxCount {
			b.MaxConcurrency = 0
		}
		if b.MaxContextTokens < 0 || b.MaxContextTokens > maxCount {
			b.MaxContextTokens = 0
		}
		out.Backends = append(out.Backends, b)
	}
	return out, leftOut
}

// maxPrintable bounds an agent string written into a comment or a log.
const maxPrintable = 200

// Printable returns s as it may be written into a gateway's comment or a
// log line: unchanged when it is printable ASCII, else quoted with every
// other byte escaped (a newline, a '\r', Unicode's line separators and
// direction overrides included), so it cannot end the comment; clipped to
// 200 bytes either way.
func Printable(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			clean = false
			break
		}
	}
	if !clean {
		s = strconv.QuoteToASCII(s)
	}
	if len(s) > maxPrintable {
		s = s[:maxPrintable-3] + "..."
	}
	return s
}
