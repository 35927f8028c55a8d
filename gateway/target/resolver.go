package target

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"
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

	mu    sync.Mutex
	last  map[string]remembered // by address text (host:port)
	tick  uint64
	file  string // the answers file (KeepAnswers); "" keeps none
	dirty bool   // an answer changed since the file was written or read

	saveMu sync.Mutex
	saved  []byte // the answers file's content as last written
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
// last changed (the zero AddrPort when it has not changed since r began,
// or since a heft-sync before it began, with its answers file).
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
	if !known || next.addr != old.addr || next.prev != old.prev {
		r.dirty = true
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
	r.dirty = true
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
// one server to a gateway: the one that Wins is kept, with its own Prev
// (else the other's: either was heft's at that engine's old address), and
// the other is in dropped. With an answers file, what changed is written
// (a failed write is in err, ReasonWrite).
func (r *Resolver) ResolveAll(ctx context.Context, bs []Backend) (out []Resolved, dropped []string, err error) {
	var errs []error
	at := map[netip.AddrPort]int{} // index in out
	for i, ans := range r.lookupAll(ctx, bs) {
		b, a, prev, err := bs[i], ans.addr, ans.prev, ans.err
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
			if prev.IsValid() {
				// The winner's own old address, not the loser's: else the
				// server or endpoint heft left it at would stay.
				out[i].Prev = prev
			}
		} else if !out[i].Prev.IsValid() {
			out[i].Prev = prev
		}
		dropped = append(dropped, fmt.Sprintf("worker %s left out: %s resolves to %s, the address of worker %s",
			Printable(loser.WorkerID), Printable(loser.Address), a, Printable(out[i].WorkerID)))
	}
	if err := r.saveAnswers(); err != nil {
		errs = append(errs, err)
	}
	return out, dropped, errors.Join(errs...)
}

// lookupTimeout bounds one name's lookup, and lookupsAtOnce how many run
// together: a resolver that answers nothing (a blackholed DNS server) then
// costs an apply seconds, not the whole apply's minute for the first names
// and a failed gateway read for the rest (the lookups ran one after
// another, each until the resolver's own timeouts). 8 s leaves room for
// one dead name server before a live one (5 s each by default).
var lookupTimeout = 8 * time.Second

const lookupsAtOnce = 32

type answer struct {
	addr, prev netip.AddrPort
	err        error
}

// lookupAll resolves every backend's address, in bs's order.
func (r *Resolver) lookupAll(ctx context.Context, bs []Backend) []answer {
	out := make([]answer, len(bs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(lookupsAtOnce, len(bs)) {
		wg.Go(func() {
			for i := range next {
				lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
				out[i].addr, out[i].prev, out[i].err = r.resolveMoved(lctx, bs[i].Address)
				cancel()
			}
		})
	}
	for i := range bs {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
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
