// Package testutil holds small helpers shared by the tests of the agent,
// the coordinator and the simulator. Only _test.go files import it.
package testutil

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// RepoRoot walks up from the test's working directory (its package) to
// the folder holding go.mod, where testdata/ and the scripts live.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}

// SyncBuffer is a bytes.Buffer that one goroutine may write while another
// reads it: a program's output or log, watched by its test.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Testdata returns the path of a file or folder under the repository's
// testdata/, failing the test when it does not exist.
func Testdata(t testing.TB, parts ...string) string {
	t.Helper()
	p := filepath.Join(append([]string{RepoRoot(t), "testdata"}, parts...)...)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("fixture: %v", err)
	}
	return p
}

// ReadTestdata returns the content of a file under testdata/.
func ReadTestdata(t testing.TB, parts ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(Testdata(t, parts...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Eventually polls cond every few milliseconds until it holds, and fails
// the test naming what it waited for when it does not hold within
// timeout. It is the one way tests wait for something another goroutine
// or process does: never a bare sleep.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// VerifyNoLeaks runs a package's tests and then fails the run when a
// goroutine the tests started is still running: the TestMain of every
// package that starts goroutines. Idle keep-alive connections of an
// http.Client are leaks too: tests close their clients' idle connections.
func VerifyNoLeaks(m *testing.M, opts ...goleak.Option) {
	goleak.VerifyTestMain(m, opts...)
}
