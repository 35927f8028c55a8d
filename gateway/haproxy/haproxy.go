// Package haproxy keeps an HAProxy backend in step with heft through the
// runtime API (the stats socket at level admin): weights, drain and
// maintenance states, and addresses of server-template slots, with no
// reload. Servers heft does not know are left alone.
package haproxy

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/target"
)

// Orders of servers.
const (
	OrderAddress = "address" // a server carries the worker at its address
	OrderWeight  = "weight"  // slots carry the serving workers heaviest first
)

// Config is one [[haproxy]] table.
type Config struct {
	Model   string
	Socket  string // unix socket path, or host:port of a TCP stats socket
	Backend string
	// Slots is the name prefix of the backend's server-template (default
	// "heft": "server-template heft 1-8 ...").
	Slots string
	Order string // OrderAddress (default) or OrderWeight
	// AddServers lets heft-sync "add server" (HAProxy ≥ 2.5) when no slot
	// is free; such servers are gone after a reload and added again.
	AddServers bool
	// MaxConn sets each server's maxconn to the worker's max_concurrency
	// once the coordinator reports it.
	MaxConn bool
	Timeout time.Duration // per runtime API command (default 3 s)
	// WatchEvery is how often the process answering on the socket is read,
	// to re-apply at once after a reload (default DefaultWatchEvery).
	WatchEvery time.Duration
	// StateFile, when set, keeps each worker DNS name's last answers
	// (target.Resolver.KeepAnswers), so that a heft-sync restarted during
	// a DNS outage knows which server a name that moved was at.
	StateFile string
}

// HAProxy is the target of one backend.
type HAProxy struct {
	cfg      Config
	c        runner
	opt      planOptions
	resolver *target.Resolver // keeps each address's last good IP:port
	log      hclog.Logger
}

// New checks cfg.
func New(cfg Config, logger hclog.Logger) (*HAProxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("haproxy backend %q: %w", cfg.Backend, err)
	}
	if cfg.Slots == "" {
		cfg.Slots = "heft"
	}
	if cfg.Order == "" {
		cfg.Order = OrderAddress
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Second
	}
	h := &HAProxy{
		cfg:      cfg,
		c:        newClient(cfg.Socket, cfg.Timeout),
		resolver: target.NewResolver(nil),
		opt: planOptions{Backend: cfg.Backend, Slots: cfg.Slots, ByWeight: cfg.Order == OrderWeight,
			AddServers: cfg.AddServers, MaxConn: cfg.MaxConn},
	}
	h.log = logger.Named("haproxy").With("backend", cfg.Backend)
	h.keepAnswers()
	return h, nil
}

// keepAnswers reads back the DNS answers a heft-sync before this one kept.
// A file that cannot be used is logged and replaced at the next save: the
// resolver starts from nothing, as without a state file.
func (h *HAProxy) keepAnswers() {
	if h.cfg.StateFile == "" {
		return
	}
	n, err := h.resolver.KeepAnswers(h.cfg.StateFile)
	switch {
	case err != nil:
		h.log.Warn("the state file cannot be read; DNS answers start from nothing and it is replaced at the next apply "+
			"(a worker whose name moved meanwhile may wait for a free slot while another name does not resolve)",
			"state_file", h.cfg.StateFile, "error", err)
	case n > 0:
		h.log.Info("read back the DNS answers heft-sync kept", "state_file", h.cfg.StateFile, "names", n)
	}
}

// Validate returns every problem with cfg; heft-sync's configuration
// reports them at load, New refuses them.
func (cfg Config) Validate() error {
	var errs []error
	if cfg.Model == "" {
		errs = append(errs, errors.New("model is empty"))
	}
	if cfg.Socket == "" {
		errs = append(errs, errors.New("socket is empty (a unix socket path, or host:port)"))
	}
	if cfg.Backend == "" || strings.ContainsAny(cfg.Backend, " /\t\n;") {
		errs = append(errs, fmt.Errorf("backend %q is not a backend name", cfg.Backend))
	}
	if strings.ContainsAny(cfg.Slots, " /\t\n;") {
		errs = append(errs, fmt.Errorf("slots %q is not a server name prefix", cfg.Slots))
	}
	if cfg.Order != "" && cfg.Order != OrderAddress && cfg.Order != OrderWeight {
		errs = append(errs, fmt.Errorf("order %q: want %q or %q", cfg.Order, OrderAddress, OrderWeight))
	}
	if cfg.StateFile != "" && (strings.HasSuffix(cfg.StateFile, "/") || filepath.Base(cfg.StateFile) == ".") {
		errs = append(errs, fmt.Errorf("state_file %q names a folder, not a file", cfg.StateFile))
	}
	return errors.Join(errs...)
}

// Name implements target.Target.
func (h *HAProxy) Name() string { return "haproxy:" + h.cfg.Backend }

// Model implements target.Target.
func (h *HAProxy) Model() string { return h.cfg.Model }

// Check reads the backend once: the socket answers and the backend exists.
func (h *HAProxy) Check(ctx context.Context) error {
	servers, err := h.read(ctx)
	if err != nil {
		return err
	}
	slots, unchecked := 0, 0
	for _, s := range servers {
		if h.opt.isSlot(s.Name) {
			slots++
			if !s.Checked {
				unchecked++
			}
		}
	}
	h.log.Info("backend found", "servers", len(servers), "slots", slots, "order", h.cfg.Order)
	if err := target.CheckStateFile(h.cfg.StateFile); err != nil {
		return err
	}
	if unchecked > 0 {
		h.log.Warn("slots without a health check: an engine that dies gets requests until heft drains it; "+
			"add \"option httpchk GET /health\" and \"default-server check\" to the backend, with retries and option redispatch (docs/gateways.md)",
			"unchecked_slots", unchecked)
	}
	return nil
}

func (h *HAProxy) read(ctx context.Context) ([]server, error) {
	ans, err := h.c.run(ctx, "show servers state "+h.cfg.Backend)
	if err != nil {
		return nil, target.Fail(target.ReasonUnreachable, err)
	}
	if strings.HasPrefix(strings.TrimSpace(ans), "Can't find backend") {
		known, _ := h.c.run(ctx, "show backend")
		names := strings.Fields(strings.TrimPrefix(strings.TrimSpace(known), "# name"))
		return nil, target.Failf(target.ReasonNoBackend, "haproxy at %s has no backend %q (it has: %s)",
			h.cfg.Socket, h.cfg.Backend, strings.Join(names, ", "))
	}
	servers, err := parseServersState(ans)
	if err != nil {
		return nil, target.Fail(target.ReasonRejected, err)
	}
	if h.opt.MaxConn {
		ans, err := h.c.run(ctx, "show stat "+h.cfg.Backend+" 4 -1")
		if err != nil {
			return nil, target.Fail(target.ReasonUnreachable, err)
		}
		mc, err := parseMaxConn(ans)
		if err != nil {
			return nil, target.Fail(target.ReasonRejected, err)
		}
		for i := range servers {
			if v, ok := mc[servers[i].Name]; ok {
				servers[i].MaxConn = v
			}
		}
	}
	return servers, nil
}

// Apply implements target.Target.
func (h *HAProxy) Apply(ctx context.Context, m target.Model) (target.Result, error) {
	var res target.Result
	var errs []error
	m, res.Dropped = target.Clean(m) // never a command with an address no gateway may be given
	rs, dropped, err := h.resolver.ResolveAll(ctx, m.Backends)
	res.Dropped = append(res.Dropped, dropped...)
	if err != nil {
		errs = append(errs, err)
	}
	ws := make([]want, len(rs))
	for i, r := range rs {
		ws[i] = want{Backend: r.Backend, Addr: r.Addr, Prev: r.Prev}
	}
	servers, err := h.read(ctx)
	if err != nil {
		return res, errors.Join(append(errs, err)...)
	}
	p := makePlan(servers, ws, h.opt)
	res.RoundingError, res.Serving = p.rounding, p.serving
	errs = append(errs, p.problems...)
	changes, refused, err := h.send(ctx, p.cmds)
	res.Changes = changes
	errs = append(errs, refused...)
	if err != nil {
		return res, errors.Join(append(errs, err)...)
	}
	for _, cmd := range p.soft {
		ans, err := h.c.run(ctx, cmd)
		if err == nil && strings.HasPrefix(strings.TrimSpace(ans), "Server deleted") {
			res.Changes = append(res.Changes, cmd)
		} else {
			h.log.Debug("server not deleted yet; trying again later", "command", cmd, "answer", clip(ans), "error", err)
		}
	}
	if len(p.cmds) > 0 {
		// Read back: what HAProxy shows now is the proof.
		servers, err := h.read(ctx)
		if err != nil {
			return res, errors.Join(append(errs, err)...)
		}
		again := makePlan(servers, ws, h.opt)
		res.Serving = again.serving
		if len(again.cmds) > 0 {
			errs = append(errs, target.Failf(target.ReasonRejected, "haproxy did not take: %s", strings.Join(again.cmds, "; ")))
		}
	}
	return res, errors.Join(errs...)
}

// send sends cmds in order and returns those HAProxy took and why each
// other was refused; it stops at the first that gets no answer (err).
//
// When HAProxy refuses a server's address change (or its adding), the
// rest of that server's commands are not sent: it is left as it was. Its
// weight and "state ready" would make it serve at its old address, which
// may be a worker heft drained; putting it in maintenance instead could
// take out a worker it still serves.
func (h *HAProxy) send(ctx context.Context, cmds []string) (changes []string, refused []error, err error) {
	addrRefused := map[string]bool{} // by server ref
	for _, cmd := range cmds {
		ref := serverRef(cmd)
		if addrRefused[ref] {
			continue
		}
		ans, err := h.c.run(ctx, cmd)
		if err != nil {
			return changes, refused, target.Fail(target.ReasonUnreachable, err)
		}
		if !answerOK(ans) {
			refused = append(refused, target.Failf(target.ReasonRejected, "haproxy refused %q: %s", cmd, clip(ans)))
			if strings.Contains(cmd, " addr ") || strings.HasPrefix(cmd, "add server ") {
				addrRefused[ref] = true
			}
			continue
		}
		changes = append(changes, cmd)
	}
	return changes, refused, nil
}

// serverRef is the "backend/server" a command is about: its one word with
// a '/', which HAProxy's names cannot hold.
func serverRef(cmd string) string {
	for _, f := range strings.Fields(cmd) {
		if strings.Contains(f, "/") {
			return f
		}
	}
	return ""
}

// Served implements syncer.Reader: the backend's servers that take new
// requests now (not in maintenance or drain, weight above 0), with their
// weights; heft-sync owns its slots and the servers it added.
func (h *HAProxy) Served(ctx context.Context) ([]target.Served, error) {
	servers, err := h.read(ctx)
	if err != nil {
		return nil, err
	}
	var out []target.Served
	for _, s := range servers {
		if s.maint() || s.drain() || s.Weight <= 0 || !s.Addr.IsValid() {
			continue
		}
		out = append(out, target.Served{Address: s.Addr.String(), Weight: float64(s.Weight),
			Owned: h.opt.isSlot(s.Name) || h.opt.isAdded(s.Name)})
	}
	return out, nil
}
