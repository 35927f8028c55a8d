package envoy_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"heft/gateway/coord"
	"heft/gateway/envoy"
	"heft/gateway/gwtest"
	"heft/gateway/target"
	"heft/shared/testutil"
	"heft/shared/view"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

const model = "Qwen/Qwen3-8B"

func desired(ws ...coord.Worker) target.Model {
	m, _ := target.ForModel(model, ws)
	return m
}

func startServer(t *testing.T) *envoy.Server {
	t.Helper()
	s, err := envoy.NewServer("127.0.0.1:0", hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// stream is either an EDS or an ADS stream: both send and receive
// DiscoveryRequest/Response.
type stream interface {
	Send(*discoveryv3.DiscoveryRequest) error
	Recv() (*discoveryv3.DiscoveryResponse, error)
}

// recv reads one response and decodes its assignments, by cluster.
func recv(t *testing.T, s stream) (*discoveryv3.DiscoveryResponse, map[string]*endpointv3.ClusterLoadAssignment) {
	t.Helper()
	type got struct {
		r   *discoveryv3.DiscoveryResponse
		err error
	}
	ch := make(chan got, 1)
	go func() { r, err := s.Recv(); ch <- got{r, err} }()
	var g got
	select {
	case g = <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no xds response within 10 s")
	}
	if g.err != nil {
		t.Fatal(g.err)
	}
	if g.r.TypeUrl != resourcev3.EndpointType {
		t.Fatalf("type %s", g.r.TypeUrl)
	}
	out := map[string]*endpointv3.ClusterLoadAssignment{}
	for _, a := range g.r.Resources {
		var cla endpointv3.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			t.Fatal(err)
		}
		out[cla.ClusterName] = &cla
	}
	return g.r, out
}

// weights returns address → load_balancing_weight.
func weights(cla *endpointv3.ClusterLoadAssignment) map[string]uint32 {
	out := map[string]uint32{}
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.LbEndpoints {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			out[sa.GetAddress()+":"+strconv.Itoa(int(sa.GetPortValue()))] = e.GetLoadBalancingWeight().GetValue()
		}
	}
	return out
}

func TestEDSOverRealGRPC(t *testing.T) {
	s := startServer(t)
	qwen := s.Cluster(model, "qwen")
	if _, err := qwen.Apply(context.Background(), desired(
		gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1.37),
		gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 0.63),
		gwtest.Worker(model, "10.0.0.3:8000", view.StateHeld, 0),
	)); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	eds, err := endpointservice.NewEndpointDiscoveryServiceClient(dial(t, s.Addr())).StreamEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "envoy-1", Cluster: "edge"}
	if err := eds.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"qwen"}}); err != nil {
		t.Fatal(err)
	}
	r1, clas := recv(t, eds)
	w := weights(clas["qwen"])
	if len(w) != 2 || w["10.0.0.1:8000"] != 137 || w["10.0.0.2:8000"] != 63 {
		t.Fatalf("first assignment %v, want 137/63 and the held worker absent", w)
	}
	// ACK, then change the weights: a new version arrives on the stream.
	if err := eds.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"qwen"},
		VersionInfo: r1.VersionInfo, ResponseNonce: r1.Nonce}); err != nil {
		t.Fatal(err)
	}
	res, err := qwen.Apply(context.Background(), desired(
		gwtest.Worker(model, "10.0.0.1:8000", view.StateOffline, 0),
		gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 1.0),
		gwtest.Worker(model, "10.0.0.3:8000", view.StateAdmitted, 2.22),
	))
	if err != nil || len(res.Changes) != 1 {
		t.Fatalf("second apply: %+v %v", res, err)
	}
	r2, clas := recv(t, eds)
	if r2.VersionInfo == r1.VersionInfo {
		t.Fatalf("the version did not advance: %s", r2.VersionInfo)
	}
	w = weights(clas["qwen"])
	if len(w) != 2 || w["10.0.0.3:8000"] != 111 || w["10.0.0.2:8000"] != 50 {
		t.Fatalf("second assignment %v, want 111/50 and the offline worker absent", w)
	}
	// The same state again publishes nothing.
	if res, err := qwen.Apply(context.Background(), desired(
		gwtest.Worker(model, "10.0.0.1:8000", view.StateOffline, 0),
		gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 1.0),
		gwtest.Worker(model, "10.0.0.3:8000", view.StateAdmitted, 2.22),
	)); err != nil || len(res.Changes) != 0 {
		t.Fatalf("an unchanged apply: %+v %v", res, err)
	}
}

// Over ADS, two clusters (two models) come from one server.
func TestADSTwoClusters(t *testing.T) {
	s := startServer(t)
	a, b := s.Cluster(model, "qwen"), s.Cluster("other", "other")
	if _, err := a.Apply(context.Background(), desired(gwtest.Worker(model, "127.0.0.1:8001", view.StateAdmitted, 1))); err != nil {
		t.Fatal(err)
	}
	om, _ := target.ForModel("other", []coord.Worker{gwtest.Worker("other", "localhost:8002", view.StateAdmitted, 2)})
	if _, err := b.Apply(context.Background(), om); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, s.Addr())).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy-2"}, TypeUrl: resourcev3.EndpointType,
		ResourceNames: []string{"qwen", "other"}}); err != nil {
		t.Fatal(err)
	}
	_, clas := recv(t, ads)
	if len(clas) != 2 || weights(clas["qwen"])["127.0.0.1:8001"] != 1 || weights(clas["other"])["127.0.0.1:8002"] != 1 {
		t.Fatalf("ADS: %v / %v (a host name is resolved to an address)", weights(clas["qwen"]), weights(clas["other"]))
	}
}

// An address no gateway may be given is left out of the assignment, never
// resolved, and reported as dropped; the others are sent.
func TestAssignmentLeavesOutHostileAddresses(t *testing.T) {
	m := target.Model{Name: model, Backends: []target.Backend{
		{Address: "127.0.0.1:8000", Scheme: "http", WorkerID: "good", Serving: true, Weight: 1},
		{Address: "unix:80", Scheme: "http", WorkerID: "unix", Serving: true, Weight: 1},
		{Address: "localhost:80\nx", Scheme: "http", WorkerID: "nl", Serving: true, Weight: 1},
		{Address: "0.0.0.0:80", Scheme: "http", WorkerID: "any", Serving: true, Weight: 1},
	}}
	cla, _, err := envoy.Assignment(context.Background(), "qwen", m)
	if err != nil || len(cla.Endpoints) != 1 || len(cla.Endpoints[0].LbEndpoints) != 1 {
		t.Fatalf("assignment %v, %v: want only the good endpoint", cla, err)
	}
	s, err := envoy.NewServer("127.0.0.1:0", hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.Cluster(model, "qwen").Apply(context.Background(), m)
	if err != nil || res.Serving != 1 || len(res.Dropped) != 3 {
		t.Fatalf("apply: %+v %v", res, err)
	}
}
