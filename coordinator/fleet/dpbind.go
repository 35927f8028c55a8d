package fleet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"heft/shared/grammar"
)

// A multi-node deployment's address is the agents' word, so the join rule
// (deployment.go) cannot tell a node that claims ranks first from the node
// that runs them. The operator can: DeploymentBinding names the nodes that
// run the deployment at an address, and where one is configured only
// workers on those nodes join it, whatever order they come in. Node names
// are held by node credentials (an agent cannot speak for a name it did
// not enrol), so a compromised node cannot pass for a bound one.

// DeploymentBinding binds a multi-node data-parallel deployment's address
// to the nodes allowed to join it: the coordinator's [[dp_deployment]].
type DeploymentBinding struct {
	// Address is HOST:PORT as the launch arguments give it
	// (data_parallel_address:data_parallel_rpc_port,
	// master_addr:master_port or SGLang's dist_init_addr), as
	// GET /api/v1/workers shows it in deployment.address.
	Address string
	// Nodes are the node names whose workers join it.
	Nodes []string
}

// DeploymentBindingSyntax is how a binding is written on the command
// line and in the environment (entries separated by ';').
const DeploymentBindingSyntax = "HOST:PORT=NODE,NODE,..."

// ParseDeploymentBinding reads DeploymentBindingSyntax.
func ParseDeploymentBinding(text string) (DeploymentBinding, error) {
	addr, nodes, ok := strings.Cut(strings.TrimSpace(text), "=")
	if !ok {
		return DeploymentBinding{}, fmt.Errorf("dp_deployment %q: want %s", text, DeploymentBindingSyntax)
	}
	b := DeploymentBinding{Address: strings.TrimSpace(addr)}
	for n := range strings.SplitSeq(nodes, ",") {
		b.Nodes = append(b.Nodes, strings.TrimSpace(n))
	}
	return b, nil
}

// CheckDeploymentBindings checks the bindings: each address HOST:PORT in
// heft's grammar, bound once; each list of nodes not empty, of node names
// in heft's grammar, each named once. The configuration's validation
// uses it too.
func CheckDeploymentBindings(bs []DeploymentBinding) error {
	var errs []error
	seen := map[string]string{}
	for i, b := range bs {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("dp_deployment %d (%q): %s", i+1, b.Address, fmt.Sprintf(format, args...)))
		}
		key, err := bindingKey(b.Address)
		if err != nil {
			bad("%v", err)
		} else if prev, dup := seen[key]; dup {
			bad("the address is bound twice (also as %q): give each deployment one table with all its nodes", prev)
		} else {
			seen[key] = b.Address
		}
		if len(b.Nodes) == 0 {
			bad("nodes is empty: list the node names that run the deployment")
		}
		names := map[string]bool{}
		for _, n := range b.Nodes {
			switch err := grammar.NodeName(n); {
			case err != nil:
				bad("%v", err)
			case names[n]:
				bad("node %q is listed twice", n)
			}
			names[n] = true
		}
	}
	return errors.Join(errs...)
}

// bindingKey is a configured address as the bindings are looked up by:
// the host canonical (an IP literal without brackets or a v4-mapped
// prefix, a DNS name in lower case), then the port.
func bindingKey(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("the address is not HOST:PORT (an IPv6 host in brackets): %v", err)
	}
	if err := grammar.Host(host); err != nil {
		return "", err
	}
	// "HOST:" is how the API shows a deployment launched without a port;
	// such a binding covers those launches on the host (bound).
	if port != "" {
		if err := grammar.Port(port); err != nil {
			return "", err
		}
	}
	return net.JoinHostPort(canonicalHost(host), port), nil
}

// canonicalHost is host as bindings compare it.
func canonicalHost(host string) string {
	host = strings.Trim(host, "[]")
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().String()
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// bindings are the configured DeploymentBindings, ready to look up.
type bindings struct {
	exact  map[string]binding // by bindingKey
	byHost map[string]binding // by canonicalHost: the nodes of every binding on that host
}

// binding is the nodes bound to a deployment, and the address that says
// so, for the warning.
type binding struct {
	addr  string
	nodes []string // sorted
}

// bound says which nodes the deployment of s is bound to; ok is false
// where no binding applies. A deployment whose launch arguments give a
// port is bound by the binding of that HOST:PORT. One whose arguments
// give none (vLLM then uses its default data_parallel_rpc_port) is bound
// by every binding on its host, their nodes together: a binding written
// with the port the engine defaults to must not be passed by leaving the
// port out.
func (b *bindings) bound(s span) (binding, bool) {
	if b == nil {
		return binding{}, false
	}
	host := canonicalHost(s.host)
	if s.port == "" {
		x, ok := b.byHost[host]
		return x, ok
	}
	port := s.port
	if n, err := strconv.Atoi(port); err == nil && n > 0 && n <= 65535 {
		port = strconv.Itoa(n) // as the engine reads it: 013345 is 13345
	}
	x, ok := b.exact[net.JoinHostPort(host, port)]
	return x, ok
}

// compile makes the lookup tables of checked bindings; nil for none.
func compile(bs []DeploymentBinding) *bindings {
	if len(bs) == 0 {
		return nil
	}
	out := &bindings{exact: map[string]binding{}, byHost: map[string]binding{}}
	for _, b := range bs {
		key, _ := bindingKey(b.Address) // checked
		nodes := slices.Sorted(slices.Values(b.Nodes))
		out.exact[key] = binding{addr: b.Address, nodes: nodes}
		host, _, _ := net.SplitHostPort(key)
		h := out.byHost[canonicalHost(host)]
		addrs := b.Address
		if h.addr != "" {
			addrs = h.addr + ", " + b.Address
		}
		out.byHost[canonicalHost(host)] = binding{addr: addrs, nodes: slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(h.nodes), nodes...))))}
	}
	return out
}

// BindDeployments puts the bindings in force (replacing any before) and
// judges every worker of a multi-node deployment again under them.
func (f *Fleet) BindDeployments(bs []DeploymentBinding) error {
	if err := CheckDeploymentBindings(bs); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	f.mu.Lock()
	if f.dpBound == nil && len(bs) == 0 {
		f.mu.Unlock()
		return nil // none before, none now: nothing to judge again
	}
	f.dpBound = compile(bs)
	var ws []*worker
	for _, w := range f.workers {
		if _, ok := spanOf(w.eng); ok && !w.placeholder {
			ws = append(ws, w)
		}
	}
	changed := len(ws) > 0 && f.refresh(f.now(), ws...)
	f.mu.Unlock()
	f.writeRecords()
	if changed {
		f.notify()
	}
	return nil
}

// bindings are the fleet's bindings in force; nil for none. The caller
// holds mu.
func (f *Fleet) bindings() *bindings { return f.dpBound }
