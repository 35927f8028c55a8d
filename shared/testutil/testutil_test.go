package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRepoRoot(t *testing.T) {
	root := RepoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("%s holds no go.mod", root)
	}
	if !strings.HasSuffix(filepath.Join(root, "shared", "testutil"), filepath.Join("shared", "testutil")) {
		t.Errorf("root %s", root)
	}
}

func TestSyncBuffer(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := len(b.String()); n != 800 {
		t.Errorf("%d bytes, want 800", n)
	}
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, "the third call", time.Second, func() bool { n++; return n == 3 })
	if n != 3 {
		t.Errorf("cond called %d times, want 3", n)
	}
}

func TestTestdata(t *testing.T) {
	if p := Testdata(t, "engines"); !strings.HasSuffix(p, filepath.Join("testdata", "engines")) {
		t.Errorf("Testdata = %s", p)
	}
}

func TestGolden(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.golden")
	if err := os.WriteFile(path, []byte("a\nb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	Golden(t, path, []byte("a\nb\n"))
	ft := &fakeT{TB: t}
	func() {
		defer func() { _ = recover() }()
		Golden(ft, path, []byte("a\nc\n"))
	}()
	if !strings.Contains(ft.msg, "line 2") || !strings.Contains(ft.msg, "got: c") || !strings.Contains(ft.msg, "want: b") {
		t.Errorf("mismatch reported as %q", ft.msg)
	}
}

// fakeT records a Fatalf instead of ending the test.
type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic("fatal")
}
