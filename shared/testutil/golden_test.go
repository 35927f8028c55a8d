package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// With -update, Golden writes what the test produced, folders included,
// and a later run without it compares against that.
func TestGoldenUpdateWritesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "out.golden")
	*update = true
	Golden(t, path, []byte("x\n"))
	*update = false
	if b, err := os.ReadFile(path); err != nil || string(b) != "x\n" {
		t.Fatalf("after -update the file holds %q, %v", b, err)
	}
	Golden(t, path, []byte("x\n"))
}
