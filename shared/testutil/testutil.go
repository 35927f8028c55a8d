// Package testutil holds small helpers shared by the tests of the agent,
// the coordinator and the simulator. Only _test.go files import it.
package testutil

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
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
