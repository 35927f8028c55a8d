package link

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/agent/status"
	"heft/shared/testutil"
	"heft/shared/wire"
)

// count returns how many lines of the log hold s.
func (b *syncBuffer) count(s string) int { return strings.Count(b.String(), s) }

// The link's state reaches the board, and the log says each change once:
// many refused dials are one error line, the welcome after them one info
// line, and the board says connected.
func TestRefusedThenConnectedLogsEachChangeOnce(t *testing.T) {
	f := newFakeCoord(t)
	f.set(func(f *fakeCoord) { f.refuse = http.StatusUnauthorized })
	cfg := testConfig(f)
	cfg.Status = status.New()
	r := start(t, cfg, newFakeHandler())
	testutil.Eventually(t, "five refused dials", 15*time.Second, func() bool { return f.refused.Load() >= 5 })
	if n := r.log.count("coordinator rejected the agent token (401)"); n != 1 {
		t.Errorf("%d lines about the refused token over %d dials, want 1", n, f.refused.Load())
	}
	if !strings.Contains(r.log.String(), "[ERROR]") {
		t.Error("a refused token is not logged at error level")
	}
	if it, ok := cfg.Status.Get(status.AreaCoordinator, f.url); !ok || it.OK || it.Reason != ReasonRefused {
		t.Errorf("board says %+v, want refused", it)
	}

	f.set(func(f *fakeCoord) { f.refuse = 0 })
	fc := f.accept(t)
	fc.nextOf(t, wire.TypeSnapshot)
	if it, _ := cfg.Status.Get(status.AreaCoordinator, f.url); it.OK {
		t.Error("connected before the welcome")
	}
	fc.send(t, &wire.Welcome{CoordinatorVersion: "c1"})
	r.log.waitLog(t, "connected to coordinator again")
	if it, _ := cfg.Status.Get(status.AreaCoordinator, f.url); !it.OK {
		t.Errorf("board says %+v after the welcome, want ok", it)
	}

	// A dropped link is one warning, then one line when it is back.
	fc.c.Close(websocket.StatusServiceRestart, "coordinator restarting")
	fc2 := f.accept(t)
	fc2.nextOf(t, wire.TypeSnapshot)
	fc2.send(t, &wire.Welcome{CoordinatorVersion: "c1"})
	testutil.Eventually(t, "a second recovery line", 15*time.Second, func() bool { return r.log.count("connected to coordinator again") == 2 })
	if n := r.log.count("link to coordinator lost; reconnecting"); n != 1 {
		t.Errorf("%d lines about the lost link, want 1", n)
	}
}

// A coordinator URL that answers HTTP (the dashboard at /) says what to
// write, once, instead of looping on "expected 101".
func TestNotTheAgentEndpointSaysWhatToWrite(t *testing.T) {
	f := newFakeCoord(t)
	f.set(func(f *fakeCoord) { f.refuse = http.StatusOK })
	r := start(t, testConfig(f), newFakeHandler())
	testutil.Eventually(t, "five dials", 15*time.Second, func() bool { return f.refused.Load() >= 5 })
	want := "coordinator URL answered 200, not a websocket: it must be the coordinator's agent endpoint"
	if n := r.log.count(want); n != 1 {
		t.Errorf("%d lines %q, want 1; log:\n%s", n, want, r.log.String())
	}
	if !strings.Contains(r.log.String(), `hint="write ws://HOST:PORT/api/v1/agent (wss:// with TLS)"`) {
		t.Error("no hint of what to write")
	}
}

// Nothing listening: one warning, however many dials.
func TestUnreachableIsOneWarning(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := testConfig(&fakeCoord{})
	cfg.URL = "ws://" + addr + "/api/v1/agent"
	cfg.Status = status.New()
	r := start(t, cfg, newFakeHandler())
	testutil.Eventually(t, "five retries", 15*time.Second, func() bool { return r.log.count("link to coordinator down; retrying") >= 5 })
	if n := r.log.count("coordinator unreachable; retrying"); n != 1 {
		t.Errorf("%d warnings about the unreachable coordinator, want 1; log:\n%s", n, r.log.String())
	}
	if it, _ := cfg.Status.Get(status.AreaCoordinator, cfg.URL); it.Reason != ReasonUnreachable || !strings.Contains(it.Error, "connection refused") {
		t.Errorf("board says %+v", it)
	}
}

// The close codes the coordinator refuses with are errors that say what
// to do.
func TestRefusalsByCloseCode(t *testing.T) {
	l := &link{}
	for _, tc := range []struct {
		code   websocket.StatusCode
		reason string
		error  bool
	}{
		{wire.CloseProtocolVersion, ReasonVersion, true},
		{wire.CloseSuperseded, ReasonSuperseded, true},
		{wire.CloseNodeCredential, ReasonRefused, true},
		{wire.CloseNodePending, ReasonPending, false},
		{wire.CloseLimit, ReasonRefused, true},
		{wire.CloseSlowConsumer, ReasonLost, false},
		{websocket.StatusGoingAway, ReasonLost, false},
	} {
		f := l.failure((&session{}).readError(websocket.CloseError{Code: tc.code, Reason: "x"}))
		if f.Reason != tc.reason || f.Error != tc.error || f.Msg == "" {
			t.Errorf("close %d: %+v, want reason %s, error %v", tc.code, f, tc.reason, tc.error)
		}
	}
}

// A coordinator URL that redirects is not followed, so the agent token and
// node credential go nowhere else: the log says once where it points and
// what to set, and the agent retries with backoff. A client passed in the
// Config gets the same policy, on a copy: the caller's is left as it was.
func TestRedirectIsNotFollowed(t *testing.T) {
	for _, own := range []bool{false, true} {
		t.Run(fmt.Sprintf("client_from_config=%v", own), func(t *testing.T) {
			var followed, dials atomic.Int64
			other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				followed.Add(1)
				http.NotFound(w, r)
			}))
			defer other.Close()
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				dials.Add(1)
				http.Redirect(w, r, other.URL+AgentPath, http.StatusTemporaryRedirect)
			}))
			defer front.Close()

			cfg := testConfig(&fakeCoord{})
			cfg.URL = "ws" + strings.TrimPrefix(front.URL, "http") + AgentPath
			cfg.Credentials = &memCredentials{cred: "node-secret-credential"}
			cfg.Status = status.New()
			if own {
				tr := http.DefaultTransport.(*http.Transport).Clone()
				defer tr.CloseIdleConnections()
				cfg.HTTPClient = &http.Client{Transport: tr}
			}
			r := start(t, cfg, newFakeHandler())
			testutil.Eventually(t, "three dials", 15*time.Second, func() bool { return dials.Load() >= 3 })
			r.stop(t)

			if n := followed.Load(); n != 0 {
				t.Errorf("the redirect was followed %d times", n)
			}
			const msg = "coordinator URL redirects elsewhere"
			if n := r.log.count(msg); n != 1 {
				t.Errorf("%d lines %q over %d dials, want 1", n, msg, dials.Load())
			}
			log := r.log.String()
			if !strings.Contains(log, "[ERROR]") || !strings.Contains(log, "redirect_to=ws"+strings.TrimPrefix(other.URL, "http")+AgentPath) {
				t.Errorf("the error line does not name the redirect target; log:\n%s", log)
			}
			if it, _ := cfg.Status.Get(status.AreaCoordinator, cfg.URL); it.Reason != ReasonNotEndpoint ||
				!strings.Contains(it.Error, "coordinator answered 307") || !strings.Contains(it.Error, "set coordinator.url to the final URL") {
				t.Errorf("board says %+v", it)
			}
			if own && cfg.HTTPClient.CheckRedirect != nil {
				t.Error("the caller's client was changed")
			}
		})
	}
}
