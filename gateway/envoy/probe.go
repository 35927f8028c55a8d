package envoy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// probeNode is the node ID Probe gives the xDS server, in its log.
const probeNode = "heft-sync-check"

// Answer is what the xDS server on an address answered Probe.
type Answer struct {
	// Version is the EDS version it answered with; "" when it held the
	// stream open without answering, as heft-sync does before it
	// publishes anything.
	Version string
	// Endpoints is, for each asked cluster the answer holds, its number
	// of endpoints; a cluster it does not publish is absent.
	Endpoints map[string]int
}

// Probe asks what answers on listen for clusters' assignments, over an
// EDS stream as Envoy asks, and reports whether it is an xDS server. One
// that answers with a DiscoveryResponse is; so is a gRPC server that
// takes the stream and holds it open for wait without an answer (an xDS
// server that has published nothing yet waits for something to send).
// Anything else is an error: nothing that speaks gRPC answered within
// wait, or the gRPC server refused the stream (no EDS service there).
func Probe(ctx context.Context, listen string, clusters []string, wait time.Duration) (Answer, error) {
	addr := dialAddr(listen)
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return Answer{}, fmt.Errorf("xds probe %s: %w", addr, err)
	}
	defer conn.Close()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	opened := false
	stream, err := endpointservice.NewEndpointDiscoveryServiceClient(conn).StreamEndpoints(ctx)
	if err == nil {
		err = stream.Send(&discoveryv3.DiscoveryRequest{
			Node:          &corev3.Node{Id: probeNode},
			TypeUrl:       resourcev3.EndpointType,
			ResourceNames: clusters,
		})
		opened = err == nil
	}
	var resp *discoveryv3.DiscoveryResponse
	if err == nil {
		resp, err = stream.Recv()
	}
	// The server ends the stream at the deadline too (grpc-timeout), and
	// its RST_STREAM may come before the client's own timer.
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
	switch {
	case err == nil:
		return answer(resp)
	case parent.Err() != nil:
		return Answer{}, fmt.Errorf("xds probe %s: %w", addr, parent.Err())
	case opened && timedOut && conn.GetState() == connectivity.Ready:
		return Answer{}, nil // the stream held open: nothing published yet
	case status.Code(err) == codes.Unimplemented:
		return Answer{}, fmt.Errorf("%s answers gRPC but has no EDS service: not an xDS server", addr)
	case timedOut:
		return Answer{}, fmt.Errorf("nothing that speaks gRPC answered on %s within %s: not an xDS server", addr, wait)
	default:
		return Answer{}, fmt.Errorf("%s does not answer as an xDS server: %w", addr, err)
	}
}

// answer reads the endpoints of each cluster in resp.
func answer(resp *discoveryv3.DiscoveryResponse) (Answer, error) {
	a := Answer{Version: resp.GetVersionInfo(), Endpoints: map[string]int{}}
	if resp.GetTypeUrl() != resourcev3.EndpointType {
		return Answer{}, fmt.Errorf("the xds server answered type %q, not %q", resp.GetTypeUrl(), resourcev3.EndpointType)
	}
	for _, r := range resp.GetResources() {
		var cla endpointv3.ClusterLoadAssignment
		if err := r.UnmarshalTo(&cla); err != nil {
			return Answer{}, fmt.Errorf("the xds server's answer: %w", err)
		}
		n := 0
		for _, l := range cla.GetEndpoints() {
			n += len(l.GetLbEndpoints())
		}
		a.Endpoints[cla.GetClusterName()] = n
	}
	return a, nil
}

// dialAddr is where a client reaches a server listening on listen: the
// loopback address for a wildcard host.
func dialAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if host == "" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
		if ip.Is4() {
			return net.JoinHostPort("127.0.0.1", port)
		}
		return net.JoinHostPort("::1", port)
	}
	return listen
}
