package link

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

// A node name mistyped and later fixed: the mistyped name's enrolment
// keeps the real name's credential, and the real name's next one keeps
// the mistyped one's. The file keeps its old shape for this node, so a
// file an older agent wrote is read, and an older agent reads this one.
func TestCredentialsOfOtherNamesAreKept(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, CredentialFileName)
	if err := os.WriteFile(path, []byte(`{"node":"gpu-a","credential":"cred-a"}`+"\n"), 0o600); err != nil {
		t.Fatal(err) // as an older agent wrote it
	}
	load := func(node string) string {
		t.Helper()
		c, err := CredentialFile(dir, node)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.Load()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	save := func(node, cred string) {
		t.Helper()
		c, err := CredentialFile(dir, node)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Save(cred); err != nil {
			t.Fatal(err)
		}
	}
	if got := load("gpu-a"); got != "cred-a" {
		t.Fatalf("an older agent's file: %q", got)
	}
	save("gpu-aa", "cred-aa") // node.name mistyped; that name enrols
	if got := load("gpu-a"); got != "cred-a" {
		t.Errorf("gpu-a after gpu-aa enrolled: %q, want its credential kept", got)
	}
	var doc struct{ Node, Credential string } // what an older agent reads
	data, _ := os.ReadFile(path)
	if err := json.Unmarshal(data, &doc); err != nil || doc.Node != "gpu-aa" || doc.Credential != "cred-aa" {
		t.Errorf("top of the file: %+v (%v), want the name that saved last", doc, err)
	}
	save("gpu-a", "cred-a2") // fixed, released and enrolled again
	if got := load("gpu-aa"); got != "cred-aa" {
		t.Errorf("gpu-aa after gpu-a enrolled again: %q", got)
	}
	if got := load("gpu-a"); got != "cred-a2" {
		t.Errorf("gpu-a: %q, want its new credential", got)
	}
	if got := load("gpu-b"); got != "" {
		t.Errorf("a name never enrolled loaded %q", got)
	}

	// Many names: the newest are kept, and the file stays readable.
	for i := range 40 {
		save(fmt.Sprintf("n%02d-%s", i, strings.Repeat("x", 240)), strings.Repeat("c", wire.MaxCredentialBytes))
	}
	if got := load(fmt.Sprintf("n%02d-%s", 39-maxOtherNodes, strings.Repeat("x", 240))); got == "" {
		t.Error("one of the newest other names was dropped")
	}
	if got := load("gpu-a"); got != "" {
		t.Errorf("the oldest name is still kept (%q): the list is not bounded", got)
	}

	// The agent says, at start, that it keeps other names' credentials.
	f := newFakeCoord(t)
	cfg := testConfig(f)
	cfg.Credentials, _ = CredentialFile(dir, "gpu-a")
	r := start(t, cfg, newFakeHandler())
	r.log.waitLog(t, "state_dir also keeps the credentials of other node names")
}

// The file is opened, not followed, and checked as opened: a FIFO does
// not hang the start, a symlink and a file too large to be the agent's are
// refused without reading them whole.
func TestCredentialFileMustBeRegular(t *testing.T) {
	refused := func(t *testing.T, dir, want string) {
		t.Helper()
		done := make(chan error, 1)
		go func() { _, err := CredentialFile(dir, "n"); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("got %v, want an error saying %q", err, want)
			}
		case <-time.After(5 * time.Second):
			t.Error("CredentialFile blocked: the agent's start hangs")
			if f, err := os.OpenFile(filepath.Join(dir, CredentialFileName), os.O_WRONLY, 0); err == nil {
				f.Close() // unblock the reader
			}
			<-done
		}
	}
	t.Run("fifo", func(t *testing.T) {
		dir := t.TempDir()
		if err := syscall.Mkfifo(filepath.Join(dir, CredentialFileName), 0o600); err != nil {
			t.Fatal(err)
		}
		refused(t, dir, "not a regular file")
	})
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(t.TempDir(), "elsewhere")
		if err := os.WriteFile(target, []byte(`{"node":"n","credential":"c"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, CredentialFileName)); err != nil {
			t.Fatal(err)
		}
		refused(t, dir, "symbolic link")
	})
	t.Run("large", func(t *testing.T) {
		dir := t.TempDir()
		// Valid JSON, but padded past what the agent writes.
		data := []byte(`{"node":"n","credential":"c"}` + strings.Repeat(" ", maxCredentialFile))
		if err := os.WriteFile(filepath.Join(dir, CredentialFileName), data, 0o600); err != nil {
			t.Fatal(err)
		}
		refused(t, dir, "larger than")
	})
}
