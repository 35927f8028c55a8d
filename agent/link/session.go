package link

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"heft/shared/wire"
)

// refusedError is a dial the coordinator answered with an HTTP status
// instead of upgrading to a websocket: 401 for an unknown token, 200 or
// 404 for a URL that is not its agent endpoint.
type refusedError struct {
	status int
	err    error
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("coordinator answered %d %s instead of a websocket: %v", e.status, http.StatusText(e.status), e.err)
}
func (e *refusedError) Unwrap() error { return e.err }

// badMessageError ends a session because the coordinator sent something
// this agent cannot use.
type badMessageError struct{ err error }

func (e *badMessageError) Error() string { return "bad message from coordinator: " + e.err.Error() }
func (e *badMessageError) Unwrap() error { return e.err }

// isBusy reports whether a Handler's Probe error says the engine was busy
// and the probe deferred: an error in its chain with a Busy method that
// returns true (probe.ErrBusy has one), as net.Error has Timeout.
func isBusy(err error) bool {
	var b interface{ Busy() bool }
	return errors.As(err, &b) && b.Busy()
}

// session is one websocket connection.
type session struct {
	l         *link
	conn      *websocket.Conn
	ctx       context.Context // ends with the session
	end       context.CancelCauseFunc
	heartbeat atomic.Int64 // time.Duration
	prev      atomic.Pointer[last]
	// peerClose is the coordinator's close frame, as the reader read it:
	// the reason a session ended even when a write noticed first.
	peerClose atomic.Pointer[error]
	started   chan struct{} // closed once Hello and the first snapshot are out
}

// dialHeader authenticates the dial: the agent token, and the node
// credential once the node holds one, which the coordinator accepts alone
// (the agent token is needed only to enrol).
func (l *link) dialHeader() http.Header {
	h := http.Header{"Authorization": {"Bearer " + l.agentToken()}}
	if cred := l.credential(); cred != "" {
		h.Set(wire.HeaderNode, l.cfg.Node)
		h.Set(wire.HeaderNodeCredential, cred)
	}
	return h
}

// session dials, runs one connection until it fails or the agent stops,
// and returns why it ended.
func (l *link) session() error {
	dialCtx, cancel := context.WithTimeout(l.ctx, l.cfg.DialTimeout)
	conn, resp, err := websocket.Dial(dialCtx, l.cfg.URL, &websocket.DialOptions{
		HTTPClient: l.client,
		HTTPHeader: l.dialHeader(),
	})
	cancel()
	if err != nil {
		var redirect *redirectError
		if errors.As(err, &redirect) { // refused by refuseRedirect, so no resp
			return &refusedError{status: redirect.status, err: err}
		}
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return &refusedError{status: resp.StatusCode, err: err}
		}
		return &dialError{err}
	}
	defer conn.CloseNow()
	conn.SetReadLimit(wire.MaxMessageBytes)
	l.log.Debug("websocket open; saying hello", "url", l.cfg.URL)

	s := &session{l: l, conn: conn, started: make(chan struct{})}
	s.ctx, s.end = context.WithCancelCause(l.ctx)
	defer s.end(nil)
	s.heartbeat.Store(int64(l.cfg.SnapshotEvery))

	// The reader must run all the time: pongs and close frames arrive
	// through it. It reads under no deadline, so it lasts until the
	// connection closes and a close handshake can still complete.
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		s.readLoop()
	}()
	var wg sync.WaitGroup
	wg.Go(s.writeLoop)
	wg.Go(s.pollLoop)
	wg.Go(s.pingLoop)

	<-s.ctx.Done()
	// A write or ping in flight gets a moment to finish, so that a close
	// frame can still follow it; one stuck on a stalled coordinator is cut.
	if !waitFor(&wg, closeGrace) {
		conn.CloseNow()
		wg.Wait()
	}
	cause := context.Cause(s.ctx)
	var bad *badMessageError
	switch {
	case l.ctx.Err() != nil:
		cause = nil
		conn.Close(websocket.StatusGoingAway, "agent shutting down")
	case errors.As(cause, &bad):
		conn.Close(websocket.StatusPolicyViolation, closeReason(bad.Error()))
	default:
		// A write that failed because the coordinator closed the link:
		// its close frame says why (a refused credential, say), so let the
		// reader read it before the connection is cut.
		if closedUnder(cause) {
			t := time.NewTimer(closeGrace)
			select {
			case <-readDone:
			case <-t.C:
			}
			t.Stop()
		}
		conn.CloseNow()
	}
	<-readDone
	l.dropTransient()
	if pc := s.peerClose.Load(); pc != nil && websocket.CloseStatus(cause) == -1 {
		cause = *pc
	}
	return cause
}

// waitFor waits for wg at most d and reports whether it finished.
func waitFor(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// start sends Hello and a fresh snapshot: every connection begins as if
// the coordinator knew nothing.
func (s *session) start() error {
	cfg := s.l.cfg
	hello := &wire.Hello{Node: cfg.Node, AgentVersion: cfg.AgentVersion, Host: cfg.Host,
		NodeCredential: s.l.credential(), KeepsCredential: true, Measurements: s.l.h.Held()}
	err := s.write(hello)
	if errors.Is(err, errUnsendable) && len(hello.Measurements) > 0 {
		// The offers cost the hello: the coordinator measures instead.
		s.l.log.Warn("the measurements held for the coordinator do not fit the hello; sent without them", "error", err)
		hello.Measurements = nil
		err = s.write(hello)
	}
	if err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	snap := s.l.h.Snapshot(s.ctx)
	s.offered(snap)
	if err := s.writeSnapshot(&snap); err != nil {
		return fmt.Errorf("send snapshot: %w", err)
	}
	return nil
}

// last is the snapshot most recently offered to the writer and when, for
// the poller to compare against.
type last struct {
	snap wire.Snapshot
	at   time.Time
}

func (s *session) offered(snap wire.Snapshot) { s.prev.Store(&last{snap: snap, at: time.Now()}) }

func (s *session) readLoop() {
	for {
		_, data, err := s.conn.Read(context.Background())
		if err != nil {
			s.end(s.readError(err))
			return
		}
		env, err := wire.Decode(data)
		if err != nil {
			s.end(&badMessageError{err})
			return
		}
		if err := s.dispatch(env); err != nil {
			s.end(&badMessageError{err})
			return
		}
	}
}

// closedUnder reports whether err is a write that found the connection
// closed by the other side, whose close frame may be waiting to be read.
func closedUnder(err error) bool {
	return !errors.Is(err, errPeerClosed) && (errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET))
}

// errPeerClosed marks the coordinator's close frame.
var errPeerClosed = errors.New("coordinator closed the link")

func (s *session) readError(err error) error {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		err = fmt.Errorf("%w: %q (code %d): %w", errPeerClosed, ce.Reason, int(ce.Code), err)
		s.peerClose.Store(&err)
		return err
	}
	return fmt.Errorf("read: %w", err)
}

func (s *session) dispatch(env *wire.Envelope) error {
	switch env.Type {
	case wire.TypeWelcome:
		s.l.welcomed(env.Welcome)
		if sec := env.Welcome.SnapshotSeconds; sec > 0 {
			// Clamped before converting: a huge value would overflow to a
			// negative heartbeat, a snapshot on every poll.
			s.heartbeat.Store(int64(time.Duration(min(sec, maxHeartbeatSeconds)) * time.Second))
		}
		if c := env.Welcome.NodeCredential; c != "" {
			s.l.enrolled(c)
		}
	case wire.TypeCached:
		s.l.h.Cached(*env.Cached)
	case wire.TypeProbeRequest:
		s.l.startProbe(*env.ProbeRequest)
	default:
		return fmt.Errorf("unexpected message type %q", env.Type)
	}
	return nil
}

// writeLoop owns the writing: Hello and the first snapshot, then probe
// messages and snapshots as they come, one at a time, each under
// WriteTimeout. A failed write ends the session; a probe message then
// stays queued for the next one.
func (s *session) writeLoop() {
	if err := s.start(); err != nil {
		s.end(err)
		return
	}
	close(s.started)
	for s.ctx.Err() == nil {
		m, snap, ok := s.l.next()
		if !ok {
			select {
			case <-s.ctx.Done():
				return
			case <-s.l.wake:
			}
			continue
		}
		if snap != nil {
			if err := s.writeSnapshot(snap); err != nil {
				s.end(fmt.Errorf("send snapshot: %w", err))
				return
			}
			continue
		}
		err := s.write(m.payload)
		if err != nil && !errors.Is(err, errUnsendable) {
			s.end(fmt.Errorf("send %s: %w", describe(m.payload), err))
			return
		}
		if err != nil {
			s.l.log.Error("probe message dropped", "message", describe(m.payload), "error", err)
		}
		s.l.ack(m.id)
	}
}

// writeSnapshot writes one snapshot; one that cannot be encoded is logged
// (loudly once, until a snapshot goes through again) and skipped rather
// than ending the session.
func (s *session) writeSnapshot(snap *wire.Snapshot) error {
	err := s.write(snap)
	switch {
	case errors.Is(err, errUnsendable):
		if s.l.snapFailing {
			s.l.log.Debug("snapshot not sent", "error", err)
		} else {
			s.l.log.Error("snapshot not sent", "error", err)
		}
		s.l.snapFailing = true
		return nil
	case err == nil:
		s.l.snapFailing = false
	}
	return err
}

// errUnsendable marks a message at fault itself: sending it again cannot help.
var errUnsendable = errors.New("message cannot be sent")

func (s *session) write(payload any) error {
	data, err := wire.Encode(payload)
	if err != nil {
		return fmt.Errorf("%w: %w", errUnsendable, err)
	}
	if len(data) > wire.MaxMessageBytes {
		return fmt.Errorf("%w: %d bytes exceeds the %d byte limit", errUnsendable, len(data), wire.MaxMessageBytes)
	}
	// Not derived from s.ctx: a context that ends during (or just after) a
	// write closes the connection, and the session may end at any moment.
	ctx, cancel := context.WithTimeout(context.Background(), s.l.cfg.WriteTimeout)
	defer cancel()
	return s.conn.Write(ctx, websocket.MessageText, data)
}

// pollLoop takes a snapshot every PollEvery and offers it when it changed
// significantly or the heartbeat is due. It never waits for the writer.
func (s *session) pollLoop() {
	if !s.waitStarted() {
		return
	}
	t := time.NewTicker(s.l.cfg.PollEvery)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		if s.ctx.Err() != nil {
			return // select picks at random when both are ready
		}
		next := s.l.h.Snapshot(s.ctx)
		prev := s.prev.Load()
		due := time.Since(prev.at) >= time.Duration(s.heartbeat.Load())
		if due || s.l.cfg.Significant(prev.snap, next) {
			s.offered(next)
			s.l.offer(next)
		}
	}
}

// pingLoop ends the session when the coordinator stops answering pings.
func (s *session) pingLoop() {
	if !s.waitStarted() {
		return
	}
	t := time.NewTicker(s.l.cfg.PingEvery)
	defer t.Stop()
	failed := 0
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		if s.ctx.Err() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.l.cfg.PingTimeout) // as in write
		err := s.conn.Ping(ctx)
		cancel()
		if s.ctx.Err() != nil {
			return
		}
		if err == nil {
			failed = 0
			continue
		}
		failed++
		s.l.log.Debug("ping unanswered", "error", err, "in_a_row", failed)
		if failed >= pingFailures {
			s.end(fmt.Errorf("coordinator did not answer %d pings: %w", failed, err))
			return
		}
	}
}

func (s *session) waitStarted() bool {
	select {
	case <-s.started:
		return true
	case <-s.ctx.Done():
		return false
	}
}

// closeReason fits a close reason into the 123 bytes a close frame allows.
func closeReason(s string) string {
	return wire.Clip(s, 123)
}
