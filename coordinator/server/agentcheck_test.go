package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"heft/gateway/gwtest"
	"heft/gateway/render"
	"heft/shared/testutil"
	"heft/shared/view"
)

// agentCheckRig is a fake fleet of two workers of one model at two real
// upstreams, the coordinator's agent-check responder, and a real HAProxy
// whose two servers ask it for their state every 100 ms.
type agentCheckRig struct {
	ts       *testServer
	a, b     *gwtest.Upstream
	hx       *gwtest.HAProxy
	stop     func()
	listener string
}

func startAgentCheckRig(t *testing.T, viewerToken string) *agentCheckRig {
	t.Helper()
	opts := testOptions()
	opts.Tokens.Viewer = viewerToken
	r := &agentCheckRig{a: gwtest.NewUpstream(t, "a"), b: gwtest.NewUpstream(t, "b")}
	r.ts = startServer(t, opts, nil)
	ag := connectAgent(t, r.ts, "gpu-a")
	ag.keepReading()
	ag.snapshot("Qwen/Qwen3-8B", "a", "b")
	testutil.Eventually(t, "two workers", 10*time.Second, func() bool { return len(r.ts.fleet.Workers()) == 2 })
	r.set("a", r.a.Addr, view.StateAdmitted, 3, 16)
	r.set("b", r.b.Addr, view.StateAdmitted, 1, 16)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.listener = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.ts.ServeAgentCheck(ctx, ln) }()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("ServeAgentCheck: %v", err)
			}
		})
	}
	t.Cleanup(r.stop)

	// The servers are the coordinator's own rendering with agent checks,
	// as config management would fetch it.
	path := "/api/v1/models/Qwen/Qwen3-8B/weights?format=haproxy&agent_check=" + r.listener + "&agent_inter=100ms"
	status, lines, _ := r.ts.do(t, "GET", path, viewerToken, nil)
	if status != http.StatusOK {
		t.Fatalf("%s: %d %s", path, status, lines)
	}
	// With a viewer token, each agent-send carries ${HEFT_VIEWER_TOKEN},
	// which HAProxy fills from its environment: no hand edit.
	servers := string(lines)
	if viewerToken != "" {
		if !strings.Contains(servers, `agent-send "${HEFT_VIEWER_TOKEN} Qwen/Qwen3-8B `) {
			t.Fatalf("the rendering does not carry the token's variable:\n%s", servers)
		}
		t.Setenv(render.DefaultAgentTokenEnv, viewerToken)
	}
	r.hx = gwtest.StartHAProxy(t, `global
    stats socket {{socket}} mode 600 level admin
defaults
    mode http
    option http-no-delay
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend llm
    bind {{front}}
    default_backend qwen
backend qwen
    balance roundrobin
`+servers)
	return r
}

func (r *agentCheckRig) set(id, addr, state string, weight float64, maxConc int) {
	r.ts.fleet.update("gpu-a/"+id, func(w *view.Worker) {
		w.Address, w.State, w.Weight = addr, state, nil
		if weight > 0 {
			w.Weight = &weight
		}
		w.MaxConcurrency = &maxConc
	})
}

// waitSplit waits until 40 sequential requests split as want. The
// deadline is generous: with the load clients' requests in HAProxy's
// rotation too, an exact split takes a few tries, each slow on a busy
// machine.
func (r *agentCheckRig) waitSplit(t *testing.T, what string, want map[string]int) {
	t.Helper()
	var last map[string]int
	testutil.Eventually(t, what, time.Minute, func() bool {
		last = gwtest.Split(t, "http://"+r.hx.Front+"/", 40)
		return fmt.Sprint(last) == fmt.Sprint(want)
	})
}

// stat reads one column of "show stat" for each server of the backend,
// by upstream name ("a", "b").
func (r *agentCheckRig) stat(t *testing.T, column string) map[string]string {
	t.Helper()
	names := map[string]string{render.HAProxyServerName(r.a.Addr): "a", render.HAProxyServerName(r.b.Addr): "b"}
	out := map[string]string{}
	for _, row := range r.hx.Stat(t) {
		if name, ok := names[row["svname"]]; ok && row["pxname"] == "qwen" {
			out[name] = row[column]
		}
	}
	return out
}

// HAProxy pulls heft's weights, drains and caps from the coordinator
// itself, within its check interval, with no error under a little load;
// a coordinator that is gone changes nothing.
func TestAgentCheckDrivesRealHAProxy(t *testing.T) {
	r := startAgentCheckRig(t, "")
	r.waitSplit(t, "the 3:1 weights", map[string]int{"a": 30, "b": 10})
	if mc := r.stat(t, "slim"); mc["a"] != "16" || mc["b"] != "16" {
		t.Errorf("maxconn from the agent: %v, want 16 each", mc)
	}

	// A little load all along: 4 clients in a loop; every answer must be 200.
	var sent, failed atomic.Int64
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var load sync.WaitGroup
	client := &http.Client{Timeout: 5 * time.Second}
	for range 4 {
		load.Go(func() {
			for loadCtx.Err() == nil {
				resp, err := client.Get("http://" + r.hx.Front + "/")
				sent.Add(1)
				if err != nil || resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
				if resp != nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		})
	}

	changed := time.Now()
	r.set("b", r.b.Addr, view.StateAdmitted, 1, 16)
	r.set("a", r.a.Addr, view.StateAdmitted, 1, 24)
	r.waitSplit(t, "even weights", map[string]int{"a": 20, "b": 20})
	t.Logf("HAProxy routed by the new weights %v after the change (agent-inter 100ms; including the 40 requests that show it)",
		time.Since(changed).Round(time.Millisecond))
	testutil.Eventually(t, "a's maxconn 24", 10*time.Second, func() bool { return r.stat(t, "slim")["a"] == "24" })

	changed = time.Now()
	r.set("b", r.b.Addr, view.StateHeld, 0, 16)
	r.waitSplit(t, "b drained", map[string]int{"a": 40})
	t.Logf("HAProxy drained b %v after it was held", time.Since(changed).Round(time.Millisecond))
	if st := r.stat(t, "status"); !strings.HasPrefix(st["b"], "DRAIN") {
		t.Errorf("b's status %q, want DRAIN", st["b"])
	}
	r.set("b", r.b.Addr, view.StateAdmitted, 1, 16)
	r.waitSplit(t, "b back", map[string]int{"a": 20, "b": 20})

	stopLoad()
	load.Wait()
	client.CloseIdleConnections()
	if sent.Load() == 0 || failed.Load() != 0 {
		t.Errorf("%d of %d requests under load failed", failed.Load(), sent.Load())
	}
	t.Logf("%d requests under load while the weights changed, %d failed", sent.Load(), failed.Load())

	// The coordinator goes away: HAProxy's checks meet a closed port
	// (L4CON) and the split stays as it was.
	r.stop()
	testutil.Eventually(t, "agent checks refused", 10*time.Second, func() bool {
		st := r.stat(t, "agent_status")
		return st["a"] == "L4CON" && st["b"] == "L4CON"
	})
	if got := gwtest.Split(t, "http://"+r.hx.Front+"/", 40); fmt.Sprint(got) != fmt.Sprint(map[string]int{"a": 20, "b": 20}) {
		t.Errorf("with the coordinator gone the split is %v, want 20/20 as before", got)
	}
}

// With a viewer token, HAProxy must send it first; the rendering has it
// take the token from its environment, and a real HAProxy started with
// HEFT_VIEWER_TOKEN set follows the weights (the 3:1 split comes from the
// coordinator's answers, which need the token). A request without it
// changes nothing.
func TestAgentCheckToken(t *testing.T) {
	r := startAgentCheckRig(t, "viewer-token-for-the-agent-check-test")
	r.waitSplit(t, "the 3:1 weights with the token", map[string]int{"a": 30, "b": 10})

	s := r.ts.Server
	answers := s.agentAnswers()
	for line, want := range map[string]string{
		"viewer-token-for-the-agent-check-test Qwen/Qwen3-8B " + r.a.Addr: "ready 3% maxconn:16",
		"Qwen/Qwen3-8B " + r.a.Addr:                                       agentCheckRefused,
		"wrong Qwen/Qwen3-8B " + r.a.Addr:                                 agentCheckRefused,
		"viewer-token-for-the-agent-check-test Qwen/Qwen3-8B 10.9.9.9:1":  agentCheckUnlisted,
		"viewer-token-for-the-agent-check-test Other/Model " + r.a.Addr:   agentCheckUnlisted,
	} {
		if got, _ := s.agentCheckAnswer(line, answers); got != want {
			t.Errorf("%q: %q, want %q", line, got, want)
		}
	}
}
