package coordinator

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/coordinator/nodes"
	"heft/shared/grammar"
	"heft/shared/view"
	"heft/shared/wire"
)

// A node name outside shared/grammar is refused by the admin routes with
// the rule (400), unless a record is stored under it: a record stored
// before the rule survives a restart over the real store, is listed and
// releasable, and admits no connection.
func TestNodeNameGrammarOverARestart(t *testing.T) {
	cfg := testConfig(t)
	r := start(t, cfg)
	for _, req := range []struct{ method, path string }{
		{"GET", "/api/v1/nodes/gpu%20b"}, {"DELETE", "/api/v1/nodes/gpu%20b"}, {"POST", "/api/v1/nodes/gpu%20b/reject"},
		{"POST", "/api/v1/nodes/gpu%20b/probe"}, {"POST", "/api/v1/nodes/-gpu/admit"},
	} {
		status, body := r.do(t, req.method, req.path, adminToken, "")
		if status != http.StatusBadRequest || !strings.Contains(string(body), "node name") || !strings.Contains(string(body), grammar.NodeRule) {
			t.Errorf("%s %s: %d %s, want 400 naming the rule", req.method, req.path, status, body)
		}
	}
	seen := time.Now().UTC()
	for _, rec := range []nodes.Record{
		{Name: "gpu a", State: nodes.StateEnrolled, CredentialSHA256: strings.Repeat("ab", 32), Since: seen, LastSeen: seen},
		{Name: "gpu;b", State: nodes.StateUnbound, Since: seen, LastSeen: seen},
	} {
		if err := r.st.SaveNode(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	r = start(t, cfg)
	status, body := r.do(t, "GET", "/api/v1/nodes", adminToken, "")
	var list view.Nodes
	if status != http.StatusOK || json.Unmarshal(body, &list) != nil || len(list.Nodes) != 2 || list.Nodes[0].Name != "gpu a" || !list.Nodes[0].Credential {
		t.Fatalf("nodes after the restart: %d %s, want both stored records", status, body)
	}
	if status, body := r.do(t, "GET", "/api/v1/nodes/gpu%20a", adminToken, ""); status != http.StatusOK {
		t.Errorf("GET the stored record: %d %s", status, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(r.base, "http")+"/api/v1/agent",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + agentToken}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.CloseNow() }()
	a := &agent{t: t, c: c, node: "gpu a"}
	a.send(&wire.Hello{Node: "gpu a", NodeCredential: "x", KeepsCredential: true, AgentVersion: "test", Host: wire.Host{Hostname: "h"}})
	if env, err := a.next(); err == nil || websocket.CloseStatus(err) != websocket.StatusPolicyViolation || !strings.Contains(err.Error(), "node name") {
		t.Errorf("hello under the stored name: %v %v, want a policy-violation close naming the node name", env, err)
	}
	for _, name := range []string{"gpu%20a", "gpu%3Bb"} {
		if status, body := r.do(t, "DELETE", "/api/v1/nodes/"+name, adminToken, ""); status != http.StatusNoContent {
			t.Errorf("release %s: %d %s", name, status, body)
		}
	}
	if nodes, err := r.st.LoadNodes(); err != nil || len(nodes) != 0 {
		t.Errorf("stored records after the releases: %v %v", nodes, err)
	}
}
