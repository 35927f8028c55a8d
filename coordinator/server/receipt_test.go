package server

import (
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/shared/testutil"
	"heft/shared/wire"
)

// Strings that would reach a gateway's configuration are refused on
// receipt: the connection closes with a reason naming the string, and the
// fleet never sees the message. Before shared/grammar, every one of these
// reached the fleet (and from it heft-sync's nginx file and HAProxy).
func TestGatewayStringsRefusedOnReceipt(t *testing.T) {
	engine := func(change func(e *wire.Engine)) *wire.Snapshot {
		e := wire.Engine{Kind: wire.EngineVLLM, URL: "http://127.0.0.1:8000", Model: "m", Ready: true, CapacityKey: "gpu-z/e0"}
		change(&e)
		return &wire.Snapshot{Node: "gpu-z", At: time.Now(), Engines: []wire.Engine{e}}
	}
	measurement := wire.Measurement{CapacityKey: "gpu-z/e0\n    server 10.6.6.6:80;", Model: "m", ThroughputTPS: 100}
	for _, tc := range []struct {
		name   string
		msg    any
		reason string
	}{
		{"key with an nginx directive", engine(func(e *wire.Engine) { e.CapacityKey = "k\n    server 10.6.6.6:80;" }), "capacity key"},
		{"key with a space", engine(func(e *wire.Engine) { e.CapacityKey = "k backup" }), "capacity key"},
		{"model with a YAML key", engine(func(e *wire.Engine) { e.Model = "m\ngeneral_settings:\n  master_key: x" }), "model name"},
		{"model with a quote", engine(func(e *wire.Engine) { e.Model = `m" agent-send "x` }), "model name"},
		{"advertise_url unix", engine(func(e *wire.Engine) { e.AdvertiseURL = "http://unix:80" }), "advertise_url"},
		{"advertise_url inet_aton", engine(func(e *wire.Engine) { e.AdvertiseURL = "http://0x7f000001:80" }), "advertise_url"},
		{"engine url with a semicolon in its path", engine(func(e *wire.Engine) { e.URL = "http://127.0.0.1:8000/;x" }), "engine url"},
		{"probe result key", &wire.ProbeResult{RequestID: "r", Measurement: measurement}, "capacity key"},
		{"probe status key", &wire.ProbeStatus{CapacityKey: "k#x", State: wire.ProbeRunning}, "capacity key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, testOptions(), nil)
			bad := connectAgent(t, ts, "gpu-z")
			bad.send(tc.msg)
			ce := closeOf(t, bad.c)
			if ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, tc.reason) ||
				!strings.Contains(ce.Reason, "grammar") {
				t.Fatalf("closed with %d %q, want %d naming %q", ce.Code, ce.Reason, websocket.StatusPolicyViolation, tc.reason)
			}
			testutil.Eventually(t, "the disconnect metric", 10*time.Second, func() bool {
				return ts.counter(t, "heft_agent_disconnects_total", map[string]string{"reason": dropInvalid}) == 1
			})
			for _, call := range ts.fleet.callLog() {
				if strings.HasPrefix(call, "snapshot") || strings.HasPrefix(call, "probe") {
					t.Errorf("the fleet was handed the refused message: %s", call)
				}
			}
			if n := len(ts.fleet.Workers()); n != 0 {
				t.Errorf("%d workers stored", n)
			}
		})
	}
}

// A node name outside shared/grammar is refused at the hello, before the
// registry or the fleet hears of it, with a close reason naming the rule;
// the names heft's tools and Kubernetes give pass.
func TestNodeNameRefusedOnReceipt(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	for _, node := range []string{"gpu a", "gpu/a", "-gpu", ".", "gpu:a", "gpu-a\u202egnp.exe", "gpu%2fa"} {
		c, _, err := dial(t, ts, agentToken)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		a := &agent{t: t, c: c, node: node}
		a.send(&wire.Hello{Node: node, AgentVersion: "test", Host: wire.Host{Hostname: "h"}})
		ce := closeOf(t, c)
		if ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "node name") || !strings.Contains(ce.Reason, "grammar") {
			t.Errorf("hello from %q: closed with %d %q, want %d naming the node name's grammar", node, ce.Code, ce.Reason, websocket.StatusPolicyViolation)
		}
		if n := ts.fleet.connects(node); n != 0 {
			t.Errorf("hello from %q reached the fleet", node)
		}
		if _, ok := ts.opts.Nodes.Get(node); ok {
			t.Errorf("a node record was made for %q", node)
		}
	}
	if n := ts.counter(t, "heft_node_refusals_total", map[string]string{"reason": "name"}); n != 7 {
		t.Errorf("heft_node_refusals_total{reason=\"name\"} = %v, want 7", n)
	}
	for _, node := range []string{"gpu-a", "node-0042", "vllm-7d9f8c6b5-x2x4q", "ip-10-0-1-5.ec2.internal", "gpu_b"} {
		connectAgent(t, ts, node)
	}
}
