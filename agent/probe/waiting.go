package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"syscall"
	"time"
)

// WaitNoticeEvery is how often a probe that waits for its engine says so
// (Config.OnWaiting), besides the first time and when the reason changes.
const WaitNoticeEvery = 5 * time.Second

// Waiting is a probe waiting for its engine to be ready, or (Busy) for a
// busy engine to be idle.
type Waiting struct {
	URL    string
	Reason string // why the engine is not ready, in a few words: "connection refused"; or its load
	Waited time.Duration
	Left   time.Duration // how much longer the probe waits before it gives up
	Busy   bool
}

// String says it as a person reads it: "engine at http://127.0.0.1:8000
// not ready (connection refused); waiting up to 4m50s more".
func (w Waiting) String() string {
	if w.Busy {
		return fmt.Sprintf("engine at %s busy (%s); waiting up to %s more for it to be idle", w.URL, w.Reason, w.Left.Round(time.Second))
	}
	return fmt.Sprintf("engine at %s not ready (%s); waiting up to %s more", w.URL, w.Reason, w.Left.Round(time.Second))
}

// waitNotices decides when a wait is worth a notice: the first time,
// when the reason changes, and every `every` in between.
type waitNotices struct {
	every  time.Duration
	last   time.Time
	reason string
}

func (n *waitNotices) due(now time.Time, reason string) bool {
	if !n.last.IsZero() && reason == n.reason && now.Sub(n.last) < n.every {
		return false
	}
	n.last, n.reason = now, reason
	return true
}

// waiting returns waitReady's callback for this probe: it shows the wait
// in Progress every time, and tells OnWaiting when a notice is due.
func (p *prober) waiting(start time.Time) func(why error, left time.Duration) {
	notices := &waitNotices{every: WaitNoticeEvery}
	return func(why error, left time.Duration) {
		w := Waiting{URL: p.cfg.URL, Reason: notReadyReason(why), Waited: time.Since(start), Left: max(left, 0)}
		p.report(Progress{Phase: PhaseWaitingReady, Elapsed: w.Waited, Waiting: &w})
		if p.cfg.OnWaiting != nil && notices.due(time.Now(), w.Reason) {
			p.cfg.OnWaiting(w)
		}
	}
}

// notReadyReason puts why a readiness check failed in a few words: the
// transport's cause without the URL the message already names, or what
// the engine answered.
func notReadyReason(err error) string {
	var dns *net.DNSError
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.As(err, &dns):
		return "unknown host " + dns.Name
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "no answer in time"
	case errors.As(err, &ue):
		return ue.Err.Error()
	case err == nil:
		return "not ready"
	}
	return err.Error()
}
