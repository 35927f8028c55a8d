// Package collect assembles what the agent sees into a wire.Snapshot: the
// host, its GPUs, and the facts of every configured engine, including the
// KV pools their start-up logs print, which it follows for as long as the
// agent runs.
package collect

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/engine"
	"heft/agent/enginelog"
	"heft/agent/gpu"
	"heft/agent/host"
	"heft/agent/logsource"
	"heft/agent/status"
	"heft/shared/backoff"
	"heft/shared/wire"
)

// Config is what the collector watches.
type Config struct {
	// Node names this host in capacity keys; the host name when empty.
	// It is every engine's Node.
	Node    string
	Engines []engine.Config
	// GPUError is why GPUs cannot be read (gpu.Open's error), reported in
	// every snapshot.
	GPUError string
	// LogOptions say where the host keeps journals, Docker's socket and
	// data, and pod logs, for the engines' log sources.
	LogOptions logsource.Options
	// Status receives each engine's and each log's state, logged once per
	// change. Nil: the states are neither kept nor logged (one-shot use,
	// as inspect, which reports them itself).
	Status *status.Board
}

// Collector builds snapshots. It is safe for concurrent use.
type Collector struct {
	cfg     Config
	gpus    gpu.Source
	logger  hclog.Logger
	engines []*engineState
	wg      sync.WaitGroup

	mu      sync.Mutex
	byKey   map[string]*engine.Client
	hostErr string // last host error logged, so it is logged once
	host    wire.Host
	hostAt  time.Time // when host was read
}

// hostEvery is how often host facts are read again: they barely change,
// and reading them walks /sys for every CPU.
const hostEvery = 30 * time.Second

// engineState is one engine and what its log has said.
type engineState struct {
	spec   engine.Config
	client *engine.Client
	src    *logsource.Source // nil: no log configured
	rep    *status.Reporter  // the engine's state on the board
	watch  *logWatch         // the log's state on the board; nil while the log is not followed
	// ignored says why a configured log is not read ("" when it is).
	ignored string

	mu sync.Mutex
	// tracker holds what the log has said (nil: not read); pending is a
	// fresh tracker a new Follow feeds after a failed one, until it has
	// caught up (see adopt), and pendingAt when it was last fed.
	tracker   *enginelog.Tracker
	pending   *enginelog.Tracker
	pendingAt time.Time
	once      *enginelog.Facts // from ReadLogsOnce
	follows   bool
	// bannerAt is when the log's start-up number bannerOf was first seen
	// showing its banner only (enginelog.Facts.BannerOnly).
	bannerOf int
	bannerAt time.Time

	// The last full read of the engine, reused between full reads while the
	// engine stays ready and its log says nothing new (see facts).
	last    wire.Engine
	lastAt  time.Time
	lastLog string
}

// fullEvery is how often a ready engine is read in full (models, version,
// metrics, process). In between, one cheap readiness check per poll keeps
// a restart or an outage visible within a poll, while load and clocks,
// which only heartbeats carry, are at most this old.
const fullEvery = 5 * time.Second

// New checks the configuration and builds a collector over gpus.
func New(cfg Config, gpus gpu.Source, logger hclog.Logger) (*Collector, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	logger = logger.Named("collect")
	if gpus == nil {
		return nil, errors.New("collect: no gpu source")
	}
	if strings.TrimSpace(cfg.Node) == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return nil, fmt.Errorf("collect: no node name and no host name: %v", err)
		}
		cfg.Node = h
	}
	if len(cfg.Engines) > wire.MaxEngines {
		return nil, fmt.Errorf("collect: %d engines, at most %d", len(cfg.Engines), wire.MaxEngines)
	}
	c := &Collector{cfg: cfg, gpus: gpus, logger: logger, byKey: map[string]*engine.Client{}}
	board, repLogger := cfg.Status, logger
	if board == nil {
		board, repLogger = status.New(), hclog.NewNullLogger()
	}
	engineRep, logRep := board.Reporter(status.AreaEngine, "url", repLogger), board.Reporter(status.AreaLog, "log", repLogger)
	seen := map[string]bool{}
	for _, spec := range cfg.Engines {
		spec.Node = cfg.Node
		client, err := engine.New(spec, logger)
		if err != nil {
			return nil, fmt.Errorf("collect: %w", err)
		}
		if seen[client.URL()] {
			return nil, fmt.Errorf("collect: engine %s is configured twice", client.URL())
		}
		seen[client.URL()] = true
		st := &engineState{spec: spec, client: client, rep: engineRep}
		if spec.Log != "" {
			src, err := logsource.Open(spec.Log, cfg.LogOptions, logger.Named("engine").With("url", client.URL()))
			if err != nil {
				return nil, fmt.Errorf("collect: engine %s: %w", client.URL(), err)
			}
			st.src = src
			if g := client.LogGrammar(); g == nil {
				st.ignored = fmt.Sprintf("heft reads the start-up logs of %s only, and this engine is %s", strings.Join(engine.LogKinds(), ", "), client.Kind())
				logger.Warn("engine log ignored: heft reads no start-up log of this engine kind",
					"url", client.URL(), "log", spec.Log, "kind", client.Kind())
			} else {
				t := enginelog.NewTracker(g)
				st.tracker, st.watch = t, newLogWatch(spec.Log, logRep)
			}
		}
		c.engines = append(c.engines, st)
	}
	return c, nil
}

// Start starts one follower per engine log and returns. Followers read the
// log from its start, keep up with it across rotation and truncation
// (resetting the tracker), and end with ctx; Wait waits for them.
func (c *Collector) Start(ctx context.Context) {
	for _, st := range c.engines {
		if st.tracker == nil {
			continue
		}
		st.mu.Lock()
		if st.follows {
			st.mu.Unlock()
			continue
		}
		st.follows = true
		st.mu.Unlock()
		c.wg.Go(func() { c.follow(ctx, st) })
		c.wg.Go(func() { st.watch.run(ctx) })
	}
}

// Wait blocks until every follower started by Start has ended.
func (c *Collector) Wait() { c.wg.Wait() }

// follow follows one engine's log source, again after a pause when it
// fails (no permission, no such unit, container or pod, a stream cut),
// until ctx ends. Each Follow reads the engine's current run from its
// start, so after a failed one the lines go to a fresh tracker, which
// replaces the one in use only once it has caught up (adopt): feeding the
// old one again would count the same start-up twice, and showing the
// fresh one at once would show pools half read again.
func (c *Collector) follow(ctx context.Context, st *engineState) {
	logger := c.logger.With("url", st.client.URL(), "log", st.spec.Log)
	// Follow returns only for a lasting problem (no permission, no such
	// unit), so the waits grow to 30 s and stay there.
	b := &backoff.Backoff{Min: time.Second, Max: 30 * time.Second}
	for attempt := 0; ; attempt++ {
		st.watch.started()
		st.mu.Lock()
		feed := st.tracker
		if attempt > 0 {
			feed = enginelog.NewTracker(st.client.LogGrammar())
			st.pending, st.pendingAt = feed, time.Now()
		}
		st.mu.Unlock()
		err := st.src.Follow(ctx, logsource.Handler{
			Line: func(line string) {
				feed.Feed(line)
				if attempt > 0 {
					st.mu.Lock()
					st.pendingAt = time.Now()
					st.mu.Unlock()
				}
			},
			Reset: func(reason string) {
				logger.Info("engine log moved on (rotated, truncated, restarted); facts kept until the next start-up", "reason", reason)
				feed.Reset()
			},
		})
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("follower stopped")
		}
		st.watch.failed(err) // on the board, and in the log once
		if !b.Wait(ctx) {
			return
		}
	}
}

// ReadLogsOnce reads every engine log from start to end once, for one-shot
// use (heft-agent inspect) where no follower runs. A log without pool
// lines still gives its launch args, version and model; an unreadable log
// is an error naming it, and the other logs are still read.
func (c *Collector) ReadLogsOnce(ctx context.Context) error {
	var errs []error
	for _, st := range c.engines {
		if st.tracker == nil {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var readErr error
		f, err := enginelog.ReadEach(st.client.LogGrammar(), func(yield func(string)) error {
			readErr = st.src.ReadAll(ctx, logsource.Handler{Line: yield})
			return readErr
		})
		if readErr != nil {
			errs = append(errs, fmt.Errorf("engine log %s: %w", st.spec.Log, readErr))
			continue
		}
		if err != nil && !errors.Is(err, enginelog.ErrNoPools) {
			errs = append(errs, fmt.Errorf("engine log %s: %w", st.spec.Log, err))
			continue
		}
		f.BannerOnly = false // read whole: no follower is between two lines
		st.mu.Lock()
		st.once = &f
		st.mu.Unlock()
	}
	return errors.Join(errs...)
}

// caughtUp is how long a fresh tracker must go without a line before it
// counts as having read the current run again, when its facts still
// differ from the ones in use (the engine changed while the source could
// not be read).
const caughtUp = 2 * time.Second

// logFacts returns what the engine's log has said so far, or nil. A fresh
// tracker fed after a failed Follow replaces the one in use (adopt) once
// it says the same, or once it has begun a start-up and read nothing for
// caughtUp.
func (st *engineState) logFacts() *enginelog.Facts {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.follows && st.pending != nil {
		cur, _ := st.tracker.Facts()
		next, _ := st.pending.Facts()
		if next.Startups > 0 && (sameLog(cur, next) || time.Since(st.pendingAt) >= caughtUp) || cur.Startups == 0 && !hasFacts(cur) {
			st.tracker, st.pending = st.pending, nil
		}
	}
	if st.follows && st.tracker != nil {
		f, _ := st.tracker.Facts()
		if f.BannerOnly {
			// A banner with nothing after it for caughtUp is all this
			// start-up prints for now (an engine that logs its arguments
			// elsewhere): the snapshot names the engine without them.
			if st.bannerOf != f.Startups {
				st.bannerOf, st.bannerAt = f.Startups, time.Now()
			}
			f.BannerOnly = time.Since(st.bannerAt) < caughtUp
		}
		if hasFacts(f) {
			return &f
		}
	}
	return st.once
}

func hasFacts(f enginelog.Facts) bool {
	return f.Startups > 0 || len(f.Ranks) > 0 || len(f.LaunchArgs) > 0 || f.Model != "" || f.Version != ""
}

// sameLog reports whether two trackers' facts agree on what a snapshot
// shows of them.
func sameLog(a, b enginelog.Facts) bool {
	return slices.Equal(a.Ranks, b.Ranks) && a.ExpectedRanks == b.ExpectedRanks && a.Ready == b.Ready &&
		a.Model == b.Model && a.Version == b.Version && maps.Equal(a.LaunchArgs, b.LaunchArgs)
}

// logStatus is what the wire says of the engine's log source, nil when no
// log is configured. Its error is the source's last one while no line has
// been read since.
func (st *engineState) logStatus() *wire.LogSource {
	if st.src == nil {
		return nil
	}
	s := st.src.Status()
	out := &wire.LogSource{Spec: bound(s.Spec), Resolved: bound(s.Resolved), Via: bound(s.Via), Wrapper: bound(s.Wrapper), Lines: s.Lines}
	for _, n := range s.Skipped {
		out.Skipped += n
	}
	switch {
	case st.ignored != "":
		out.Error = st.ignored
	case s.LastError != "" && !s.LastLineAt.After(s.LastErrorAt):
		out.Error = bound(s.LastError)
	}
	return out
}

// LogStatus returns the full status of each engine's log source, by the
// engine's URL, for heft-agent inspect; engines without a log are absent.
func (c *Collector) LogStatus() map[string]logsource.Status {
	out := map[string]logsource.Status{}
	for _, st := range c.engines {
		if st.src != nil {
			out[st.client.URL()] = st.src.Status()
		}
	}
	return out
}

// Snapshot reads the host, the GPUs and every engine now. It never fails:
// what cannot be read is reported inside the snapshot (GPUError,
// Engine.Error) or logged (host facts).
func (c *Collector) Snapshot(ctx context.Context) wire.Snapshot {
	snap := wire.Snapshot{Node: c.cfg.Node, At: time.Now().UTC(), GPUs: []wire.GPU{}, Engines: []wire.Engine{}}
	snap.Host = c.hostFacts(ctx)

	gpus, err := c.gpus.Devices(ctx)
	var gpuErrs []string
	if c.cfg.GPUError != "" {
		gpuErrs = append(gpuErrs, c.cfg.GPUError)
	}
	if err != nil && !slices.Contains(gpuErrs, err.Error()) {
		gpuErrs = append(gpuErrs, err.Error())
	}
	snap.GPUError = bound(strings.Join(gpuErrs, "; "))
	if len(gpus) > wire.MaxGPUs {
		gpus = gpus[:wire.MaxGPUs]
	}
	snap.GPUs = append(snap.GPUs, gpus...)

	engines := make([]wire.Engine, len(c.engines))
	var wg sync.WaitGroup
	for i, st := range c.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			engines[i] = st.facts(ctx, snap.GPUs)
		}()
	}
	wg.Wait()
	snap.Engines = append(snap.Engines, engines...)
	snap.GPUs = MarkForeign(snap.GPUs, snap.Engines)

	byKey := map[string]*engine.Client{}
	for i, e := range snap.Engines {
		if e.CapacityKey != "" {
			byKey[e.CapacityKey] = c.engines[i].client
		}
	}
	c.mu.Lock()
	c.byKey = byKey
	c.mu.Unlock()
	return snap
}

// facts reads the engine in full every fullEvery, or at once when it was
// not ready, its log told something new, or a readiness check fails.
func (st *engineState) facts(ctx context.Context, gpus []wire.GPU) wire.Engine {
	lf := st.logFacts()
	sig := logSignature(lf)
	st.mu.Lock()
	last, at, lastLog := st.last, st.lastAt, st.lastLog
	st.mu.Unlock()
	if !at.IsZero() && time.Since(at) < fullEvery && last.Ready && last.Error == "" && sig == lastLog {
		if ok, err := st.client.Ready(ctx); ok && err == nil {
			last.LogSource = st.logStatus()
			return last
		}
	}
	e := st.client.Facts(ctx, gpus, lf)
	e.LogSource = st.logStatus()
	if ctx.Err() != nil {
		return e
	}
	reportEngine(st.rep, e)
	st.mu.Lock()
	st.last, st.lastAt, st.lastLog = e, time.Now(), sig
	st.mu.Unlock()
	return e
}

// logSignature sums up what a log said that an engine's facts depend on.
func logSignature(f *enginelog.Facts) string {
	if f == nil {
		return ""
	}
	return fmt.Sprintf("%v|%d|%d|%t|%s|%s|%d|%t", f.Ranks, f.ExpectedRanks, f.Startups, f.Ready, f.Model, f.Version, len(f.LaunchArgs), f.FromPreviousFile)
}

// hostFacts returns the host's facts, read again every hostEvery.
func (c *Collector) hostFacts(ctx context.Context) wire.Host {
	c.mu.Lock()
	if !c.hostAt.IsZero() && time.Since(c.hostAt) < hostEvery {
		h := c.host
		c.mu.Unlock()
		return h
	}
	c.mu.Unlock()
	h, err := host.Collect(ctx)
	if ctx.Err() != nil {
		return h // a cancelled poll is no host problem
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil && err.Error() != c.hostErr {
		c.logger.Warn("host facts incomplete", "error", err)
	}
	c.hostErr = ""
	if err != nil {
		c.hostErr = err.Error()
	}
	c.host, c.hostAt = h, time.Now()
	return h
}

// Engine returns the client of the engine with the given capacity key, as
// of the last snapshot.
func (c *Collector) Engine(key string) (*engine.Client, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl, ok := c.byKey[key]
	return cl, ok
}

// Clients returns every engine's client, in configuration order.
func (c *Collector) Clients() []*engine.Client {
	out := make([]*engine.Client, len(c.engines))
	for i, st := range c.engines {
		out[i] = st.client
	}
	return out
}

// MarkForeign returns gpus with GPUProcess.Foreign set on every process
// that belongs to no engine's process tree. It judges only from trees it
// knows: when every engine's process was found and holds GPU memory, any
// other GPU process is foreign; otherwise only processes that an engine
// found on its own GPUs outside its tree, and that no other engine owns.
// An engine whose tree is unknown (remote, hidden by permissions, in
// another pid namespace) thus never has its own processes called foreign.
// The input is not modified.
func MarkForeign(gpus []wire.GPU, engines []wire.Engine) []wire.GPU {
	foreign := map[int]bool{}
	own := map[int]bool{}
	allKnown := len(engines) > 0
	for _, e := range engines {
		if e.PID <= 0 || len(e.GPUUUIDs) == 0 {
			allKnown = false
		}
		theirs := map[int]bool{}
		for _, p := range e.ForeignProcesses {
			foreign[p.PID] = true
			theirs[p.PID] = true
		}
		for _, g := range gpus {
			if !slices.Contains(e.GPUUUIDs, g.UUID) {
				continue
			}
			for _, p := range g.Processes {
				if !theirs[p.PID] {
					own[p.PID] = true
				}
			}
		}
	}
	out := make([]wire.GPU, len(gpus))
	for i, g := range gpus {
		g.Processes = slices.Clone(g.Processes)
		for j := range g.Processes {
			pid := g.Processes[j].PID
			g.Processes[j].Foreign = !own[pid] && (allKnown || foreign[pid])
		}
		out[i] = g
	}
	return out
}

// bound cuts s to what the wire accepts.
func bound(s string) string { return wire.Clip(s, wire.MaxStringBytes) }
