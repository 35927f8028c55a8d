// Package memnet is an in-memory network for tests that run in a
// testing/synctest bubble: a listener whose connections are net.Pipe
// pairs, and an HTTP client that dials it. Inside a bubble time only moves
// while every goroutine waits on something of the bubble's, which a real
// socket is not; a pipe is. A server on a memnet listener and its clients
// then run on the bubble's clock, so what they time is exact.
package memnet

import (
	"context"
	"net"
	"net/http"
	"sync"
	"syscall"
)

// Listener is a net.Listener of in-memory connections. Its Addr is a
// loopback TCP address (port is chosen by Listen's caller), so code that
// derives a URL from a listener's address works unchanged; the address is
// not a socket, and only Dial and Client reach the listener.
type Listener struct {
	addr   *net.TCPAddr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

// Listen returns a listener that says it is 127.0.0.1:port.
func Listen(port int) *Listener {
	return &Listener{addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port},
		conns: make(chan net.Conn), closed: make(chan struct{})}
}

// Accept waits for the next Dial.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close stops Accept; dials after it are refused. Connections already
// accepted stay open.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr is the loopback address the listener stands for.
func (l *Listener) Addr() net.Addr { return l.addr }

// Dial connects to the listener, whatever network and address it is
// given: it has the signature of http.Transport's DialContext.
func (l *Listener) Dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: l.addr, Err: syscall.ECONNREFUSED}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Client returns an HTTP client whose every request goes to the
// listener. Call its CloseIdleConnections before the bubble ends.
func (l *Listener) Client() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: l.Dial}}
}
