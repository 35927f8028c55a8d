package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"heft/shared/wire"
)

// scriptedEngine answers the probe's readiness checks without a socket,
// so the wait runs inside a synctest bubble: refused connections for
// refuseFor, then 503 while the model loads.
type scriptedEngine struct {
	start     time.Time
	refuseFor time.Duration
}

func (e *scriptedEngine) RoundTrip(req *http.Request) (*http.Response, error) {
	if time.Since(e.start) < e.refuseFor {
		return refusing{}.RoundTrip(req)
	}
	return &http.Response{StatusCode: http.StatusServiceUnavailable, Body: io.NopCloser(strings.NewReader("loading model")),
		Header: http.Header{}, Request: req}, nil
}

// refusing is a round tripper whose dials are refused, as an engine that
// is down.
type refusing struct{}

func (refusing) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
}

// An engine that stays down is said to be down at once and then every
// WaitNoticeEvery, with how long the probe will still wait, until it
// gives up; the measurement says why.
func TestWaitingForADownEngineIsAnnounced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var notices []Waiting
		var at []time.Time
		start := time.Now()
		cfg := quick("http://127.0.0.1:8000")
		cfg.ReadyTimeout = 30 * time.Second
		cfg.HTTPClient = &http.Client{Transport: refusing{}}
		cfg.OnWaiting = func(w Waiting) { notices, at = append(notices, w), append(at, time.Now()) }
		var progress int
		cfg.Progress = func(p Progress) {
			if p.Waiting != nil {
				progress++
			}
		}
		m, err := Run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if m.Failure != wire.CodeEngineUnreachable || !strings.Contains(m.Problems[0], "did not become ready within 30s") {
			t.Errorf("failure %q problems %q", m.Failure, m.Problems)
		}
		// Checks 50 ms, 100 ms, ... 1 s apart: notices at 0 s, then at the
		// first check 5 s after the last notice.
		if len(notices) != 6 {
			t.Fatalf("%d notices, want 6 over 30 s: %+v", len(notices), notices)
		}
		if at[0] != start {
			t.Errorf("first notice after %v, want at once", at[0].Sub(start))
		}
		for i := 1; i < len(at); i++ {
			if gap := at[i].Sub(at[i-1]); gap < WaitNoticeEvery || gap > WaitNoticeEvery+time.Second {
				t.Errorf("notice %d came %v after the one before, want %v to %v", i, gap, WaitNoticeEvery, WaitNoticeEvery+time.Second)
			}
		}
		if got, want := notices[0].String(), "engine at http://127.0.0.1:8000 not ready (connection refused); waiting up to 30s more"; got != want {
			t.Errorf("first notice %q, want %q", got, want)
		}
		if last := notices[5]; last.Left >= 5*time.Second || last.Waited < 25*time.Second {
			t.Errorf("last notice %+v", last)
		}
		if progress <= len(notices) {
			t.Errorf("%d progress updates with the reason, want one per check (more than the %d notices)", progress, len(notices))
		}
	})
}

// A new reason is said at once: an engine that starts listening and is
// still loading its model.
func TestWaitingReasonChangeIsAnnounced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := &scriptedEngine{start: time.Now(), refuseFor: 1500 * time.Millisecond}
		var notices []Waiting
		cfg := quick("http://127.0.0.1:8000")
		cfg.ReadyTimeout = 3 * time.Second
		cfg.HTTPClient = &http.Client{Transport: e}
		cfg.OnWaiting = func(w Waiting) { notices = append(notices, w) }
		if _, err := Run(t.Context(), cfg); err != nil {
			t.Fatal(err)
		}
		if len(notices) != 2 || !strings.HasPrefix(notices[1].Reason, "GET /health: 503 Service Unavailable: loading model") {
			t.Errorf("notices %+v, want the refusal and then the 503", notices)
		}
	})
}

func TestNotReadyReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("get: %w", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), "connection refused"},
		{&net.DNSError{Name: "engine.invalid", Err: "no such host"}, "unknown host engine.invalid"},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), "no answer in time"},
		{errors.New("GET /health: 503 Service Unavailable: loading"), "GET /health: 503 Service Unavailable: loading"},
	} {
		if got := notReadyReason(tc.err); got != tc.want {
			t.Errorf("notReadyReason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
