package link

import (
	"context"
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"heft/shared/testutil"
	"heft/shared/wire"
)

const testToken = "s3cret"

// fakeCoord is a coordinator-like websocket server, on 127.0.0.1 or in
// memory (newPipeCoord, for tests in a testing/synctest bubble).
type fakeCoord struct {
	t      *testing.T
	url    string       // ws:// URL of its agent endpoint
	client *http.Client // dials it in memory; nil on 127.0.0.1
	wait   time.Duration
	conns  chan *fakeConn
	stop   chan struct{}

	mu      sync.Mutex
	refuse  int  // when non-zero, answer dials with this HTTP status
	stall   bool // accept connections and never answer (see serveStalled)
	headers []http.Header
	dials   []time.Time // when each dial arrived

	refused atomic.Int64
}

// fakeConn is one accepted agent connection; a goroutine reads it into got.
type fakeConn struct {
	c      *websocket.Conn
	mu     sync.Mutex
	got    []*wire.Envelope
	notify chan struct{}
	seen   int // messages handed out by next
	done   chan struct{}
	err    error         // why reading ended; valid after done
	wait   time.Duration // how long next waits for a message
}

// newFakeCoord starts a fake coordinator on 127.0.0.1: real sockets.
func newFakeCoord(t *testing.T) *fakeCoord {
	f := &fakeCoord{t: t, wait: 10 * time.Second, conns: make(chan *fakeConn, 100), stop: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(f.serve))
	f.url = "ws" + strings.TrimPrefix(srv.URL, "http") + "/api/v1/agent"
	t.Cleanup(func() {
		close(f.stop)
		srv.Close()
	})
	return f
}

// newPipeCoord starts a fake coordinator whose connections are in-memory
// pipes, for a test inside a testing/synctest bubble: there time only
// moves while every goroutine waits on something of the bubble's, which a
// real socket is not. Waits are long, as the bubble's clock makes them
// free.
func newPipeCoord(t *testing.T) *fakeCoord {
	f := &fakeCoord{t: t, wait: 24 * time.Hour, conns: make(chan *fakeConn, 100), stop: make(chan struct{}),
		url: "ws://coordinator.test/api/v1/agent"}
	ln := &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
	srv := &http.Server{Handler: http.HandlerFunc(f.serve)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	f.client = &http.Client{Transport: &http.Transport{DialContext: ln.dial}}
	t.Cleanup(func() {
		close(f.stop)
		_ = srv.Close()
		<-served
		f.client.CloseIdleConnections()
	})
	return f
}

// pipeListener accepts the in-memory connections its dial makes.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		return nil, syscall.ECONNREFUSED
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "coordinator.test:80" }

func (f *fakeCoord) set(fn func(f *fakeCoord)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeCoord) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.headers = append(f.headers, r.Header.Clone())
	f.dials = append(f.dials, time.Now())
	refuse, stall := f.refuse, f.stall
	f.mu.Unlock()
	if refuse != 0 {
		f.refused.Add(1)
		http.Error(w, "refused", refuse)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+testToken {
		f.refused.Add(1)
		http.Error(w, "bad agent token", http.StatusUnauthorized)
		return
	}
	if stall && f.client != nil {
		f.serveStalled(w, r)
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	c.SetReadLimit(wire.MaxMessageBytes)
	fc := &fakeConn{c: c, notify: make(chan struct{}, 1), done: make(chan struct{})}
	f.conns <- fc
	defer close(fc.done)
	if stall {
		<-f.stop
		fc.err = c.CloseNow()
		return
	}
	for {
		_, data, err := c.Read(context.Background())
		if err != nil {
			fc.err = err
			return
		}
		env, err := wire.Decode(data)
		if err != nil {
			f.t.Errorf("agent sent an invalid message: %v", err)
			fc.err = err
			c.Close(websocket.StatusPolicyViolation, "invalid")
			return
		}
		fc.mu.Lock()
		fc.got = append(fc.got, env)
		fc.mu.Unlock()
		select {
		case fc.notify <- struct{}{}:
		default:
		}
	}
}

// serveStalled completes the websocket handshake in memory and then reads
// and drops every byte without answering, pings included: a coordinator
// that hangs. (On 127.0.0.1 a stalled one just never reads, and the socket
// buffers take what the agent writes; an in-memory pipe has no buffer.)
func (f *fakeCoord) serveStalled(w http.ResponseWriter, r *http.Request) {
	sum := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		f.t.Errorf("hijack: %v", err)
		return
	}
	defer conn.Close()
	fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(sum[:]))
	if rw.Flush() != nil {
		return
	}
	fc := &fakeConn{notify: make(chan struct{}, 1), done: make(chan struct{})}
	f.conns <- fc
	defer close(fc.done)
	_, fc.err = io.Copy(io.Discard, conn)
}

// dialTimes returns when each dial so far arrived.
func (f *fakeCoord) dialTimes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.dials)
}

// accept waits for the next agent connection.
func (f *fakeCoord) accept(t *testing.T) *fakeConn {
	t.Helper()
	select {
	case fc := <-f.conns:
		fc.wait = f.wait
		return fc
	case <-time.After(f.wait):
		t.Fatal("agent did not connect")
		return nil
	}
}

// next returns the next message the agent sent on this connection.
func (fc *fakeConn) next(t *testing.T) *wire.Envelope {
	t.Helper()
	deadline := time.After(fc.wait)
	for {
		fc.mu.Lock()
		if fc.seen < len(fc.got) {
			env := fc.got[fc.seen]
			fc.seen++
			fc.mu.Unlock()
			return env
		}
		fc.mu.Unlock()
		select {
		case <-fc.notify:
		case <-fc.done:
			fc.mu.Lock()
			more := fc.seen < len(fc.got)
			fc.mu.Unlock()
			if !more {
				t.Fatalf("connection ended while waiting for a message: %v", fc.err)
			}
		case <-deadline:
			t.Fatal("no message from the agent")
		}
	}
}

// nextOf returns the next message of type typ, skipping others (snapshots
// sent as heartbeats, say).
func (fc *fakeConn) nextOf(t *testing.T, typ string) *wire.Envelope {
	t.Helper()
	for {
		if env := fc.next(t); env.Type == typ {
			return env
		}
	}
}

func (fc *fakeConn) send(t *testing.T, payload any) {
	t.Helper()
	data, err := wire.Encode(payload)
	if err != nil {
		t.Fatal(err)
	}
	fc.sendRaw(t, data)
}

func (fc *fakeConn) sendRaw(t *testing.T, data []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := fc.c.Write(ctx, websocket.MessageText, data); err != nil {
		t.Fatalf("write to agent: %v", err)
	}
}

// closeStatus waits for the agent to end the connection and returns the
// close code it sent (-1 when it just dropped the connection).
func (fc *fakeConn) closeStatus(t *testing.T) websocket.StatusCode {
	t.Helper()
	select {
	case <-fc.done:
		return websocket.CloseStatus(fc.err)
	case <-time.After(fc.wait + 5*time.Second):
		t.Fatal("agent did not close the connection")
		return 0
	}
}

// fakeHandler stands in for the collector and the prober.
type fakeHandler struct {
	mu     sync.Mutex
	snap   wire.Snapshot
	snapFn func(n int64) wire.Snapshot // overrides snap when set

	polls      atomic.Int64
	probeCalls atomic.Int64
	probe      func(ctx context.Context, req wire.ProbeRequest) (wire.Measurement, error)
	cached     chan wire.CachedMeasurement
	held       []wire.CachedMeasurement // what Held offers
}

func newFakeHandler() *fakeHandler {
	return &fakeHandler{
		snap:   wire.Snapshot{Node: "gpu-a", Host: testHost, Engines: []wire.Engine{{Kind: "vllm", URL: "http://127.0.0.1:8000"}}},
		cached: make(chan wire.CachedMeasurement, 10),
	}
}

func (h *fakeHandler) Snapshot(ctx context.Context) wire.Snapshot {
	n := h.polls.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.snapFn != nil {
		return h.snapFn(n)
	}
	s := h.snap
	s.At = time.Now()
	return s
}

func (h *fakeHandler) setSnap(fn func(s *wire.Snapshot)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fn(&h.snap)
}

func (h *fakeHandler) Probe(ctx context.Context, req wire.ProbeRequest) (wire.Measurement, error) {
	h.probeCalls.Add(1)
	if h.probe != nil {
		return h.probe(ctx, req)
	}
	return measurement(req.CapacityKey), nil
}

func (h *fakeHandler) Cached(m wire.CachedMeasurement) { h.cached <- m }

func (h *fakeHandler) Held() []wire.CachedMeasurement {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

func measurement(key string) wire.Measurement {
	return wire.Measurement{CapacityKey: key, EngineKind: "vllm", EngineURL: "http://127.0.0.1:8000", Model: "m",
		ThroughputTPS: 992, OutputTokens: 2048, Requests: 16, Complete: true}
}

var testHost = wire.Host{Hostname: "gpu-a", OS: "linux", Arch: "amd64", CPUCores: 8}

// syncBuffer collects log output from many goroutines.
type syncBuffer struct{ testutil.SyncBuffer }

// waitLog polls the log until it holds want.
func (b *syncBuffer) waitLog(t *testing.T, want string) {
	t.Helper()
	testutil.Eventually(t, "log line "+want, 15*time.Second, func() bool { return strings.Contains(b.String(), want) })
}

// running is one link.Run under test.
type running struct {
	cancel context.CancelFunc
	done   chan error
	log    *syncBuffer
}

func testConfig(f *fakeCoord) Config {
	return Config{
		URL: f.url, HTTPClient: f.client, Token: testToken, Node: "gpu-a", AgentVersion: "test", Host: testHost,
		SnapshotEvery: time.Hour, PollEvery: 5 * time.Millisecond,
		MinBackoff: 2 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		PingEvery: time.Hour, WriteTimeout: 5 * time.Second,
	}
}

func start(t *testing.T, cfg Config, h Handler) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1), log: &syncBuffer{}}
	logger := hclog.New(&hclog.LoggerOptions{Output: r.log, Level: hclog.Debug})
	go func() { r.done <- Run(ctx, cfg, h, logger) }()
	t.Cleanup(func() {
		r.stop(t)
		if t.Failed() {
			t.Logf("agent log:\n%s", r.log.String())
		}
	})
	return r
}

// stop cancels Run and waits for it to return.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after cancel")
		return nil
	}
}
