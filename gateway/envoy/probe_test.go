package envoy_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"heft/gateway/envoy"
	"heft/gateway/gwtest"
	"heft/shared/view"
)

// Probe tells an xDS server from anything else on an address, over real
// gRPC: heft-sync's server that published answers with its version and
// the asked clusters it publishes; one that published nothing holds the
// stream open; a gRPC server without EDS, a listener that never answers
// and one that hangs up are not xDS servers.
func TestProbeTellsAnXDSServerFromAnythingElse(t *testing.T) {
	ctx := context.Background()
	s := startServer(t)
	if _, err := s.Cluster(model, "qwen").Apply(ctx, desired(
		gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1),
		gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 2),
	)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a, err := envoy.Probe(ctx, s.Addr(), []string{"qwen", "other"}, 10*time.Second)
	if err != nil || a.Version != "1" || len(a.Endpoints) != 1 || a.Endpoints["qwen"] != 2 {
		t.Fatalf("published: %+v, %v", a, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the answer took %s: an xDS server that published answers at once", d)
	}

	a, err = envoy.Probe(ctx, startServer(t).Addr(), []string{"qwen"}, 300*time.Millisecond)
	if err != nil || a.Version != "" || a.Endpoints != nil {
		t.Fatalf("nothing published: %+v, %v; want the stream held open and no error", a, err)
	}

	bare, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	served := make(chan struct{})
	go func() { _ = gs.Serve(bare); close(served) }()
	t.Cleanup(func() { gs.Stop(); <-served })
	if _, err := envoy.Probe(ctx, bare.Addr().String(), []string{"qwen"}, 10*time.Second); err == nil ||
		!strings.Contains(err.Error(), "no EDS service") {
		t.Errorf("gRPC without EDS: %v", err)
	}

	silent, err := net.Listen("tcp", "127.0.0.1:0") // never accepts: the kernel queues the connection
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if _, err := envoy.Probe(ctx, silent.Addr().String(), []string{"qwen"}, 300*time.Millisecond); err == nil ||
		!strings.Contains(err.Error(), "nothing that speaks gRPC answered on "+silent.Addr().String()) {
		t.Errorf("silent listener: %v", err)
	}

	hangup, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for {
			c, err := hangup.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { hangup.Close(); <-closed })
	if _, err := envoy.Probe(ctx, hangup.Addr().String(), []string{"qwen"}, 10*time.Second); err == nil ||
		!strings.Contains(err.Error(), hangup.Addr().String()+" does not answer as an xDS server") {
		t.Errorf("listener that hangs up: %v", err)
	}
}

// A wildcard listen address is dialled on loopback.
func TestProbeDialsWildcardOnLoopback(t *testing.T) {
	for listen, want := range map[string]string{
		":18000":          "127.0.0.1:18000",
		"0.0.0.0:18000":   "127.0.0.1:18000",
		"[::]:18000":      "[::1]:18000",
		"10.0.0.2:18000":  "10.0.0.2:18000",
		"localhost:18000": "localhost:18000",
	} {
		if got := envoy.DialAddr(listen); got != want {
			t.Errorf("%s: %s, want %s", listen, got, want)
		}
	}
}

// A Detached server builds clusters but neither serves nor publishes.
func TestDetachedServerDoesNotServe(t *testing.T) {
	s := envoy.Detached("127.0.0.1:18000", hclog.NewNullLogger())
	if s.Addr() != "127.0.0.1:18000" || s.Close() != nil {
		t.Fatalf("addr %s", s.Addr())
	}
	if err := s.Run(context.Background()); err == nil {
		t.Fatal("a detached server ran")
	}
}
