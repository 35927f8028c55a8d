package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/netutil"

	"heft/agent/collect"
	"heft/agent/metrics"
	"heft/agent/status"
	"heft/shared/version"
)

// watcher is what /metrics and /healthz read: the handler's newest
// snapshot, the collector's log counts and the status board.
type watcher struct {
	node       string
	coordURL   string // as dialled
	h          *Handler
	col        *collect.Collector
	board      *status.Board
	started    time.Time
	stuckAfter time.Duration
}

// stuckAfter is how long the agent may go without a snapshot before
// /healthz calls it stuck: the link or keepFresh takes one every poll
// interval, and even a snapshot of engines that hang ends within their
// request timeouts (5 s each), so minutes without one mean the agent
// itself is wedged and a restart can help.
func stuckAfter(poll time.Duration) time.Duration { return max(20*poll, 2*time.Minute) }

// keepFresh takes a snapshot whenever nobody else has for two poll
// intervals (the link polls only while connected), so that engines and
// logs are watched, logged and exported while the coordinator is away.
// It never adds one while another is being taken: a slow one (an engine
// that hangs) must not pile up more.
func (h *Handler) keepFresh(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, at := h.lastSnapshot(); h.inflight.Load() == 0 && time.Since(at) >= 2*every {
			h.Snapshot(ctx)
		}
	}
}

// state is the metrics' view of the agent now.
func (w *watcher) state() metrics.State {
	snap, _ := w.h.lastSnapshot()
	coord, _ := w.board.Get(status.AreaCoordinator, w.coordURL)
	s := metrics.State{Node: w.node, Version: version.Version, Connected: coord.OK, GPUs: snap.GPUs}
	lines := w.col.LogLines()
	for i, c := range w.col.Clients() {
		e := metrics.Engine{Kind: c.Kind(), URL: c.URL(), Probes: w.h.probeCounts(c.URL())}
		if i < len(snap.Engines) { // in configuration order, as the clients
			e.Up = snap.Engines[i].Ready && snap.Engines[i].Error == ""
		}
		if n, ok := lines[c.URL()]; ok {
			e.Log, e.LogLines = c.Config().Log, n
		}
		s.Engines = append(s.Engines, e)
	}
	return s
}

// Health is /healthz's JSON body.
type Health struct {
	// Status is "ok", "degraded" (something below is failing: the agent
	// itself is fine and says so with 200) or "stuck" (no snapshot for
	// too long: 503, a restart may help).
	Status         string    `json:"status"`
	Node           string    `json:"node"`
	Version        string    `json:"version"`
	Coordinator    string    `json:"coordinator"`
	Connected      bool      `json:"connected"`
	LastSnapshotAt time.Time `json:"last_snapshot_at,omitzero"`
	// Failing lists what fails now: the coordinator link, engines, logs,
	// probes, each with why and since when.
	Failing []status.Item `json:"failing"`
}

// health judges the agent. Only the agent being stuck is unhealthy: an
// engine that is down, a log that is missing or a coordinator that is
// away are the world's state, which the agent reports (and restarting it
// would not mend), so they make it "degraded", still 200.
func (w *watcher) health(now time.Time) (Health, int) {
	_, at := w.h.lastSnapshot()
	coord, _ := w.board.Get(status.AreaCoordinator, w.coordURL)
	hl := Health{Status: "ok", Node: w.node, Version: version.Version, Coordinator: w.coordURL,
		Connected: coord.OK, LastSnapshotAt: at, Failing: []status.Item{}}
	for _, it := range w.board.Items() {
		if !it.OK {
			hl.Failing = append(hl.Failing, it)
		}
	}
	if len(hl.Failing) > 0 {
		hl.Status = "degraded"
	}
	since := w.started
	if at.After(since) {
		since = at
	}
	if now.Sub(since) > w.stuckAfter {
		hl.Status = "stuck"
		return hl, http.StatusServiceUnavailable
	}
	return hl, http.StatusOK
}

// stuck reports whether /healthz would say 503 now.
func (w *watcher) stuck() bool {
	_, code := w.health(time.Now())
	return code != http.StatusOK
}

// handler serves GET /metrics and GET /healthz.
func (w *watcher) handler(logger hclog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler(w.state, logger))
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, r *http.Request) {
		hl, code := w.health(time.Now())
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(code)
		enc := json.NewEncoder(rw)
		enc.SetIndent("", "  ")
		_ = enc.Encode(hl)
	})
	return mux
}

// How the agent's own server treats its clients (Prometheus, a
// supervisor's health check): whoever can reach the listen address must
// not be able to hold the agent's file descriptors, which it needs for its
// engines and the coordinator. Tests shorten serveIdle.
var (
	serveIdle     = time.Minute
	serveMaxConns = 64 // one scrape needs one
)

// serve serves w on ln until ctx ends, then shuts the server down.
func (w *watcher) serve(ctx context.Context, ln net.Listener, logger hclog.Logger) {
	ln = netutil.LimitListener(ln, serveMaxConns)
	srv := &http.Server{Handler: w.handler(logger), ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: serveIdle,
		ErrorLog: logger.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Error("serving /metrics and /healthz stopped", "error", err)
	}
	<-done
}
