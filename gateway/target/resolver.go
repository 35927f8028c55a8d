package target

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
)

// A failed lookup on the gateway host is a fault of the control plane (its
// resolver), not evidence about the engine, so it must not take a worker
// out of a gateway: a Resolver keeps each address's last good answer and
// falls back to it.

// maxRemembered bounds what a Resolver keeps: far more addresses than a
// model has workers.
const maxRemembered = 4096

// Resolver resolves worker addresses for a gateway that takes only IP
// addresses, remembering the last good answer of each. It is safe for
// concurrent use.
type Resolver struct {
	lookup LookupFunc

	mu   sync.Mutex
	last map[string]remembered // by address text (host:port)
	tick uint64
}

type remembered struct {
	addr netip.AddrPort
	prev netip.AddrPort // the answer before addr, when the answer changed
	used uint64         // tick of the last use: the least recently used goes first
}

// NewResolver returns a Resolver that looks names up with lookup (nil: the
// system's resolver).
func NewResolver(lookup LookupFunc) *Resolver {
	if lookup == nil {
		lookup = lookupDefault
	}
	return &Resolver{lookup: lookup, last: map[string]remembered{}}
}

// Resolve is the package's Resolve, but when it fails it also returns the
// last good answer for addr, if any: a valid AddrPort with an error is
// usable but may be stale; the zero AddrPort means nothing is known.
func (r *Resolver) Resolve(ctx context.Context, addr string) (netip.AddrPort, error) {
	a, _, err := r.resolveMoved(ctx, addr)
	return a, err
}

// resolveMoved is Resolve, with what addr resolved to before its answer
// last changed (the zero AddrPort when it has not changed since r began).
func (r *Resolver) resolveMoved(ctx context.Context, addr string) (a, prev netip.AddrPort, err error) {
	a, err = resolve(ctx, addr, r.lookup)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tick++
	old, known := r.last[addr]
	if err != nil {
		if !known {
			return netip.AddrPort{}, netip.AddrPort{}, err
		}
		old.used = r.tick
		r.last[addr] = old
		return old.addr, old.prev, err
	}
	if !known && len(r.last) >= maxRemembered {
		r.forgetOldest()
	}
	next := remembered{addr: a, prev: old.prev, used: r.tick}
	if known && old.addr != a {
		next.prev = old.addr
	}
	r.last[addr] = next
	return a, next.prev, nil
}

func (r *Resolver) forgetOldest() {
	var oldest string
	first := true
	for k, v := range r.last {
		if first || v.used < r.last[oldest].used {
			oldest, first = k, false
		}
	}
	delete(r.last, oldest)
}

// Resolved is a backend with the IP:port it resolved to. Addr is the zero
// AddrPort when its lookup failed and it never resolved before: a gateway
// then leaves whatever server may carry it as it is.
type Resolved struct {
	Backend
	Addr netip.AddrPort
	// Prev is what it resolved to before its answer last changed, if the
	// answer changed since the Resolver began: where a gateway may still
	// carry it.
	Prev netip.AddrPort
}

// ResolveAll resolves bs (one backend per address text, as Clean leaves
// them). A failed lookup falls back to the last good address and is in err
// (ReasonResolve) either way. Two backends that resolve to one IP:port are
// one server to a gateway: the one that Wins is kept and the other is in
// dropped.
func (r *Resolver) ResolveAll(ctx context.Context, bs []Backend) (out []Resolved, dropped []string, err error) {
	var errs []error
	at := map[netip.AddrPort]int{} // index in out
	for _, b := range bs {
		a, prev, err := r.resolveMoved(ctx, b.Address)
		switch {
		case err != nil && a.IsValid():
			errs = append(errs, Failf(ReasonResolve, "worker %s: %v; kept at its last good address %s", Printable(b.WorkerID), err, a))
		case err != nil:
			errs = append(errs, Failf(ReasonResolve, "worker %s: %v; no address known for it yet, so the gateway keeps what it has", Printable(b.WorkerID), err))
			out = append(out, Resolved{Backend: b})
			continue
		}
		i, dup := at[a]
		if !dup {
			at[a] = len(out)
			out = append(out, Resolved{Backend: b, Addr: a, Prev: prev})
			continue
		}
		loser := b
		if Wins(b, out[i].Backend) {
			loser, out[i].Backend = out[i].Backend, b
		}
		dropped = append(dropped, fmt.Sprintf("worker %s left out: %s resolves to %s, the address of worker %s",
			Printable(loser.WorkerID), Printable(loser.Address), a, Printable(out[i].WorkerID)))
	}
	return out, dropped, errors.Join(errs...)
}

// Wins reports whether a rather than b is kept when both are at one
// IP:port: a serving worker over one that is not, so that a held or
// offline worker never drains a serving one; then the smaller worker ID.
// This is ForSelection's rule without its measurement time, which a
// Backend does not carry.
func Wins(a, b Backend) bool {
	if a.Serving != b.Serving {
		return a.Serving
	}
	return a.WorkerID < b.WorkerID
}
