package reliability

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"heft/agent/config"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/sim"
)

// simOn starts a simulated engine on addr, retrying while the port of a
// just-closed one lingers.
func simOn(t *testing.T, cfg sim.Config, addr string) *sim.Server {
	t.Helper()
	s := startSimAt(t, cfg, addr)
	t.Cleanup(func() { s.Close() })
	return s
}

// startSimAt starts a sim on addr, retrying while a closed one's port is
// still being released; the caller owns closing it.
func startSimAt(t *testing.T, cfg sim.Config, addr string) *sim.Server {
	t.Helper()
	var s *sim.Server
	var err error
	defer func() {
		if s == nil {
			t.Logf("start sim on %s: %v", addr, err)
		}
	}()
	testutil.Eventually(t, "a sim on "+addr, 10*time.Second, func() bool {
		s, err = sim.Start(cfg, addr)
		return err == nil
	})
	return s
}

// An engine restarted with the same launch arguments is the same worker:
// no new burst. Restarted with other launch arguments it is a new worker,
// measured with a burst of its own, and the old one leaves the fleet. Real
// simulated engines, a real agent (collector, log follower, link, probe)
// and a real coordinator.
func TestEngineRestart(t *testing.T) {
	stateDir := t.TempDir()
	c := startCoord(t, stateDir, "127.0.0.1:0", quietLogger(t), nil)
	api := c.api()
	logPath := filepath.Join(t.TempDir(), "vllm.log")
	base := sim.Config{Flavor: sim.FlavorVLLM, SingleTPS: 800, Batch16TPS: 8000, LogPath: logPath}
	s := simOn(t, base, "127.0.0.1:0")
	addr := strings.TrimPrefix(s.URL(), "http://")
	a := startSimAgent(t, c.agentURL(), "sim-node", []config.Engine{{Kind: "vllm", URL: s.URL(), Log: logPath}})

	// admittedOtherThan waits for one admitted worker whose ID is not in
	// old, and returns it.
	admittedOtherThan := func(t *testing.T, what string, old ...string) view.Worker {
		t.Helper()
		var got view.Worker
		// A generous deadline: a restart, a probe and admission took past
		// 30 s under -race beside six CPU hogs (scripts/test-under-load.sh).
		testutil.Eventually(t, what, 2*time.Minute, func() bool {
			for id, w := range mustWorkers(t, api) {
				if !slices.Contains(old, id) && w.State == view.StateAdmitted {
					got = w
					return true
				}
			}
			return false
		})
		return got
	}
	first := admittedOtherThan(t, "the engine measured and admitted")
	if got := a.probeCounts(); !maps.Equal(got, map[string]int{first.ID: 1}) {
		t.Fatalf("probes after registration: %v, want one for %s", got, first.ID)
	}

	// stop closes the engine and waits until the coordinator has seen it go.
	started := time.Now() // after the first start
	stop := func(t *testing.T, id string) {
		t.Helper()
		s.Close()
		testutil.Eventually(t, "the coordinator to see the engine down", 20*time.Second, func() bool {
			return mustWorkers(t, api)[id].State == view.StatePending
		})
		// A real engine's restart prints a new pid and a later time in its
		// log's first line. The in-process sim keeps the test's pid and
		// stamps whole seconds, so only a start in a later second looks new
		// (logfollow compares the file's first bytes to see a rewrite).
		for time.Now().Unix() == started.Unix() {
			time.Sleep(10 * time.Millisecond) // wait for the next whole second (see above)
		}
	}
	// restart starts the engine again. Its close belongs to the whole test,
	// not to the subtest that restarts it: the next phase (and the final
	// coordinator restart) needs this engine still serving.
	outer := t
	restart := func(t *testing.T, cfg sim.Config) {
		t.Helper()
		next := startSimAt(t, cfg, addr)
		outer.Cleanup(func() { next.Close() })
		s = next
		started = time.Now() // not before the time the log's lines carry
	}

	t.Run("same launch arguments", func(t *testing.T) {
		stop(t, first.ID)
		restart(t, base)
		testutil.Eventually(t, "the worker admitted again", 20*time.Second, func() bool {
			return mustWorkers(t, api)[first.ID].State == view.StateAdmitted
		})
		ws := mustWorkers(t, api)
		if len(ws) != 1 {
			t.Fatalf("workers %v, want only %s", slices.Collect(maps.Keys(ws)), first.ID)
		}
		if got := a.probeCounts(); !maps.Equal(got, map[string]int{first.ID: 1}) {
			t.Fatalf("probes after a restart with the same arguments: %v, want still one for %s", got, first.ID)
		}
		if w := ws[first.ID]; len(w.History) != 1 || *w.Throughput != *first.Throughput {
			t.Fatalf("measurements %v, want the first one only", w.History)
		}
	})

	for _, tc := range []struct {
		name string
		cfg  sim.Config
	}{
		// A smaller KV pool: the new start-up log is a little shorter.
		{"other launch arguments, shorter log", func() sim.Config { c := base; c.KVTokens = []int64{50000}; return c }()},
		// A max_num_seqs flag: the new start-up log is longer than the old.
		{"other launch arguments, longer log", func() sim.Config { c := base; c.MaxRunning = 64; return c }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := mustWorkers(t, api)
			if len(ws) != 1 {
				t.Fatalf("workers before: %v", slices.Collect(maps.Keys(ws)))
			}
			var old view.Worker
			for _, w := range ws {
				old = w
			}
			before := a.probeCounts()
			stop(t, old.ID)
			restart(t, tc.cfg)
			next := admittedOtherThan(t, "a new worker for the new launch arguments, measured and admitted", old.ID)
			testutil.Eventually(t, "the old worker to leave the fleet", 20*time.Second, func() bool {
				_, still := mustWorkers(t, api)[old.ID]
				return !still
			})
			want := maps.Clone(before)
			want[next.ID]++
			if got := a.probeCounts(); !maps.Equal(got, want) || want[next.ID] != 1 {
				t.Fatalf("probes %v, want %v: one burst for the new worker", got, want)
			}
			t.Logf("restart with other arguments: worker %s replaced by %s (%s tok/s), 1 burst", old.ID, next.ID,
				fmtTPS(next.Throughput))
		})
	}
	if t.Failed() {
		return
	}

	// Last, the coordinator restarts under the running agent: the worker
	// comes back measured, without a burst, and the launches it replaced
	// (still in the state file) do not come back with it.
	ws := mustWorkers(t, api)
	if len(ws) != 1 {
		t.Fatalf("workers before the coordinator restart: %v", slices.Collect(maps.Keys(ws)))
	}
	var current view.Worker
	for _, w := range ws {
		current = w
	}
	before := a.probeCounts()
	c.stop()
	startCoord(t, stateDir, c.addr, quietLogger(t), nil)
	if ws := mustWorkers(t, api); len(ws) != 1 || ws[current.ID].ID == "" {
		t.Fatalf("workers right after the coordinator restart: %v, want only %s", slices.Collect(maps.Keys(ws)), current.ID)
	}
	testutil.Eventually(t, "the agent back and its worker admitted", 30*time.Second, func() bool {
		ws := mustWorkers(t, api)
		w := ws[current.ID]
		return len(ws) == 1 && w.AgentConnected && w.State == view.StateAdmitted
	})
	if got := a.probeCounts(); !maps.Equal(got, before) {
		t.Fatalf("probes after the coordinator restart: %v, want %v (no burst)", got, before)
	}
	t.Log("coordinator restart: the worker is back without a burst; the 2 replaced launches stay gone")
}

func fmtTPS(p *float64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprintf("%.0f", *p)
}
