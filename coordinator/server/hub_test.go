package server

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"heft/coordinator/fleet"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

func TestAgentAuth(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	for _, tc := range []struct{ name, token string }{
		{"no token", ""},
		{"wrong token", "nope"},
		{"admin token", adminToken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, resp, err := dial(t, ts, tc.token)
			if err == nil {
				t.Fatal("dial succeeded")
			}
			if resp == nil || resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("want 401, got %v (%v)", resp, err)
			}
		})
	}
	// A plain request shows the JSON body of the refusal.
	status, body, hdr := ts.do(t, "GET", "/api/v1/agent", "wrong", nil)
	if status != http.StatusUnauthorized || !strings.Contains(errorMessage(t, body), "agent token") {
		t.Errorf("got %d %s", status, body)
	}
	if !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("WWW-Authenticate = %q", hdr.Get("WWW-Authenticate"))
	}
	if got := ts.counter(t, "heft_auth_failures_total", map[string]string{"kind": "agent"}); got != 4 {
		t.Errorf("heft_auth_failures_total{kind=agent} = %g, want 4", got)
	}
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0")
	testutil.Eventually(t, "the snapshot to reach the fleet", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e0"); return ok })
}

// A bad message closes only its own connection with a code and a reason;
// a second agent and the fleet's state are untouched.
func TestBadMessagesCloseOnlyThatConnection(t *testing.T) {
	big := bytes.Repeat([]byte("x"), wire.MaxMessageBytes+1)
	negative := []byte(`{"type":"probe_result","v":1,"probe_result":{"measurement":{"capacity_key":"gpu-a/e0","throughput_tps":-5}}}`)
	hello := func(node string) []byte {
		data, _ := wire.Encode(&wire.Hello{Node: node, Host: wire.Host{Hostname: node}})
		return data
	}
	snapshotOf := func(node string) []byte {
		data, _ := wire.Encode(&wire.Snapshot{Node: node, Engines: []wire.Engine{{Kind: "vllm", URL: "http://x", CapacityKey: "gpu-a/e0"}}})
		return data
	}
	for _, tc := range []struct {
		name       string
		hello      bool // say hello first
		msg        []byte
		code       websocket.StatusCode
		reason     string
		metricDrop string
	}{
		{"malformed JSON", true, []byte(`{"type":"snapshot",`), websocket.StatusPolicyViolation, "not a JSON object", dropInvalid},
		{"wrong version", true, []byte(`{"type":"snapshot","v":2,"snapshot":{}}`), CloseProtocolVersion, "protocol version: peer speaks v2, this side v1", dropVersion},
		{"wrong version hello", false, []byte(`{"type":"hello","v":7,"hello":{"node":"x"}}`), CloseProtocolVersion, "protocol version: peer speaks v7", dropVersion},
		{"oversized", true, big, websocket.StatusMessageTooBig, "", dropTooBig},
		{"no hello first", false, snapshotOf("gpu-z"), websocket.StatusPolicyViolation, "first message must be hello, got snapshot", dropNoHello},
		{"negative number", true, negative, websocket.StatusPolicyViolation, "measurement.throughput_tps is negative", dropInvalid},
		{"hello twice", true, hello("gpu-z"), websocket.StatusPolicyViolation, "hello sent twice", dropInvalid},
		{"someone else's node", true, snapshotOf("gpu-a"), websocket.StatusPolicyViolation, `snapshot.node "gpu-a" differs from hello.node "gpu-z"`, dropInvalid},
		{"coordinator message", true, func() []byte { d, _ := wire.Encode(&wire.Welcome{}); return d }(), websocket.StatusPolicyViolation, "unexpected message type welcome", dropInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, testOptions(), nil)
			good := connectAgent(t, ts, "gpu-a")
			good.snapshot("m", "e0")
			testutil.Eventually(t, "the good worker", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e0"); return ok })
			before, _ := ts.fleet.Worker("gpu-a/e0")

			var bad *agent
			if tc.hello {
				bad = connectAgent(t, ts, "gpu-z")
			} else {
				c, _, err := dial(t, ts, agentToken)
				if err != nil {
					t.Fatal(err)
				}
				bad = &agent{t: t, c: c}
			}
			if err := bad.c.Write(testCtx(t), websocket.MessageText, tc.msg); err != nil {
				t.Fatalf("write: %v", err)
			}
			ce := closeOf(t, bad.c)
			if ce.Code != tc.code || !strings.Contains(ce.Reason, tc.reason) {
				t.Fatalf("closed with %d %q, want %d containing %q", ce.Code, ce.Reason, tc.code, tc.reason)
			}
			if len(ce.Reason) > 123 {
				t.Errorf("reason is %d bytes", len(ce.Reason))
			}

			// The good agent is still connected and still heard.
			good.snapshot("m", "e0", "e1")
			testutil.Eventually(t, "the good agent's second snapshot", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e1"); return ok })
			after, _ := ts.fleet.Worker("gpu-a/e0")
			if after.State != before.State || !after.AgentConnected || after.Node != "gpu-a" {
				t.Errorf("good worker changed: before %+v after %+v", before, after)
			}
			if n := len(ts.fleet.probeResults()); n != 0 {
				t.Errorf("%d rejected probe results reached the fleet", n)
			}
			testutil.Eventually(t, "the disconnect metric", 10*time.Second, func() bool {
				return ts.counter(t, "heft_agent_disconnects_total", map[string]string{"reason": tc.metricDrop}) == 1
			})
			if n := ts.AgentsConnected(); n != 1 {
				t.Errorf("agents connected = %d, want 1", n)
			}
		})
	}
}

func TestHelloTimeout(t *testing.T) {
	ts := startServer(t, testOptions(), func(s *Server) { s.lim.helloTimeout = 100 * time.Millisecond })
	c, _, err := dial(t, ts, agentToken)
	if err != nil {
		t.Fatal(err)
	}
	ce := closeOf(t, c)
	if ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "no hello within") {
		t.Fatalf("closed with %d %q", ce.Code, ce.Reason)
	}
}

func TestMessageRateLimit(t *testing.T) {
	ts := startServer(t, testOptions(), func(s *Server) { s.lim.msgRate, s.lim.msgBurst = 0.001, 5 })
	a := connectAgent(t, ts, "gpu-a") // the hello is message 1
	for range 5 {
		s := &wire.Snapshot{Node: "gpu-a"}
		data, _ := wire.Encode(s)
		// Writes after the close may fail; the close frame is what matters.
		_ = a.c.Write(testCtx(t), websocket.MessageText, data)
	}
	ce := closeOf(t, a.c)
	if ce.Code != websocket.StatusPolicyViolation || ce.Reason != "message rate exceeded" {
		t.Fatalf("closed with %d %q", ce.Code, ce.Reason)
	}
	testutil.Eventually(t, "the metric", 10*time.Second, func() bool {
		return ts.counter(t, "heft_agent_disconnects_total", map[string]string{"reason": dropRate}) == 1
	})
}

func TestNewerConnectionWins(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	old := connectAgent(t, ts, "gpu-a")
	old.snapshot("m", "e0")
	testutil.Eventually(t, "the worker", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e0"); return ok })
	oldID, _ := ts.fleet.currentConn("gpu-a")

	newer := connectAgent(t, ts, "gpu-a")
	ce := closeOf(t, old.c)
	if ce.Code != CloseSuperseded || ce.Reason != "superseded by a newer connection from this node" {
		t.Fatalf("older connection closed with %d %q", ce.Code, ce.Reason)
	}
	testutil.Eventually(t, "the old connection's disconnect", 10*time.Second, func() bool {
		return slices.Contains(ts.fleet.callLog(), fmt.Sprintf("disconnect gpu-a %d", oldID))
	})
	newID, ok := ts.fleet.currentConn("gpu-a")
	if !ok || newID == oldID {
		t.Fatalf("fleet's current connection = %d (%t), old was %d", newID, ok, oldID)
	}
	if w, _ := ts.fleet.Worker("gpu-a/e0"); !w.AgentConnected || w.State == view.StateOffline {
		t.Errorf("the worker went offline when the old connection closed: %+v", w)
	}
	// The newer connection works, and actions reach it.
	newer.snapshot("m", "e0", "e1")
	testutil.Eventually(t, "the new snapshot", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e1"); return ok })
	if status, body, _ := ts.do(t, "POST", "/api/v1/workers/gpu-a/e0/probe", adminToken, nil); status != http.StatusOK {
		t.Fatalf("probe: %d %s", status, body)
	}
	if env := newer.read(); env.Type != wire.TypeProbeRequest || env.ProbeRequest.CapacityKey != "gpu-a/e0" {
		t.Fatalf("newer connection got %+v", env)
	}
	if n := ts.AgentsConnected(); n != 1 {
		t.Errorf("agents connected = %d", n)
	}
	if v := ts.counter(t, "heft_agent_disconnects_total", map[string]string{"reason": dropSuperseded}); v != 1 {
		t.Errorf("superseded disconnects = %g", v)
	}
}

func TestReportsReachTheFleet(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0")
	a.send(&wire.ProbeStatus{CapacityKey: "gpu-a/e0", State: wire.ProbeRunning})
	a.send(&wire.ProbeResult{RequestID: "r1", Measurement: wire.Measurement{CapacityKey: "gpu-a/e0", ThroughputTPS: 900, OutputTokens: 2048}})
	// A result the fleet refuses is logged, not a reason to hang up.
	a.send(&wire.ProbeResult{Measurement: wire.Measurement{CapacityKey: "gpu-b/elsewhere", ThroughputTPS: 1}})
	a.snapshot("m", "e0", "e1")
	testutil.Eventually(t, "every report", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e1"); return ok })
	log := ts.fleet.callLog()
	for _, want := range []string{"probe_status gpu-a gpu-a/e0 running", "probe_result gpu-a gpu-a/e0", "probe_result gpu-a gpu-b/elsewhere"} {
		if !slices.Contains(log, want) {
			t.Errorf("fleet did not get %q: %v", want, log)
		}
	}
	w, _ := ts.fleet.Worker("gpu-a/e0")
	if w.Throughput == nil || *w.Throughput != 900 {
		t.Errorf("throughput = %v", w.Throughput)
	}
	mfs := ts.scrape(t, "")
	for typ, want := range map[string]float64{"hello": 1, "snapshot": 2, "probe_status": 1, "probe_result": 2} {
		if v, _ := metricValue(mfs, "heft_agent_messages_total", map[string]string{"type": typ}); v != want {
			t.Errorf("messages{type=%s} = %g, want %g", typ, v, want)
		}
	}
}

// A peer that never reads must not hold up other agents or the API; its
// queue or its writes run out and it alone is dropped.
func TestStuckPeerDoesNotBlockOthers(t *testing.T) {
	for _, tc := range []struct {
		name         string
		queueSize    int
		perSnap      int // ~256 KiB messages the fleet sends per snapshot
		writeTimeout time.Duration
		drop         string
	}{
		// Many messages at once: the queue overflows. Writes never time out
		// here: on a busy machine encoding the messages can take longer than
		// a short write timeout, which would then end the connection first.
		{"queue overflows", 4, 16, time.Hour, dropQueueFull},
		// 16 MiB in a queue that holds it all: the socket fills and a write times out.
		{"write stalls", 64, 32, 300 * time.Millisecond, dropWriteTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, testOptions(), func(s *Server) {
				s.lim.writeTimeout = tc.writeTimeout
				s.lim.queueSize = tc.queueSize
			})
			problem := strings.Repeat("p", wire.MaxStringBytes)
			var problems []string
			for range wire.MaxProblemCount {
				problems = append(problems, problem)
			}
			ts.fleet.setOnSnapshot(func(node string, s wire.Snapshot) []fleet.Action {
				if node != "stuck" {
					return nil
				}
				var out []fleet.Action
				for range tc.perSnap {
					out = append(out, fleet.Action{Node: node, Message: &wire.CachedMeasurement{
						Measurement: wire.Measurement{CapacityKey: "stuck/e0", Problems: problems}}})
				}
				return out
			})

			stuck := connectAgent(t, ts, "stuck") // reads its welcome, then never again
			good := connectAgent(t, ts, "gpu-a")
			for i := range 2 {
				stuck.snapshot("m", "e0")
				// The good agent and the API answer while the stuck one is flooded.
				good.snapshot("m", fmt.Sprintf("e%d", i))
				testutil.Eventually(t, "the good agent's snapshot", 10*time.Second, func() bool { _, ok := ts.fleet.Worker(fmt.Sprintf("gpu-a/e%d", i)); return ok })
				if status, _, _ := ts.do(t, "GET", "/api/v1/workers", "", nil); status != http.StatusOK {
					t.Fatalf("workers: %d", status)
				}
			}
			testutil.Eventually(t, "the stuck agent to be dropped", 10*time.Second, func() bool {
				return ts.counter(t, "heft_agent_disconnects_total", map[string]string{"reason": tc.drop}) == 1 &&
					!ts.hub.connected("stuck")
			})
			if !ts.hub.connected("gpu-a") {
				t.Fatal("the good agent was dropped too")
			}
			// The good agent still gets its messages.
			if status, body, _ := ts.do(t, "POST", "/api/v1/workers/gpu-a/e0/probe", adminToken, nil); status != http.StatusOK {
				t.Fatalf("probe: %d %s", status, body)
			}
			if env := good.read(); env.Type != wire.TypeProbeRequest {
				t.Fatalf("good agent got %s", env.Type)
			}
		})
	}
}

func TestGracefulShutdown(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0")
	testutil.Eventually(t, "the worker", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e0"); return ok })

	req, _ := http.NewRequestWithContext(testCtx(t), "GET", ts.base+"/api/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := newSSEReader(resp.Body)
	if _, err := events.next(); err != nil {
		t.Fatal(err)
	}

	connID, _ := ts.fleet.currentConn("gpu-a")
	ts.stop()
	ce := closeOf(t, a.c)
	if ce.Code != websocket.StatusServiceRestart || ce.Reason != "coordinator shutting down" {
		t.Fatalf("agent closed with %d %q", ce.Code, ce.Reason)
	}
	if _, err := events.next(); err == nil {
		t.Error("the event stream went on after shutdown")
	}
	select {
	case err := <-ts.runErr:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		ts.runErr <- nil // for the cleanup
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return")
	}
	if !slices.Contains(ts.fleet.callLog(), fmt.Sprintf("disconnect gpu-a %d", connID)) {
		t.Errorf("the fleet was not told the agent left: %v", ts.fleet.callLog())
	}
	if _, _, err := dial(t, ts, agentToken); err == nil {
		t.Error("a new agent could connect after shutdown")
	}
}

func TestTruncateReason(t *testing.T) {
	long := strings.Repeat("é", 100) // 200 bytes
	got := truncateReason(long)
	if len(got) > 123 || !strings.HasSuffix(got, "…") || !utf8.ValidString(got) {
		t.Errorf("truncateReason = %q (%d bytes)", got, len(got))
	}
	if truncateReason("short") != "short" {
		t.Error("short reasons must stay")
	}
}

// Pings keep a reading agent and drop one that stopped reading.
func TestPingDropsSilentPeer(t *testing.T) {
	ts := startServer(t, testOptions(), func(s *Server) {
		// A timeout long beside a pong's trip on a busy machine, so the
		// live agent never misses one; the silent one misses them all.
		s.lim.pingEvery = 30 * time.Millisecond
		s.lim.pingTimeout = 2 * time.Second
	})
	live := connectAgent(t, ts, "gpu-a")
	readErr := make(chan error, 1)
	ctx := testCtx(t)
	go func() {
		// Reading answers pings; nothing else arrives.
		_, _, err := live.c.Read(ctx)
		readErr <- err
	}()
	connectAgent(t, ts, "silent") // reads its welcome, then never again
	testutil.Eventually(t, "the silent agent to be dropped", 10*time.Second, func() bool {
		return ts.counter(t, "heft_agent_disconnects_total", map[string]string{"reason": dropPingTimeout}) == 1
	})
	if ts.hub.connected("silent") || !ts.hub.connected("gpu-a") {
		t.Fatalf("silent connected %t, live connected %t", ts.hub.connected("silent"), ts.hub.connected("gpu-a"))
	}
	select {
	case err := <-readErr:
		t.Fatalf("the live agent's connection ended: %v", err)
	default:
	}
}

// An agent that keeps sending is alive even while its pong waits behind
// what it sends (coder/websocket answers a ping only from the reader, and
// the coordinator sees the pong only after the messages before it): it is
// not dropped for a late pong. Once it falls silent, it is.
func TestPingSparesASendingPeer(t *testing.T) {
	ts := startServer(t, testOptions(), func(s *Server) {
		s.lim.pingEvery = 30 * time.Millisecond
		s.lim.pingTimeout = 300 * time.Millisecond
		s.lim.msgRate, s.lim.msgBurst = 1000, 1000
	})
	talker := connectAgent(t, ts, "talker") // reads its welcome, then never again: no pong
	data, err := wire.Encode(&wire.Snapshot{Node: "talker"})
	if err != nil {
		t.Fatal(err)
	}
	// Send for six ping timeouts, a message every 50 ms.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(6 * 300 * time.Millisecond); time.Now().Before(end); <-tick.C {
		if err := talker.c.Write(testCtx(t), websocket.MessageText, data); err != nil {
			t.Fatalf("the sending agent's connection ended: %v", err)
		}
	}
	if !ts.hub.connected("talker") {
		t.Fatal("the sending agent was dropped")
	}
	testutil.Eventually(t, "the agent, silent now, to be dropped", 10*time.Second, func() bool {
		return ts.counter(t, "heft_agent_disconnects_total", map[string]string{"reason": dropPingTimeout}) == 1
	})
}
