package proc

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"heft/shared/testutil"
)

// Child-process modes of the test binary, chosen by environment:
//
//	HEFT_PROC_TEST_CHILD=listen  listen on 127.0.0.1:0, print "PORT n",
//	                             live until stdin closes
//	HEFT_PROC_TEST_CHILD=parent  start the test binary again as a "listen"
//	                             child whose argv is a bare process title,
//	                             then wait for it
//
// They give the tests a real listener in another process, with a real
// command line, to find by its port.
const childEnv = "HEFT_PROC_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		testutil.VerifyNoLeaks(m)
	case "listen":
		os.Exit(listenChild())
	case "parent":
		self, err := os.Executable()
		if err != nil {
			os.Exit(1)
		}
		cmd := &exec.Cmd{Path: self, Args: []string{"VLLM::APIServer"}, Env: append(os.Environ(), childEnv+"=listen"),
			Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
		if cmd.Run() != nil {
			os.Exit(1)
		}
		os.Exit(0)
	default:
		os.Exit(2)
	}
}

func listenChild() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer ln.Close()
	fmt.Printf("PORT %d\n", ln.Addr().(*net.TCPAddr).Port)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test closes our stdin
	return 0
}

// child is a test-binary process started with a chosen argv.
type child struct {
	cmd   *exec.Cmd
	port  int
	stdin io.Closer
	once  sync.Once
}

// startChild runs the test binary with argv as its command line in the
// given mode and waits (with a deadline) for the port it listens on.
func startChild(t *testing.T, mode string, argv []string) *child {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := &exec.Cmd{Path: self, Args: argv, Env: append(os.Environ(), childEnv+"="+mode)}
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
	c := &child{cmd: cmd, stdin: stdin}
	t.Cleanup(c.stop)
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
	case c.port = <-portc:
	case <-time.After(20 * time.Second):
		t.Fatal("child did not report its port")
	}
	return c
}

// stop ends the child (closing its stdin ends it and its own child) and
// waits for it.
func (c *child) stop() {
	c.once.Do(func() {
		_ = c.stdin.Close()
		done := make(chan struct{})
		go func() { _ = c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-done
		}
	})
}
