// Package discover finds the inference engines running on this host, for
// an agent configured with discover = true: every listening TCP socket
// whose process (or one of its four closest ancestors) launches an engine
// heft knows, and anything listening on an engine's default port, asked
// over HTTP which kind it is (engine.Detect). For each engine it also
// finds the log the process writes: a file its stdout or stderr is
// redirected to, else the log of the Kubernetes pod or Docker container
// it runs in, or the journal of its systemd service.
package discover

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	psnet "github.com/shirou/gopsutil/v4/net"

	"heft/agent/engine"
	"heft/agent/engine/proc"
)

// DefaultTimeout bounds each request that asks a port which engine
// answers there.
const DefaultTimeout = 2 * time.Second

// Engine is one engine found on this host.
type Engine struct {
	Kind string
	URL  string
	// Log is the engine's log source (logsource syntax), "" when none was
	// found.
	Log string
	// PID is the engine's root process, 0 when its owner cannot be seen
	// (another user's process, a container behind a port forwarder).
	PID  int
	Argv []string
}

// Options shape a search.
type Options struct {
	// Timeout bounds each request to a candidate port; DefaultTimeout
	// when zero.
	Timeout time.Duration
	// PodsRoot holds the kubelet's pod logs (engine_logs.pods_root), where
	// an engine running in a pod has its log.
	PodsRoot string
	// Keep, when set, limits the search to the engine processes it
	// accepts (by root pid; 0 for a listener whose process cannot be
	// seen). Tests use it to see only the engines they started on a host
	// others share.
	Keep func(pid int) bool
}

// listener is a listening socket that may be an engine.
type listener struct {
	port int
	host string // as an engine URL writes it
	pid  int    // the engine's root process, 0 when unseen
	argv []string
}

// Find returns the engines running on this host, ordered by port, and
// notes on what listens where an engine might but is not one. An error
// means the host's sockets could not be listed at all.
func Find(ctx context.Context, opts Options) ([]Engine, []string, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	cands, err := candidates(ctx, opts.Keep)
	if err != nil {
		return nil, nil, err
	}
	var found []Engine
	var notes []string
	seenRoot := map[int]bool{}
	for _, c := range cands {
		if c.pid > 0 && seenRoot[c.pid] {
			continue // one engine, one more port (a metrics or RPC port)
		}
		url := "http://" + net.JoinHostPort(c.host, strconv.Itoa(c.port))
		kind, err := engine.Detect(ctx, url, opts.Timeout)
		if err != nil {
			if c.pid > 0 {
				notes = append(notes, fmt.Sprintf("%s (pid %d, %s) is not an engine: %v", url, c.pid, launchWords(c.argv), err))
			}
			continue
		}
		e := Engine{Kind: kind, URL: url, PID: c.pid, Argv: c.argv}
		if c.pid > 0 {
			seenRoot[c.pid] = true
			e.Log = LogOf(c.pid, kind, opts.PodsRoot)
		}
		found = append(found, e)
	}
	return found, notes, nil
}

// candidates lists the listening sockets worth asking, one per port,
// ordered by port: those of an engine's process, and those on an engine's
// default port whatever owns them.
func candidates(ctx context.Context, keep func(int) bool) ([]listener, error) {
	conns, err := psnet.ConnectionsWithContext(ctx, "tcp")
	if err != nil {
		return nil, fmt.Errorf("list tcp sockets: %w", err)
	}
	defaults := map[int]bool{}
	for _, p := range engine.DefaultPorts() {
		defaults[p.Port] = true
	}
	self := os.Getpid()
	byPort := map[int]listener{}
	for _, c := range conns {
		port := int(c.Laddr.Port)
		if c.Status != "LISTEN" || int(c.Pid) == self {
			continue
		}
		if _, ok := byPort[port]; ok {
			continue // the same port on IPv4 and IPv6, or SO_REUSEPORT
		}
		host, ok := urlHost(c.Laddr.IP)
		if !ok {
			continue
		}
		l := listener{port: port, host: host}
		if c.Pid > 0 {
			root, argv, err := proc.EngineRoot(ctx, int(c.Pid), engine.LaunchesEngine)
			if err == nil && engine.LooksLikeEngine(argv) {
				l.pid, l.argv = root, argv
			}
		}
		if l.pid == 0 && !defaults[port] {
			continue
		}
		if keep != nil && !keep(l.pid) {
			continue
		}
		byPort[port] = l
	}
	out := make([]listener, 0, len(byPort))
	for _, l := range byPort {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b listener) int { return a.port - b.port })
	return out, nil
}

// urlHost is where the agent dials a socket listening on ip: loopback for
// every interface, else the address itself. ok is false for an address
// that cannot be read.
func urlHost(ip string) (string, bool) {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return "", false
	}
	switch {
	case a.IsUnspecified() || (a.Is4() && a.IsLoopback()):
		return "127.0.0.1", true
	case a.Is4In6():
		return a.Unmap().String(), true
	}
	return a.String(), true
}

// launchWords is a command line shortened for a note.
func launchWords(argv []string) string {
	s := strings.Join(argv, " ")
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}
