package haproxy_test

import (
	"context"
	"strings"
	"testing"

	"heft/gateway/gwtest"
	"heft/gateway/haproxy"
	"heft/gateway/target"
	"heft/shared/view"
)

// An address no gateway may be given never reaches the runtime API: the
// worker is left out and reported, with no resolve attempted and no error,
// and the good worker gets its slot. Before, "0.0.0.0:80" and
// "224.0.0.1:80" took slots, and "unix:80" was looked up in DNS, a failure
// that marked the target down.
func TestHostileAddressesNeverReachTheSocket(t *testing.T) {
	a, u := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "unknown")
	hx := gwtest.StartHAProxy(t, strings.NewReplacer("{{a}}", a.Addr, "{{u}}", u.Addr).Replace(cfgByAddress))
	h := newTarget(t, haproxy.Config{Socket: hx.Socket, Backend: "qwen"})
	b := gwtest.NewUpstream(t, "b")
	m := desired(gwtest.Worker(model, b.Addr, view.StateAdmitted, 1))
	for _, addr := range []string{"unix:80", "0.0.0.0:80", "localhost:80\nset server qwen/gpu-a addr 10.9.9.9", "[::1]:x", "224.0.0.1:80"} {
		m.Backends = append(m.Backends, target.Backend{Address: addr, Scheme: "http", WorkerID: "w-" + addr, State: view.StateAdmitted, Serving: true, Weight: 1})
	}
	res, err := h.Apply(context.Background(), m)
	if err != nil || res.Serving != 1 || len(res.Dropped) != 5 {
		t.Fatalf("apply: %+v %v", res, err)
	}
	for _, c := range res.Changes {
		if strings.Contains(c, "0.0.0.0") || strings.Contains(c, "10.9.9.9") || strings.Contains(c, "224.") {
			t.Errorf("a command carried a hostile address: %q", c)
		}
	}
	split := gwtest.Split(t, "http://"+hx.Front+"/", 10)
	if split["b"] == 0 {
		t.Errorf("the good worker gets no request: %v", split)
	}
}
