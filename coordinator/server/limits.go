package server

import (
	"errors"
	"fmt"
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
			kind = connAgent
		case "/api/v1/events":
			kind = connEvents
		}
		c := s.caps[kind]
		if c.n.Add(1) > c.max {
			c.n.Add(-1)
			c.refused.Add(1)
			if now := time.Now().UnixNano(); now-c.warned.Load() >= int64(warnEvery) {
				c.warned.Store(now)
				s.log.Warn("connection cap reached: refusing new connections of this kind", "kind", kind, "max", c.max,
					"setting", c.key, "refused_so_far", c.refused.Load(), "source", s.clientIP(r))
			}
			w.Header().Set("Retry-After", strconv.Itoa(int(warnEvery.Seconds())))
			writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("too many %s connections at once (%s = %d); retry later", kind, c.key, c.max))
			return
		}
		defer c.n.Add(-1)
		next.ServeHTTP(w, r)
	})
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
