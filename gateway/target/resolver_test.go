package target

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeLookup answers from names; a name missing from it fails, as does
// every name while down.
type fakeLookup struct {
	mu    sync.Mutex
	names map[string]string
	down  bool
	calls int
}

func (f *fakeLookup) lookup(_ context.Context, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	a, ok := f.names[host]
	if f.down || !ok {
		return nil, errors.New("resolver unreachable")
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}

func (f *fakeLookup) set(host, addr string, down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.names[host], f.down = addr, down
}

// A failed lookup falls back to the last good answer (with the error, so
// it is seen); a good one replaces it (DNS changes are legitimate).
func TestResolverKeepsLastGoodAddress(t *testing.T) {
	f := &fakeLookup{names: map[string]string{}}
	r := NewResolver(f.lookup)
	ctx := context.Background()
	if a, err := r.Resolve(ctx, "gpu-a:8000"); err == nil || a.IsValid() {
		t.Fatalf("never resolved: %v %v, want an error and no address", a, err)
	}
	f.set("gpu-a", "10.0.0.1", false)
	if a, err := r.Resolve(ctx, "gpu-a:8000"); err != nil || a != netip.MustParseAddrPort("10.0.0.1:8000") {
		t.Fatalf("resolved: %v %v", a, err)
	}
	f.set("gpu-a", "10.0.0.1", true)
	if a, err := r.Resolve(ctx, "gpu-a:8000"); err == nil || a != netip.MustParseAddrPort("10.0.0.1:8000") {
		t.Fatalf("while down: %v %v, want the last good address and the error", a, err)
	}
	f.set("gpu-a", "10.0.0.2", false)
	if a, err := r.Resolve(ctx, "gpu-a:8000"); err != nil || a != netip.MustParseAddrPort("10.0.0.2:8000") {
		t.Fatalf("after a DNS change: %v %v", a, err)
	}
	calls := f.calls
	if a, err := r.Resolve(ctx, "127.0.0.1:9000"); err != nil || a != netip.MustParseAddrPort("127.0.0.1:9000") || f.calls != calls {
		t.Fatalf("an IP literal: %v %v, looked up %d times", a, err, f.calls-calls)
	}
}

// What a Resolver keeps is bounded; the least recently used goes first.
func TestResolverIsBounded(t *testing.T) {
	f := &fakeLookup{names: map[string]string{}}
	r := NewResolver(f.lookup)
	ctx := context.Background()
	for i := range maxRemembered + 1 {
		host := fmt.Sprintf("gpu-%d", i)
		f.set(host, "10.0.0.1", false)
		if _, err := r.Resolve(ctx, host+":80"); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			continue
		}
		if _, err := r.Resolve(ctx, "gpu-0:80"); err != nil { // used again: kept
			t.Fatal(err)
		}
	}
	if len(r.last) != maxRemembered {
		t.Fatalf("keeps %d addresses, want %d", len(r.last), maxRemembered)
	}
	if _, ok := r.last["gpu-0:80"]; !ok {
		t.Fatal("forgot the address used last")
	}
	if _, ok := r.last["gpu-1:80"]; ok {
		t.Fatal("kept the least recently used address")
	}
}

func TestResolverConcurrent(t *testing.T) {
	f := &fakeLookup{names: map[string]string{"gpu-a": "10.0.0.1"}}
	r := NewResolver(f.lookup)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				_, _ = r.Resolve(context.Background(), fmt.Sprintf("gpu-a:%d", 8000+(i*50+j)%20))
			}
		})
	}
	wg.Wait()
}

// Two workers whose address texts differ but resolve to one IP:port are
// one server: the serving one is kept whatever the order, and the other
// is reported as left out.
func TestResolveAllOneBackendPerAddress(t *testing.T) {
	f := &fakeLookup{names: map[string]string{"localhost": "127.0.0.1", "gpu-b": "127.0.0.1"}}
	r := NewResolver(f.lookup)
	admitted := Backend{Address: "127.0.0.1:8000", WorkerID: "w-z-new", State: "admitted", Serving: true, Weight: 1}
	offline := Backend{Address: "localhost:8000", WorkerID: "w-a-old", State: "offline"}
	for _, bs := range [][]Backend{{admitted, offline}, {offline, admitted}} {
		rs, dropped, err := r.ResolveAll(context.Background(), bs)
		if err != nil || len(rs) != 1 || rs[0].WorkerID != "w-z-new" || rs[0].Addr != netip.MustParseAddrPort("127.0.0.1:8000") {
			t.Fatalf("resolved %+v, %v: want only the admitted worker", rs, err)
		}
		if len(dropped) != 1 || !strings.HasPrefix(dropped[0], "worker w-a-old left out: ") {
			t.Fatalf("dropped %q", dropped)
		}
	}
	// Two serving ones: the smaller worker ID, whatever the order.
	other := Backend{Address: "gpu-b:8000", WorkerID: "w-b", State: "admitted", Serving: true, Weight: 2}
	for _, bs := range [][]Backend{{admitted, other}, {other, admitted}} {
		rs, dropped, _ := r.ResolveAll(context.Background(), bs)
		if len(rs) != 1 || rs[0].WorkerID != "w-b" || len(dropped) != 1 {
			t.Fatalf("resolved %+v, dropped %q", rs, dropped)
		}
	}
}

// A backend that never resolved is kept with no address, and its error
// says so; one with a last good address keeps it.
func TestResolveAllReportsFailures(t *testing.T) {
	f := &fakeLookup{names: map[string]string{"gpu-a": "10.0.0.1"}}
	r := NewResolver(f.lookup)
	bs := []Backend{{Address: "gpu-a:8000", WorkerID: "a", Serving: true, Weight: 1}, {Address: "gpu-b:8000", WorkerID: "b", Serving: true, Weight: 1}}
	_, _, _ = r.ResolveAll(context.Background(), bs)
	f.set("gpu-a", "10.0.0.1", true)
	rs, _, err := r.ResolveAll(context.Background(), bs)
	if len(rs) != 2 || rs[0].Addr != netip.MustParseAddrPort("10.0.0.1:8000") || rs[1].Addr.IsValid() {
		t.Fatalf("resolved %+v", rs)
	}
	if Reason(err) != ReasonResolve || !strings.Contains(err.Error(), "last good address 10.0.0.1:8000") {
		t.Fatalf("error %v", err)
	}
}

// A resolver that answers nothing (a blackholed DNS server) costs an apply
// about one lookup's bound, whatever the number of names, and each name
// keeps its last good address. Before, the names were looked up one after
// another, each until the apply's own deadline was spent, which then
// failed the gateway's read too.
func TestSilentResolverCostsOneLookupBound(t *testing.T) {
	old := lookupTimeout
	lookupTimeout = 100 * time.Millisecond
	t.Cleanup(func() { lookupTimeout = old })
	var silent atomic.Bool
	r := NewResolver(func(ctx context.Context, host string) ([]netip.Addr, error) {
		if silent.Load() {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return []netip.Addr{netip.MustParseAddr("10.0.0.1")}, nil
	})
	var bs []Backend
	for i := range 40 {
		bs = append(bs, Backend{Address: fmt.Sprintf("gpu-%d:%d", i, 8000+i), WorkerID: fmt.Sprint(i), Serving: true, Weight: 1})
	}
	if _, _, err := r.ResolveAll(context.Background(), bs); err != nil {
		t.Fatal(err)
	}
	silent.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	rs, _, err := r.ResolveAll(ctx, bs)
	if took := time.Since(start); took > time.Second || ctx.Err() != nil {
		t.Fatalf("40 silent lookups took %s (the apply's deadline: %v)", took, ctx.Err())
	}
	if Reason(err) != ReasonResolve || len(rs) != len(bs) {
		t.Fatalf("resolved %d, %v: want every name at its last good address", len(rs), err)
	}
	for _, x := range rs {
		if !x.Addr.IsValid() {
			t.Fatalf("%s lost its last good address", x.Address)
		}
	}
}
