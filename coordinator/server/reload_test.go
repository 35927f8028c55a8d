package server

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"heft/shared/testutil"
	"heft/shared/wire"
)

// servedCN makes one request over its own fresh TLS connection and
// returns the common name of the certificate the server presented.
func servedCN(t *testing.T, base string, pool *x509.CertPool) string {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(base + "/healthz")
	if err != nil {
		t.Fatalf("https: %v", err)
	}
	resp.Body.Close()
	return resp.TLS.PeerCertificates[0].Subject.CommonName
}

// Reload swaps the certificate and the tokens for new connections and
// requests; connections already open stay; a certificate that does not
// load, or tokens that would lock agents out, change nothing.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := testutil.SelfSignedCert(t, dir, "first")
	newCert, newKey, newPool := testutil.SelfSignedCert(t, dir, "second")
	pool.AppendCertsFromPEM(mustRead(t, newCert))
	opts := testOptions()
	opts.TLSCertFile, opts.TLSKeyFile = certFile, keyFile
	s, err := newServer(opts, newFakeFleet(), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	ts := runServer(t, s, "https")
	if cn := servedCN(t, ts.base, pool); cn != "first" {
		t.Fatalf("served %q at start", cn)
	}

	// An agent and a keep-alive API client, both connected before the reload.
	keep := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer keep.CloseIdleConnections()
	client := &http.Client{Transport: keep}
	c, _, err := websocket.Dial(testCtx(t), strings.Replace(ts.base, "https", "wss", 1)+"/api/v1/agent", &websocket.DialOptions{
		HTTPClient: client, HTTPHeader: http.Header{"Authorization": {"Bearer " + agentToken}}})
	if err != nil {
		t.Fatalf("wss: %v", err)
	}
	defer c.CloseNow()
	data, _ := wire.Encode(&wire.Hello{Node: "gpu-a"})
	if err := c.Write(testCtx(t), websocket.MessageText, data); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Read(testCtx(t)); err != nil { // the welcome
		t.Fatal(err)
	}
	c.CloseRead(testCtx(t)) // reads on, so that Ping sees its pong
	adminStatus := func(cl *http.Client, token string) (status int, reused bool) {
		t.Helper()
		req, _ := http.NewRequestWithContext(testCtx(t), "DELETE", ts.base+"/api/v1/workers/no-such-worker/pin", nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused }}))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body) // read to the end, so the connection is kept
		resp.Body.Close()
		return resp.StatusCode, reused
	}
	// 404: the token is right and the worker unknown; 401: the token is wrong.
	if st, _ := adminStatus(client, adminToken); st != http.StatusNotFound {
		t.Fatalf("admin before reload: %d", st)
	}

	// Copy the second certificate over the first, as an operator renews it.
	for src, dst := range map[string]string{newCert: certFile, newKey: keyFile} {
		if err := os.WriteFile(dst, mustRead(t, src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Reload(Tokens{Agent: agentToken, Admin: "new-admin-token"}); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if cn := servedCN(t, ts.base, newPool); cn != "second" {
		t.Errorf("served %q after the reload, want the new certificate", cn)
	}
	st, reused := adminStatus(client, "new-admin-token")
	if st != http.StatusNotFound || !reused {
		t.Errorf("new admin token on the connection opened before: %d (reused %t)", st, reused)
	}
	if st, _ := adminStatus(client, adminToken); st != http.StatusUnauthorized {
		t.Errorf("old admin token after the reload: %d", st)
	}
	if err := c.Ping(testCtx(t)); err != nil {
		t.Errorf("the agent connected before the reload was dropped: %v", err)
	}

	// Bad input changes nothing.
	if err := os.WriteFile(certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(Tokens{Agent: agentToken, Admin: "third-admin-token"}); err == nil || !strings.Contains(err.Error(), certFile) {
		t.Errorf("Reload with a broken certificate: %v", err)
	}
	if err := s.Reload(Tokens{Agent: "", Admin: "third-admin-token"}); err == nil || !strings.Contains(err.Error(), "no agent token") {
		t.Errorf("Reload without an agent token: %v", err)
	}
	if err := s.Reload(Tokens{Agent: agentToken, Admin: agentToken}); err == nil || !strings.Contains(err.Error(), "must differ") {
		t.Errorf("Reload with admin = agent token: %v", err)
	}
	if cn := servedCN(t, ts.base, newPool); cn != "second" {
		t.Errorf("served %q after failed reloads", cn)
	}
	if st, _ := adminStatus(client, "new-admin-token"); st != http.StatusNotFound {
		t.Errorf("the admin token in force after failed reloads: %d", st)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
