package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/link"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

// A thousand agents, each with one engine of its own capacity key, are
// measured once; the coordinator is then restarted on the same address
// and state. Every agent must come back by itself, no burst may run again
// (each gets its cached measurement instead), and the reconnections must
// spread out rather than arrive in one wave.
func TestThousandAgentsReconnectAfterRestart(t *testing.T) {
	// Under the race detector every handshake costs several times more; a
	// quarter of the fleet checks the same races in a time a shared 2-core
	// host can give (1,000 there took minutes per enrolment write).
	n := 1000
	if raceEnabled {
		n = 250
	}
	// The coordinator's first retry waits uniformly in [MinBackoff,
	// 2·MinBackoff] (link.DefaultMinBackoff = 500 ms): that window is what
	// spreads a fleet that lost its coordinator at the same instant.
	const minSpread = 250 * time.Millisecond
	// Once the new listener is up, every agent's pending wait is at most
	// link.DefaultMaxBackoff (30 s); the rest is handshakes on a busy host.
	const backWithin = link.DefaultMaxBackoff + 15*time.Second

	dir := t.TempDir()
	logger := quietLogger(t)
	c := startCoord(t, dir, "127.0.0.1:0", logger, nil)

	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	stopAgents := sync.OnceFunc(func() { cancel(); running.Wait() })
	t.Cleanup(stopAgents)
	agents := make([]*fixedAgent, n)
	dials := make([]*dialLog, n)
	retries := make([]*retryLog, n)
	for i := range agents {
		a := newFixedAgent(fmt.Sprintf("node-%04d", i), 20000+i, 900+float64(i%9)*25)
		agents[i], dials[i], retries[i] = a, &dialLog{}, &retryLog{}
		running.Go(func() {
			err := link.Run(ctx, link.Config{
				URL: c.agentURL(), Token: agentToken, Node: a.node, AgentVersion: "reliability",
				HTTPClient: dials[i].client(),
				Host:       wire.Host{Hostname: a.node, OS: "linux", Arch: "amd64"},
				// One Snapshot call per session: it marks the session's start.
				PollEvery: time.Hour, SnapshotEvery: time.Hour,
			}, a, retries[i].logger())
			if err != nil {
				t.Errorf("link.Run %s: %v", a.node, err)
			}
		})
	}

	admitted := func() int { return c.Fleet().Stats().WorkersByState[view.StateAdmitted] }
	testutil.Eventually(t, fmt.Sprintf("%d workers measured and admitted", n), 3*time.Minute, func() bool {
		time.Sleep(100 * time.Millisecond) // the count walks every worker; no need to spin
		return admitted() == n
	})
	// The coordinator hands each agent its valid result to keep.
	testutil.Eventually(t, "every measurement handed to its agent", time.Minute, func() bool {
		for _, a := range agents {
			if a.cached.Load() < 1 {
				return false
			}
		}
		return true
	})
	// On a loaded machine a session can end before the restart (a ping
	// not answered in time); its agent reconnects and, when its result had
	// not landed yet, is rightly asked again. An agent with one session
	// must have been probed exactly once, any other at most once a session.
	probed := map[string]int64{}       // by capacity key
	cachedBefore := map[string]int64{} // a reconnect may already have brought one
	reconnected := 0
	for _, a := range agents {
		got, sessions := a.probes.Load(), int64(len(a.sessionsSince(time.Time{})))
		if got < 1 || got > sessions || (sessions == 1 && got != 1) {
			t.Fatalf("%s was probed %d times in %d sessions before the restart, want 1 (at most one a session)", a.node, got, sessions)
		}
		if sessions > 1 {
			reconnected++
		}
		probed[a.key], cachedBefore[a.key] = got, a.cached.Load()
	}
	if reconnected > 0 {
		t.Logf("%d agents reconnected before the restart", reconnected)
	}

	// Restart: a clean shutdown tells every agent at the same instant.
	down := time.Now()
	c.stop()
	stopped := time.Now()
	c2 := startCoord(t, dir, c.addr, logger, nil)
	up := time.Now()

	// Stored workers start as if their agents had just left; they would go
	// offline (out of the weight table) after the grace, 30 s.
	maxOffline := 0
	testutil.Eventually(t, fmt.Sprintf("all %d agents connected again", n), backWithin, func() bool {
		maxOffline = max(maxOffline, c2.Fleet().Stats().WorkersByState[view.StateOffline])
		return c2.Server().AgentsConnected() == n
	})
	back := time.Now()
	testutil.Eventually(t, "every agent's cached measurement", 10*time.Second, func() bool {
		for _, a := range agents {
			if a.cached.Load() <= cachedBefore[a.key] {
				return false
			}
		}
		return true
	})
	// Every agent got its cached measurement, so the fleet has decided on
	// every worker: nothing may have asked for a burst, nor may a tick now.
	for reason, n := range c2.Fleet().Stats().ProbeRequests {
		if n != 0 {
			t.Errorf("the restarted coordinator made %d %s probe requests", n, reason)
		}
	}
	if acts := c2.Fleet().Tick(); len(acts) != 0 {
		t.Errorf("a fleet tick after the restart asks for %d probes", len(acts))
	}
	for _, a := range agents {
		if got := a.probes.Load(); got != probed[a.key] {
			t.Fatalf("%s was probed %d times in all, %d before the restart: the restart re-ran its burst", a.node, got, probed[a.key])
		}
	}
	ws := c2.Fleet().Workers()
	if len(ws) != n {
		t.Fatalf("%d workers after the restart, want %d", len(ws), n)
	}
	for _, w := range ws {
		if w.State != view.StateAdmitted || !w.AgentConnected || w.Throughput == nil || len(w.History) < 1 || int64(len(w.History)) > probed[w.ID] {
			t.Fatalf("worker %s after the restart: state %s, connected %t, throughput %v, %d measurements",
				w.ID, w.State, w.AgentConnected, w.Throughput, len(w.History))
		}
	}

	// When each agent's link chose to dial again (the wait its jittered
	// backoff drew when the shutdown ended its session), when it dialled,
	// and when its new session began, relative to the shutdown. The herd
	// check reads the waits drawn: they are what the jitter decides. When
	// the dials and sessions happen also depends on the host: on a starved
	// one the runtime fires the timers that expired while it waited
	// together (78 of 250 dials in one 50 ms window beside a loaded suite,
	// from waits spread over 500 ms), and a restarted coordinator upgrades
	// its backlog in bursts.
	var waits, redials, offsets, afterUp []time.Duration
	multi := 0
	for i, a := range agents {
		s := a.sessionsSince(down)
		if len(s) == 0 {
			t.Fatalf("%s has no session since the restart", a.node)
		}
		if len(s) > 1 {
			multi++
		}
		d := dials[i].since(down)
		if len(d) == 0 {
			t.Fatalf("%s has a session since the restart but no dial", a.node)
		}
		w, ok := retries[i].firstSince(down)
		if !ok {
			t.Fatalf("%s reconnected without a retry logged since the shutdown began", a.node)
		}
		waits = append(waits, w)
		redials = append(redials, d[0].Sub(down))
		offsets = append(offsets, s[0].Sub(down))
		afterUp = append(afterUp, s[0].Sub(up))
	}
	for _, l := range [][]time.Duration{waits, redials, offsets, afterUp} {
		slices.Sort(l)
	}
	span := waits[len(waits)-1] - waits[0]
	densest := densestWindow(waits, 50*time.Millisecond)
	t.Logf("shutdown took %s, restart %s; %d agents back %s after the shutdown began (%s after the new listener)",
		stopped.Sub(down).Round(time.Millisecond), up.Sub(stopped).Round(time.Millisecond), n,
		back.Sub(down).Round(time.Millisecond), back.Sub(up).Round(time.Millisecond))
	t.Logf("first waits drawn: shortest %s, p50 %s, longest %s; spread %s; densest 50 ms window holds %d of %d",
		waits[0].Round(time.Millisecond), pct(waits, 50), waits[len(waits)-1].Round(time.Millisecond), span.Round(time.Millisecond), densest, n)
	t.Logf("first dials after the shutdown began: first %s, p50 %s, last %s; densest 50 ms window holds %d",
		redials[0].Round(time.Millisecond), pct(redials, 50), redials[len(redials)-1].Round(time.Millisecond), densestWindow(redials, 50*time.Millisecond))
	t.Logf("sessions after the shutdown began: first %s, p50 %s, last %s; densest 50 ms window holds %d; "+
		"%d agents needed more than one session; 0 bursts re-run",
		offsets[0].Round(time.Millisecond), pct(offsets, 50), offsets[len(offsets)-1].Round(time.Millisecond),
		densestWindow(offsets, 50*time.Millisecond), multi)
	t.Logf("after the new listener: p50 %s, p90 %s, p99 %s, last %s; most workers offline at once meanwhile: %d",
		pct(afterUp, 50), pct(afterUp, 90), pct(afterUp, 99), afterUp[len(afterUp)-1].Round(time.Millisecond), maxOffline)
	if span < minSpread {
		t.Errorf("the first waits drawn spread over %s only, want at least %s: the backoff is not jittered", span, minSpread)
	}
	if densest > n/4 {
		t.Errorf("%d of %d agents drew waits within one 50 ms window: a thundering herd", densest, n)
	}

	stopAgents()
}

// dialLog records when an agent's link dials the coordinator.
type dialLog struct {
	mu    sync.Mutex
	times []time.Time
}

func (d *dialLog) client() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	var dialer net.Dialer
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.mu.Lock()
		d.times = append(d.times, time.Now())
		d.mu.Unlock()
		return dialer.DialContext(ctx, network, addr)
	}
	return &http.Client{Transport: tr}
}

// since returns the dials at or after t0.
func (d *dialLog) since(t0 time.Time) []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return timesSince(d.times, t0)
}

// retryLog keeps the waits an agent's link logs before each redial
// ("retry_in" on its debug line), with when it logged them.
type retryLog struct {
	mu    sync.Mutex
	at    []time.Time
	waits []time.Duration
	buf   []byte
}

func (r *retryLog) logger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, JSONFormat: true, Output: r})
}

func (r *retryLog) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = append(r.buf, p...)
	for {
		i := bytes.IndexByte(r.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		var line struct {
			RetryIn string `json:"retry_in"`
		}
		if json.Unmarshal(r.buf[:i], &line) == nil && line.RetryIn != "" {
			if d, err := time.ParseDuration(line.RetryIn); err == nil {
				r.at, r.waits = append(r.at, time.Now()), append(r.waits, d)
			}
		}
		r.buf = r.buf[i+1:]
	}
}

// firstSince is the first wait logged at or after t0.
func (r *retryLog) firstSince(t0 time.Time) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, at := range r.at {
		if !at.Before(t0) {
			return r.waits[i], true
		}
	}
	return 0, false
}

// densestWindow is the largest number of sorted times within any window
// of width w.
func densestWindow(sorted []time.Duration, w time.Duration) int {
	best, lo := 0, 0
	for hi := range sorted {
		for sorted[hi]-sorted[lo] > w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

func pct(sorted []time.Duration, p int) time.Duration {
	return sorted[(len(sorted)-1)*p/100].Round(time.Millisecond)
}
