package link

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"heft/shared/wire"
)

// The node credential: a new node says it keeps one and presents none;
// the credential the coordinator hands it is kept in state_dir (0600) and
// presented in every later hello, across reconnects and restarts.
func TestNodeCredentialKeptAndPresented(t *testing.T) {
	dir := t.TempDir()
	creds, err := CredentialFile(dir, "gpu-a")
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeCoord(t)
	cfg := testConfig(f)
	cfg.Credentials = creds
	r := start(t, cfg, newFakeHandler())
	fc := f.accept(t)
	hello := fc.next(t).Hello
	if !hello.KeepsCredential || hello.NodeCredential != "" {
		t.Fatalf("first hello: keeps %v, credential %q", hello.KeepsCredential, hello.NodeCredential)
	}
	const cred = "a-credential-from-the-coordinator-0123456789"
	fc.send(t, &wire.Welcome{CoordinatorVersion: "test", NodeCredential: cred})
	r.log.waitLog(t, "enrolled")
	info, err := os.Stat(filepath.Join(dir, CredentialFileName))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("credential file: %v, mode %v", err, info.Mode().Perm())
	}
	fc.c.Close(websocket.StatusServiceRestart, "restarting")
	if got := f.accept(t).next(t).Hello.NodeCredential; got != cred {
		t.Errorf("after a reconnect the hello presents %q, want the kept credential", got)
	}
	r.stop(t)

	// A restarted agent reads it back; another node name does not use it.
	again, err := CredentialFile(dir, "gpu-a")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := again.Load(); got != cred {
		t.Errorf("after a restart: %q", got)
	}
	other, _ := CredentialFile(dir, "gpu-b")
	if got, _ := other.Load(); got != "" {
		t.Errorf("another node name loaded %q", got)
	}
}

// A refused credential and a pending approval are said in the log, with
// what an operator does about them, and the agent keeps retrying slowly.
func TestNodeRefusedOrPendingIsLogged(t *testing.T) {
	for _, tc := range []struct {
		code websocket.StatusCode
		want string
	}{
		{wire.CloseNodeCredential, "DELETE /api/v1/nodes/NAME"},
		{wire.CloseNodePending, "awaits an admin's approval"},
	} {
		f := newFakeCoord(t)
		r := start(t, testConfig(f), newFakeHandler())
		fc := f.accept(t)
		fc.next(t)
		fc.c.Close(tc.code, "as the coordinator says")
		r.log.waitLog(t, tc.want)
		f.accept(t) // it retries
	}
}

func TestCredentialFileChecks(t *testing.T) {
	if _, err := CredentialFile("", "n"); err == nil {
		t.Error("an empty state_dir was accepted")
	}
	blocked := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocked, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CredentialFile(filepath.Join(blocked, "sub"), "n"); err == nil || !strings.Contains(err.Error(), "state_dir") {
		t.Errorf("a state_dir under a file: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, CredentialFileName)
	if err := os.WriteFile(path, []byte(`{"node":"n","credential":"c"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := CredentialFile(dir, "n"); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a credential others may read: %v", err)
	}
	if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CredentialFile(dir, "n"); err == nil || !strings.Contains(err.Error(), "release the node name") {
		t.Errorf("a garbled credential file: %v", err)
	}
}
