// Package engine talks to one inference engine beside the agent: vLLM,
// SGLang, mlx-lm's server, llama.cpp's llama-server or Ollama. It reads
// what the engine serves (models, version, ready, load and KV pools per
// data-parallel rank from its endpoints and /metrics), finds the engine's
// processes from the port it listens on, reads its launch arguments,
// derives the capacity key, and tells which GPUs the engine uses and who
// else holds memory on them.
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
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

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
	// Node goes into the capacity key.
	Node string
	// Timeout bounds each request; DefaultTimeout when zero.
	Timeout time.Duration
}

// Client reads one engine. It is safe for concurrent use.
type Client struct {
	cfg     Config
	kind    string
	url     string // as configured, without a trailing slash
	base    string // url without a trailing /v1
	port    int
	local   bool
	timeout time.Duration
	http    *http.Client
	logger  hclog.Logger

	mu        sync.Mutex
	pid       int // last engine root process found
	listener  int // last listener pid found
	proc      processLookup
	lastModel string // last model seen, kept across a short outage
	lastArgs  []string
	lastSrc   string // source of lastArgs
	warned    map[string]bool
}

// New validates the kind and URL and returns a client.
func New(cfg Config, logger hclog.Logger) (*Client, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	kind := strings.ToLower(strings.TrimSpace(cfg.Kind))
	if !slices.Contains(wire.EngineKinds, kind) {
		return nil, fmt.Errorf("engine kind %q is not one of %s", cfg.Kind, strings.Join(wire.EngineKinds, ", "))
	}
	raw := strings.TrimSpace(cfg.URL)
	if !strings.Contains(raw, "://") {
		return nil, fmt.Errorf("engine url %q: needs a scheme, e.g. http://%s", cfg.URL, raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("engine url %q: %w", cfg.URL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("engine url %q: scheme must be http or https", cfg.URL)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("engine url %q: no host", cfg.URL)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("engine url %q: must not carry a query, fragment or credentials", cfg.URL)
	}
	port := 80
	if u.Scheme == "https" {
		port = 443
	}
	if p := u.Port(); p != "" {
		port, err = strconv.Atoi(p)
		if err != nil || port <= 0 || port > 65535 {
			return nil, fmt.Errorf("engine url %q: bad port", cfg.URL)
		}
	}
	clean := strings.TrimRight(raw, "/")
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	cfg.Kind = kind
	return &Client{
		cfg:     cfg,
		kind:    kind,
		url:     clean,
		base:    strings.TrimSuffix(clean, "/v1"),
		port:    port,
		local:   isLocalHost(u.Hostname()),
		timeout: timeout,
		http: &http.Client{
			// Redirects off: an engine does not redirect, a login proxy does.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		logger: logger.Named("engine").With("kind", kind, "url", clean),
		warned: map[string]bool{},
	}, nil
}

// Kind returns the engine kind.
func (c *Client) Kind() string { return c.kind }

// URL returns the engine URL as configured, without a trailing slash.
func (c *Client) URL() string { return c.url }

// Config returns the configuration the client was built with.
func (c *Client) Config() Config { return c.cfg }

// Ready asks the engine's health endpoint.
func (c *Client) Ready(ctx context.Context) (bool, error) {
	return c.ready(ctx)
}

// Load reads how busy the engine is, cheaply, for the probe's idle check:
// /metrics for vLLM and SGLang (SGLang without metrics: /v1/loads, then
// /get_load), /slots then /metrics for llama.cpp. mlx-lm and Ollama
// expose no request counts: their Load has Known false and no error.
func (c *Client) Load(ctx context.Context) (wire.Load, error) {
	switch c.kind {
	case wire.EngineVLLM:
		mf, err := c.scrape(ctx)
		if err != nil {
			return wire.Load{}, err
		}
		return mf.Load, nil
	case wire.EngineSGLang:
		mf, err := c.scrape(ctx)
		if err == nil && mf.Load.Known {
			return mf.Load, nil
		}
		if err != nil && !errors.Is(err, errNotServed) {
			return wire.Load{}, err
		}
		l, _, lerr := c.sglangLoads(ctx)
		if lerr == nil {
			return l, nil
		}
		if !errors.Is(lerr, errNotServed) {
			return wire.Load{}, lerr
		}
		return c.sglangGetLoad(ctx)
	case wire.EngineLlamaCpp:
		l, err := c.llamaSlots(ctx)
		if err == nil || !errors.Is(err, errNotServed) {
			return l, err
		}
		mf, merr := c.scrape(ctx)
		if merr != nil {
			if errors.Is(merr, errNotServed) {
				return wire.Load{}, errors.New("llama-server serves neither /slots nor /metrics; start it with --slots or --metrics")
			}
			return wire.Load{}, merr
		}
		return mf.Load, nil
	default:
		return wire.Load{}, nil
	}
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
	metrics  MetricsFacts
	pools    []wire.Rank
	poolsSrc string
	info     *serverInfo
	props    *llamaProps
	ps       []ollamaModel
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

// Facts reads everything the agent reports about the engine. It never
// fails: problems go in Engine.Error. gpus are this host's GPUs (their
// processes decide GPUUUIDs and ForeignProcesses); logFacts, when not
// nil, are what the engine's start-up log said.
func (c *Client) Facts(ctx context.Context, gpus []wire.GPU, logFacts *LogFacts) wire.Engine {
	e := wire.Engine{Kind: c.kind, URL: c.url}
	r := c.read(ctx)

	// The engine's processes, when it runs on this host.
	var tree []int
	var cmdArgs map[string]string
	if r.down {
		c.forgetProcess()
	}
	if c.local {
		pid, argv, t, err := c.findProcess(ctx)
		switch {
		case err == nil:
			e.PID, tree = pid, t
			if LooksLikeEngine(argv) {
				cmdArgs = ArgsFromCmdline(argv)
			}
		case errors.Is(err, ErrNoListener):
			c.logger.Debug("engine process not found", "port", c.port)
		default:
			c.warnOnce(err.Error(), "cannot find the engine's process", "error", err)
		}
	}

	// Launch arguments: command line, then the log, then SGLang's /server_info.
	var args []string
	switch {
	case len(cmdArgs) > 0:
		args, e.LaunchArgsSource = NormalizeArgs(cmdArgs), SourceCmdline
	case logFacts != nil && len(logFacts.LaunchArgs) > 0:
		args, e.LaunchArgsSource = NormalizeArgs(logFacts.LaunchArgs), SourceLog
	case r.info != nil && len(r.info.Args) > 0:
		args, e.LaunchArgsSource = NormalizeArgs(r.info.Args), SourceServerInfo
	}
	args, e.LaunchArgsSource = c.stickyArgs(args, e.LaunchArgsSource, r.down)

	e.Models = r.models
	e.Ready = r.ready && !r.down
	e.Version = r.version
	if e.Version == "" && logFacts != nil {
		e.Version = bound(logFacts.Version)
	}
	e.Load = r.load
	e.Model = c.pickModel(r, cmdArgs, logFacts, args)
	e.Ranks, e.RanksSource = c.pickRanks(r, logFacts)
	if len(e.Ranks) > 0 {
		e.RanksAt = time.Now().UTC()
	}
	if e.Model != "" {
		e.CapacityKey = CapacityKey(c.cfg.Node, c.kind, e.Model, args)
	}
	e.LaunchArgs = boundList(args)
	e.GPUUUIDs, e.ForeignProcesses = gpuUse(gpus, tree)
	if len(r.problems) > 0 {
		e.Error = bound(strings.Join(r.problems, "; "))
	}
	return e
}

// read asks the engine's HTTP endpoints, kind by kind.
func (c *Client) read(ctx context.Context) *reading {
	r := &reading{}
	models, err := c.models(ctx)
	r.note(err)
	r.models = models
	if r.down {
		return r
	}
	ready, err := c.ready(ctx)
	r.note(err)
	r.ready = ready
	if r.down {
		return r
	}
	if v, err := c.version(ctx); err != nil {
		r.note(err)
	} else {
		r.version = v
	}
	if r.down {
		return r
	}

	switch c.kind {
	case wire.EngineVLLM:
		mf, err := c.scrape(ctx)
		r.note(err)
		r.metrics, r.load = mf, mf.Load
	case wire.EngineSGLang:
		info, err := c.sglangServerInfo(ctx)
		r.note(err)
		if err == nil {
			r.info = &info
			if r.version == "" {
				r.version = info.Version
			}
		}
		if r.down {
			return r
		}
		mf, err := c.scrape(ctx)
		r.note(err)
		r.metrics, r.load = mf, mf.Load
		if len(mf.Ranks) > 0 {
			r.pools, r.poolsSrc = mf.Ranks, SourceMetrics
		}
		if r.down || (mf.Load.Known && len(mf.Ranks) > 0) {
			return r
		}
		l, pools, err := c.sglangLoads(ctx)
		r.note(err)
		if err == nil {
			if !r.load.Known {
				r.load = l
			}
			if len(r.pools) == 0 && len(pools) > 0 {
				r.pools, r.poolsSrc = pools, SourceLoads
			}
		} else if errors.Is(err, errNotServed) && !r.load.Known {
			l, err := c.sglangGetLoad(ctx)
			r.note(err)
			if err == nil {
				r.load = l
			}
		}
	case wire.EngineLlamaCpp:
		props, err := c.llamaProps(ctx)
		r.note(err)
		if err == nil {
			r.props = &props
			if r.version == "" {
				r.version = props.BuildInfo
			}
		}
		if r.down {
			return r
		}
		l, err := c.Load(ctx)
		r.note(err)
		r.load = l
	case wire.EngineOllama:
		ps, err := c.ollamaPS(ctx)
		r.note(err)
		r.ps = ps
	}
	return r
}

// pickModel chooses the served model: the configured override, then what
// the engine says it has loaded, then its model list, then the log, then
// the launch arguments.
func (c *Client) pickModel(r *reading, cmdArgs map[string]string, lf *LogFacts, args []string) string {
	var candidates []string
	candidates = append(candidates, c.cfg.Model)
	switch c.kind {
	case wire.EngineOllama:
		if len(r.ps) > 0 {
			candidates = append(candidates, r.ps[0].Name)
		}
	case wire.EngineMLX:
		// /v1/models lists the whole Hugging Face cache; --model is the one served.
		candidates = append(candidates, cmdArgs["model"])
	case wire.EngineLlamaCpp:
		if r.props != nil {
			candidates = append(candidates, r.props.ModelAlias)
		}
	}
	if len(r.models) > 0 {
		candidates = append(candidates, r.models[0])
	}
	if lf != nil {
		candidates = append(candidates, lf.Model)
	}
	for _, key := range []string{"served_model_name", "model"} {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, key+"="); ok {
				candidates = append(candidates, v)
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	candidates = append(candidates, c.lastModel)
	for _, m := range candidates {
		if m = strings.TrimSpace(m); m != "" {
			c.lastModel = bound(m)
			return c.lastModel
		}
	}
	return ""
}

// pickRanks chooses the KV pools per rank by how truthful each source is:
// the start-up log, then SGLang's per-rank metrics or /v1/loads, then
// SGLang's /server_info (only where it cannot mislabel ranks), then
// llama.cpp's n_ctx × total_slots, then Ollama's context length. Never
// vLLM's cache_config_info: its num_gpu_blocks is the sum over DP ranks.
func (c *Client) pickRanks(r *reading, lf *LogFacts) ([]wire.Rank, string) {
	if lf != nil && len(lf.Ranks) > 0 && wire.CheckRanks(lf.Ranks) == nil {
		ranks := slices.Clone(lf.Ranks)
		slices.SortFunc(ranks, func(a, b wire.Rank) int { return a.DPRank - b.DPRank })
		src := c.cfg.Log
		if src == "" {
			src = SourceLog
		}
		return ranks, bound(src)
	}
	if len(r.pools) > 0 {
		return r.pools, r.poolsSrc
	}
	if info := r.info; info != nil {
		if caps := info.Capacities; len(caps) > 0 && (info.Ranked || allEqual(caps)) {
			return caps, SourceServerInfo
		}
		if info.DPSize <= 1 && info.MaxTotalNumTokens > 0 {
			return []wire.Rank{{DPRank: 0, KVTokens: info.MaxTotalNumTokens}}, SourceServerInfo
		}
	}
	if p := r.props; p != nil && p.NCtx > 0 && p.TotalSlots > 0 && p.NCtx <= maxKVTokens/p.TotalSlots {
		return []wire.Rank{{DPRank: 0, KVTokens: p.NCtx * p.TotalSlots}}, SourceProps
	}
	for _, m := range r.ps {
		if (c.cfg.Model == "" || m.Name == c.cfg.Model) && m.ContextLength > 0 {
			return []wire.Rank{{DPRank: 0, KVTokens: m.ContextLength}}, SourceAPIPS
		}
	}
	return nil, ""
}

func allEqual(ranks []wire.Rank) bool {
	for _, r := range ranks[1:] {
		if r.KVTokens != ranks[0].KVTokens {
			return false
		}
	}
	return true
}

// stickyArgs keeps the command-line arguments of the last read while the
// engine is down and its process gone: the log or /server_info would give
// another set, and so another capacity key, for the same engine during a
// short outage.
func (c *Client) stickyArgs(args []string, src string, down bool) ([]string, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if down && src != SourceCmdline && c.lastSrc == SourceCmdline {
		return c.lastArgs, c.lastSrc
	}
	if src != "" {
		c.lastArgs, c.lastSrc = args, src
	}
	return args, src
}

// findProcess returns the engine's root pid, its argv and its process
// tree. A pid found before is checked cheaply and kept while it still
// listens on the port.
// processLookup caches what findProcess found: finding a port's owner
// walks every process's file descriptors, far too dear for every poll.
type processLookup struct {
	at   time.Time
	root int
	argv []string
	tree []int
	err  error
}

// processRecheck is how long a process lookup is trusted while its
// process lives and the engine answers; an engine that went down, or whose
// process exited, is looked up afresh at once. A lookup walks every
// process's file descriptors (about 70 ms of CPU on a small host), so this
// sets most of the agent's idle CPU.
const processRecheck = 60 * time.Second

func (c *Client) findProcess(ctx context.Context) (int, []string, []int, error) {
	c.mu.Lock()
	p := c.proc
	c.mu.Unlock()
	if !p.at.IsZero() && time.Since(p.at) < processRecheck && (p.err != nil || processAlive(p.root)) {
		return p.root, p.argv, p.tree, p.err
	}
	root, argv, tree, err := c.lookupProcess(ctx)
	c.mu.Lock()
	c.proc = processLookup{at: time.Now(), root: root, argv: argv, tree: tree, err: err}
	c.mu.Unlock()
	return root, argv, tree, err
}

// forgetProcess drops the cached lookup, so a restarted engine's new
// process (and launch arguments) is found at the next poll.
func (c *Client) forgetProcess() {
	c.mu.Lock()
	c.proc = processLookup{}
	c.mu.Unlock()
}

// processAlive reports whether pid still exists (kill 0 would need
// permission over it; its /proc entry does not).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil || runtime.GOOS != "linux"
}

func (c *Client) lookupProcess(ctx context.Context) (int, []string, []int, error) {
	c.mu.Lock()
	listener := c.listener
	c.mu.Unlock()
	if listener == 0 || !stillListens(ctx, listener, c.port) {
		var err error
		listener, err = FindListener(ctx, c.port)
		if err != nil {
			c.mu.Lock()
			c.listener, c.pid = 0, 0
			c.mu.Unlock()
			return 0, nil, nil, err
		}
	}
	root, argv, err := engineProcess(ctx, listener)
	if err != nil {
		return 0, nil, nil, err
	}
	tree, err := ProcessTree(ctx, root)
	if err != nil {
		return 0, nil, nil, err
	}
	c.mu.Lock()
	c.listener, c.pid = listener, root
	c.mu.Unlock()
	return root, argv, tree, nil
}

// gpuUse returns the GPUs on which a process of tree holds memory, and
// the processes on those GPUs that are outside tree.
func gpuUse(gpus []wire.GPU, tree []int) ([]string, []wire.GPUProcess) {
	if len(tree) == 0 {
		return nil, nil
	}
	in := make(map[int]bool, len(tree))
	for _, pid := range tree {
		in[pid] = true
	}
	var uuids []string
	var foreign []wire.GPUProcess
	for _, g := range gpus {
		mine := slices.ContainsFunc(g.Processes, func(p wire.GPUProcess) bool { return in[p.PID] })
		if !mine || g.UUID == "" {
			continue
		}
		if len(uuids) < wire.MaxListItems {
			uuids = append(uuids, g.UUID)
		}
		for _, p := range g.Processes {
			if !in[p.PID] && len(foreign) < wire.MaxProcesses {
				p.Foreign = true
				foreign = append(foreign, p)
			}
		}
	}
	return uuids, foreign
}

// boundList cuts a list to what the wire accepts. The capacity key is
// computed over the whole list before this.
func boundList(list []string) []string {
	if len(list) > wire.MaxListItems {
		list = list[:wire.MaxListItems]
	}
	out := make([]string, 0, len(list))
	for _, s := range list {
		out = append(out, bound(s))
	}
	if len(out) == 0 {
		return nil
	}
	return out
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
