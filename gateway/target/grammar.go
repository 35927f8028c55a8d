package target

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"

	"heft/shared/grammar"
)

// The gateway side's own check of what it writes into a gateway. The
// coordinator checks every agent string on receipt (shared/grammar);
// heft-sync and the renderings check again here, with the same grammar
// and a few refusals of their own, so that nothing an agent said becomes a
// gateway directive even when it got past the coordinator (an older one,
// a bug, a hand-edited state file).

// MaxAddress bounds a worker's host:port: a DNS name (253), brackets, a
// colon and a port.
const MaxAddress = 253 + 2 + 1 + 5

// CheckAddress reports why addr is not a host:port a gateway may dial:
// grammar.Address (an IP literal, IPv6 in brackets, or a DNS name of
// letters, digits, '-' and '_'; a port in 1–65535; never nginx's "unix:"
// prefix, whitespace, a quote, ';', '{', '}', '#' or a control character),
// and not the unspecified, a multicast or the broadcast address, which no
// worker listens on.
func CheckAddress(addr string) error {
	if len(addr) > MaxAddress {
		return fmt.Errorf("address of %d bytes is longer than %d", len(addr), MaxAddress)
	}
	if err := grammar.Address(addr); err != nil {
		return err
	}
	host, _, _ := net.SplitHostPort(addr)
	if ip, err := netip.ParseAddr(host); err == nil {
		if err := checkIP(ip); err != nil {
			return fmt.Errorf("address %s: %w", Printable(addr), err)
		}
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
