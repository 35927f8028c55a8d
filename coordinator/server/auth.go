package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"heft/shared/settings"
	"heft/shared/wire"
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

// anyToken reports whether got is one of the tokens in list (one per line
// during a rotation, settings.SplitTokens).
func anyToken(got, list string) bool {
	return slices.ContainsFunc(settings.SplitTokens(list), func(t string) bool { return tokenEqual(got, t) })
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// checkToken returns true when the request holds one of the wanted
// tokens, and otherwise answers 401, or 429 once its source has failed
// too often with this kind of token. The token is checked first: a right
// token is never slowed down by someone else's wrong ones, even from the
// same address (one NAT, one TLS proxy). Tokens are at least 32 random
// bytes, so the limit is there to quieten a misconfigured or hostile
// client, not to stop guessing. query allows ?token=, for EventSource
// and browsers, which cannot set headers.
func (s *Server) checkToken(w http.ResponseWriter, r *http.Request, kind string, query bool, want ...string) bool {
	got := bearer(r)
	if got == "" && query {
		got = r.URL.Query().Get("token")
	}
	for _, t := range want {
		if tokenEqual(got, t) {
			return true
		}
	}
	ip := s.clientIP(r)
	if wait, blocked := s.auth.fail(ip, kind); blocked {
		s.metrics.authLimited.Inc()
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("too many wrong %s tokens from this address; retry later", kind))
		return false
	}
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

// agentAuth guards the agent endpoint: an agent token, or, for a node
// that holds its credential, that credential (agentNode names the node it
// speaks for, which its hello must name). The shared agent token is then
// needed only to enrol, so a rotation that has not reached every agent
// yet, or a coordinator restarted with the new token only, shuts out no
// enrolled node.
// The token it returns names the agent token that matched (a hash's
// first bytes, never the token), for the new names' rate limit.
func (s *Server) agentAuth(w http.ResponseWriter, r *http.Request) (agentNode, token string, ok bool) {
	agents := settings.SplitTokens(s.tokens().Agent)
	got := bearer(r)
	for _, t := range agents {
		if tokenEqual(got, t) {
			return "", tokenName(t), true
		}
	}
	if node, cred := r.Header.Get(wire.HeaderNode), r.Header.Get(wire.HeaderNodeCredential); node != "" && cred != "" && s.opts.Nodes.Verify(node, cred) {
		return node, "", true
	}
	ok = s.checkToken(w, r, authAgent, false, agents...)
	return "", tokenName(got), ok
}

// tokenName names a token without revealing it.
func tokenName(t string) string {
	h := sha256.Sum256([]byte(t))
	return hex.EncodeToString(h[:6])
}

func (s *Server) adminAuth(w http.ResponseWriter, r *http.Request) bool {
	return s.checkToken(w, r, authAdmin, false, settings.SplitTokens(s.tokens().Admin)...)
}

// readAuth guards reads: open unless a viewer token is configured, then the
// viewer or the admin token, in the header or as ?token=.
func (s *Server) readAuth(w http.ResponseWriter, r *http.Request) bool {
	t := s.tokens()
	if t.Viewer == "" {
		return true
	}
	return s.checkToken(w, r, authViewer, true, readTokens(t)...)
}

// readTokens are the tokens a read guarded by the viewer token takes: each
// line of the viewer and the admin setting (a rotation holds two).
func readTokens(t Tokens) []string {
	return append(settings.SplitTokens(t.Viewer), settings.SplitTokens(t.Admin)...)
}

// clientIP is the address a request comes from. X-Forwarded-For is read
// only when the peer is one of Options.TrustedProxies, and then only its
// entries those proxies appended: the rightmost address that is not a
// trusted proxy. Anyone else could write any address there.
func (s *Server) clientIP(r *http.Request) string {
	peer := peerIP(r)
	if len(s.opts.TrustedProxies) == 0 {
		return peer
	}
	addr, err := netip.ParseAddr(peer)
	if err != nil || !s.trusted(addr) {
		return peer
	}
	hops := r.Header.Values("X-Forwarded-For")
	for i := len(hops) - 1; i >= 0; i-- {
		list := strings.Split(hops[i], ",")
		for j := len(list) - 1; j >= 0; j-- {
			hop, err := netip.ParseAddr(strings.TrimSpace(list[j]))
			if err != nil {
				return addr.String() // a hop we cannot read: stop at the last proxy we trust
			}
			hop = hop.Unmap()
			if !s.trusted(hop) {
				return hop.String()
			}
			addr = hop
		}
	}
	return addr.String()
}

func (s *Server) trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range s.opts.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peerIP is the TCP peer's address.
func peerIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().String()
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

// Bounds of the failure table: its size, and how many entries are looked
// at to choose one to forget when it is full.
const (
	maxTrackedSources = 4096
	evictionSample    = 64
)

// authLimiter counts failed authentications per (source address, token
// kind) in a table of fixed size: a burst of failures, refilled evenly
// over a period; past it the source gets 429 for that kind of token. A
// full table forgets the entry with the most failures left to spend (the
// least failing; among equals the one quiet longest) from a random sample,
// never the whole table, so a spray of fresh addresses cannot free an
// address that is being limited: it only replaces other fresh addresses.
type authLimiter struct {
	mu      sync.Mutex
	now     func() time.Time
	burst   float64
	rate    float64 // tokens per second
	sources map[authKey]*bucket
}

type authKey struct{ ip, kind string }

func newAuthLimiter(now func() time.Time) *authLimiter {
	l := &authLimiter{now: now, sources: map[authKey]*bucket{}}
	l.set(10, time.Minute)
	return l
}

func (l *authLimiter) set(burst float64, per time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.burst, l.rate = burst, burst/per.Seconds()
}

// fail records a failure of kind from ip and reports whether the source
// had already used up its failures, and how long until it may try again.
func (l *authLimiter) fail(ip, kind string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	k := authKey{ip, kind}
	b, ok := l.sources[k]
	if !ok {
		if len(l.sources) >= maxTrackedSources {
			l.evict(now)
		}
		b = &bucket{}
		l.sources[k] = b
	}
	if b.take(now, l.rate, l.burst) {
		return 0, false
	}
	return time.Duration((1 - b.tokens) / l.rate * float64(time.Second)), true
}

// evict forgets one entry: the one with the most tokens among a sample.
func (l *authLimiter) evict(now time.Time) {
	var victim authKey
	var best *bucket
	n := 0
	for k, b := range l.sources { // map order is random: a fair sample
		b.refill(now, l.rate, l.burst)
		if best == nil || b.tokens > best.tokens || (b.tokens == best.tokens && b.last.Before(best.last)) {
			victim, best = k, b
		}
		if n++; n == evictionSample || b.tokens >= l.burst {
			break // a forgiven entry is as good as any
		}
	}
	delete(l.sources, victim)
}

// blocked reports, without counting a failure, whether ip is limited for
// kind; for tests.
func (l *authLimiter) blocked(ip, kind string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.sources[authKey{ip, kind}]
	if !ok {
		return false
	}
	b.refill(l.now(), l.rate, l.burst)
	return b.tokens < 1
}
