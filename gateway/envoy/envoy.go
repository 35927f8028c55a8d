// Package envoy serves heft's weights to Envoy as EDS over xDS v3 (both a
// plain EDS stream and ADS), with go-control-plane's snapshot cache: one
// ClusterLoadAssignment per model, load_balancing_weight per endpoint.
//
// Drained workers (held, offline, not yet measured) are left out of the
// assignment rather than sent as DRAINING: every Envoy removes an absent
// endpoint from load balancing and lets its open streams finish, while
// what DRAINING does has changed between Envoy versions and depends on
// the cluster's health-check settings. With active health checks, set
// the cluster's ignore_health_on_host_removal so a removed endpoint that
// still passes its check is dropped at once.
package envoy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/log"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"heft/gateway/scale"
	"heft/gateway/target"
)

// MaxWeight is the largest load_balancing_weight heft-sync sends.
const MaxWeight = 1000

// snapshotKey is the one snapshot every Envoy gets: the weights do not
// depend on which proxy asks.
const snapshotKey = "heft"

type everyNode struct{}

func (everyNode) ID(*corev3.Node) string { return snapshotKey }

// Server is one xDS server on one listen address.
type Server struct {
	listen string
	ln     net.Listener // nil: Detached
	grpc   *grpc.Server
	cache  cachev3.SnapshotCache
	log    hclog.Logger

	mu       sync.Mutex
	clusters map[string]*endpointv3.ClusterLoadAssignment
	version  int
}

// Config is one model served as one cluster by the xDS server on Listen;
// tables that share Listen share one server.
type Config struct {
	Listen  string
	Model   string
	Cluster string // default: the model name
	// StateFile, when set, keeps what heft-sync last published for the
	// cluster, so a restarted heft-sync starts from what Envoy routes by.
	StateFile string
}

// ClusterName is the cluster's name: Cluster, or the model name.
func (c Config) ClusterName() string {
	if c.Cluster != "" {
		return c.Cluster
	}
	return c.Model
}

// Validate returns every problem with c.
func (c Config) Validate() error {
	var errs []error
	if c.Model == "" || c.Listen == "" {
		errs = append(errs, errors.New("model and listen are required"))
	}
	if _, _, err := net.SplitHostPort(c.Listen); c.Listen != "" && err != nil {
		errs = append(errs, fmt.Errorf("listen %q is not host:port", c.Listen))
	}
	if c.StateFile != "" && (strings.HasSuffix(c.StateFile, "/") || filepath.Base(c.StateFile) == ".") {
		errs = append(errs, fmt.Errorf("state_file %q names a folder, not a file", c.StateFile))
	}
	return errors.Join(errs...)
}

// NewServer listens on listen; Run serves.
func NewServer(listen string, logger hclog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("envoy xds listen %s: %w", listen, err)
	}
	return newServer(ln, ln.Addr().String(), logger), nil
}

// Detached is a server for listen that does not listen, and so publishes
// nothing: heft-sync --check builds on it the clusters of an address the
// heft-sync service holds, to check their state files. Run fails.
func Detached(listen string, logger hclog.Logger) *Server {
	return newServer(nil, listen, logger)
}

func newServer(ln net.Listener, listen string, logger hclog.Logger) *Server {
	l := logger.Named("envoy").With("listen", listen)
	s := &Server{listen: listen, ln: ln, log: l, clusters: map[string]*endpointv3.ClusterLoadAssignment{}}
	s.cache = cachev3.NewSnapshotCache(false, everyNode{}, log.LoggerFuncs{
		DebugFunc: func(f string, a ...any) { l.Trace(fmt.Sprintf(f, a...)) },
		InfoFunc:  func(f string, a ...any) { l.Debug(fmt.Sprintf(f, a...)) },
		WarnFunc:  func(f string, a ...any) { l.Warn(fmt.Sprintf(f, a...)) },
		ErrorFunc: func(f string, a ...any) { l.Error(fmt.Sprintf(f, a...)) },
	})
	return s
}

// Addr is the address the server listens on; a Detached server's listen.
func (s *Server) Addr() string { return s.listen }

// Run serves xDS until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	if s.ln == nil {
		return fmt.Errorf("envoy xds %s: not listening (a server built for --check)", s.listen)
	}
	xds := serverv3.NewServer(ctx, s.cache, serverv3.CallbackFuncs{
		StreamOpenFunc: func(_ context.Context, id int64, typ string) error {
			s.log.Debug("xds stream opened", "stream", id, "type", typ)
			return nil
		},
		StreamClosedFunc: func(id int64, node *corev3.Node) {
			s.log.Debug("xds stream closed", "stream", id, "node", node.GetId())
		},
	})
	s.grpc = grpc.NewServer()
	endpointservice.RegisterEndpointDiscoveryServiceServer(s.grpc, xds)
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(s.grpc, xds)
	done := make(chan error, 1)
	go func() { done <- s.grpc.Serve(s.ln) }()
	s.log.Info("serving EDS and ADS")
	select {
	case <-ctx.Done():
		s.grpc.Stop() // streams are long-lived: a graceful stop would wait for Envoy to hang up
		<-done
		return nil
	case err := <-done:
		if errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}
		return fmt.Errorf("envoy xds serve: %w", err)
	}
}

// Close releases the listener of a server that never ran.
func (s *Server) Close() error {
	if s.ln == nil {
		return nil
	}
	return s.ln.Close()
}

// set replaces one cluster's assignment and publishes a new snapshot when
// it changed. It reports whether it did.
func (s *Server) set(name string, cla *endpointv3.ClusterLoadAssignment) (bool, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.clusters[name]; ok && proto.Equal(old, cla) {
		return false, strconv.Itoa(s.version), nil
	}
	s.clusters[name] = cla
	s.version++
	names := make([]string, 0, len(s.clusters))
	for n := range s.clusters {
		names = append(names, n)
	}
	slices.Sort(names)
	res := make([]types.Resource, 0, len(names))
	for _, n := range names {
		res = append(res, s.clusters[n])
	}
	v := strconv.Itoa(s.version)
	snap, err := cachev3.NewSnapshot(v, map[resourcev3.Type][]types.Resource{resourcev3.EndpointType: res})
	if err != nil {
		return false, v, err
	}
	if err := s.cache.SetSnapshot(context.Background(), snapshotKey, snap); err != nil {
		return false, v, err
	}
	return true, v, nil
}

// current is what was last published for cluster name; nil before that.
func (s *Server) current(name string) *endpointv3.ClusterLoadAssignment {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clusters[name]
}

// Cluster is the target of one model's cluster on a server.
type Cluster struct {
	s           *Server
	model, name string
	stateFile   string
	resolver    *target.Resolver // keeps each address's last good IP:port

	mu    sync.Mutex
	saved []byte // the state file's content as last written
}

// Cluster returns the target that serves model as cluster name.
func (s *Server) Cluster(model, name string) *Cluster {
	return &Cluster{s: s, model: model, name: name, resolver: target.NewResolver(nil)}
}

// KeepingState makes c keep what it publishes in path (Config.StateFile;
// "" keeps nothing) and returns c. What path holds is published at once:
// an Envoy that connects before the cluster's first apply (one started
// while the coordinator lists no worker of the model) gets what heft-sync
// last published, not an empty cluster.
func (c *Cluster) KeepingState(path string) *Cluster {
	c.stateFile = path
	c.restore()
	c.keepAnswers()
	return c
}

// AnswersFile is where a cluster with state file path keeps its DNS
// answers (target.Resolver.KeepAnswers): a file of its own beside it, as an
// older heft-sync refuses a state file with fields it does not know.
func AnswersFile(path string) string { return path + ".names" }

// keepAnswers reads back the DNS answers a heft-sync before this one kept,
// so that a name whose answer moved during an outage leaves its old
// endpoint. A file that cannot be used is logged and replaced at the next
// save: the resolver starts from nothing, as without it.
func (c *Cluster) keepAnswers() {
	if c.stateFile == "" {
		return
	}
	path := AnswersFile(c.stateFile)
	n, err := c.resolver.KeepAnswers(path)
	switch {
	case err != nil:
		c.s.log.Warn("the DNS answers file cannot be read; answers start from nothing and it is replaced at the next apply "+
			"(a worker whose name moved meanwhile keeps its old endpoint while another name does not resolve)",
			"cluster", c.name, "file", path, "error", err)
	case n > 0:
		c.s.log.Info("read back the DNS answers heft-sync kept", "cluster", c.name, "file", path, "names", n)
	}
}

// Name implements target.Target.
func (c *Cluster) Name() string { return "envoy:" + c.name }

// Model implements target.Target.
func (c *Cluster) Model() string { return c.model }

// Assignment builds the ClusterLoadAssignment of m's serving workers.
func Assignment(ctx context.Context, name string, m target.Model) (*endpointv3.ClusterLoadAssignment, float64, error) {
	cla, rounding, _, err := assign(ctx, name, m, target.NewResolver(nil), nil)
	return cla, rounding, err
}

// assign is Assignment through r, and what it drops because another worker
// resolves to the same IP:port. A failed lookup is no evidence against an
// engine: r falls back to the last good address, and while a serving
// worker has none, prev's endpoints (what was published last) that no
// worker claims are kept, since one of them may be that worker. A worker
// claims its address and, when its DNS answer changed, the one before.
func assign(ctx context.Context, name string, m target.Model, r *target.Resolver,
	prev *endpointv3.ClusterLoadAssignment) (*endpointv3.ClusterLoadAssignment, float64, []string, error) {
	m, _ = target.Clean(m)
	rs, dropped, err := r.ResolveAll(ctx, m.Backends)
	var fs []float64
	for _, b := range rs {
		if b.Serving {
			fs = append(fs, b.Weight)
		}
	}
	ints, rounding := scale.Ints(fs, MaxWeight)
	var eps []*endpointv3.LbEndpoint
	claimed := map[netip.AddrPort]bool{}
	unresolved := false
	i := 0
	for _, b := range rs {
		claimed[b.Addr] = true
		// A worker whose DNS answer changed also claims its old address:
		// the endpoint there was its own, published by this heft-sync, not
		// one an unresolved worker may be at, so it goes (else the moved
		// worker, or a held one, kept its share there).
		claimed[b.Prev] = true
		if !b.Serving {
			continue
		}
		w := ints[i]
		i++
		if !b.Addr.IsValid() {
			unresolved = true
			continue
		}
		eps = append(eps, endpoint(b.Addr, uint32(w)))
	}
	if unresolved {
		for _, l := range prev.GetEndpoints() {
			for _, e := range l.GetLbEndpoints() {
				if a, err := endpointAddr(e); err == nil && !claimed[a] {
					claimed[a] = true
					eps = append(eps, e)
				}
			}
		}
	}
	return assignment(name, eps), rounding, dropped, err
}

// endpointAddr is the IP:port e is at.
func endpointAddr(e *endpointv3.LbEndpoint) (netip.AddrPort, error) {
	sa := e.GetEndpoint().GetAddress().GetSocketAddress()
	a, err := netip.ParseAddr(sa.GetAddress())
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("endpoint %q: %w", sa.GetAddress(), err)
	}
	return netip.AddrPortFrom(a, uint16(sa.GetPortValue())), nil
}

// endpoint is one healthy endpoint at a with weight w.
func endpoint(a netip.AddrPort, w uint32) *endpointv3.LbEndpoint {
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address:       a.Addr().String(),
				PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(a.Port())},
			}}},
		}},
		HealthStatus:        corev3.HealthStatus_HEALTHY,
		LoadBalancingWeight: wrapperspb.UInt32(w),
	}
}

// assignment is cluster name's assignment of eps, in one locality.
func assignment(name string, eps []*endpointv3.LbEndpoint) *endpointv3.ClusterLoadAssignment {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	if len(eps) > 0 {
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{LbEndpoints: eps}}
	}
	return cla
}

// Apply implements target.Target.
func (c *Cluster) Apply(ctx context.Context, m target.Model) (target.Result, error) {
	_, dropped := target.Clean(m)
	cla, rounding, collided, rerr := assign(ctx, c.name, m, c.resolver, c.s.current(c.name))
	res := target.Result{RoundingError: rounding, Dropped: append(dropped, collided...)}
	for _, l := range cla.Endpoints {
		res.Serving += len(l.LbEndpoints)
	}
	changed, version, err := c.s.set(c.name, cla)
	if err != nil {
		return res, target.Fail(target.ReasonOther, fmt.Errorf("publish the xds snapshot: %w", err))
	}
	if changed {
		res.Changes = append(res.Changes, fmt.Sprintf("published cluster %s with %d endpoints as version %s", c.name, res.Serving, version))
	}
	if err := c.save(cla); err != nil {
		// Envoy has the new assignment; only a restarted heft-sync would
		// not know it.
		return res, errors.Join(rerr, target.Fail(target.ReasonWrite,
			fmt.Errorf("published, but could not keep it in the state file (a restarted heft-sync would take out workers still measuring): %w", err)))
	}
	return res, rerr
}
