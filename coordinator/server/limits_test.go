package server

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"heft/shared/testutil"
)

// failingListener fails its first Accept calls as a process at its
// open-file limit does.
type failingListener struct {
	net.Listener
	fails int
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails > 0 {
		l.fails--
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: errors.New("accept4: too many open files")}
	}
	return l.Listener.Accept()
}

// Accept errors at the open-file limit are logged at warn, once per
// interval, not at debug.
func TestAcceptErrorsAreWarned(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	var logs testutil.SyncBuffer
	l := &warnListener{Listener: &failingListener{Listener: inner, fails: 3}, log: hclog.New(&hclog.LoggerOptions{Output: &logs})}
	for range 3 {
		if _, err := l.Accept(); err == nil {
			t.Fatal("the failing accept succeeded")
		}
	}
	if n := strings.Count(logs.String(), "[WARN]"); n != 1 || !strings.Contains(logs.String(), "too many open files") {
		t.Errorf("%d warnings:\n%s", n, logs.String())
	}
}
