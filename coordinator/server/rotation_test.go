package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"heft/shared/wire"
)

// dialAs connects with token and, when cred is set, the node name and
// credential headers an enrolled agent sends.
func dialAs(t *testing.T, ts *testServer, token, node, cred string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	if cred != "" {
		h.Set(wire.HeaderNode, node)
		h.Set(wire.HeaderNodeCredential, cred)
	}
	c, resp, err := websocket.Dial(testCtx(t), ts.wsURL(), &websocket.DialOptions{HTTPHeader: h})
	if c != nil {
		c.SetReadLimit(4 * wire.MaxMessageBytes)
		t.Cleanup(func() { _ = c.CloseNow() })
	}
	return c, resp, err
}

// During a rotation the agent and admin token settings hold two tokens,
// one a line, and either is accepted; a reload to the new one alone
// refuses the old one.
func TestEveryTokenOfARotationIsAccepted(t *testing.T) {
	const newAgent, newAdmin = "new-agent-token-0123456789abcdef0123", "new-admin-token-0123456789abcdef0123"
	opts := testOptions()
	opts.Tokens.Agent += "\n" + newAgent
	opts.Tokens.Admin += "\n" + newAdmin
	ts := startServer(t, opts, nil)
	for _, tok := range []string{agentToken, newAgent} {
		if _, _, err := dial(t, ts, tok); err != nil {
			t.Errorf("agent token %q refused: %v", tok[:8], err)
		}
	}
	for _, tok := range []string{adminToken, newAdmin} {
		if status, body, _ := ts.do(t, "POST", "/api/v1/workers/nope/hold", tok, nil); status != http.StatusNotFound {
			t.Errorf("admin token %q: %d %s, want 404 (authenticated, no such worker)", tok[:8], status, body)
		}
	}
	if err := ts.Reload(Tokens{Agent: newAgent, Admin: newAdmin}); err != nil {
		t.Fatal(err)
	}
	if _, resp, err := dial(t, ts, agentToken); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the removed agent token: %v", err)
	}
	if _, _, err := dial(t, ts, newAgent); err != nil {
		t.Errorf("the new agent token: %v", err)
	}
	if err := ts.Reload(Tokens{Agent: newAgent + "\n" + adminToken, Admin: adminToken}); err == nil || !strings.Contains(err.Error(), "must differ") {
		t.Errorf("an admin token among the agent tokens: %v", err)
	}
}

// An enrolled node's credential lets it in without the agent token, for
// its own node name only; a wrong credential does not.
func TestEnrolledNodeNeedsNoAgentToken(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	_, w := hello(t, ts, "gpu-a", "", true)
	if w == nil || w.NodeCredential == "" {
		t.Fatal("no credential at enrolment")
	}
	cred := w.NodeCredential

	// The agent token has rotated away: the credential alone is enough.
	c, _, err := dialAs(t, ts, "an-old-agent-token", "gpu-a", cred)
	if err != nil {
		t.Fatalf("enrolled node with an old agent token: %v", err)
	}
	a := &agent{t: t, c: c, node: "gpu-a"}
	a.send(&wire.Hello{Node: "gpu-a", AgentVersion: "test", Host: wire.Host{Hostname: "gpu-a"}, NodeCredential: cred, KeepsCredential: true})
	if env := a.read(); env.Type != wire.TypeWelcome {
		t.Fatalf("got %s, want welcome", env.Type)
	}

	// A wrong credential, or none, with a wrong token: 401.
	for _, tc := range []struct{ name, node, cred string }{{"wrong credential", "gpu-a", "not-the-credential"}, {"unknown node", "gpu-x", cred}} {
		if _, resp, err := dialAs(t, ts, "an-old-agent-token", tc.node, tc.cred); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %v, want 401", tc.name, err)
		}
	}

	// Let in by gpu-a's credential, a hello for gpu-b is refused.
	_, w2 := hello(t, ts, "gpu-b", "", true)
	if w2 == nil {
		t.Fatal("gpu-b not enrolled")
	}
	c, _, err = dialAs(t, ts, "", "gpu-a", cred)
	if err != nil {
		t.Fatal(err)
	}
	imp := &agent{t: t, c: c, node: "gpu-b"}
	imp.send(&wire.Hello{Node: "gpu-b", AgentVersion: "test", Host: wire.Host{Hostname: "gpu-b"}, NodeCredential: w2.NodeCredential, KeepsCredential: true})
	if ce := closeOf(t, c); ce.Code != CloseNodeCredential {
		t.Errorf("a hello for another node than the credential's: closed with %d %q", ce.Code, ce.Reason)
	}
}
