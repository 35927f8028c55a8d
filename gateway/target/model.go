package target

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"heft/shared/view"
)

// Backend is one worker as a gateway should see it.
type Backend struct {
	Address  string // host:port the gateway dials
	Scheme   string // "http" or "https", from the worker's URL
	WorkerID string
	Node     string
	Engine   string // the engine's kind (vllm, sglang, ...): its health route
	State    string // the coordinator's state
	// Serving is true for an admitted or stale worker (view.Serving) with
	// a positive weight: it gets Weight. Every other worker is drained: it
	// gets no new request.
	Serving bool
	Weight  float64
	// MaxConcurrency is what the worker runs at once; 0 while unknown.
	MaxConcurrency int
	// MaxContextTokens is the longest sequence the worker can hold (its
	// max_context_tokens); 0 while unknown.
	MaxContextTokens int64
}

// Model is a gateway's desired state for one model: every worker of the
// model, by address.
type Model struct {
	Name     string
	Backends []Backend // sorted by Address, one per address
}

// Equal reports whether two desired states are the same.
func (m Model) Equal(o Model) bool { return m.Name == o.Name && slices.Equal(m.Backends, o.Backends) }

// Serving returns the backends that get traffic, in Address order.
func (m Model) Serving() []Backend {
	var out []Backend
	for _, b := range m.Backends {
		if b.Serving {
			out = append(out, b)
		}
	}
	return out
}

// ForModel builds the desired state of model from the coordinator's
// workers, with their decode weights. Workers of other models are ignored.
// Problems are workers the gateway cannot use as the coordinator gives
// them, with why: left out (an address that cannot be read) or drained
// (admitted with a weight that is not above zero, which heft's own rules
// never give).
//
// Two workers can share an address: an engine restarted with other launch
// arguments is a new worker while the old one shows offline for a while.
// Then a serving worker wins over one that is not, and among equals the
// one measured last, so the gateway follows what runs there now.
func ForModel(model string, ws []view.Worker) (Model, []string) {
	return ForSelection(model, Selection{}, ws)
}

// ForSelection is ForModel for a target's Selection: with Kind
// view.WeightPrefill (a backend that takes long prompts) an admitted
// worker serves with its prefill weight, and one without (no valid prefill
// measurement yet) is drained; with MinContextTokens a worker not known to
// hold that many tokens is drained.
func ForSelection(model string, sel Selection, ws []view.Worker) (Model, []string) {
	m := Model{Name: model}
	var problems []string
	byAddr := map[string]int{}
	var measured []time.Time // per backend: when its worker was measured
	for _, w := range ws {
		if w.Model != model {
			continue
		}
		addr, scheme, err := Address(w)
		if err != nil {
			problems = append(problems, fmt.Sprintf("worker %s left out: %v", Printable(w.ID), err))
			continue
		}
		b := Backend{Address: addr, Scheme: scheme, WorkerID: w.ID, Node: w.Node, Engine: w.Engine, State: w.State}
		if w.MaxContextTokens != nil && *w.MaxContextTokens > 0 {
			b.MaxContextTokens = *w.MaxContextTokens
		}
		weight, which := w.Weight, "weight"
		if sel.Kind == view.WeightPrefill {
			weight, which = w.PrefillWeight, "prefill weight"
		}
		switch {
		case !view.Serving(w.State):
		case b.MaxContextTokens < sel.MinContextTokens:
			// Not known to hold this backend's conversations: drained.
		case w.Draining:
			// Its agent measures it (probe_busy "drain"): drained until
			// the probe ends.
		case weight != nil && *weight > 0 && !math.IsInf(*weight, 0):
			b.Serving, b.Weight = true, *weight
		case weight == nil && sel.Kind == view.WeightPrefill:
			// No valid prefill measurement yet: drained until it has one.
		case weight == nil:
			problems = append(problems, fmt.Sprintf("worker %s is %s without a weight: drained", Printable(w.ID), Printable(w.State)))
		default:
			problems = append(problems, fmt.Sprintf("worker %s is %s with %s %g: drained", Printable(w.ID), Printable(w.State), which, *weight))
		}
		if w.MaxConcurrency != nil {
			b.MaxConcurrency = *w.MaxConcurrency
		}
		var at time.Time
		if w.MeasuredAt != nil {
			at = *w.MeasuredAt
		}
		i, dup := byAddr[addr]
		if !dup {
			byAddr[addr] = len(m.Backends)
			m.Backends = append(m.Backends, b)
			measured = append(measured, at)
			continue
		}
		old := m.Backends[i]
		replace := b.Serving && !old.Serving ||
			b.Serving == old.Serving && (at.After(measured[i]) || at.Equal(measured[i]) && b.WorkerID < old.WorkerID)
		if replace {
			m.Backends[i], measured[i] = b, at
		}
	}
	slices.SortFunc(m.Backends, func(a, b Backend) int { return cmp.Compare(a.Address, b.Address) })
	return m, problems
}

// Address returns the host:port a gateway dials for w, and the scheme.
//
// A coordinator sends "address", the host:port of the agent's advertise
// URL (or of its URL when the agent offered none), with every worker. One
// older than that field sends none; for it the address is derived from
// "url", the engine URL the agent dialled, which is only right when the
// agent dialled the engine at an address the gateway reaches too. That
// fallback stays while such coordinators may run (they predate heft-sync,
// so it is cheap to keep); this is the one place that decides it.
func Address(w view.Worker) (addr, scheme string, err error) {
	scheme = "http"
	if u, perr := url.Parse(w.URL); perr == nil && u.Scheme == "https" {
		scheme = "https"
	}
	if w.Address != "" {
		if err := CheckAddress(w.Address); err != nil {
			return "", "", err
		}
		return w.Address, scheme, nil
	}
	u, err := url.Parse(w.URL)
	if err != nil || u.Host == "" {
		return "", "", fmt.Errorf("url %q has no host", w.URL)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		switch u.Scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		default:
			return "", "", fmt.Errorf("url %q has no port", w.URL)
		}
	}
	addr = net.JoinHostPort(host, port)
	if err := CheckAddress(addr); err != nil {
		return "", "", err
	}
	return addr, scheme, nil
}

// Resolve turns host:port into an IP address and port, preferring IPv4,
// for gateways that take only IP addresses (HAProxy's runtime API, Envoy
// EDS). A gateway driver resolves through a Resolver instead, which keeps
// the last good answer.
func Resolve(ctx context.Context, addr string) (netip.AddrPort, error) {
	return resolve(ctx, addr, lookupDefault)
}

// LookupFunc looks a host name up: net.DefaultResolver's LookupNetIP for
// "ip" unless a test gives its own.
type LookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

func lookupDefault(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// resolve is Resolve with lookup for host names; an IP literal is never
// looked up.
func resolve(ctx context.Context, addr string, lookup LookupFunc) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	p, err := net.LookupPort("tcp", port)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		if err := checkIP(ip); err != nil {
			return netip.AddrPort{}, err
		}
		return netip.AddrPortFrom(ip.Unmap(), uint16(p)), nil
	}
	ips, err := lookup(ctx, host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("resolve %s: %w", host, err)
	}
	if len(ips) == 0 {
		return netip.AddrPort{}, fmt.Errorf("resolve %s: no address", host)
	}
	best := ips[0]
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			best = ip
			break
		}
	}
	if err := checkIP(best); err != nil {
		return netip.AddrPort{}, fmt.Errorf("resolve %s: %w", host, err)
	}
	return netip.AddrPortFrom(best.Unmap(), uint16(p)), nil
}
