// Package link keeps heft-agent's one websocket to the coordinator: it
// dials with the agent token, says hello, sends snapshots on change and as
// a heartbeat, runs the probes the coordinator asks for, and reconnects by
// itself with jittered backoff. Nothing it does blocks the collector: the
// newest snapshot waits in a slot of one, and probe results that could not
// be delivered wait in a small outbox for the next connection.
package link

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"heft/agent/status"
	"heft/shared/backoff"
	"heft/shared/wire"
)

// Defaults for the zero values of Config.
const (
	DefaultSnapshotEvery = 15 * time.Second
	DefaultPollEvery     = time.Second
	DefaultMinBackoff    = 500 * time.Millisecond
	DefaultMaxBackoff    = 15 * time.Second // well under the coordinator's 30 s offline grace
	DefaultPingEvery     = 15 * time.Second
	DefaultPingTimeout   = 10 * time.Second
	DefaultWriteTimeout  = 10 * time.Second
	DefaultDialTimeout   = 15 * time.Second

	// stableSession is how long a session must last for the next reconnect
	// to start again from the shortest backoff.
	stableSession = 30 * time.Second
	// pingFailures ends a session after this many unanswered pings in a row.
	pingFailures = 2
	// closeGrace is how long a write or ping in flight may finish when a
	// session ends before the connection is cut.
	closeGrace = time.Second
	// maxOutbox bounds the probe messages kept for the coordinator.
	maxOutbox = 64
	// maxHeartbeatSeconds bounds the heartbeat a Welcome may ask for.
	maxHeartbeatSeconds = 3600
)

// Handler is what the link asks of the rest of the agent.
type Handler interface {
	// Snapshot returns the current facts. It is called every PollEvery and
	// should return quickly (the collector keeps its facts ready).
	Snapshot(ctx context.Context) wire.Snapshot
	// Probe measures the engine with req's capacity key. An error with a
	// Busy() bool method that returns true (probe.ErrBusy) means the
	// probe was deferred because the engine was busy.
	Probe(ctx context.Context, req wire.ProbeRequest) (wire.Measurement, error)
	// Cached receives the coordinator's fresh measurement for a capacity
	// key. It is called from the read loop and must not block.
	Cached(m wire.CachedMeasurement)
	// Held returns the measurements to offer in the next hello
	// (wire.Hello.Measurements): those Cached kept that still hold.
	Held() []wire.CachedMeasurement
}

// Config says where and how to connect. Zero durations take the defaults.
type Config struct {
	URL   string // ws:// or wss:// URL of the coordinator's agent endpoint
	Token string // sent as Authorization: Bearer
	// ReadToken, when set, reads the token again (the agent's
	// token_file): after the coordinator refused the token in use (401),
	// and on each receive from Reread (SIGHUP). A token that cannot be read
	// keeps the one in use.
	ReadToken    func() (string, error)
	Reread       <-chan struct{}
	Node         string
	AgentVersion string
	Host         wire.Host
	TLS          *tls.Config // nil: system roots
	// HTTPClient dials the coordinator; nil: one of its own with TLS.
	// The link uses a copy that refuses redirects.
	// Tests pass one whose connections are in memory.
	HTTPClient *http.Client
	// Status receives the link's state (status.AreaCoordinator, named by
	// URL), which logs each change once; nil: a board of its own.
	Status *status.Board
	// Credentials keeps the node credential the coordinator hands out at
	// enrolment (CredentialFile in the agent's state_dir); nil keeps it
	// in memory, for this process only.
	Credentials Credentials

	// SnapshotEvery is the heartbeat: a snapshot goes out at least this
	// often. The coordinator's Welcome may ask for another interval.
	SnapshotEvery time.Duration
	// PollEvery is how often the Handler's snapshot is compared with the
	// last one sent.
	PollEvery time.Duration
	// Significant reports whether next differs enough from prev to be sent
	// before the heartbeat is due. Nil: only heartbeats.
	Significant func(prev, next wire.Snapshot) bool

	MinBackoff, MaxBackoff time.Duration
	PingEvery, PingTimeout time.Duration
	WriteTimeout           time.Duration // per message; a stalled coordinator ends the session
	DialTimeout            time.Duration
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.SnapshotEvery, DefaultSnapshotEvery)
	def(&c.PollEvery, DefaultPollEvery)
	def(&c.MinBackoff, DefaultMinBackoff)
	def(&c.MaxBackoff, DefaultMaxBackoff)
	def(&c.PingEvery, DefaultPingEvery)
	def(&c.PingTimeout, DefaultPingTimeout)
	def(&c.WriteTimeout, DefaultWriteTimeout)
	def(&c.DialTimeout, DefaultDialTimeout)
	if c.Significant == nil {
		c.Significant = func(prev, next wire.Snapshot) bool { return false }
	}
}

func (c *Config) check() error {
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("link: coordinator url: %w", err)
	}
	switch u.Scheme {
	case "ws", "wss", "http", "https":
	default:
		return fmt.Errorf("link: coordinator url %q: scheme must be ws or wss", c.URL)
	}
	hello := wire.Hello{Node: c.Node, AgentVersion: c.AgentVersion, Host: c.Host}
	if err := hello.Validate(); err != nil {
		return fmt.Errorf("link: %w", err)
	}
	return nil
}

// Run keeps the link up until ctx ends and returns nil then; it returns an
// error only for a Config it cannot use.
func Run(ctx context.Context, cfg Config, h Handler, logger hclog.Logger) error {
	l, err := newLink(ctx, cfg, h, logger)
	if err != nil {
		return err
	}
	return l.run()
}

// link is the state that outlives one websocket session.
type link struct {
	ctx    context.Context // the agent's lifetime; probes run under it
	cfg    Config
	h      Handler
	log    hclog.Logger
	rep    *status.Reporter // the link's state, logged once per change
	client *http.Client
	randN  func(int64) int64

	probes sync.WaitGroup
	wake   chan struct{} // cap 1: something waits in the outbox or slot
	// snapFailing is set while snapshots cannot be encoded; only the
	// writer, one session at a time, touches it.
	snapFailing bool

	mu      sync.Mutex
	probing map[string]bool // capacity keys being probed
	outbox  []outMsg
	nextID  uint64
	slot    *wire.Snapshot // the newest snapshot not yet written
	cred    string         // the node credential, "" before enrolment
	token   string         // the agent token in use
}

// outMsg is a probe message waiting for the writer. Durable messages (the
// answer to a request) survive a lost connection; "running" notes do not.
type outMsg struct {
	id      uint64
	payload any // *wire.ProbeResult or *wire.ProbeStatus
	durable bool
}

func newLink(ctx context.Context, cfg Config, h Handler, logger hclog.Logger) (*link, error) {
	cfg.setDefaults()
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if h == nil {
		return nil, errors.New("link: no handler")
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	logger = logger.Named("link")
	var client *http.Client
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient // a copy: the caller's client keeps its redirect policy
		client = &c
	} else {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = cfg.TLS
		client = &http.Client{Transport: tr}
	}
	client.CheckRedirect = refuseRedirect
	if cfg.Credentials == nil {
		cfg.Credentials = &memCredentials{}
	}
	cred, err := cfg.Credentials.Load()
	if err != nil {
		return nil, fmt.Errorf("link: %w", err)
	}
	if others := otherNodes(cfg.Credentials); len(others) > 0 {
		logger.Info("state_dir also keeps the credentials of other node names: kept, not presented", "node", cfg.Node, "other_nodes", others)
	}
	board := cfg.Status
	if board == nil {
		board = status.New()
	}
	return &link{
		ctx:     ctx,
		cfg:     cfg,
		h:       h,
		log:     logger,
		rep:     board.Reporter(status.AreaCoordinator, "url", logger),
		client:  client,
		randN:   rand.Int64N,
		wake:    make(chan struct{}, 1),
		probing: map[string]bool{},
		cred:    cred,
		token:   cfg.Token,
	}, nil
}

func (l *link) agentToken() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.token
}

// rereadToken reads the agent token again, if the link can, and reports
// whether it changed.
func (l *link) rereadToken(why string) bool {
	if l.cfg.ReadToken == nil {
		return false
	}
	tok, err := l.cfg.ReadToken()
	if err != nil {
		l.log.Error("cannot read the agent token again; keeping the one in use", "why", why, "error", err)
		return false
	}
	l.mu.Lock()
	changed := tok != l.token
	l.token = tok
	l.mu.Unlock()
	if changed {
		l.log.Info("read a new agent token from token_file", "why", why)
	} else {
		l.log.Debug("read the agent token again: unchanged", "why", why)
	}
	return changed
}

// watchReread reads the token again on each receive from Reread.
func (l *link) watchReread() {
	for {
		select {
		case <-l.ctx.Done():
			return
		case _, ok := <-l.cfg.Reread:
			if !ok {
				return
			}
			l.rereadToken("reload signal")
		}
	}
}

func (l *link) credential() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cred
}

// enrolled keeps the credential the coordinator handed this node. If it
// cannot be kept on disk it is still used for as long as the agent runs,
// and the log says what a restart will then need.
func (l *link) enrolled(cred string) {
	l.mu.Lock()
	l.cred = cred
	l.mu.Unlock()
	if err := l.cfg.Credentials.Save(cred); err != nil {
		l.log.Error("cannot keep the node credential: after a restart the coordinator will refuse this node until an admin releases its name",
			"node", l.cfg.Node, "error", err)
		return
	}
	args := []any{"node", l.cfg.Node}
	if others := otherNodes(l.cfg.Credentials); len(others) > 0 {
		args = append(args, "other_nodes_kept", others)
	}
	l.log.Info("enrolled: the coordinator handed this node its credential, kept in state_dir", args...)
}

// otherNodes returns the other node names whose credentials c keeps, if
// it says: a node.name changed by mistake can be changed back.
func otherNodes(c Credentials) []string {
	if o, ok := c.(interface{ otherNodes() []string }); ok {
		return o.otherNodes()
	}
	return nil
}

// refuseRedirect keeps the dial at coordinator.url: net/http would carry
// the node credential header (and, to the same host, the agent token) to
// wherever a redirect points.
func refuseRedirect(req *http.Request, _ []*http.Request) error {
	e := &redirectError{to: wsURL(req.URL)}
	if req.Response != nil {
		e.status = req.Response.StatusCode
	}
	return e
}

// wsURL writes u as coordinator.url takes it (ws://, wss://), without a password.
func wsURL(u *url.URL) string {
	c := *u
	switch c.Scheme {
	case "http":
		c.Scheme = "ws"
	case "https":
		c.Scheme = "wss"
	}
	return c.Redacted()
}

func (l *link) run() error {
	defer l.client.CloseIdleConnections()
	defer l.probes.Wait()
	if l.cfg.Reread != nil {
		var rereads sync.WaitGroup
		defer rereads.Wait()
		rereads.Go(l.watchReread)
	}
	b := &backoff.Backoff{Min: l.cfg.MinBackoff, Max: l.cfg.MaxBackoff, Jitter: true, RandN: l.randN}
	for {
		if l.ctx.Err() != nil {
			return nil // never dial once stopped
		}
		start := time.Now()
		err := l.session()
		if l.ctx.Err() != nil {
			return nil
		}
		if time.Since(start) > stableSession {
			b.Reset()
		}
		wait := b.Next()
		var refused *refusedError
		if errors.As(err, &refused) && refused.status == http.StatusUnauthorized && l.rereadToken("the coordinator refused the token in use (401)") {
			wait = l.cfg.MinBackoff // a new token: try it soon
		}
		code := websocket.CloseStatus(err)
		switch code {
		case wire.CloseProtocolVersion, wire.CloseSuperseded, wire.CloseNodeCredential, wire.CloseNodePending, wire.CloseLimit:
			// Reconnecting soon cannot help: another agent holds this node
			// name, one side must be upgraded, or an admin must act. Back
			// off all the way.
			wait = l.cfg.MaxBackoff
		}
		// One line when the link goes down or the reason changes; each
		// retry after that only at debug level.
		l.rep.Fail(l.cfg.URL, l.failure(err))
		l.log.Debug("link to coordinator down; retrying", "error", err, "retry_in", wait.String())
		if !b.Sleep(l.ctx, wait) {
			return nil
		}
	}
}

// send queues a probe message for the coordinator and wakes the writer.
func (l *link) send(payload any, durable bool) {
	l.mu.Lock()
	l.nextID++
	l.outbox = append(l.outbox, outMsg{id: l.nextID, payload: payload, durable: durable})
	if len(l.outbox) > maxOutbox {
		drop := 0 // the oldest transient message, else the oldest of all
		for i, m := range l.outbox {
			if !m.durable {
				drop = i
				break
			}
		}
		l.log.Warn("outbox full, dropping a probe message", "message", describe(l.outbox[drop].payload))
		l.outbox = append(l.outbox[:drop], l.outbox[drop+1:]...)
	}
	l.mu.Unlock()
	l.poke()
}

// offer puts a snapshot in the slot, replacing one not yet written.
func (l *link) offer(s wire.Snapshot) {
	l.mu.Lock()
	l.slot = &s
	l.mu.Unlock()
	l.poke()
}

func (l *link) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// next returns what the writer should write: probe messages first, in
// order, then the snapshot. A probe message stays queued until acked.
func (l *link) next() (outMsg, *wire.Snapshot, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.outbox) > 0 {
		return l.outbox[0], nil, true
	}
	if s := l.slot; s != nil {
		l.slot = nil
		return outMsg{}, s, true
	}
	return outMsg{}, nil, false
}

func (l *link) ack(id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, m := range l.outbox {
		if m.id == id {
			l.outbox = append(l.outbox[:i], l.outbox[i+1:]...)
			return
		}
	}
}

// dropTransient forgets what only made sense on the connection just lost,
// and the snapshot slot: the next session starts with a fresh snapshot.
func (l *link) dropTransient() {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := l.outbox[:0]
	for _, m := range l.outbox {
		if m.durable {
			kept = append(kept, m)
		}
	}
	clear(l.outbox[len(kept):])
	l.outbox = kept
	l.slot = nil
}

// startProbe runs one probe per capacity key; a request for a key already
// being probed is answered "running" and not started again.
func (l *link) startProbe(req wire.ProbeRequest) {
	status := func(state, msg string) *wire.ProbeStatus {
		return &wire.ProbeStatus{RequestID: req.RequestID, CapacityKey: req.CapacityKey, State: state, Message: clip(msg)}
	}
	l.mu.Lock()
	if l.probing[req.CapacityKey] {
		l.mu.Unlock()
		l.log.Debug("probe already running", "capacity_key", req.CapacityKey, "request_id", req.RequestID)
		l.send(status(wire.ProbeRunning, "a probe of this engine is already running"), false)
		return
	}
	l.probing[req.CapacityKey] = true
	l.probes.Add(1)
	l.mu.Unlock()

	l.log.Info("probe requested", "capacity_key", req.CapacityKey, "reason", req.Reason, "request_id", req.RequestID)
	l.send(status(wire.ProbeRunning, ""), false)
	pctx := context.WithValue(l.ctx, statusKey{}, func(state, msg string) { l.send(status(state, msg), true) })
	go func() {
		defer l.probes.Done()
		m, err := l.h.Probe(pctx, req)
		l.mu.Lock()
		delete(l.probing, req.CapacityKey)
		l.mu.Unlock()
		if l.ctx.Err() != nil {
			return // shutting down: the coordinator will ask again
		}
		if err == nil {
			if m.CapacityKey == "" {
				m.CapacityKey = req.CapacityKey
			}
			if verr := m.Validate(); verr != nil {
				err = fmt.Errorf("probe gave an invalid measurement: %w", verr)
			}
		}
		switch {
		case err == nil:
			l.log.Info("probe finished", "capacity_key", req.CapacityKey, "throughput_tps", m.ThroughputTPS, "failure", m.Failure)
			l.send(&wire.ProbeResult{RequestID: req.RequestID, Measurement: m}, true)
		case isBusy(err):
			l.log.Info("probe deferred: engine busy", "capacity_key", req.CapacityKey)
			l.send(status(wire.ProbeDeferredBusy, err.Error()), true)
		default:
			l.log.Warn("probe failed", "capacity_key", req.CapacityKey, "error", err)
			l.send(status(wire.ProbeFailed, err.Error()), true)
		}
	}()
}

func clip(s string) string { return wire.Clip(s, wire.MaxStringBytes) }

type statusKey struct{}

// SendProbeStatus tells the coordinator what the probe that ctx belongs
// to is doing (wire.ProbeDraining: drain the worker at the gateways
// while it measures); ctx is the one the link passed to Handler.Probe.
// It reports whether ctx had a link to send through.
func SendProbeStatus(ctx context.Context, state, msg string) bool {
	send, ok := ctx.Value(statusKey{}).(func(state, msg string))
	if ok {
		send(state, msg)
	}
	return ok
}

func describe(payload any) string {
	switch p := payload.(type) {
	case *wire.ProbeResult:
		return "probe result for " + p.Measurement.CapacityKey
	case *wire.ProbeStatus:
		return "probe " + p.State + " for " + p.CapacityKey
	}
	return fmt.Sprintf("%T", payload)
}
