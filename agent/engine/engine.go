// Package engine talks to one inference engine beside the agent: vLLM,
// SGLang, mlx-lm's server, llama.cpp's llama-server or Ollama, each
// described by one file (vllm.go, sglang.go, ...) listed in registry.go.
// It reads what the engine serves (models, version, ready, load and KV
// pools per data-parallel rank from its endpoints and /metrics), finds
// the engine's processes from the port it listens on (engine/proc), reads
// its launch arguments and derives the capacity key (engine/launch), and
// tells which GPUs the engine uses and who else holds memory on them.
//
// Facts never fails: what cannot be read goes in wire.Engine.Error, and
// the agent keeps running. Every request has a timeout and every body a
// size bound.
package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/engine/proc"
	"heft/shared/wire"
)

// DefaultTimeout bounds each request to an engine.
const DefaultTimeout = 5 * time.Second

// Launch-argument and rank sources recorded in wire.Engine.
const (
	SourceCmdline    = "cmdline"
	SourceLog        = "log"
	SourceServerInfo = "server_info"
	SourceMetrics    = "metrics"
	SourceLoads      = "v1_loads"
	SourceProps      = "props"
	SourceAPIPS      = "api_ps"
	SourceModels     = "v1_models"
)

// Config names one engine.
type Config struct {
	Kind string
	URL  string
	// Log is the engine's start-up log, if any; it names the ranks'
	// source when the pools come from it.
	Log string
	// Model overrides the served model (Ollama serves many).
	Model string
	// AdvertiseURL is what gateways dial, when configured; else the
	// client derives one (advertise.go).
	AdvertiseURL string
	// Node goes into the capacity key.
	Node string
	// Timeout bounds each request; DefaultTimeout when zero.
	Timeout time.Duration
}

// Client reads one engine. It is safe for concurrent use.
type Client struct {
	cfg     Config
	kind    *descriptor
	url     string // as configured, without a trailing slash
	base    string // url without a trailing /v1
	port    int
	local   bool
	procs   *proc.Finder // nil for an engine on another host
	primary func(v4 bool) (netip.Addr, error)
	timeout time.Duration
	http    *http.Client
	logger  hclog.Logger

	mu        sync.Mutex
	lastModel string // last model seen, kept across a short outage
	lastArgs  []string
	lastSrc   string // source of lastArgs
	listen    []netip.AddrPort
	listenAt  time.Time
	warned    map[string]bool
	// unserved holds when an optional endpoint last answered that it is
	// not served (mayAsk).
	unserved map[string]time.Time
}

// notServedFor is how long an optional endpoint that answered "not
// served" is left alone: asked every second, it would fill the engine's
// access log with 404s; asked again after this, an engine upgraded in
// place is seen.
const notServedFor = 5 * time.Minute

// mayAsk reports whether path has not answered "not served" within
// notServedFor.
func (c *Client) mayAsk(path string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, seen := c.unserved[path]
	return !seen || time.Since(at) >= notServedFor
}

// notServed notes that path answered "not served".
func (c *Client) notServed(path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unserved == nil {
		c.unserved = map[string]time.Time{}
	}
	c.unserved[path] = time.Now()
}

// New validates the kind and URL and returns a client.
func New(cfg Config, logger hclog.Logger) (*Client, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	d, err := checkKind(cfg.Kind)
	if err != nil {
		return nil, err
	}
	u, port, err := parseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	clean := strings.TrimRight(strings.TrimSpace(cfg.URL), "/")
	cfg.Kind = d.name
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	c := &Client{
		cfg:     cfg,
		kind:    d,
		url:     clean,
		base:    strings.TrimSuffix(clean, "/v1"),
		port:    port,
		local:   proc.IsLocalHost(u.Hostname()),
		primary: PrimaryAddress,
		timeout: timeout,
		http: &http.Client{
			// Redirects off: an engine does not redirect, a login proxy does.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		logger: logger.Named("engine").With("kind", d.name, "url", clean),
		warned: map[string]bool{},
	}
	if c.local {
		c.procs = proc.NewFinder(port, launchesEngine)
	}
	return c, nil
}

// parseURL checks an engine URL and returns it with its port.
func parseURL(raw string) (*url.URL, int, error) {
	s := strings.TrimSpace(raw)
	if !strings.Contains(s, "://") {
		return nil, 0, fmt.Errorf("engine url %q: needs a scheme, e.g. http://%s", raw, s)
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, 0, fmt.Errorf("engine url %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, 0, fmt.Errorf("engine url %q: scheme must be http or https", raw)
	}
	if u.Hostname() == "" {
		return nil, 0, fmt.Errorf("engine url %q: no host", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, 0, fmt.Errorf("engine url %q: must not carry a query, fragment or credentials", raw)
	}
	port := 80
	if u.Scheme == "https" {
		port = 443
	}
	if p := u.Port(); p != "" {
		port, err = strconv.Atoi(p)
		if err != nil || port <= 0 || port > 65535 {
			return nil, 0, fmt.Errorf("engine url %q: bad port", raw)
		}
	}
	return u, port, nil
}

// Kind returns the engine kind.
func (c *Client) Kind() string { return c.kind.name }

// URL returns the engine URL as configured, without a trailing slash.
func (c *Client) URL() string { return c.url }

// Config returns the configuration the client was built with.
func (c *Client) Config() Config { return c.cfg }

// Ready asks the engine's health endpoint.
func (c *Client) Ready(ctx context.Context) (bool, error) {
	return c.ready(ctx)
}

// Load reads how busy the engine is, cheaply, for the probe's idle check.
// Kinds that expose no request counts (mlx-lm, Ollama) give Known false
// and no error.
func (c *Client) Load(ctx context.Context) (wire.Load, error) {
	return c.kind.adapter.load(ctx, c)
}

// reading collects what one Facts call learned from the engine's HTTP
// endpoints.
type reading struct {
	down     bool // nothing answers: skip the remaining requests
	problems []string
	models   []string
	ready    bool
	version  string
	load     wire.Load
	// served is the model the engine says it has loaded, where its own
	// endpoints say (Ollama's /api/ps, llama.cpp's model alias).
	served string
	// pools are KV pools per rank from the kind's endpoints, and where
	// they came from; the log's, when there is one, win over them.
	pools    []wire.Rank
	poolsSrc string
	// args are launch arguments the engine serves, and where from.
	args    map[string]string
	argsSrc string
	// running is what the engine runs at once, all ranks together, when
	// its endpoints say (running.go), and where from.
	running    int
	runningSrc string
	// modelLens are /v1/models' max_model_len by model, where listed.
	modelLens map[string]int64
	// maxModelLen is the maximum model length the kind's own endpoints
	// state, and where from.
	maxModelLen    int64
	maxModelLenSrc string
}

// note records a failure. Endpoints the engine does not serve are not
// faults; an unreachable engine stops further requests.
func (r *reading) note(err error) {
	if err == nil || errors.Is(err, errNotServed) {
		return
	}
	if errors.Is(err, errUnreachable) {
		r.down = true
	}
	r.problems = append(r.problems, err.Error())
}

// read asks the endpoints every kind serves, then the kind's own.
func (c *Client) read(ctx context.Context) *reading {
	r := &reading{}
	models, lens, err := c.models(ctx)
	r.note(err)
	r.models, r.modelLens = models, lens
	if r.down {
		return r
	}
	ready, err := c.ready(ctx)
	r.note(err)
	r.ready = ready
	if r.down {
		return r
	}
	c.kind.adapter.read(ctx, c, r)
	return r
}

// findProcess returns the engine's processes on this host.
func (c *Client) findProcess(ctx context.Context) (proc.Process, error) {
	if c.procs == nil {
		return proc.Process{}, proc.ErrNoListener
	}
	return c.procs.Find(ctx)
}

// warnOnce logs a warning the first time a given problem appears.
func (c *Client) warnOnce(key, msg string, kv ...any) {
	c.mu.Lock()
	seen := c.warned[key]
	c.warned[key] = true
	c.mu.Unlock()
	if !seen {
		c.logger.Warn(msg, kv...)
	}
}

// Tree lists the engine's processes on this host: its root and every
// descendant. It is nil when the engine is not local or its process cannot
// be found.
func (c *Client) Tree(ctx context.Context) []int {
	if !c.local {
		return nil
	}
	p, err := c.findProcess(ctx)
	if err != nil {
		return nil
	}
	return p.Tree
}
