package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// OpenDeleted counts this process's descriptors on the deleted file that
// was at path (Linux's /proc); the test is skipped elsewhere.
func OpenDeleted(t testing.TB, path string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, fd := range fds {
		if to, _ := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); to == path+" (deleted)" {
			n++
		}
	}
	return n
}
