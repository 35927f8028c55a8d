package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/coordinator/nodes"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

// lastClose is the close frame of the last hello that was not welcomed.
var lastClose websocket.CloseError

// hello dials and says hello as node with cred; it returns the connection
// and the welcome (nil when the coordinator closed instead: then the
// close frame is in lastClose).
func hello(t *testing.T, ts *testServer, node, cred string, keeps bool) (*agent, *wire.Welcome) {
	t.Helper()
	c, _, err := dial(t, ts, agentToken)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	a := &agent{t: t, c: c, node: node}
	a.send(&wire.Hello{Node: node, AgentVersion: "test", Host: wire.Host{Hostname: node}, NodeCredential: cred, KeepsCredential: keeps})
	_, data, err := c.Read(testCtx(t))
	if err != nil {
		lastClose = websocket.CloseError{Code: websocket.CloseStatus(err)}
		var ce websocket.CloseError
		if errors.As(err, &ce) {
			lastClose = ce
		}
		return a, nil
	}
	env, err := wire.Decode(data)
	if err != nil || env.Type != wire.TypeWelcome {
		t.Fatalf("first message %v %v", env, err)
	}
	return a, env.Welcome
}

func registry(t *testing.T, cfg nodes.Config) *nodes.Registry {
	t.Helper()
	r, err := nodes.New(cfg, nodes.Memory{}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A node's identity is its credential: the first connection of a name is
// handed one; a later connection without it, or with another, is closed
// with 4004 and a reason, and the node's own connection and workers stay
// as they were. An older agent that keeps no credential is admitted
// unbound, by name, until require_node_credential.
func TestNodeCredentialGuardsTheName(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	real, w := hello(t, ts, "gpu-a", "", true)
	if w == nil || len(w.NodeCredential) < 40 {
		t.Fatalf("enrolment welcome %+v, want a credential", w)
	}
	real.snapshot("m", "e0")
	testutil.Eventually(t, "the worker", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e0"); return ok })
	before := strings.Join(ts.fleet.callLog(), "\n")

	for _, tc := range []struct{ name, cred string }{{"no credential", ""}, {"another credential", nodes.NewCredential()}} {
		imp, w := hello(t, ts, "gpu-a", tc.cred, true)
		if w != nil {
			t.Fatalf("%s: the impostor was welcomed", tc.name)
		}
		_ = imp
		ce := lastClose
		if ce.Code != CloseNodeCredential || !strings.Contains(ce.Reason, "credential") {
			t.Errorf("%s: closed with %d %q", tc.name, ce.Code, ce.Reason)
		}
	}
	if after := strings.Join(ts.fleet.callLog(), "\n"); after != before {
		t.Errorf("an impostor reached the fleet:\n%s", strings.TrimPrefix(after, before))
	}
	if c, ok := ts.fleet.currentConn("gpu-a"); !ok || c == 0 {
		t.Error("the real node lost its connection")
	}
	// The real agent still talks.
	real.snapshot("m", "e0", "e1")
	testutil.Eventually(t, "the real node's next snapshot", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-a/e1"); return ok })
	// Its own credential works on a new connection (which supersedes).
	again, w2 := hello(t, ts, "gpu-a", w.NodeCredential, true)
	if w2 == nil || w2.NodeCredential != "" {
		t.Fatalf("reconnect with the credential: %+v", w2)
	}
	if ce := closeOf(t, real.c); ce.Code != CloseSuperseded {
		t.Errorf("older connection closed with %d", ce.Code)
	}
	_ = again
	if v := ts.counter(t, "heft_node_refusals_total", map[string]string{"reason": nodes.LabelCredential}); v != 2 {
		t.Errorf("heft_node_refusals_total{reason=credential} = %g, want 2", v)
	}
	if v := ts.counter(t, "heft_agent_disconnects_total", map[string]string{"reason": dropNodeRefused}); v != 2 {
		t.Errorf("disconnects{node_refused} = %g, want 2", v)
	}

	// An agent that keeps no credential: unbound, admitted by name...
	old, w3 := hello(t, ts, "gpu-old", "", false)
	if w3 == nil || w3.NodeCredential != "" {
		t.Fatalf("old agent: %+v", w3)
	}
	old.c.CloseNow()
	// ...and bound by the first agent that can keep one (trust on first use).
	if _, w4 := hello(t, ts, "gpu-old", "", true); w4 == nil || w4.NodeCredential == "" {
		t.Fatalf("binding an unbound name: %+v", w4)
	}
	if _, w5 := hello(t, ts, "gpu-old", "", false); w5 != nil {
		t.Error("an old agent was admitted for a bound name")
	}
}

func TestRequireNodeCredentialRefusesOldAgents(t *testing.T) {
	opts := testOptions()
	cfg := nodes.DefaultConfig()
	cfg.RequireCredential = true
	opts.Nodes = registry(t, cfg)
	ts := startServer(t, opts, nil)
	_, w := hello(t, ts, "gpu-old", "", false)
	if w != nil {
		t.Fatal("an agent that keeps no credential was admitted")
	}
	if ce := lastClose; ce.Code != CloseNodeCredential || !strings.Contains(ce.Reason, "upgrade") {
		t.Errorf("closed with %d %q", ce.Code, ce.Reason)
	}
}

// With approve_new_nodes a new name is handed its credential and closed
// with 4005 until an admin approves it; approve, reject and release are
// admin actions, and the pending list is in the API.
func TestApproveRejectRelease(t *testing.T) {
	opts := testOptions()
	cfg := nodes.DefaultConfig()
	cfg.ApproveNew = true
	opts.Nodes = registry(t, cfg)
	ts := startServer(t, opts, nil)

	a, w := hello(t, ts, "gpu-new", "", true)
	if w == nil || w.NodeCredential == "" {
		t.Fatalf("a pending node is handed its credential first: %+v", w)
	}
	cred := w.NodeCredential
	if ce := closeOf(t, a.c); ce.Code != CloseNodePending {
		t.Fatalf("closed with %d %q, want 4005", ce.Code, ce.Reason)
	}
	if _, ok := ts.fleet.currentConn("gpu-new"); ok {
		t.Fatal("a pending node reached the fleet")
	}
	if status, _, _ := ts.do(t, "GET", "/api/v1/nodes?state=pending", "", nil); status != http.StatusUnauthorized {
		t.Errorf("the node list without a token: %d, want 401", status)
	}
	status, body, _ := ts.do(t, "GET", "/api/v1/nodes?state=pending", adminToken, nil)
	var list view.Nodes
	if err := json.Unmarshal(body, &list); status != http.StatusOK || err != nil || len(list.Nodes) != 1 || list.Nodes[0].Name != "gpu-new" ||
		!list.Nodes[0].Credential || list.Nodes[0].Hostname != "gpu-new" {
		t.Fatalf("pending list: %d %s", status, body)
	}
	if strings.Contains(string(body), cred) {
		t.Error("the credential is shown")
	}
	// The names alone are read as the workers are (open without a viewer
	// token): heft-sync keeps a pending node's routed workers by them.
	if status, body, _ := ts.do(t, "GET", "/api/v1/pending-nodes", "", nil); status != http.StatusOK || string(body) != `{"nodes":["gpu-new"]}`+"\n" {
		t.Errorf("pending names: %d %q", status, body)
	}
	if status, _, _ := ts.do(t, "POST", "/api/v1/nodes/gpu-new/approve", "", nil); status != http.StatusUnauthorized {
		t.Errorf("approve without the admin token: %d", status)
	}
	if status, body, _ := ts.do(t, "POST", "/api/v1/nodes/gpu-new/approve", adminToken, nil); status != http.StatusOK ||
		!strings.Contains(string(body), `"state":"enrolled"`) {
		t.Fatalf("approve: %d %s", status, body)
	}
	if _, w := hello(t, ts, "gpu-new", cred, true); w == nil {
		t.Fatal("the approved node was refused")
	}
	if status, _, _ := ts.do(t, "POST", "/api/v1/nodes/gpu-new/approve", adminToken, nil); status != http.StatusConflict {
		t.Errorf("approving an enrolled node: %d, want 409", status)
	}

	// Reject: its connection is closed and it stays refused.
	if status, body, _ := ts.do(t, "POST", "/api/v1/nodes/gpu-new/reject", adminToken, nil); status != http.StatusOK {
		t.Fatalf("reject: %d %s", status, body)
	}
	testutil.Eventually(t, "the rejected node's connection closed", 10*time.Second, func() bool { return !ts.hub.connected("gpu-new") })
	if _, body, _ := ts.do(t, "GET", "/api/v1/pending-nodes", "", nil); string(body) != `{"nodes":[]}`+"\n" {
		t.Errorf("pending names after the reject: %q", body)
	}
	if _, w := hello(t, ts, "gpu-new", cred, true); w != nil {
		t.Error("a rejected node was welcomed")
	}
	// Release: the name enrols again (pending again, with approval on).
	if status, _, _ := ts.do(t, "DELETE", "/api/v1/nodes/gpu-new", adminToken, nil); status != http.StatusNoContent {
		t.Fatalf("release: %d", status)
	}
	if !slices.Contains(ts.fleet.callLog(), "forget_node gpu-new") {
		t.Error("the fleet was not told to forget the released node's workers, pins and measurements")
	}
	a, w = hello(t, ts, "gpu-new", "", true)
	if w == nil || w.NodeCredential == "" || w.NodeCredential == cred {
		t.Fatalf("after release: %+v", w)
	}
	if ce := closeOf(t, a.c); ce.Code != CloseNodePending {
		t.Errorf("after release: closed with %d", ce.Code)
	}
	if status, _, _ := ts.do(t, "DELETE", "/api/v1/nodes/nobody", adminToken, nil); status != http.StatusNotFound {
		t.Errorf("release of an unknown name: %d", status)
	}
}

// An admin's reject or release that is stored while a connection of the
// node is between its Admit and its registration finds no connection to
// close; the hub asks the registry again once it has registered it, so the
// connection is closed all the same and the node does not stay connected.
func TestRejectOrReleaseDuringHelloCloses(t *testing.T) {
	for _, action := range []string{"reject", "release"} {
		t.Run(action, func(t *testing.T) {
			reg := registry(t, nodes.DefaultConfig())
			opts := testOptions()
			opts.Nodes = reg
			ts := startServer(t, opts, nil)
			a, w := hello(t, ts, "gpu-a", "", true)
			if w == nil || w.NodeCredential == "" {
				t.Fatalf("enrol: %+v", w)
			}
			cred := w.NodeCredential
			// The welcome is queued before the hub registers the connection
			// and tells the fleet; wait for the fleet's Connect, or the hook
			// below would run for this connection too.
			testutil.Eventually(t, "the first connection registered", 10*time.Second, func() bool { return ts.fleet.connects("gpu-a") == 1 })
			a.c.CloseNow()
			testutil.Eventually(t, "the first connection gone", 10*time.Second, func() bool { return !ts.hub.connected("gpu-a") })

			// The admin's change lands after Admit accepted the second
			// connection, with no kick: the hub cannot have seen it yet.
			ts.fleet.setOnConnect(func(node string) {
				var err error
				if action == "reject" {
					_, err = reg.Reject(node)
				} else {
					err = reg.Release(node)
				}
				if err != nil {
					t.Errorf("%s: %v", action, err)
				}
			})
			b, w := hello(t, ts, "gpu-a", cred, true)
			ce := lastClose
			if w != nil {
				ce = closeOf(t, b.c)
			}
			if ce.Code != CloseNodeCredential {
				t.Errorf("closed with %d %q, want %d", ce.Code, ce.Reason, CloseNodeCredential)
			}
			testutil.Eventually(t, "the node disconnected", 10*time.Second, func() bool { return !ts.hub.connected("gpu-a") })
		})
	}
}

// Past max_nodes, a new name is refused with 4006 and a reason; known
// names still connect.
func TestMaxNodes(t *testing.T) {
	opts := testOptions()
	cfg := nodes.DefaultConfig()
	cfg.MaxNodes, cfg.MaxPending = 2, 1
	opts.Nodes = registry(t, cfg)
	ts := startServer(t, opts, nil)
	_, w1 := hello(t, ts, "a", "", true)
	hello(t, ts, "b", "", true)
	_, w := hello(t, ts, "c", "", true)
	if w != nil {
		t.Fatal("a third node was admitted past max_nodes 2")
	}
	if ce := lastClose; ce.Code != CloseLimit || !strings.Contains(ce.Reason, "max_nodes") {
		t.Errorf("closed with %d %q", ce.Code, ce.Reason)
	}
	if _, w := hello(t, ts, "a", w1.NodeCredential, true); w == nil {
		t.Error("a known node was refused at the limit")
	}
}

// Past a kind's cap new connections of that kind get 503, with a warning
// in the log; other kinds still get through.
func TestConnectionCaps(t *testing.T) {
	opts := testOptions()
	opts.MaxEventStreams = 2
	ts := startServer(t, opts, nil)
	for range 2 {
		openEvents(t, ts, "")
	}
	status, body, hdr := ts.do(t, "GET", "/api/v1/events", "", nil)
	if status != http.StatusServiceUnavailable || !strings.Contains(errorMessage(t, body), "max_event_streams") || hdr.Get("Retry-After") == "" {
		t.Errorf("a third event stream: %d %s", status, body)
	}
	if status, _, _ := ts.do(t, "GET", "/api/v1/workers", "", nil); status != http.StatusOK {
		t.Errorf("an API request while event streams are at their cap: %d", status)
	}
	connectAgent(t, ts, "gpu-a") // agents are counted apart
	if v := ts.counter(t, "heft_connections_refused_total", map[string]string{"kind": connEvents}); v != 1 {
		t.Errorf("heft_connections_refused_total{events} = %g", v)
	}
	// Agents have their cap too, counted for as long as their connection
	// lasts, not only while the upgrade is handled.
	opts = testOptions()
	opts.MaxAgentConnections = 1
	ts2 := startServer(t, opts, nil)
	connectAgent(t, ts2, "gpu-a")
	if _, resp, err := dial(t, ts2, agentToken); err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a second agent past max_agent_connections 1: %v %v", resp, err)
	}
	if v := ts.counter(t, "heft_connections", map[string]string{"kind": connEvents}); v != 2 {
		t.Errorf("heft_connections{events} = %g", v)
	}
}

// A subscriber that stops reading is dropped when a write stalls, not
// buffered for: the server's memory for it is one event.
func TestSlowEventSubscriberIsDropped(t *testing.T) {
	ts := startServer(t, testOptions(), func(s *Server) {
		s.lim.sseWriteTimeout = 200 * time.Millisecond
		s.lim.sseMinGap = 0
	})
	a := connectAgent(t, ts, "gpu-a")
	names := make([]string, wire.MaxEngines)
	for i := range names {
		names[i] = strings.Repeat("n", 90) + string(rune('a'+i%26)) + strings.Repeat("x", i) // within grammar.MaxKeyBytes
	}
	a.snapshot("m", names...)
	testutil.Eventually(t, "the workers", 10*time.Second, func() bool { return len(ts.fleet.Workers()) == wire.MaxEngines })
	req, _ := http.NewRequestWithContext(testCtx(t), "GET", ts.base+"/api/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // never read: a stuck tab
	i := 0
	testutil.Eventually(t, "the unread event stream dropped", 30*time.Second, func() bool {
		i++ // changes keep coming, until the stream's socket buffers are full and a write stalls
		ts.fleet.update("gpu-a/"+names[i%len(names)], func(w *view.Worker) {
			w.Warnings = append(w.Warnings, view.Warning{Code: "x", Message: strings.Repeat("w", 2000)})
		})
		return ts.counter(t, "heft_connections", map[string]string{"kind": connEvents}) == 0
	})
}
