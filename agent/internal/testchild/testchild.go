// Package testchild lets a test start its own test binary again as a
// child process with a command line of the test's choosing, listening on
// a port, so that process discovery is tested against a real listener in
// another process and its real argv. Only tests import it.
//
// The test binary's TestMain sees the child by its environment (the
// variable the test names) and runs Serve, or Parent for a child that
// starts the listener as its own child under a bare process title.
package testchild

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// Child is a running child process.
type Child struct {
	Cmd  *exec.Cmd
	Port int // the port it (or its own child) listens on

	stdin io.Closer
	once  sync.Once
}

// Start runs the test binary with argv as its command line and env added
// to its environment, waits (with a deadline) for the port it reports,
// and stops it when the test ends.
// AddrEnv, when set in a child's environment, is the address Serve
// listens on.
const AddrEnv = "HEFT_TESTCHILD_ADDR"

func Start(t testing.TB, argv []string, env ...string) *Child {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := &exec.Cmd{Path: self, Args: argv, Env: append(os.Environ(), env...)}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{Cmd: cmd, stdin: stdin}
	t.Cleanup(c.Stop)
	portc := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var p int
			if _, err := fmt.Sscanf(sc.Text(), "PORT %d", &p); err == nil {
				portc <- p
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case c.Port = <-portc:
	case <-time.After(20 * time.Second):
		t.Fatal("child did not report its port")
	}
	return c
}

// Stop ends the child (closing its stdin ends it and its own child) and
// waits for it.
func (c *Child) Stop() {
	c.once.Do(func() {
		_ = c.stdin.Close()
		done := make(chan struct{})
		go func() { _ = c.Cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.Cmd.Process.Kill()
			<-done
		}
	})
}

// Serve is the child's side: it listens on 127.0.0.1:0, reports the port
// on stdout, serves h there (h nil: it only accepts connections), and
// returns the exit code once its stdin closes. It listens on AddrEnv's
// address when that is set.
func Serve(h http.Handler) int {
	addr := "127.0.0.1:0"
	if a := os.Getenv(AddrEnv); a != "" {
		addr = a // a chosen port: an engine restarted on its port
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer ln.Close()
	if h != nil {
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
	}
	fmt.Printf("PORT %d\n", ln.Addr().(*net.TCPAddr).Port)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test closes our stdin
	return 0
}

// Parent is the side of a child that starts the listener as its own
// child, whose argv is the bare process title (as vLLM's spawned API
// servers have), with env added, and waits for it.
func Parent(title string, env ...string) int {
	self, err := os.Executable()
	if err != nil {
		return 1
	}
	cmd := &exec.Cmd{Path: self, Args: []string{title}, Env: append(os.Environ(), env...),
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	if cmd.Run() != nil {
		return 1
	}
	return 0
}
