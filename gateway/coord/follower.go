// Package coord follows a heft coordinator: it reads the workers once
// (GET /api/v1/workers), then follows the event stream (GET
// /api/v1/events), and hands every complete, valid state it reads to a
// callback. It reconnects by itself with backoff. While the coordinator
// cannot be reached or answers something it cannot trust, it hands out
// nothing, so whatever is downstream keeps the last state it was given.
package coord

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/shared/backoff"
	"heft/shared/wire"
)

// Reasons a connection to the coordinator failed, the label of
// heft_sync_coordinator_errors_total.
const (
	ReasonUnreachable  = "unreachable"  // no TCP/TLS connection, or it broke
	ReasonUnauthorized = "unauthorized" // 401/403: the viewer token is missing or wrong
	ReasonStatus       = "status"       // another non-200 answer
	ReasonGarbage      = "garbage"      // an answer that is not a workers document
	ReasonStale        = "stale"        // the event stream went silent
	ReasonEnded        = "ended"        // the coordinator closed the event stream
)

// Reasons lists every reason, for metrics that start at zero.
var Reasons = []string{ReasonUnreachable, ReasonUnauthorized, ReasonStatus, ReasonGarbage, ReasonStale, ReasonEnded}

// Config says how to reach the coordinator.
type Config struct {
	URL    string       // base URL, e.g. "https://heft.example:7070"
	Token  string       // viewer (or admin) token; "" when reads are open
	Client *http.Client // nil: a client without timeouts (the stream is long)
	// ReadToken, when set, reads the token again (heft-sync's token_file)
	// after the coordinator refuses it, so that a token rotated on the
	// coordinator is taken without restarting heft-sync.
	ReadToken func() (string, error)
	// MinBackoff and MaxBackoff bound the wait between reconnects
	// (defaults 500 ms and 30 s).
	MinBackoff, MaxBackoff time.Duration
	// StaleAfter ends a stream that sends nothing, not even the
	// coordinator's 15 s ping, for this long (default 45 s).
	StaleAfter time.Duration
	// RequestTimeout bounds GET /api/v1/workers and the wait for the
	// event stream's headers (default 10 s).
	RequestTimeout time.Duration
	// PendingEvery is how often a session reads the nodes waiting for
	// approval, for Hooks.Pending (default PendingEvery).
	PendingEvery time.Duration
}

// Snapshot is one complete state of the fleet.
type Snapshot struct {
	Workers []Worker
	At      time.Time
}

// Hooks receive what the follower sees. Every field may be nil. They are
// called from the follower's goroutine, one at a time, except Pending.
type Hooks struct {
	Snapshot  func(Snapshot)
	Connected func(bool)
	Error     func(reason string, err error)
	// Pending gets the names of the nodes waiting for an admin's approval
	// (GET /api/v1/pending-nodes), read once before each session's first
	// Snapshot, then every PendingEvery from a goroutine of its own: after
	// Connected(true), never after Connected(false).
	Pending func(nodes []string)
}

// Follower follows one coordinator.
type Follower struct {
	cfg    Config
	base   *url.URL
	hooks  Hooks
	log    hclog.Logger
	client *http.Client

	tokenMu sync.Mutex
	token   string // what requests present: cfg.Token, or what ReadToken read since
}

// New checks cfg and returns a Follower; Run starts it.
func New(cfg Config, hooks Hooks, logger hclog.Logger) (*Follower, error) {
	u, err := url.Parse(strings.TrimRight(cfg.URL, "/"))
	if err != nil {
		return nil, fmt.Errorf("coordinator url %q: %w", cfg.URL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("coordinator url %q: want http://host:port or https://host:port", cfg.URL)
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 500 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(30*time.Second, cfg.MinBackoff)
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 45 * time.Second
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	client := &http.Client{}
	if cfg.Client != nil {
		c := *cfg.Client
		client = &c
	}
	client.CheckRedirect = sameCoordinator
	return &Follower{cfg: cfg, base: u, hooks: hooks, log: logger.Named("coordinator"), client: client, token: cfg.Token}, nil
}

// Run follows the coordinator until ctx ends.
func (f *Follower) Run(ctx context.Context) {
	// Half jitter: many heft-syncs do not return to a restarted
	// coordinator in step, and none retries much sooner than the doubling.
	retry := backoff.Backoff{Min: f.cfg.MinBackoff, Max: f.cfg.MaxBackoff, HalfJitter: true}
	for {
		delivered, err := f.session(ctx)
		if ctx.Err() != nil {
			return
		}
		reason := classify(err)
		if f.hooks.Connected != nil {
			f.hooks.Connected(false)
		}
		if f.hooks.Error != nil {
			f.hooks.Error(reason, err)
		}
		if delivered || reason == ReasonUnauthorized && f.rereadToken() {
			retry.Reset()
		}
		wait := retry.Next()
		f.log.Warn("coordinator connection lost; gateways keep their last state", "reason", reason, "error", err, "retry_in", wait.Round(time.Millisecond))
		if !retry.Sleep(ctx, wait) {
			return
		}
	}
}

// session reads the workers once, then follows the event stream until it
// fails. delivered says whether any state was handed out.
func (f *Follower) session(ctx context.Context) (delivered bool, err error) {
	ws, err := f.readWorkers(ctx)
	if err != nil {
		return false, err
	}
	if f.hooks.Connected != nil {
		f.hooks.Connected(true)
	}
	if f.hooks.Pending != nil {
		// Read once before the first state, so that it is weighed knowing
		// which nodes wait, then every PendingEvery.
		p := &pendingReader{f: f}
		more := p.read(ctx)
		pctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		if more {
			wg.Go(func() { p.watch(pctx) })
		}
		defer wg.Wait()
		defer stop()
	}
	f.emit(ws)
	f.log.Info("following the coordinator", "url", f.base.Redacted(), "workers", len(ws))
	return true, f.follow(ctx, ws)
}

func (f *Follower) emit(ws []Worker) {
	if f.hooks.Snapshot != nil {
		f.hooks.Snapshot(Snapshot{Workers: ws, At: time.Now()})
	}
}

func (f *Follower) request(ctx context.Context, path, accept string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.base.String()+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	if tok := f.currentToken(); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	return req, nil
}

func (f *Follower) currentToken() string {
	f.tokenMu.Lock()
	defer f.tokenMu.Unlock()
	return f.token
}

// rereadToken reads the token again after the coordinator refused it and
// reports whether it changed: a viewer token rotated on the coordinator
// and written to heft-sync's token_file is then used from the next try.
func (f *Follower) rereadToken() bool {
	if f.cfg.ReadToken == nil {
		return false
	}
	tok, err := f.cfg.ReadToken()
	if err != nil {
		f.log.Warn("the coordinator refused the token, and the token file cannot be read again", "error", err)
		return false
	}
	f.tokenMu.Lock()
	defer f.tokenMu.Unlock()
	if tok == f.token {
		return false
	}
	f.token = tok
	f.log.Info("the coordinator refused the token; the token file holds another, which the next try presents")
	return true
}

// get reads the body of GET path, a JSON document of at most maxBody
// bytes, within RequestTimeout.
func (f *Follower) get(ctx context.Context, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.RequestTimeout)
	defer cancel()
	req, err := f.request(ctx, path, "application/json")
	if err != nil {
		return nil, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, &connError{err}
	}
	defer resp.Body.Close()
	if err := checkStatus(resp, "GET "+path); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, &connError{fmt.Errorf("read GET %s: %w", path, err)}
	}
	if len(data) > maxBody {
		return nil, fmt.Errorf("%w: GET %s answered over %d bytes", ErrGarbage, path, maxBody)
	}
	return data, nil
}

func (f *Follower) readWorkers(ctx context.Context) ([]Worker, error) {
	data, err := f.get(ctx, "/api/v1/workers")
	if err != nil {
		return nil, err
	}
	ws, err := decodeWorkers(data)
	if err != nil {
		return nil, fmt.Errorf("GET /api/v1/workers: %w", err)
	}
	return ws, nil
}

// follow reads the event stream, handing out each new state, until the
// stream fails or goes silent for StaleAfter.
func (f *Follower) follow(ctx context.Context, cur []Worker) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		stale bool
	)
	watchdog := time.AfterFunc(f.cfg.RequestTimeout, func() {
		mu.Lock()
		stale = true
		mu.Unlock()
		cancel()
	})
	defer watchdog.Stop()

	req, err := f.request(ctx, "/api/v1/events", "text/event-stream")
	if err != nil {
		return err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return f.streamErr(ctx, &stale, &mu, &connError{err})
	}
	defer resp.Body.Close()
	if err := checkStatus(resp, "GET /api/v1/events"); err != nil {
		return err
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return fmt.Errorf("%w: GET /api/v1/events answered %q, not text/event-stream", ErrGarbage, resp.Header.Get("Content-Type"))
	}
	watchdog.Reset(f.cfg.StaleAfter)
	r := newEventReader(resp.Body, func() { watchdog.Reset(f.cfg.StaleAfter) })
	for {
		ev, err := r.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errEnded
			}
			return f.streamErr(ctx, &stale, &mu, &connError{err})
		}
		next, ok, err := applyEvent(cur, ev)
		if err != nil {
			return fmt.Errorf("event %q: %w", ev.Name, err)
		}
		if !ok {
			f.log.Debug("ignored an event", "event", ev.Name)
			continue
		}
		cur = next
		f.emit(cur)
	}
}

func (f *Follower) streamErr(ctx context.Context, stale *bool, mu *sync.Mutex, err error) error {
	mu.Lock()
	defer mu.Unlock()
	if *stale && ctx.Err() != nil {
		return errStale{f.cfg.StaleAfter}
	}
	return err
}

var errEnded = errors.New("the coordinator closed the event stream")

type errStale struct{ after time.Duration }

func (e errStale) Error() string {
	return fmt.Sprintf("the event stream sent nothing for %s (the coordinator pings every 15 s)", e.after)
}

// connError marks a transport failure.
type connError struct{ err error }

func (e *connError) Error() string { return e.err.Error() }
func (e *connError) Unwrap() error { return e.err }

// statusError is a non-200 answer.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return e.msg }

func checkStatus(resp *http.Response, what string) error {
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	msg := fmt.Sprintf("%s answered %s: %s", what, resp.Status, wire.Clip(strings.TrimSpace(string(body)), 200))
	if loc := resp.Header.Get("Location"); loc != "" {
		msg += fmt.Sprintf(" (a redirect to %s, not followed: set [coordinator] url to where the coordinator answers)", wire.Clip(loc, 200))
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		msg += " (set [coordinator] token_file to a file holding the coordinator's viewer or admin token)"
	}
	return &statusError{code: resp.StatusCode, msg: msg}
}

func classify(err error) string {
	var se *statusError
	var ce *connError
	var st errStale
	switch {
	case errors.As(err, &se) && (se.code == http.StatusUnauthorized || se.code == http.StatusForbidden):
		return ReasonUnauthorized
	case errors.As(err, &se):
		return ReasonStatus
	case errors.Is(err, ErrGarbage):
		return ReasonGarbage
	case errors.As(err, &st):
		return ReasonStale
	case errors.Is(err, errEnded):
		return ReasonEnded
	case errors.As(err, &ce):
		return ReasonUnreachable
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return ReasonUnreachable
	}
	return ReasonUnreachable
}

// sameCoordinator follows a redirect only to the coordinator it was
// given: the same scheme, host and port (a proxy adding a path), or the
// same host name moved from http to https (a proxy upgrading the scheme,
// which heft-sync followed before redirects were checked). The
// coordinator's API never redirects itself; whatever sends heft-sync
// elsewhere (a host answering in its place) would have it follow the
// fleet another host lists, so that answer is taken as it is and refused
// as a status, naming where it pointed.
func sameCoordinator(req *http.Request, via []*http.Request) error {
	first := via[0].URL
	to := req.URL
	same := to.Scheme == first.Scheme && strings.EqualFold(to.Host, first.Host)
	upgraded := first.Scheme == "http" && to.Scheme == "https" && strings.EqualFold(to.Hostname(), first.Hostname())
	if len(via) > 3 || !(same || upgraded) {
		return http.ErrUseLastResponse
	}
	return nil
}
