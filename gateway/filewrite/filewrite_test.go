package filewrite

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAtomicKeepsModeAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.conf")
	if err := Atomic(p, []byte("one\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v", st.Mode().Perm())
	}
	os.Chmod(p, 0o600)
	if err := Atomic(p, []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	data, _ := Read(p)
	if st, _ := os.Stat(p); string(data) != "two\n" || st.Mode().Perm() != 0o600 {
		t.Fatalf("%q %v: an existing file keeps its mode", data, st.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("left behind: %v", entries)
	}
	if data, err := Read(filepath.Join(dir, "missing")); data != nil || err != nil {
		t.Fatalf("a missing file: %v %v", data, err)
	}
	if err := Atomic(filepath.Join(dir, "no", "such", "dir"), nil, 0o644); err == nil {
		t.Fatal("wrote into a folder that does not exist")
	}
}

func TestRun(t *testing.T) {
	if err := Run(context.Background(), []string{"true"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	err := Run(context.Background(), []string{"sh", "-c", "echo the reason >&2; exit 3"}, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "the reason") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("Run = %v", err)
	}
	if err := Run(context.Background(), nil, time.Minute); err != nil {
		t.Fatalf("no command: %v", err)
	}
}
