package elfcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

func TestCompareGlibc(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"2.17", "2.17", 0},
		{"2.2.5", "2.17", -1},
		{"2.34", "2.28", 1},
		{"2.3.4", "2.3", 1},
		{"2.3", "2.3.0", 0},
		{"2.9", "2.10", -1},
	}
	for _, tc := range tests {
		if got := CompareGlibc(tc.a, tc.b); got != tc.want {
			t.Errorf("CompareGlibc(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestDeclaredGlibc(t *testing.T) {
	for _, tc := range []struct {
		n    Needs
		want string
	}{
		{Needs{Static: true}, ""},
		{Needs{Interp: "/lib64/ld-linux-x86-64.so.2"}, MinGlibc},
		{Needs{Interp: "/lib64/ld-linux-x86-64.so.2", GlibcFloor: "2.2.5"}, MinGlibc},
		{Needs{Interp: "/lib64/ld-linux-x86-64.so.2", GlibcFloor: "2.34"}, "2.34"},
	} {
		if got := tc.n.DeclaredGlibc(); got != tc.want {
			t.Errorf("%+v: DeclaredGlibc = %q, want %q", tc.n, got, tc.want)
		}
	}
}

// build compiles a one-line Go program with the given cgo setting.
func build(t *testing.T, cgo string, src string) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("ELF binaries")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module m\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "m")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo, "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestReadStatic(t *testing.T) {
	n, err := Read(build(t, "0", "package main\nfunc main() {}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !n.Static || n.Interp != "" || len(n.Libraries) != 0 || n.GlibcFloor != "" {
		t.Errorf("a CGO_ENABLED=0 program: %+v, want static", n)
	}
}

func TestReadCgo(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	// os/user with cgo calls getpwuid_r from glibc, a versioned symbol.
	n, err := Read(build(t, "1", "package main\nimport \"os/user\"\nfunc main() { user.Current() }\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n.Static || n.Interp == "" || n.GlibcFloor == "" || CompareGlibc(n.GlibcFloor, "2.2.5") < 0 {
		t.Errorf("a cgo program: %+v, want a loader and a glibc floor", n)
	}
	t.Logf("cgo program built here: loader %s, libraries %v, glibc floor %s", n.Interp, n.Libraries, n.GlibcFloor)
}

func TestReadNotELF(t *testing.T) {
	path := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err == nil {
		t.Error("a shell script read as ELF")
	}
}
