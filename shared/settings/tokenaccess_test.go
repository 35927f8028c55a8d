//go:build unix

package settings

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// readAsEnv makes the test binary read the token file it names and print
// the error, for TestTokenFileAccessHint's child running as another user.
const readAsEnv = "HEFT_SETTINGS_TEST_READ"

func TestMain(m *testing.M) {
	if p := os.Getenv(readAsEnv); p != "" {
		_, err := ReadTokenFile(p)
		fmt.Println(err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestDescribeAccess(t *testing.T) {
	got := describeAccess("/etc/heft/agent.token", false, owner{uid: 0, gid: 0, mode: 0o600}, identity{uid: 65534, gid: 65534, groups: []int{65534}})
	for _, want := range []string{"the file is owned by " + userName(0) + ", group " + groupName(0) + ", mode 0600",
		"runs as " + userName(65534) + ", groups " + groupName(65534), "cannot read it",
		"chgrp " + groupName(65534) + " /etc/heft/agent.token && chmod 640 /etc/heft/agent.token"} {
		if !strings.Contains(got, want) {
			t.Errorf("hint lacks %q:\n%s", want, got)
		}
	}
	got = describeAccess("/etc/heft", true, owner{uid: 0, gid: 0, mode: 0o700}, identity{uid: 1000, gid: 1000})
	if !strings.Contains(got, "its folder /etc/heft is owned by") || !strings.Contains(got, "cannot enter it") || !strings.Contains(got, "chmod 750 /etc/heft") {
		t.Errorf("folder hint: %s", got)
	}
}

// TestTokenFileAccessHint reads a root-owned 0600 token file as the
// nobody user (the way gen-token's old hint left the file for the
// packaged services, which run as heft): the error names the owner,
// group, mode and the user running. It needs root to start the child as
// another user.
func TestTokenFileAccessHint(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to read the file as another user")
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // the child must reach the file
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "agent.token")
	if err := os.WriteFile(path, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The child runs a copy of the test binary where the user can reach
	// it: the build folder is open to its owner only.
	self := filepath.Join(dir, "settings.test")
	if exe, err := os.Executable(); err != nil {
		t.Fatal(err)
	} else if b, err := os.ReadFile(exe); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(self, b, 0o755); err != nil {
		t.Fatal(err)
	}
	read := func() string {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), readAsEnv+"="+path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Skipf("cannot run as uid 65534 here: %v: %s", err, out)
		}
		return string(out)
	}
	out := read()
	t.Logf("as nobody: %s", out)
	for _, want := range []string{"permission denied", "owned by " + userName(0) + ", group " + groupName(0) + ", mode 0600",
		"runs as " + userName(65534), "chgrp " + groupName(65534) + " " + path} {
		if !strings.Contains(out, want) {
			t.Errorf("error lacks %q:\n%s", want, out)
		}
	}
	// A folder the user cannot enter is named instead.
	sub := filepath.Join(dir, "closed")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(sub, "agent.token")
	if err := os.WriteFile(path, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := read(); !strings.Contains(out, "its folder "+sub+" is owned by") {
		t.Errorf("error does not name the folder:\n%s", out)
	}
}
