package proc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"slices"
	"testing"

	"heft/agent/internal/testchild"
)

// launches stands in for the engine package's rule: a command line that
// names vllm and has arguments.
func launches(argv []string) bool { return len(argv) > 1 && argv[0] == "vllm" }

func TestFindListenerInAnotherProcess(t *testing.T) {
	argv := []string{"vllm", "serve", "Qwen/Qwen3-8B", "--tensor-parallel-size", "2", "--enforce-eager"}
	ch := startChild(t, "listen", argv)
	pid, err := FindListener(t.Context(), ch.Port)
	if err != nil {
		t.Fatalf("FindListener: %v", err)
	}
	if pid != ch.Cmd.Process.Pid {
		t.Fatalf("pid %d, want the child's %d", pid, ch.Cmd.Process.Pid)
	}
	got, err := Cmdline(t.Context(), pid)
	if err != nil || !reflect.DeepEqual(got, argv) {
		t.Fatalf("Cmdline %q, %v; want %q", got, err, argv)
	}
}

func TestFindListenerSkipsOwnProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := FindListener(t.Context(), ln.Addr().(*net.TCPAddr).Port); !errors.Is(err, ErrNoListener) {
		t.Errorf("own listener: err %v, want ErrNoListener", err)
	}
	if _, err := FindListener(t.Context(), 0); err == nil {
		t.Error("port 0 accepted")
	}
}

func TestTreeAndEngineRoot(t *testing.T) {
	// The parent is "vllm serve ..."; its child listens under a bare
	// process title, as vLLM's spawned API servers do.
	argv := []string{"vllm", "serve", "Qwen/Qwen3-8B", "--data-parallel-size", "2"}
	ch := startChild(t, "parent", argv)
	parent := ch.Cmd.Process.Pid
	listener, err := FindListener(t.Context(), ch.Port)
	if err != nil {
		t.Fatal(err)
	}
	if listener == parent {
		t.Fatal("the listener should be the grandchild")
	}
	root, got, err := EngineRoot(t.Context(), listener, launches)
	if err != nil || root != parent || !reflect.DeepEqual(got, argv) {
		t.Fatalf("EngineRoot = %d %q %v; want %d %q", root, got, err, parent, argv)
	}
	// Nothing accepted: the listener and its own argv.
	root, got, err = EngineRoot(t.Context(), listener, func([]string) bool { return false })
	if err != nil || root != listener || !reflect.DeepEqual(got, []string{"VLLM::APIServer"}) {
		t.Fatalf("EngineRoot accepting nothing = %d %q %v; want the listener %d", root, got, err, listener)
	}
	tree, err := Tree(t.Context(), parent)
	if err != nil {
		t.Fatal(err)
	}
	if tree[0] != parent || !slices.Contains(tree, listener) {
		t.Errorf("tree %v, want %d first and %d in it", tree, parent, listener)
	}
	if slices.Contains(tree, os.Getpid()) {
		t.Error("the tree climbed above its root")
	}
	if _, err := Tree(t.Context(), 1<<30); err == nil {
		t.Error("tree of a pid that does not exist")
	}
}

func TestFinderKeepsAndForgets(t *testing.T) {
	argv := []string{"vllm", "serve", "M"}
	ch := startChild(t, "parent", argv)
	f := NewFinder(ch.Port, launches)
	p, err := f.Find(t.Context())
	if err != nil || p.Root != ch.Cmd.Process.Pid || !reflect.DeepEqual(p.Argv, argv) || len(p.Tree) < 2 {
		t.Fatalf("Find = %+v, %v; want root %d with its child", p, err, ch.Cmd.Process.Pid)
	}
	again, err := f.Find(t.Context())
	if err != nil || !reflect.DeepEqual(again, p) {
		t.Errorf("second Find = %+v, %v; want the kept %+v", again, err, p)
	}

	// The engine exits: its root is gone, so the lookup is not trusted.
	ch.Stop()
	if p, err := f.Find(t.Context()); !errors.Is(err, ErrNoListener) {
		t.Errorf("after exit: Find = %+v, %v; want ErrNoListener", p, err)
	}
	// A failed lookup is kept too, until Forget.
	f.Forget()
	if _, err := f.Find(t.Context()); !errors.Is(err, ErrNoListener) {
		t.Errorf("after Forget: %v, want ErrNoListener", err)
	}
}

// An engine restarted on its port with the same command line is found as
// soon as it listens again: a failed lookup is not kept for Recheck then.
func TestFinderFindsARestartedEngineAtOnce(t *testing.T) {
	argv := []string{"vllm", "serve", "M"}
	first := startChild(t, "listen", argv)
	f := NewFinder(first.Port, launches)
	if p, err := f.Find(t.Context()); err != nil || p.Root != first.Cmd.Process.Pid {
		t.Fatalf("Find = %+v, %v", p, err)
	}
	first.Stop()
	if _, err := f.Find(t.Context()); !errors.Is(err, ErrNoListener) {
		t.Fatalf("engine stopped: %v, want ErrNoListener", err)
	}
	// Kept while nothing listens.
	if _, err := f.Find(t.Context()); !errors.Is(err, ErrNoListener) {
		t.Fatalf("still stopped: %v, want ErrNoListener", err)
	}
	second := testchild.Start(t, argv, childEnv+"=listen", fmt.Sprintf("%s=127.0.0.1:%d", testchild.AddrEnv, first.Port))
	p, err := f.Find(t.Context())
	if err != nil || p.Root != second.Cmd.Process.Pid || !reflect.DeepEqual(p.Argv, argv) {
		t.Fatalf("restarted: Find = %+v, %v; want the new process %d at once", p, err, second.Cmd.Process.Pid)
	}
}

func TestIsLocalHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "127.0.0.1": true, "[::1]": true, "0.0.0.0": true, "127.0.0.2": true,
		"203.0.113.7": false, "example.invalid": false,
	} {
		if got := IsLocalHost(host); got != want {
			t.Errorf("IsLocalHost(%q) = %v", host, got)
		}
	}
	if h, err := os.Hostname(); err == nil && !IsLocalHost(h) {
		t.Errorf("own host name %q not local", h)
	}
}

func BenchmarkTree(b *testing.B) {
	for b.Loop() {
		if _, err := Tree(b.Context(), os.Getpid()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFindListener(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	for b.Loop() {
		_, _ = FindListener(b.Context(), port)
	}
}
