package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Kinds of credential, the label of heft_auth_failures_total.
const (
	authAgent  = "agent"
	authAdmin  = "admin"
	authViewer = "viewer"
)

// tokenEqual compares in constant time. Hashing first hides the length too.
func tokenEqual(got, want string) bool {
	if want == "" {
		return false
	}
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// checkToken answers 429 or 401 and returns false unless the request holds
// one of the wanted tokens. query allows ?token=, for EventSource and
// browsers, which cannot set headers.
func (s *Server) checkToken(w http.ResponseWriter, r *http.Request, kind string, query bool, want ...string) bool {
	ip := sourceIP(r)
	if wait, blocked := s.auth.blocked(ip); blocked {
		s.metrics.authLimited.Inc()
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		writeError(w, http.StatusTooManyRequests, "too many failed authentications from this address; retry later")
		return false
	}
	got := bearer(r)
	if got == "" && query {
		got = r.URL.Query().Get("token")
	}
	for _, t := range want {
		if tokenEqual(got, t) {
			return true
		}
	}
	s.auth.fail(ip)
	s.metrics.authFailures.WithLabelValues(kind).Inc()
	s.log.Debug("authentication failed", "kind", kind, "source", ip, "path", r.URL.Path)
	w.Header().Set("WWW-Authenticate", `Bearer realm="heft"`)
	msg := fmt.Sprintf("missing or wrong %s token: send Authorization: Bearer <token>", kind)
	if kind == authAdmin && s.tokens().Admin == "" {
		msg = "admin actions are disabled: the coordinator has no admin_token configured"
	}
	writeError(w, http.StatusUnauthorized, msg)
	return false
}

func (s *Server) agentAuth(w http.ResponseWriter, r *http.Request) bool {
	return s.checkToken(w, r, authAgent, false, s.tokens().Agent)
}

func (s *Server) adminAuth(w http.ResponseWriter, r *http.Request) bool {
	return s.checkToken(w, r, authAdmin, false, s.tokens().Admin)
}

// readAuth guards reads: open unless a viewer token is configured, then the
// viewer or the admin token, in the header or as ?token=.
func (s *Server) readAuth(w http.ResponseWriter, r *http.Request) bool {
	t := s.tokens()
	if t.Viewer == "" {
		return true
	}
	return s.checkToken(w, r, authViewer, true, t.Viewer, t.Admin)
}

// sourceIP is the peer's address. Forwarding headers are not trusted: a
// proxy in front would put every client in one bucket, which is safe.
func sourceIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// bucket is a token bucket: up to burst tokens, refilled at rate per second.
type bucket struct {
	tokens float64
	last   time.Time
}

func (b *bucket) refill(now time.Time, rate, burst float64) {
	if b.last.IsZero() {
		b.tokens, b.last = burst, now
		return
	}
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = math.Min(burst, b.tokens+dt*rate)
		b.last = now
	}
}

// take spends one token if there is one.
func (b *bucket) take(now time.Time, rate, burst float64) bool {
	b.refill(now, rate, burst)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// maxTrackedSources bounds the limiter's memory under a spray of addresses.
const maxTrackedSources = 4096

// authLimiter allows a burst of failed authentications per source address,
// refilled evenly over a period; past it the source gets 429.
type authLimiter struct {
	mu      sync.Mutex
	now     func() time.Time
	burst   float64
	rate    float64 // tokens per second
	sources map[string]*bucket
}

func newAuthLimiter(now func() time.Time) *authLimiter {
	l := &authLimiter{now: now, sources: map[string]*bucket{}}
	l.set(10, time.Minute)
	return l
}

func (l *authLimiter) set(burst float64, per time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.burst, l.rate = burst, burst/per.Seconds()
}

// blocked reports whether ip has used up its failures, and how long until
// it may try again.
func (l *authLimiter) blocked(ip string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.sources[ip]
	if !ok {
		return 0, false
	}
	b.refill(l.now(), l.rate, l.burst)
	if b.tokens >= 1 {
		return 0, false
	}
	return time.Duration((1 - b.tokens) / l.rate * float64(time.Second)), true
}

func (l *authLimiter) fail(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.sources[ip]
	if !ok {
		if len(l.sources) >= maxTrackedSources {
			l.prune(now)
		}
		b = &bucket{}
		l.sources[ip] = b
	}
	b.take(now, l.rate, l.burst)
}

// prune forgets sources that have earned all their tokens back; if that is
// not enough, it forgets everyone rather than grow without bound.
func (l *authLimiter) prune(now time.Time) {
	for ip, b := range l.sources {
		b.refill(now, l.rate, l.burst)
		if b.tokens >= l.burst {
			delete(l.sources, ip)
		}
	}
	if len(l.sources) >= maxTrackedSources {
		clear(l.sources)
	}
}
