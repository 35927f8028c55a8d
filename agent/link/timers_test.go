package link

import (
	"fmt"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"

	"heft/shared/testutil"
	"heft/shared/wire"
)

// The tests here are about time: heartbeats, pings and backoff. They run
// in a testing/synctest bubble against an in-memory coordinator, so the
// link's real timers run on the bubble's clock, which moves only when
// every goroutine waits: minutes pass in no time, and each wait can be
// checked to the nanosecond.

func TestHeartbeatSnapshots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newPipeCoord(t)
		cfg := testConfig(f)
		cfg.SnapshotEvery, cfg.PollEvery = 20*time.Second, time.Second
		start(t, cfg, newFakeHandler())
		fc := f.accept(t)
		last := fc.nextOf(t, wire.TypeSnapshot).Snapshot.At
		for i := range 4 {
			at := fc.nextOf(t, wire.TypeSnapshot).Snapshot.At
			// Unchanged facts go out once per heartbeat, at the first poll
			// at which it is due, and never sooner.
			if gap := at.Sub(last); gap != cfg.SnapshotEvery {
				t.Fatalf("heartbeat %d came %v after the one before, want %v", i, gap, cfg.SnapshotEvery)
			}
			last = at
		}
	})
}

func TestWelcomeSetsHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newPipeCoord(t)
		cfg := testConfig(f) // heartbeat an hour
		cfg.PollEvery = time.Second
		start(t, cfg, newFakeHandler())
		fc := f.accept(t)
		first := fc.nextOf(t, wire.TypeSnapshot).Snapshot.At
		fc.send(t, &wire.Welcome{CoordinatorVersion: "c1", SnapshotSeconds: 5})
		s := fc.next(t)
		if s.Type != wire.TypeSnapshot {
			t.Fatalf("got %q, want a heartbeat snapshot", s.Type)
		}
		if gap := s.Snapshot.At.Sub(first); gap != 5*time.Second {
			t.Errorf("heartbeat after the welcome came %v after the first snapshot, want the coordinator's 5s", gap)
		}
	})
}

func TestUnansweredPingsEndSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newPipeCoord(t)
		f.set(func(f *fakeCoord) { f.stall = true })
		cfg := testConfig(f)
		cfg.PingEvery, cfg.PingTimeout = 10*time.Second, 4*time.Second
		cfg.MinBackoff, cfg.MaxBackoff = time.Second, time.Second
		r := start(t, cfg, newFakeHandler())
		f.accept(t)
		f.accept(t) // the agent gave up on the silent first connection
		r.log.waitLog(t, "did not answer 2 pings")
		// Pings at 10 s and 20 s, each unanswered for 4 s: the session
		// ends at 24 s, and the agent dials again a second later.
		dials := f.dialTimes()
		if gap := dials[1].Sub(dials[0]); gap != 25*time.Second {
			t.Errorf("redialled %v after the first dial, want 2 pings (10s apart, 4s timeout) and 1s backoff: 25s", gap)
		}
	})
}

func TestSupersededOrWrongVersionBacksOffFully(t *testing.T) {
	for _, code := range []websocket.StatusCode{wire.CloseSuperseded, wire.CloseProtocolVersion} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newPipeCoord(t)
				cfg := testConfig(f)
				cfg.MinBackoff, cfg.MaxBackoff = time.Second, 5*time.Minute
				start(t, cfg, newFakeHandler())
				fc := f.accept(t)
				fc.nextOf(t, wire.TypeSnapshot)
				closed := time.Now()
				fc.c.Close(code, "superseded by a newer connection from this node")
				f.accept(t)
				// The agent must not fight the other connection: it waits the
				// whole backoff, not a jittered part of the first one.
				if gap := time.Since(closed); gap != cfg.MaxBackoff {
					t.Errorf("reconnected after %v, want the full backoff %v", gap, cfg.MaxBackoff)
				}
			})
		})
	}
}

func TestRefusedDialsBackOffWithJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newPipeCoord(t)
		f.set(func(f *fakeCoord) { f.refuse = http.StatusServiceUnavailable })
		cfg := testConfig(f)
		cfg.MinBackoff, cfg.MaxBackoff = time.Second, 16*time.Second
		start(t, cfg, newFakeHandler())
		waitDials(t, f, 10)
		dials := f.dialTimes()
		spread := false
		for n := range 9 {
			gap := dials[n+1].Sub(dials[n])
			ceil := min(cfg.MaxBackoff, cfg.MinBackoff<<(n+1))
			if gap < cfg.MinBackoff || gap > ceil {
				t.Errorf("wait %d: %v, want within [%v, %v]", n, gap, cfg.MinBackoff, ceil)
			}
			if gap != cfg.MinBackoff && gap != ceil {
				spread = true
			}
		}
		if !spread {
			t.Error("every wait sat on a bound: no jitter")
		}
	})
}

func TestStableSessionResetsBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newPipeCoord(t)
		f.set(func(f *fakeCoord) { f.refuse = http.StatusServiceUnavailable })
		cfg := testConfig(f)
		cfg.MinBackoff, cfg.MaxBackoff = time.Second, time.Hour
		start(t, cfg, newFakeHandler())
		waitDials(t, f, 8) // the backoff has grown far past its start
		f.set(func(f *fakeCoord) { f.refuse = 0 })
		fc := f.accept(t)
		fc.nextOf(t, wire.TypeSnapshot)
		time.Sleep(stableSession + time.Second) // the session must outlive stableSession to count as stable (the case under test)
		fc.c.Close(websocket.StatusServiceRestart, "coordinator restarting")
		closed := time.Now()
		f.accept(t)
		if gap := time.Since(closed); gap > 2*cfg.MinBackoff {
			t.Errorf("after a stable session the agent waited %v, want the first backoff (at most %v)", gap, 2*cfg.MinBackoff)
		}
	})
}

// waitDials waits in the bubble until the fake has seen n dials.
func waitDials(t *testing.T, f *fakeCoord, n int) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%d dials", n), 24*time.Hour, func() bool { return len(f.dialTimes()) >= n })
}

// A Welcome asking for a heartbeat too long for a time.Duration gets the
// longest the agent takes (an hour), not an overflowed negative one that
// would send a snapshot on every poll.
func TestWelcomeHeartbeatIsClamped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newPipeCoord(t)
		cfg := testConfig(f)
		cfg.SnapshotEvery, cfg.PollEvery = 2*time.Hour, time.Second
		start(t, cfg, newFakeHandler())
		fc := f.accept(t)
		first := fc.nextOf(t, wire.TypeSnapshot).Snapshot.At
		fc.send(t, &wire.Welcome{CoordinatorVersion: "c1", SnapshotSeconds: 9_223_372_037}) // × 1e9 ns passes MaxInt64
		s := fc.next(t)
		if s.Type != wire.TypeSnapshot {
			t.Fatalf("got %q, want a heartbeat snapshot", s.Type)
		}
		if gap := s.Snapshot.At.Sub(first); gap != maxHeartbeatSeconds*time.Second {
			t.Errorf("heartbeat came %v after the first snapshot, want %v", gap, maxHeartbeatSeconds*time.Second)
		}
	})
}
