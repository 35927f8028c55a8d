package testutil

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// update is `go test ./pkg -update`: rewrite golden files with what the
// tests produce, then review the diff with git.
var update = flag.Bool("update", false, "rewrite golden files with what the tests produce")

// Golden compares got with the golden file at path (relative to the test's
// package) and fails the test at the first line that differs. With
// -update it writes got to path instead.
func Golden(t testing.TB, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden file: %v (run go test with -update to write it)", err)
	}
	if bytes.Equal(got, want) {
		return
	}
	gotLines, wantLines := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < len(gotLines) || i < len(wantLines); i++ {
		g, w := line(gotLines, i), line(wantLines, i)
		if g != w {
			t.Fatalf("%s differs at line %d:\n got: %s\nwant: %s\n(if the change is intended, run go test with -update and review the diff)",
				path, i+1, g, w)
		}
	}
}

func line(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "(end of file)"
}
