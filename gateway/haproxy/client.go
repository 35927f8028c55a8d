package haproxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// runner sends one runtime API command and returns HAProxy's answer; a
// test gives its own.
type runner interface {
	run(ctx context.Context, cmd string) (string, error)
}

// client speaks HAProxy's runtime API (the "stats socket") in its
// non-interactive mode: one connection per command, which HAProxy answers
// and closes.
type client struct {
	network, addr string
	timeout       time.Duration
}

// newClient takes a unix socket path or a host:port TCP stats socket.
func newClient(socket string, timeout time.Duration) client {
	if strings.HasPrefix(socket, "/") || strings.HasPrefix(socket, ".") {
		return client{network: "unix", addr: socket, timeout: timeout}
	}
	return client{network: "tcp", addr: socket, timeout: timeout}
}

// maxAnswer bounds one answer; "show servers state" of a large backend is
// well under it.
const maxAnswer = 16 << 20

// run sends one command and returns HAProxy's answer.
func (c client) run(ctx context.Context, cmd string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, c.network, c.addr)
	if err != nil {
		return "", fmt.Errorf("connect to the runtime API at %s: %w", c.addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, cmd+"\n"); err != nil {
		return "", fmt.Errorf("send %q to %s: %w", cmd, c.addr, err)
	}
	data, err := io.ReadAll(io.LimitReader(conn, maxAnswer))
	if err != nil {
		return "", fmt.Errorf("read the answer to %q from %s: %w", cmd, c.addr, err)
	}
	return string(data), nil
}
