// Package gwtest holds what the gateway tests share: a fake coordinator
// that speaks the real API on loopback, small upstream servers that say
// which one answered, and real haproxy and nginx processes in a temporary
// folder.
package gwtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"heft/gateway/coord"
	"heft/gateway/gwproc"
	"heft/shared/testutil"
	"heft/shared/view"
)

// RequireBinary returns the path of a gateway binary. It skips the test
// when the binary is absent, unless HEFT_REQUIRE_GATEWAYS is set (CI sets
// it, so a missing install fails loudly there).
func RequireBinary(t testing.TB, name string) string {
	t.Helper()
	return gwproc.Require(t, name)
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Worker builds a coordinator worker of model at addr (host:port) in
// state with weight (ignored unless admitted), as the coordinator reports
// it: its address, and the engine URL its agent dials.
func Worker(model, addr, state string, weight float64) coord.Worker {
	w := coord.Worker{
		ID: "w-" + addr, Node: "node-" + addr, Model: model, Engine: "vllm",
		URL: "http://" + addr, Address: addr, State: state, Ranks: []view.Rank{}, Warnings: []view.Warning{},
	}
	if state == view.StateAdmitted {
		w.Weight = &weight
	}
	return w
}

// Coordinator is a fake heft coordinator on loopback: GET /api/v1/workers,
// GET /api/v1/events and GET /api/v1/pending-nodes in the real
// coordinator's formats.
type Coordinator struct {
	t    testing.TB
	addr string

	mu      sync.Mutex
	workers []coord.Worker
	pending []string // node names GET /api/v1/pending-nodes answers
	raw     string   // when set, served instead of the workers (garbage)
	status  int      // when set, every answer has this status
	token   string
	subs    map[chan struct{}]bool
	hs      *http.Server
	done    chan struct{}

	Requests atomic.Int64
}

// NewCoordinator starts a fake coordinator on 127.0.0.1:0.
func NewCoordinator(t testing.TB) *Coordinator {
	c := &Coordinator{t: t, addr: "127.0.0.1:0", subs: map[chan struct{}]bool{}}
	c.Start()
	t.Cleanup(c.Stop)
	return c
}

// URL is the coordinator's base URL.
func (c *Coordinator) URL() string { return "http://" + c.addr }

// Start (re)starts the server on the same address.
func (c *Coordinator) Start() {
	c.t.Helper()
	var ln net.Listener
	testutil.Eventually(c.t, "the coordinator's port to be free", 5*time.Second, func() bool {
		var err error
		ln, err = net.Listen("tcp", c.addr)
		return err == nil
	})
	c.mu.Lock()
	c.addr = ln.Addr().String()
	c.hs = &http.Server{Handler: c.handler(), ReadHeaderTimeout: 5 * time.Second}
	c.done = make(chan struct{})
	hs, done := c.hs, c.done
	c.mu.Unlock()
	go func() {
		defer close(done)
		_ = hs.Serve(ln)
	}()
}

// Stop kills the server and every open stream, as a coordinator that
// dies does.
func (c *Coordinator) Stop() {
	c.mu.Lock()
	hs, done := c.hs, c.done
	c.hs = nil
	c.mu.Unlock()
	if hs == nil {
		return
	}
	_ = hs.Close()
	<-done
}

// SetWorkers replaces the fleet and sends it to every open stream.
func (c *Coordinator) SetWorkers(ws ...coord.Worker) {
	c.mu.Lock()
	c.workers = ws
	c.raw = ""
	c.mu.Unlock()
	c.notify()
}

// SetPending sets the node names waiting for approval, as GET
// /api/v1/pending-nodes answers them.
func (c *Coordinator) SetPending(nodes ...string) {
	c.mu.Lock()
	c.pending = nodes
	c.mu.Unlock()
}

// SetGarbage makes every answer and the next event body the given text.
func (c *Coordinator) SetGarbage(body string) {
	c.mu.Lock()
	c.raw = body
	c.mu.Unlock()
	c.notify()
}

// SetStatus makes every answer this HTTP status (0: normal answers).
func (c *Coordinator) SetStatus(code int) {
	c.mu.Lock()
	c.status = code
	c.mu.Unlock()
}

// SetToken makes reads need "Authorization: Bearer token".
func (c *Coordinator) SetToken(token string) {
	c.mu.Lock()
	c.token = token
	c.mu.Unlock()
}

func (c *Coordinator) notify() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ch := range c.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (c *Coordinator) body() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.raw != "" {
		return c.raw
	}
	ws := c.workers
	if ws == nil {
		ws = []coord.Worker{}
	}
	data, err := json.Marshal(struct {
		Workers []coord.Worker `json:"workers"`
	}{ws})
	if err != nil {
		panic(err)
	}
	return string(data)
}

func (c *Coordinator) refuse(w http.ResponseWriter, r *http.Request) bool {
	c.Requests.Add(1)
	c.mu.Lock()
	status, token := c.status, c.token
	c.mu.Unlock()
	if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
		http.Error(w, `{"error":"missing or wrong viewer token"}`, http.StatusUnauthorized)
		return true
	}
	if status != 0 {
		http.Error(w, `{"error":"broken on purpose"}`, status)
		return true
	}
	return false
}

func (c *Coordinator) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/workers", func(w http.ResponseWriter, r *http.Request) {
		if c.refuse(w, r) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, c.body()+"\n")
	})
	mux.HandleFunc("GET /api/v1/pending-nodes", func(w http.ResponseWriter, r *http.Request) {
		if c.refuse(w, r) {
			return
		}
		c.mu.Lock()
		body := view.PendingNodes{Nodes: append([]string{}, c.pending...)}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(body)
	})
	mux.HandleFunc("GET /api/v1/events", func(w http.ResponseWriter, r *http.Request) {
		if c.refuse(w, r) {
			return
		}
		ch := make(chan struct{}, 1)
		c.mu.Lock()
		c.subs[ch] = true
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			delete(c.subs, ch)
			c.mu.Unlock()
		}()
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		send := func() bool {
			_, err := fmt.Fprintf(w, "event: workers\ndata: %s\n\n", c.body())
			if err == nil {
				err = http.NewResponseController(w).Flush()
			}
			return err == nil
		}
		if !send() {
			return
		}
		ping := time.NewTicker(200 * time.Millisecond)
		defer ping.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-ch:
				if !send() {
					return
				}
			case <-ping.C:
				if _, err := io.WriteString(w, ": ping\n\n"); err != nil {
					return
				}
				_ = http.NewResponseController(w).Flush()
			}
		}
	})
	return mux
}

// Upstream is a loopback HTTP server that answers every request with its
// name, in the body and the X-Upstream header, and counts them.
type Upstream struct {
	Name   string
	Addr   string // host:port
	hits   atomic.Int64
	health atomic.Int64 // GET /health answered after HealthDelay
	srv    *http.Server
	// HealthDelay is how late GET /health answers (NewSlowHealthUpstream).
	HealthDelay time.Duration
}

// NewUpstream starts one.
func NewUpstream(t testing.TB, name string) *Upstream {
	t.Helper()
	return NewUpstreamAt(t, name, "127.0.0.1:0")
}

// NewUpstreamAt is NewUpstream listening at addr (another loopback
// address, for an engine a DNS name moves to).
func NewUpstreamAt(t testing.TB, name, addr string) *Upstream {
	t.Helper()
	return newUpstream(t, name, addr, 0)
}

// NewSlowHealthUpstream is NewUpstream whose GET /health answers only
// after delay, while every other request is answered at once: an LLM
// engine that serves fine while its API server is saturated (vLLM's and
// SGLang's /health run on the event loop that handles the requests), as
// a gateway's health check sees it. HealthChecks counts the answers.
func NewSlowHealthUpstream(t testing.TB, name string, delay time.Duration) *Upstream {
	t.Helper()
	return newUpstream(t, name, "127.0.0.1:0", delay)
}

func newUpstream(t testing.TB, name, addr string, healthDelay time.Duration) *Upstream {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	u := &Upstream{Name: name, Addr: ln.Addr().String(), HealthDelay: healthDelay}
	u.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		if healthDelay > 0 && r.URL.Path == "/health" {
			select {
			case <-time.After(healthDelay): // the engine's answer, late
			case <-r.Context().Done(): // the checker gave up and closed
				return
			}
			u.health.Add(1)
		}
		w.Header().Set("X-Upstream", name)
		io.WriteString(w, name)
	})}
	go func() { _ = u.srv.Serve(ln) }()
	t.Cleanup(func() { _ = u.srv.Close() })
	return u
}

// Hits is how many requests reached the upstream.
func (u *Upstream) Hits() int64 { return u.hits.Load() }

// HealthChecks is how many GET /health a NewSlowHealthUpstream answered
// after its delay (a checker that closed first is not counted).
func (u *Upstream) HealthChecks() int64 { return u.health.Load() }

// Split sends n sequential GET requests to url and counts the answers by
// the X-Upstream header.
func Split(t testing.TB, url string, n int) map[string]int {
	t.Helper()
	return SplitBy(t, url, n, "X-Upstream")
}

// SplitBy sends n sequential GET requests to url and counts the answers
// by a response header (a gateway's, naming the server it chose); an
// answer other than 200 counts under "status N", and a request that got
// no answer within 30 s under "no answer", so a test that waits for a
// split sees the miss and tries again (a starved machine can hold a
// request through a gateway for seconds).
func SplitBy(t testing.TB, url string, n int, header string) map[string]int {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	out := map[string]int{}
	for range n {
		resp, err := client.Get(url)
		if err != nil {
			t.Logf("GET %s: %v", url, err)
			out[NoAnswer]++
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			out["status "+strconv.Itoa(resp.StatusCode)]++
			continue
		}
		out[resp.Header.Get(header)]++
	}
	return out
}

// NoAnswer is SplitBy's key for requests that got no answer.
const NoAnswer = "no answer"

// WaitHTTP waits until url answers at all.
func WaitHTTP(t testing.TB, url string) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	testutil.Eventually(t, url+" to answer", 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
}

// Stop stops the upstream between requests: it accepts no connection any
// more, closes its idle ones and lets the requests in flight finish (an
// engine that dies in the middle of a request fails that request, which
// no gateway can retry once it has started).
func (u *Upstream) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = u.srv.Shutdown(ctx)
}

// Load is clients sending GET requests in a loop through a gateway,
// counting the answers, until Stop.
type Load struct {
	mu     sync.Mutex
	counts map[string]int // by X-Upstream, or "status NNN", or "error"
	errs   []string
	stop   chan struct{}
	wg     sync.WaitGroup
}

// StartLoad starts clients looping on url.
func StartLoad(t testing.TB, url string, clients int) *Load {
	l := &Load{counts: map[string]int{}, stop: make(chan struct{})}
	for range clients {
		l.wg.Go(func() {
			client := &http.Client{Timeout: 10 * time.Second}
			defer client.CloseIdleConnections()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				key := "error"
				resp, err := client.Get(url)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					key = resp.Header.Get("X-Upstream")
					if resp.StatusCode != http.StatusOK {
						key = "status " + strconv.Itoa(resp.StatusCode)
					}
				}
				l.mu.Lock()
				l.counts[key]++
				if err != nil && len(l.errs) < 5 {
					l.errs = append(l.errs, err.Error())
				}
				l.mu.Unlock()
			}
		})
	}
	t.Cleanup(func() { l.Stop() })
	return l
}

// Counts returns the answers so far: by upstream, "status NNN" or "error".
func (l *Load) Counts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.counts)
}

// Failed is how many requests did not get a 200 so far, and the first
// errors.
func (l *Load) Failed() (int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for k, v := range l.counts {
		if k == "error" || strings.HasPrefix(k, "status ") {
			n += v
		}
	}
	return n, slices.Clone(l.errs)
}

// Stop ends the clients and waits for them; it may be called again.
func (l *Load) Stop() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}
