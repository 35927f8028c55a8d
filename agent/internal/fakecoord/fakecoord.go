// Package fakecoord is a coordinator-like websocket server on 127.0.0.1
// for the agent's tests: it accepts agents that present its token on
// /api/v1/agent and hands the test each connection's decoded messages.
// Only tests import it.
package fakecoord

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/shared/wire"
)

// Coordinator is the fake. Conns receives each accepted connection.
type Coordinator struct {
	URL   string // ws:// URL of its agent endpoint
	Conns chan *Conn
}

// Conn is one agent connection.
type Conn struct {
	c    *websocket.Conn
	msgs chan *wire.Envelope
	done chan struct{}
	err  error // why reading ended; valid after done
}

// Start runs a fake coordinator that accepts token until the test ends.
func Start(t *testing.T, token string) *Coordinator {
	f := &Coordinator{Conns: make(chan *Conn, 10)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/agent" || r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.SetReadLimit(wire.MaxMessageBytes)
		fc := &Conn{c: c, msgs: make(chan *wire.Envelope, 1000), done: make(chan struct{})}
		f.Conns <- fc
		defer close(fc.done)
		for {
			_, data, err := c.Read(context.Background())
			if err != nil {
				fc.err = err
				return
			}
			env, err := wire.Decode(data)
			if err != nil {
				t.Errorf("agent sent an invalid message: %v", err)
				fc.err = err
				return
			}
			select {
			case fc.msgs <- env:
			default: // heartbeats nobody waits for
			}
		}
	}))
	t.Cleanup(srv.Close)
	f.URL = "ws" + strings.TrimPrefix(srv.URL, "http") + "/api/v1/agent"
	return f
}

// Next returns the next message of type typ the agent sent, skipping
// others.
func (fc *Conn) Next(t *testing.T, typ string) *wire.Envelope {
	t.Helper()
	return fc.NextWithin(t, typ, 30*time.Second)
}

// NextWithin is Next with a deadline of its own, for a message that is
// slow to come by design.
func (fc *Conn) NextWithin(t *testing.T, typ string, d time.Duration) *wire.Envelope {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case env := <-fc.msgs:
			if env.Type == typ {
				return env
			}
		case <-fc.done:
			t.Fatalf("connection ended while waiting for %s: %v", typ, fc.err)
		case <-deadline:
			t.Fatalf("no %s from the agent", typ)
		}
	}
}

// Send writes a message to the agent.
func (fc *Conn) Send(t *testing.T, payload any) {
	t.Helper()
	data, err := wire.Encode(payload)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := fc.c.Write(ctx, websocket.MessageText, data); err != nil {
		t.Fatal(err)
	}
}

// CloseStatus waits for the connection to end and returns the close code
// the agent sent (-1 when it just dropped the connection).
func (fc *Conn) CloseStatus(t *testing.T) websocket.StatusCode {
	t.Helper()
	select {
	case <-fc.done:
		return websocket.CloseStatus(fc.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not end the connection")
		return 0
	}
}
