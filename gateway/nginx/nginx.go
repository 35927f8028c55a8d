// Package nginx keeps an nginx upstream block in step with heft: it
// renders the block into a file of its own, writes it atomically, checks
// the whole configuration with "nginx -t", reloads nginx only when the
// content changed, and puts the last good file back when the check fails.
package nginx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/filewrite"
	"heft/gateway/render"
	"heft/gateway/target"
	"heft/shared/wire"
)

// MaxWeight is the largest weight heft-sync writes (render.NginxMaxWeight).
const MaxWeight = render.NginxMaxWeight

// Config is one [[nginx]] table.
type Config struct {
	Model    string
	File     string // the file heft-sync owns, included by nginx.conf (e.g. conf.d/heft-qwen.conf)
	Upstream string
	// Directives go inside the upstream block before the servers, one
	// each, without the ";": "least_conn", "keepalive 32", "zone qwen 64k".
	Directives []string
	Check      []string // default nginx -t
	Reload     []string // default nginx -s reload
	// MaxConns writes max_conns= from the worker's max_concurrency. Off by
	// default: nginx OSS has no queue behind max_conns, so a full
	// upstream answers 502 instead of waiting.
	MaxConns bool
	Timeout  time.Duration // per command (default 30 s)
}

// oneAtATime orders the applies of every upstream heft-sync writes: two
// in one nginx check and reload one configuration, and a reload while the
// other's new file waits for its check would load that file, or fail
// unseen (the reload signal is sent either way).
var oneAtATime sync.Mutex

// Nginx is the target of one upstream.
type Nginx struct {
	cfg Config
	log hclog.Logger

	mu            sync.Mutex
	reloadPending bool // the file changed but the reload failed
	// refused holds the workers whose line the check refused, by address,
	// with when; they are left out until refuseFor has passed.
	refused map[string]refusal
	// unresolved holds when each served worker's name first failed to
	// resolve in the check, by address (holdUnresolved); emptied by a
	// check that passes.
	unresolved map[string]time.Time
	now        func() time.Time
	// applied is the desired state the file was last rendered from, the
	// base of WeightDeadband.
	applied *target.Model
}

// New checks cfg.
func New(cfg Config, logger hclog.Logger) (*Nginx, error) {
	err := cfg.Validate()
	if st, serr := os.Stat(filepath.Dir(cfg.File)); filepath.IsAbs(cfg.File) && (serr != nil || !st.IsDir()) {
		err = errors.Join(err, fmt.Errorf("file %q: its folder does not exist", cfg.File))
	}
	if err != nil {
		return nil, fmt.Errorf("nginx upstream %q: %w", cfg.Upstream, err)
	}
	if cfg.Check == nil {
		cfg.Check = []string{"nginx", "-t"}
	}
	if cfg.Reload == nil {
		cfg.Reload = []string{"nginx", "-s", "reload"}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	return &Nginx{cfg: cfg, log: logger.Named("nginx").With("upstream", cfg.Upstream),
		refused: map[string]refusal{}, unresolved: map[string]time.Time{}, now: time.Now}, nil
}

// Validate returns every problem with cfg that needs no look at the disk;
// heft-sync's configuration reports them at load, New refuses them.
func (cfg Config) Validate() error {
	var errs []error
	if cfg.Model == "" {
		errs = append(errs, errors.New("model is empty"))
	}
	if !filepath.IsAbs(cfg.File) {
		errs = append(errs, fmt.Errorf("file %q is not an absolute path", cfg.File))
	}
	if !render.IsUpstreamName(cfg.Upstream) {
		errs = append(errs, fmt.Errorf("upstream %q is not an nginx upstream name", cfg.Upstream))
	}
	for _, d := range cfg.Directives {
		if !render.IsDirective(d) {
			errs = append(errs, fmt.Errorf("directive %q: one directive without ';', braces, quotes or comments", d))
		}
	}
	if len(cfg.Check) == 0 && cfg.Check != nil || len(cfg.Reload) == 0 && cfg.Reload != nil {
		errs = append(errs, errors.New("check and reload must name a command (leave them out for nginx -t and nginx -s reload)"))
	}
	return errors.Join(errs...)
}

// Name implements target.Target.
func (n *Nginx) Name() string { return "nginx:" + n.cfg.Upstream }

// Model implements target.Target.
func (n *Nginx) Model() string { return n.cfg.Model }

// Render returns the file's content for m, and the rounding error.
func Render(cfg Config, m target.Model) ([]byte, float64, error) {
	return render.NginxUpstream(render.Nginx{Upstream: cfg.Upstream, Directives: cfg.Directives, MaxConns: cfg.MaxConns}, m)
}

// Apply implements target.Target. A worker the file cannot hold
// (target.Clean), or whose line the check refuses, is left out and
// reported in Result.Dropped; the others are applied. One nginx serves now
// whose name it cannot resolve keeps the last good file (keepUnresolved).
func (n *Nginx) Apply(ctx context.Context, m target.Model) (target.Result, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	oneAtATime.Lock()
	defer oneAtATime.Unlock()
	var res target.Result
	m, res.Dropped = target.Clean(m)
	m, res.Dropped = n.leaveOutRefused(m, res.Dropped)
	m = steady(n.applied, m)
	old, err := filewrite.Read(n.cfg.File)
	if err != nil {
		return res, target.Fail(target.ReasonWrite, err)
	}
	var data []byte
	written := false
	for {
		if len(m.Backends) == 0 {
			if written {
				if rerr := n.restore(old); rerr != nil {
					return res, target.Failf(target.ReasonWrite, "putting back the last good %s failed: %v", n.cfg.File, rerr)
				}
			}
			return res, target.Failf(target.ReasonNoServers, "model %q has no worker nginx takes: an nginx upstream needs a server, so %s is kept", m.Name, n.cfg.File)
		}
		var rounding float64
		data, rounding, err = Render(n.cfg, m)
		if err != nil {
			return res, target.Fail(target.ReasonOther, err)
		}
		res.RoundingError, res.Serving = rounding, len(m.Serving())
		if bytes.Equal(old, data) {
			n.applied = &m
			break
		}
		if err := filewrite.Atomic(n.cfg.File, data, 0o644); err != nil {
			return res, target.Fail(target.ReasonWrite, err)
		}
		written = true
		cerr := filewrite.Run(ctx, n.cfg.Check, n.cfg.Timeout)
		if cerr == nil {
			n.applied = &m
			clear(n.unresolved)
			break
		}
		// A worker's own line refused (a host name that does not resolve):
		// leave that worker out and check the rest, rather than keep every
		// weight of the upstream frozen for one worker.
		bad, ok := refusedBackend(cerr.Error(), n.cfg.File, data, m)
		if ok && ctx.Err() == nil && servedUnresolved(cerr.Error(), old, n.cfg.Upstream, bad) && n.holdUnresolved(bad.Address) {
			return res, n.keepUnresolved(old, bad)
		}
		if ctx.Err() != nil || !ok {
			if rerr := n.restore(old); rerr != nil {
				return res, errors.Join(target.Failf(target.ReasonCheck, "the new %s failed the check: %v", n.cfg.File, cerr),
					target.Failf(target.ReasonWrite, "and putting back the last good file failed: %v", rerr))
			}
			return res, target.Failf(target.ReasonCheck, "the new %s failed the check, so the last good file is back and nginx was not reloaded: %v", n.cfg.File, cerr)
		}
		why := cerr.Error()
		if i := strings.Index(why, "[emerg]"); i >= 0 {
			why = why[i:] // nginx's own words, without the command line
		}
		n.refused[bad.Address] = refusal{at: n.now(), why: wire.Clip(why, 300)}
		res.Dropped = append(res.Dropped, fmt.Sprintf("worker %s left out: the check refused its line (%s)", target.Printable(bad.WorkerID), n.refused[bad.Address].why))
		m = without(m, bad.Address)
	}
	if !bytes.Equal(old, data) {
		res.Changes = append(res.Changes, "wrote "+n.cfg.File)
	}
	if !n.reloadPending && bytes.Equal(withoutComments(old), withoutComments(data)) {
		// Only a comment changed (a worker's state or ID): nginx would
		// run as before, and a reload closes every kept-alive client
		// connection, some just as a client sends on it.
		return res, nil
	}
	if err := filewrite.Run(ctx, n.cfg.Reload, n.cfg.Timeout); err != nil {
		// nginx runs what the file said before: put that back, after every
		// failure, so the file says what nginx runs and the next apply, by
		// this heft-sync or one restarted, writes and reloads again. A flag
		// in memory alone is lost with a restart: a restart during a streak
		// of failures found the new file, and nginx kept the old state for
		// good. (Without a file before, there is nothing to put back: nginx
		// started after this reads the new one.)
		n.reloadPending = true
		if old != nil && !bytes.Equal(old, data) && n.restore(old) == nil {
			return res, target.Failf(target.ReasonReload, "the reload failed, so the last good %s is back (tried again at the next sync): %v", n.cfg.File, err)
		}
		return res, target.Failf(target.ReasonReload, "%s is written but the reload failed (tried again at the next sync): %v", n.cfg.File, err)
	}
	n.reloadPending = false
	res.Changes = append(res.Changes, "reloaded nginx")
	return res, nil
}

// restore puts back the file as it was before the failed write: its old
// content, or no file when there was none.
func (n *Nginx) restore(old []byte) error {
	if old == nil {
		if err := os.Remove(n.cfg.File); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	return filewrite.Atomic(n.cfg.File, old, 0o644)
}

// withoutComments is data without its comments, which is what nginx reads
// of it: heft writes '#' only to start a comment (render.IsDirective
// refuses it in a directive, target.Clean in an address).
func withoutComments(data []byte) []byte {
	var out []byte
	for line := range bytes.Lines(data) {
		if i := bytes.IndexByte(line, '#'); i >= 0 {
			// Not append(line[:i], …): that would write into data.
			out = append(append(out, bytes.TrimRight(line[:i], " \t")...), '\n')
			continue
		}
		out = append(out, line...)
	}
	return out
}
