package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/shared/testutil"
	"heft/shared/wire"
)

// execReload runs the systemd unit's ExecReload with $MAINPID set to this
// process, which runs the coordinator under test.
func execReload(t *testing.T) {
	t.Helper()
	unit, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/systemd/heft-coordinator.service"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ExecReload=(.+)$`).FindSubmatch(unit)
	if m == nil {
		t.Fatal("heft-coordinator.service has no ExecReload")
	}
	args := strings.Fields(strings.ReplaceAll(string(m[1]), "$MAINPID", strconv.Itoa(os.Getpid())))
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("ExecReload %q: %v\n%s", m[1], err, out)
	}
}

// replaceFile writes data to a new file and renames it over path, as
// certificate and secret tools do.
func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// The unit's ExecReload (kill -HUP) makes a running coordinator serve a
// renewed certificate and take rotated token files, without dropping the
// agent connected before; a broken file after that changes nothing and is
// logged as an error.
func TestSIGHUPReloadsCertificateAndTokens(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := testutil.SelfSignedCert(t, dir, "first")
	newCert, newKey, _ := testutil.SelfSignedCert(t, dir, "second")
	both := pool.Clone() // trusts the first certificate and the second
	pem, err := os.ReadFile(newCert)
	if err != nil {
		t.Fatal(err)
	}
	both.AppendCertsFromPEM(pem)
	agentFile, adminFile := filepath.Join(dir, "agent.token"), filepath.Join(dir, "admin.token")
	replaceFile(t, agentFile, []byte("agent-one-0123456789abcdef0123456789\n"))
	replaceFile(t, adminFile, []byte("admin-one-0123456789abcdef0123456789\n"))
	cfg := filepath.Join(dir, "coordinator.toml")
	body := fmt.Sprintf("listen = \"127.0.0.1:0\"\nstate_dir = %q\nagent_token_file = %q\nadmin_token_file = %q\ntls_cert_file = %q\ntls_key_file = %q\napprove_new_nodes = false\n",
		t.TempDir(), agentFile, adminFile, certFile, keyFile)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr testutil.SyncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"--config", cfg}, noEnv, &stdout, &stderr, hup) }()
	re := regexp.MustCompile(`listening on (https://127\.0\.0\.1:\d+)`)
	var base string
	testutil.Eventually(t, "the listening line", 10*time.Second, func() bool {
		m := re.FindStringSubmatch(stdout.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	})

	served := func() string { // the certificate a new connection gets
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: both}, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Get(base + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].Subject.CommonName
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: both}}}
	defer client.CloseIdleConnections()
	// 404 (no such worker) means the admin token was accepted, 401 refused.
	admin := func(token string) int {
		t.Helper()
		req, _ := http.NewRequest("DELETE", base+"/api/v1/workers/no-such-worker/pin", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if cn, st := served(), admin("admin-one-0123456789abcdef0123456789"); cn != "first" || st != http.StatusNotFound {
		t.Fatalf("at start: certificate %q, admin token answered %d", cn, st)
	}
	dctx, dcancel := context.WithTimeout(ctx, 20*time.Second)
	defer dcancel()
	ws, _, err := websocket.Dial(dctx, strings.Replace(base, "https", "wss", 1)+"/api/v1/agent", &websocket.DialOptions{
		HTTPClient: client, HTTPHeader: http.Header{"Authorization": {"Bearer agent-one-0123456789abcdef0123456789"}}})
	if err != nil {
		t.Fatalf("agent: %v", err)
	}
	defer ws.CloseNow()
	hello, _ := wire.Encode(&wire.Hello{Node: "gpu-a"})
	if err := ws.Write(dctx, websocket.MessageText, hello); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ws.Read(dctx); err != nil { // the welcome
		t.Fatal(err)
	}
	ws.CloseRead(dctx) // reads on, so that Ping sees its pong

	// Renew the certificate and rotate the admin token, then reload.
	for src, dst := range map[string]string{newCert: certFile, newKey: keyFile} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		replaceFile(t, dst, data)
	}
	replaceFile(t, adminFile, []byte("admin-two-0123456789abcdef0123456789\n"))
	execReload(t)
	testutil.Eventually(t, "the renewed certificate", 10*time.Second, func() bool { return served() == "second" })
	if st := admin("admin-two-0123456789abcdef0123456789"); st != http.StatusNotFound {
		t.Errorf("the new admin token: %d", st)
	}
	if st := admin("admin-one-0123456789abcdef0123456789"); st != http.StatusUnauthorized {
		t.Errorf("the old admin token after the reload: %d", st)
	}
	if err := ws.Ping(dctx); err != nil {
		t.Errorf("the agent connected before the reload was dropped: %v", err)
	}

	// A broken token file: nothing changes, and the log says so.
	replaceFile(t, adminFile, []byte("   \n"))
	execReload(t)
	testutil.Eventually(t, "the failed reload in the log", 10*time.Second, func() bool {
		return strings.Contains(stderr.String(), "reload failed") && strings.Contains(stderr.String(), adminFile+" is empty")
	})
	if cn, st := served(), admin("admin-two-0123456789abcdef0123456789"); cn != "second" || st != http.StatusNotFound {
		t.Errorf("after a failed reload: certificate %q, admin token in force answered %d", cn, st)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d; stderr %s", code, stderr.String())
		}
	case <-time.After(time.Minute): // a deadline, not a speed: under test-under-load a stop can take long
		t.Fatal("run did not stop")
	}
	if strings.Contains(stderr.String(), "admin-two-0123456789abcdef0123456789") || strings.Contains(stderr.String(), "agent-one-0123456789abcdef0123456789") {
		t.Error("a token was logged")
	}
}
