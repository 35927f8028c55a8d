package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"
)

// Wrong tokens slow down only wrong tokens: past ten failures a minute a
// source gets 429 for that kind of token, while the right token from the
// same address, and other kinds of token, go through.
func TestAuthFailuresAreRateLimited(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	for i := range 10 {
		if status, body, _ := ts.do(t, "GET", "/api/v1/agent", "wrong", nil); status != http.StatusUnauthorized {
			t.Fatalf("failure %d: got %d %s", i+1, status, body)
		}
	}
	status, body, hdr := ts.do(t, "GET", "/api/v1/agent", "wrong", nil)
	if status != http.StatusTooManyRequests {
		t.Fatalf("after 10 failures: got %d %s", status, body)
	}
	errorMessage(t, body)
	if hdr.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	// The right agent token from the same address connects.
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0")
	// Other kinds of token from the same address are counted apart.
	if status, body, _ := ts.do(t, "POST", "/api/v1/workers/x/hold", "wrong", nil); status != http.StatusUnauthorized {
		t.Errorf("a wrong admin token after the agent token's limit: %d %s", status, body)
	}
	for range 12 {
		ts.do(t, "POST", "/api/v1/workers/x/hold", "wrong", nil)
	}
	if status, body, _ := ts.do(t, "POST", "/api/v1/workers/x/hold", adminToken, nil); status != http.StatusNotFound {
		t.Errorf("the right admin token from a limited address: %d %s", status, body)
	}
	if v := ts.counter(t, "heft_auth_failures_total", map[string]string{"kind": "agent"}); v != 10 {
		t.Errorf("heft_auth_failures_total{kind=agent} = %g, want 10", v)
	}
	if v := ts.counter(t, "heft_auth_rate_limited_total", nil); v != 4 {
		t.Errorf("heft_auth_rate_limited_total = %g, want 4 (1 agent, 3 admin)", v)
	}
}

func TestAuthLimiterRefills(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newAuthLimiter(func() time.Time { return now })
	for i := range 10 {
		if _, blocked := l.fail("10.0.0.1", authAgent); blocked {
			t.Fatalf("blocked at failure %d", i+1)
		}
	}
	wait, blocked := l.fail("10.0.0.1", authAgent)
	if !blocked || wait <= 0 || wait > 6*time.Second {
		t.Fatalf("blocked=%t wait=%s", blocked, wait)
	}
	if l.blocked("10.0.0.2", authAgent) || l.blocked("10.0.0.1", authAdmin) {
		t.Error("another source, or another kind of token, is blocked")
	}
	now = now.Add(6 * time.Second) // one failure's worth refilled
	if l.blocked("10.0.0.1", authAgent) {
		t.Error("still blocked after the refill")
	}
	l.fail("10.0.0.1", authAgent)
	if !l.blocked("10.0.0.1", authAgent) {
		t.Error("a failure after the refill should block again")
	}
}

// Issue 16, case 1 (second half): one wrong token from each of 4,100
// addresses must neither grow the table past its bound nor free an
// address that is being limited.
func TestAuthLimiterSurvivesAnAddressSpray(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newAuthLimiter(func() time.Time { return now })
	for range 11 {
		l.fail("192.0.2.66", authAdmin)
	}
	const spray = 4100
	for i := range spray {
		l.fail(fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256), authAdmin)
		now = now.Add(900 * time.Millisecond / spray)
	}
	t.Logf("after one wrong token from each of %d addresses in 0.9 s: the limited address still limited=%v; table %d entries (bound %d)",
		spray, l.blocked("192.0.2.66", authAdmin), len(l.sources), maxTrackedSources)
	if !l.blocked("192.0.2.66", authAdmin) {
		t.Error("the spray freed the limited address")
	}
	if len(l.sources) > maxTrackedSources {
		t.Errorf("limiter tracks %d sources, bound is %d", len(l.sources), maxTrackedSources)
	}
}

func TestClientIPBehindTrustedProxies(t *testing.T) {
	s := &Server{opts: Options{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}}}
	for _, tc := range []struct {
		name, peer string
		xff        []string
		want       string
	}{
		{"direct, header ignored", "192.0.2.1:5000", []string{"203.0.113.9"}, "192.0.2.1"},
		{"through a trusted proxy", "10.1.2.3:5000", []string{"203.0.113.9"}, "203.0.113.9"},
		{"client forged a hop before the proxy", "10.1.2.3:5000", []string{"198.51.100.1, 203.0.113.9"}, "203.0.113.9"},
		{"two trusted proxies", "10.1.2.3:5000", []string{"203.0.113.9", "10.9.9.9"}, "203.0.113.9"},
		{"no header", "10.1.2.3:5000", nil, "10.1.2.3"},
		{"garbage hop", "10.1.2.3:5000", []string{"not-an-ip"}, "10.1.2.3"},
		{"ipv6 proxy", "[::1]:5000", []string{"2001:db8::7"}, "2001:db8::7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.peer
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := s.clientIP(r); got != tc.want {
				t.Errorf("clientIP = %q, want %q", got, tc.want)
			}
		})
	}
	if got := (&Server{}).clientIP(&http.Request{RemoteAddr: "10.1.2.3:1", Header: http.Header{"X-Forwarded-For": {"1.2.3.4"}}}); got != "10.1.2.3" {
		t.Errorf("without trusted proxies X-Forwarded-For was believed: %q", got)
	}
}

func TestSecurityHeaders(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	for _, path := range []string{"/", "/app.js", "/api/v1/workers", "/api/v1/nope", "/healthz"} {
		_, _, h := ts.do(t, "GET", path, "", nil)
		for header, want := range map[string]string{
			"Content-Security-Policy": contentPolicy,
			"X-Content-Type-Options":  "nosniff",
			"X-Frame-Options":         "DENY",
			"Referrer-Policy":         "no-referrer",
		} {
			if got := h.Get(header); got != want {
				t.Errorf("%s: %s = %q, want %q", path, header, got, want)
			}
		}
	}
}
