package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Defaults of the caps on concurrent connections, by kind. Ten thousand
// agents fit twice over; event streams are dashboards and heft-syncs.
const (
	DefaultMaxAgentConnections = 20000
	DefaultMaxEventStreams     = 256
	DefaultMaxAPIRequests      = 512
)

// Kinds of connection, the label of heft_connections and
// heft_connections_refused_total.
const (
	connAgent  = "agent"
	connEvents = "events"
	connAPI    = "api"
)

// warnEvery spaces out the warnings of a cap that keeps being hit.
const warnEvery = 10 * time.Second

// connCap counts the connections of one kind and refuses those past max.
type connCap struct {
	kind, key string // key: the setting that sets max
	max       int64
	n         atomic.Int64
	refused   atomic.Int64
	warned    atomic.Int64 // unix nanoseconds of the last warning
}

// caps holds one connCap per kind.
type caps map[string]*connCap

func newCaps(o Options) caps {
	pick := func(v, def int) int64 {
		if v > 0 {
			return int64(v)
		}
		return int64(def)
	}
	return caps{
		connAgent:  {kind: connAgent, key: "max_agent_connections", max: pick(o.MaxAgentConnections, DefaultMaxAgentConnections)},
		connEvents: {kind: connEvents, key: "max_event_streams", max: pick(o.MaxEventStreams, DefaultMaxEventStreams)},
		connAPI:    {kind: connAPI, key: "max_api_requests", max: pick(o.MaxAPIRequests, DefaultMaxAPIRequests)},
	}
}

// limitConns serves a request only while its kind is under its cap, and
// answers 503 otherwise: a flood of one kind cannot take the memory and
// file descriptors the others need.
func (s *Server) limitConns(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := connAPI
		switch r.URL.Path {
		case "/api/v1/agent":
			next.ServeHTTP(w, r) // the hub counts agents: they outlive their handler
			return
		case "/api/v1/events":
			kind = connEvents
		case "/healthz":
			// Small and constant: a flood of other requests must not make
			// the coordinator look down to its supervisor.
			defer s.answerWithin(w)()
			next.ServeHTTP(w, r)
			return
		}
		if kind == connAPI {
			defer s.answerWithin(w)()
			if anyToken(bearer(r), s.tokens().Admin) {
				// An admin's request is not counted with anyone's: a flood
				// of reads cannot keep the admin from pinning or holding.
				next.ServeHTTP(w, r)
				return
			}
		}
		c := s.caps[kind]
		if !c.take() {
			s.refuseConn(w, r, c)
			return
		}
		defer c.release()
		next.ServeHTTP(w, r)
	})
}

// answerWithin sets the deadline by which an API answer must be written:
// a client that never reads holds its request, and its answer's memory,
// for that long and no longer. Event streams have one per write instead.
// The returned function clears it, so that nothing served next on the
// connection inherits it (net/http leaves a handler's deadline in place
// when the server has no WriteTimeout).
func (s *Server) answerWithin(w http.ResponseWriter) (clear func()) {
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(s.lim.apiWriteTimeout))
	return func() { _ = rc.SetWriteDeadline(time.Time{}) }
}

// take counts a new connection, or reports that the cap is reached.
func (c *connCap) take() bool {
	if c.n.Add(1) > c.max {
		c.n.Add(-1)
		return false
	}
	return true
}

func (c *connCap) release() { c.n.Add(-1) }

// refuseConn answers 503 for a connection past its kind's cap, with a
// warning in the log (spaced out).
func (s *Server) refuseConn(w http.ResponseWriter, r *http.Request, c *connCap) {
	c.refused.Add(1)
	if now := time.Now().UnixNano(); now-c.warned.Load() >= int64(warnEvery) {
		c.warned.Store(now)
		s.log.Warn("connection cap reached: refusing new connections of this kind", "kind", c.kind, "max", c.max,
			"setting", c.key, "refused_so_far", c.refused.Load(), "source", s.clientIP(r))
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(warnEvery.Seconds())))
	writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("too many %s connections at once (%s = %d); retry later", c.kind, c.key, c.max))
}

// warnListener logs accept errors at warn (spaced out): at the open-file
// limit the server cannot take new connections, and an operator should
// hear of it. The http.Server retries a temporary error by itself.
type warnListener struct {
	net.Listener
	log hclog.Logger

	mu   sync.Mutex
	last time.Time
	n    int
}

func (l *warnListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		l.mu.Lock()
		l.n++
		if time.Since(l.last) >= warnEvery {
			l.log.Warn("cannot accept connections (at the open-file limit? raise LimitNOFILE or max_agent_connections' headroom)",
				"error", err, "failures", l.n)
			l.last, l.n = time.Now(), 0
		}
		l.mu.Unlock()
	}
	return c, err
}

// agentBufferSize is the read and write buffer of an agent's websocket.
// net/http hands a hijacked connection its 4 KiB buffers each way; an
// agent sends a snapshot every 15 s and is sent a message now and then,
// so at 10,000 agents those 80 MB mostly sit idle. A bigger message
// bypasses the buffer.
const agentBufferSize = 1024

// smallBuffers gives the websocket library a hijacked connection with
// agentBufferSize buffers instead of net/http's, which are dropped.
type smallBuffers struct{ http.ResponseWriter }

func (w smallBuffers) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if err := brw.Writer.Flush(); err != nil { // net/http flushed its 101 already; be sure
		conn.Close()
		return nil, nil, err
	}
	br := bufio.NewReaderSize(conn, agentBufferSize)
	if n := brw.Reader.Buffered(); n > 0 {
		// Frames the agent sent right after the handshake: buffered in the
		// new reader, where the library looks for them.
		early, _ := brw.Reader.Peek(n)
		br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(early)), conn), max(agentBufferSize, n))
		if _, err := br.Peek(n); err != nil {
			conn.Close()
			return nil, nil, err
		}
	}
	return conn, bufio.NewReadWriter(br, bufio.NewWriterSize(conn, agentBufferSize)), nil
}
