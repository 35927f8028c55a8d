package haproxy_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/coord"
	"heft/gateway/gwtest"
	"heft/gateway/haproxy"
	"heft/gateway/target"
	"heft/shared/testutil"
	"heft/shared/view"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

const model = "Qwen/Qwen3-8B"

// The configuration every HAProxy example of heft uses: http-no-delay so
// the first streamed token is not held back, and slots for workers the
// file does not list.
const cfgByAddress = `global
    stats socket {{socket}} level admin
defaults
    mode http
    option http-no-delay
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend fe
    bind {{front}}
    default_backend qwen
backend qwen
    balance roundrobin
    server gpu-a {{a}} weight 1
    server not-heft {{u}} weight 7
    server-template heft 1-3 127.0.0.1:9 disabled
`

func desired(ws ...coord.Worker) target.Model {
	m, _ := target.ForModel(model, ws)
	return m
}

func logger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug})
}

func newTarget(t *testing.T, cfg haproxy.Config) *haproxy.HAProxy {
	t.Helper()
	cfg.Model = model
	h, err := haproxy.New(cfg, logger(t))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func apply(t *testing.T, h *haproxy.HAProxy, m target.Model) target.Result {
	t.Helper()
	res, err := h.Apply(context.Background(), m)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return res
}

// within checks that got is want ± tol (relative).
func within(t *testing.T, what string, got, want int, tol float64) {
	t.Helper()
	if math.Abs(float64(got-want)) > tol*float64(want)+1 {
		t.Errorf("%s: got %d requests, want %d ± %.0f%%", what, got, want, tol*100)
	}
}

func TestWeightsSplitRealRequests(t *testing.T) {
	a, b, c, u := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b"), gwtest.NewUpstream(t, "c"), gwtest.NewUpstream(t, "unknown")
	hx := gwtest.StartHAProxy(t, strings.NewReplacer("{{a}}", a.Addr, "{{u}}", u.Addr).Replace(cfgByAddress))
	h := newTarget(t, haproxy.Config{Socket: hx.Socket, Backend: "qwen"})
	if err := h.Check(context.Background()); err != nil {
		t.Fatal(err)
	}

	// PRODUCT.md's first result: weights 1.37 and 0.63; a third worker held.
	m := desired(
		gwtest.Worker(model, a.Addr, view.StateAdmitted, 1.37),
		gwtest.Worker(model, b.Addr, view.StateAdmitted, 0.63),
		gwtest.Worker(model, c.Addr, view.StateHeld, 0),
	)
	res := apply(t, h, m)
	if res.Serving != 2 || res.RoundingError > 1e-9 || len(res.Changes) == 0 {
		t.Fatalf("result %+v", res)
	}
	if again := apply(t, h, m); len(again.Changes) != 0 {
		t.Fatalf("a second apply changed %v", again.Changes)
	}
	// roundrobin over 137 + 63 + 7 (the server heft does not know keeps its weight).
	split := gwtest.Split(t, "http://"+hx.Front+"/", 414)
	within(t, "a (137)", split["a"], 274, 0.03)
	within(t, "b (63)", split["b"], 126, 0.03)
	within(t, "unknown (7)", split["unknown"], 14, 0.15)
	if split["c"] != 0 {
		t.Errorf("the held worker got %d requests", split["c"])
	}
	t.Logf("split over 414 requests at weights 137/63/7: %v", split)

	// b is held, c admitted: b's slot drains, c takes a free slot.
	m = desired(
		gwtest.Worker(model, a.Addr, view.StateAdmitted, 1.0),
		gwtest.Worker(model, b.Addr, view.StateHeld, 0),
		gwtest.Worker(model, c.Addr, view.StateAdmitted, 1.0),
	)
	apply(t, h, m)
	split = gwtest.Split(t, "http://"+hx.Front+"/", 90)
	if split["b"] != 0 || split["a"] == 0 || split["c"] == 0 {
		t.Fatalf("after b was held: %v", split)
	}

	// A restart loses every runtime change; applying again puts them back.
	hx.Restart()
	res = apply(t, h, m)
	if len(res.Changes) == 0 {
		t.Fatal("the restarted haproxy was not seen to differ")
	}
	split = gwtest.Split(t, "http://"+hx.Front+"/", 90)
	if split["b"] != 0 || split["c"] == 0 {
		t.Fatalf("after the restart: %v", split)
	}

	// Every worker held: every heft server drains; only the server heft
	// does not know is left to answer.
	apply(t, h, desired(
		gwtest.Worker(model, a.Addr, view.StateHeld, 0),
		gwtest.Worker(model, b.Addr, view.StateOffline, 0),
		gwtest.Worker(model, c.Addr, view.StatePending, 0),
	))
	split = gwtest.Split(t, "http://"+hx.Front+"/", 20)
	if split["unknown"] != 20 {
		t.Fatalf("all held: %v", split)
	}
}

// With servers kept in weight order in slots, "balance first" sends a
// quiet fleet's requests to the fastest worker, and follows a change of
// order.
func TestSlotsInWeightOrder(t *testing.T) {
	a, b, c := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b"), gwtest.NewUpstream(t, "c")
	hx := gwtest.StartHAProxy(t, `global
    stats socket {{socket}} level admin
defaults
    mode http
    option http-no-delay
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend fe
    bind {{front}}
    default_backend qwen
backend qwen
    balance first
    server-template heft 1-4 127.0.0.1:9 disabled maxconn 16
`)
	h := newTarget(t, haproxy.Config{Socket: hx.Socket, Backend: "qwen", Order: haproxy.OrderWeight})
	apply(t, h, desired(
		gwtest.Worker(model, a.Addr, view.StateAdmitted, 0.3),
		gwtest.Worker(model, b.Addr, view.StateAdmitted, 2.2),
		gwtest.Worker(model, c.Addr, view.StateAdmitted, 1.0),
	))
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 30); split["b"] != 30 {
		t.Fatalf("sequential requests with b heaviest: %v, want all 30 on b", split)
	}
	apply(t, h, desired(
		gwtest.Worker(model, a.Addr, view.StateAdmitted, 3.1),
		gwtest.Worker(model, b.Addr, view.StateAdmitted, 2.2),
		gwtest.Worker(model, c.Addr, view.StateAdmitted, 1.0),
	))
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 30); split["a"] != 30 {
		t.Fatalf("sequential requests with a heaviest: %v, want all 30 on a", split)
	}
}

func TestAddServersAndMaxConn(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	hx := gwtest.StartHAProxy(t, `global
    stats socket {{socket}} level admin
defaults
    mode http
    option http-no-delay
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend fe
    bind {{front}}
    default_backend qwen
backend qwen
    balance roundrobin
    option httpchk GET /health
    server gpu-a `+a.Addr+` weight 1
`)
	h := newTarget(t, haproxy.Config{Socket: hx.Socket, Backend: "qwen", AddServers: true, MaxConn: true})
	wa := gwtest.Worker(model, a.Addr, view.StateAdmitted, 1)
	wb := gwtest.Worker(model, b.Addr, view.StateAdmitted, 1)
	mc := 24
	wb.MaxConcurrency = &mc
	res := apply(t, h, desired(wa, wb))
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 40); split["a"] != 20 || split["b"] != 20 {
		t.Fatalf("with b added: %v (changes %v)", split, res.Changes)
	}
	if !strings.Contains(strings.Join(res.Changes, "\n"), "set maxconn server qwen/heft-127.0.0.1-") {
		t.Fatalf("no maxconn set: %v", res.Changes)
	}
	if again := apply(t, h, desired(wa, wb)); len(again.Changes) != 0 {
		t.Fatalf("a second apply changed %v", again.Changes)
	}
	// The added server has the gateway's own health check (the backend's
	// httpchk): its engine dying takes it out with nothing from heft.
	added := func() map[string]string {
		for _, row := range hx.Stat(t) {
			if row["pxname"] == "qwen" && row["addr"] == b.Addr {
				return row
			}
		}
		return nil
	}
	testutil.Eventually(t, "a health check of the added server", 10*time.Second, func() bool { return added()["check_status"] == "L7OK" })
	b.Stop()
	testutil.Eventually(t, "the added server's check to mark it down", 30*time.Second, func() bool {
		return strings.HasPrefix(added()["status"], "DOWN")
	})
	// b gone from the coordinator: its added server is removed.
	// (HAProxy deletes it once no connection is attached to it.)
	deleted := false
	testutil.Eventually(t, "the added server to be deleted", 10*time.Second, func() bool {
		res = apply(t, h, desired(wa))
		deleted = deleted || strings.Contains(strings.Join(res.Changes, "\n"), "del server")
		return deleted
	})
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 10); split["a"] != 10 {
		t.Fatalf("after b left: %v", split)
	}
}

func TestBadGateway(t *testing.T) {
	ctx := context.Background()
	a := gwtest.NewUpstream(t, "a")
	hx := gwtest.StartHAProxy(t, strings.NewReplacer("{{a}}", a.Addr, "{{u}}", a.Addr).Replace(cfgByAddress))

	h := newTarget(t, haproxy.Config{Socket: hx.Socket, Backend: "no-such-backend"})
	err := h.Check(ctx)
	if target.Reason(err) != target.ReasonNoBackend || !strings.Contains(err.Error(), "qwen") {
		t.Fatalf("a missing backend: %v (reason %s); want no_backend naming the backends there are", err, target.Reason(err))
	}
	_, err = h.Apply(ctx, desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1)))
	if target.Reason(err) != target.ReasonNoBackend {
		t.Fatalf("apply to a missing backend: %v", err)
	}

	gone := newTarget(t, haproxy.Config{Socket: hx.Dir + "/nothing.sock", Backend: "qwen"})
	if err := gone.Check(ctx); target.Reason(err) != target.ReasonUnreachable {
		t.Fatalf("a socket that is not there: %v", err)
	}

	// A TCP port that answers nothing useful.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprint(c, "HTTP/1.0 400 Bad Request\r\n\r\n")
			c.Close()
		}
	}()
	defer ln.Close()
	junk := newTarget(t, haproxy.Config{Socket: ln.Addr().String(), Backend: "qwen"})
	if err := junk.Check(ctx); err == nil {
		t.Fatal("a port that is not HAProxy's runtime API passed the check")
	}
}

// The TCP form of the stats socket works as the unix one does.
func TestTCPSocket(t *testing.T) {
	a, u := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "unknown")
	port := gwtest.FreePort(t)
	cfg := strings.NewReplacer("{{a}}", a.Addr, "{{u}}", u.Addr).Replace(cfgByAddress)
	cfg = strings.Replace(cfg, "global\n", fmt.Sprintf("global\n    stats socket ipv4@127.0.0.1:%d level admin\n", port), 1)
	gwtest.StartHAProxy(t, cfg)
	h := newTarget(t, haproxy.Config{Socket: fmt.Sprintf("127.0.0.1:%d", port), Backend: "qwen"})
	res := apply(t, h, desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1.5)))
	if res.Serving != 1 {
		t.Fatalf("result %+v", res)
	}
}
