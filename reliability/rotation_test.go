package reliability

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/agent"
	agentconfig "heft/agent/config"
	"heft/coordinator/config"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/sim"
)

// writeTokenFile replaces path with toks, one a line, mode 0600, in one
// rename so that no reader sees half a file.
func writeTokenFile(t *testing.T, path string, toks ...string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(toks, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// The agent token is rotated by the documented steps, with a coordinator
// restart in the middle: add the new token to the coordinator's
// agent_token_file and reload; restart the coordinator; write the new
// token to each agent's token_file and send it SIGHUP; remove the old one
// from the coordinator's file and reload; restart the coordinator again.
// Real sims, real agents (agent.Run), a real coordinator. offline_grace
// and stale_weight_ttl are short, so an agent shut out would take its
// worker out of the weights within the test; none may: every worker stays
// admitted or stale the whole time, and every agent is connected at the
// end. After the rotation a new node is refused the old token and let in
// with the new one.
func TestTokenRotationKeepsEveryWorkerRouted(t *testing.T) {
	t.Parallel()
	oldTok, newTok := config.NewToken(), config.NewToken()
	dir := t.TempDir()
	coordTokens := filepath.Join(dir, "agent.token")
	writeTokenFile(t, coordTokens, oldTok)
	tweak := func(cfg *config.Config) {
		cfg.AgentToken, cfg.AgentTokenFile = "", coordTokens
		cfg.Fleet.OfflineGrace, cfg.Fleet.StaleWeightTTL = time.Second, 15*time.Second
	}
	state := filepath.Join(dir, "state")
	c := startCoord(t, state, "127.0.0.1:0", quietLogger(t), tweak)
	addr := c.addr

	const n = 2
	var agentTokens []string
	var reloads []chan struct{}
	for i := range n {
		s, err := sim.Start(sim.Config{Flavor: sim.FlavorVLLM, SingleTPS: 400 + 100*float64(i), Batch16TPS: 4000 + 1000*float64(i)}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		file := filepath.Join(t.TempDir(), "agent.token")
		writeTokenFile(t, file, oldTok)
		reload := make(chan struct{}, 1)
		agentTokens, reloads = append(agentTokens, file), append(reloads, reload)
		startSimAgentWith(t, c.agentURL(), fmt.Sprintf("gpu-%d", i), []agentconfig.Engine{{Kind: "vllm", URL: s.URL()}},
			func(cfg *agentconfig.Config) {
				cfg.Coordinator.Token, cfg.Coordinator.TokenFile = "", file
			}, agent.WithReload(reload))
	}
	var current atomic.Pointer[coord]
	current.Store(c)
	testutil.Eventually(t, "both workers admitted", 120*time.Second, func() bool {
		ws := mustWorkers(t, c.api())
		admitted := 0
		for _, w := range ws {
			if w.State == view.StateAdmitted {
				admitted++
			}
		}
		return len(ws) == n && admitted == n
	})

	// Watch every worker for the whole rotation, through whichever
	// coordinator runs (none answers for a moment at each restart).
	var bad atomic.Pointer[string]
	var seen atomic.Int64
	watchCtx, stopWatch := context.WithCancel(context.Background())
	var watching sync.WaitGroup
	watching.Go(func() {
		for watchCtx.Err() == nil {
			ws, err := current.Load().api().workers(watchCtx)
			if err == nil {
				seen.Add(1)
				if len(ws) != n {
					msg := fmt.Sprintf("%d workers, want %d", len(ws), n)
					bad.CompareAndSwap(nil, &msg)
				}
				for id, w := range ws {
					if !view.Serving(w.State) || w.Weight == nil {
						msg := fmt.Sprintf("worker %s left the weights: state %s", id, w.State)
						bad.CompareAndSwap(nil, &msg)
					}
				}
			}
			time.Sleep(50 * time.Millisecond) // a poll, not a synchronisation
		}
	})
	restart := func(why string) {
		t.Helper()
		current.Load().stop()
		next := startCoord(t, state, addr, quietLogger(t), tweak)
		current.Store(next)
		testutil.Eventually(t, "both agents back after "+why, 60*time.Second, func() bool { return next.Server().AgentsConnected() == n })
	}
	reload := func() {
		t.Helper()
		if err := current.Load().Reload(); err != nil {
			t.Fatalf("reload: %v", err)
		}
	}

	// 1. Add the new token beside the old one; reload.
	writeTokenFile(t, coordTokens, oldTok, newTok)
	reload()
	// A coordinator restart in the middle.
	restart("the restart in the middle")
	// 2. Roll the agents: the new token in each token_file, then SIGHUP.
	for i := range n {
		writeTokenFile(t, agentTokens[i], newTok)
		reloads[i] <- struct{}{}
	}
	// 3. Remove the old token; reload; and restart once more, so that
	// every agent dials again after the old token is gone.
	writeTokenFile(t, coordTokens, newTok)
	reload()
	restart("the old token was removed")
	testutil.Eventually(t, "both workers admitted again", 60*time.Second, func() bool {
		for _, w := range mustWorkers(t, current.Load().api()) {
			if w.State != view.StateAdmitted || !w.AgentConnected {
				return false
			}
		}
		return true
	})
	stopWatch()
	watching.Wait()
	if p := bad.Load(); p != nil {
		t.Fatalf("during the rotation: %s", *p)
	}
	if seen.Load() < 10 {
		t.Fatalf("only %d looks at the fleet during the rotation", seen.Load())
	}

	// The old token is gone for good: a node not enrolled yet needs the
	// new one.
	url := current.Load().agentURL()
	for tok, want := range map[string]int{oldTok: http.StatusUnauthorized, newTok: http.StatusSwitchingProtocols} {
		conn, resp, _ := websocket.Dial(context.Background(), url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
		if conn != nil {
			conn.CloseNow()
		}
		if resp == nil || resp.StatusCode != want {
			t.Errorf("a new agent's dial after the rotation: %v, want %d", resp, want)
		}
	}
	t.Logf("%d looks at the fleet during the rotation; no worker left the weights", seen.Load())
}
