package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/shared/testutil"
	"heft/shared/wire"
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

// An agent that sends its hello in the same write as its handshake: the
// frame already read into net/http's buffer is not lost when the
// connection moves to the small buffers.
func TestHelloRightAfterHandshake(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	addr := strings.TrimPrefix(ts.base, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hello, _ := wire.Encode(&wire.Hello{Node: "early", Host: wire.Host{Hostname: "early"}})
	frame := append([]byte{0x81, 0x80 | 126, byte(len(hello) >> 8), byte(len(hello)), 0, 0, 0, 0}, hello...) // masked with a zero key
	req := fmt.Sprintf("GET /api/v1/agent HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer %s\r\n\r\n", addr, agentToken)
	if _, err := conn.Write(append([]byte(req), frame...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %v %v", resp, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	head := make([]byte, 2)
	if _, err := io.ReadFull(br, head); err != nil {
		t.Fatal(err)
	}
	n := int(head[1] & 0x7f)
	if n == 126 {
		ext := make([]byte, 2)
		io.ReadFull(br, ext)
		n = int(ext[0])<<8 | int(ext[1])
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(br, payload); err != nil {
		t.Fatal(err)
	}
	if env, err := wire.Decode(payload); err != nil || env.Type != wire.TypeWelcome {
		t.Fatalf("first frame from the coordinator: %q (%v), want a welcome", payload, err)
	}
}
