package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
	"heft/coordinator/store"
	"heft/shared/testutil"
	"heft/shared/view"
)

const testAdmin = "adm1n-0123456789abcdef0123456789" // writeConfig's

// startCoordinator runs the coordinator on stateDir at a fixed loopback
// address (backup reads the address from the same settings) until the
// returned stop is called.
func startCoordinator(t *testing.T, cfg, stateDir, addr string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr testutil.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--config", cfg, "--state-dir", stateDir, "--listen", addr}, noEnv, &stdout, &stderr, nil)
	}()
	testutil.Eventually(t, "the listening line", 10*time.Second, func() bool {
		return strings.Contains(stdout.String(), "listening on")
	})
	return func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Fatalf("exit %d; stderr %s", code, stderr.String())
			}
		case <-time.After(time.Minute): // a deadline, not a speed: under test-under-load a stop can take long
			t.Fatal("run did not stop")
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func adminDo(t *testing.T, method, url, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testAdmin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// A backup taken from a running coordinator, with a change made while it
// runs, restored by the documented steps (copy to state_dir/heft.db,
// start), gives a coordinator with the same workers, pins, decisions and
// node records.
func TestBackupRestore(t *testing.T) {
	stateDir := t.TempDir()
	at := time.Now().UTC().Truncate(time.Second)
	st, err := store.Open(stateDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		st.SaveWorker(fleet.WorkerRecord{ID: "w1", Node: "gpu-a", Model: "m", Engine: "vllm", URL: "http://10.0.0.1:8000", FirstSeen: at, LastSeen: at}),
		st.SaveDecision("w1", "hold"),
		st.SaveNode(nodes.Record{Name: "gpu-a", State: nodes.StateEnrolled, CredentialSHA256: strings.Repeat("ab", 32), Since: at, LastSeen: at}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	cfg := writeConfig(t, stateDir, "")
	addr := freeAddr(t)
	stop := startCoordinator(t, cfg, stateDir, addr)
	base := "http://" + addr
	// A change made while it runs is in the copy.
	if code, b := adminDo(t, http.MethodPost, base+"/api/v1/workers/w1/pin", `{"weight": 2.5}`); code != http.StatusOK {
		t.Fatalf("pin: %d %s", code, b)
	}
	backupFile := filepath.Join(t.TempDir(), "heft-backup.db")
	var stdout, stderr bytes.Buffer
	// A wrong admin token is refused, and no file is left behind.
	if code := run(context.Background(), []string{"backup", "--config", cfg, "--listen", addr, "--admin-token-file", writeToken(t, "wrong-0123456789abcdef0123456789"), backupFile},
		noEnv, &stdout, &stderr, nil); code != 1 || !strings.Contains(stderr.String(), "wrong admin token") {
		t.Errorf("wrong token: exit %d, stderr %s", code, stderr.String())
	}
	if entries, _ := os.ReadDir(filepath.Dir(backupFile)); len(entries) != 0 {
		t.Errorf("a failed backup left %v", entries)
	}
	stdout.Reset()
	stderr.Reset()
	if code := run(context.Background(), []string{"backup", "--config", cfg, "--listen", addr, backupFile}, noEnv, &stdout, &stderr, nil); code != 0 {
		t.Fatalf("backup: exit %d, stderr %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "wrote "+backupFile) {
		t.Errorf("backup said %q", stdout.String())
	}
	// The copy opens, read-only, while the coordinator still holds its file.
	if err := store.Check(backupFile); err != nil {
		t.Fatal(err)
	}
	code, b := adminDo(t, http.MethodGet, base+"/api/v1/audit", "")
	if code != http.StatusOK || !strings.Contains(string(b), `"backup"`) {
		t.Errorf("audit after a backup: %d %s", code, b)
	}
	stop()

	// Restore: a new state_dir holding the copy as heft.db.
	restored := t.TempDir()
	data, err := os.ReadFile(backupFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(restored, store.FileName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	addr = freeAddr(t)
	stop = startCoordinator(t, cfg, restored, addr)
	defer stop()
	base = "http://" + addr
	code, b = adminDo(t, http.MethodGet, base+"/api/v1/workers/w1", "")
	var wk view.Worker
	if code != http.StatusOK || json.Unmarshal(b, &wk) != nil {
		t.Fatalf("restored worker: %d %s", code, b)
	}
	if wk.PinnedWeight == nil || *wk.PinnedWeight != 2.5 || wk.AdminDecision != "hold" || wk.Node != "gpu-a" || wk.Model != "m" {
		t.Errorf("restored worker = %s", b)
	}
	code, b = adminDo(t, http.MethodGet, base+"/api/v1/nodes/gpu-a", "")
	var n view.Node
	if code != http.StatusOK || json.Unmarshal(b, &n) != nil || n.State != nodes.StateEnrolled || !n.Credential {
		t.Errorf("restored node: %d %s", code, b)
	}
}

// Without a file, or with a state file the coordinator is not running
// on, backup says what is wrong.
func TestBackupUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"backup"}, noEnv, &stdout, &stderr, nil); code != 2 || !strings.Contains(stderr.String(), "usage: heft-coordinator backup") ||
		!strings.HasPrefix(stderr.String(), "heft-coordinator backup: no FILE") {
		t.Errorf("no file: exit %d, %s", code, stderr.String())
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"backup", "--bogus"}, noEnv, &stdout, &stderr, nil); code != 2 ||
		!strings.HasPrefix(stderr.String(), `heft-coordinator backup: the last argument, "--bogus", is a flag`) {
		t.Errorf("a flag last: exit %d, %s", code, stderr.String())
	}
	stdout.Reset()
	if code := run(context.Background(), []string{"backup", "--help"}, noEnv, &stdout, &stderr, nil); code != 0 || !strings.Contains(stdout.String(), "To restore") {
		t.Errorf("--help: exit %d, %s", code, stdout.String())
	}
	stderr.Reset()
	cfg := writeConfig(t, t.TempDir(), "")
	file := filepath.Join(t.TempDir(), "b.db")
	if code := run(context.Background(), []string{"backup", "--config", cfg, "--listen", freeAddr(t), file}, noEnv, &stdout, &stderr, nil); code != 1 ||
		!strings.Contains(stderr.String(), "is the coordinator running?") {
		t.Errorf("no coordinator: exit %d, %s", code, stderr.String())
	}
	if _, err := os.Stat(file); err == nil {
		t.Error("a failed backup wrote the file")
	}
}

func writeToken(t *testing.T, tok string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
