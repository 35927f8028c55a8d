package nginx_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"heft/gateway/coord"
	"heft/gateway/gwtest"
	"heft/shared/view"
)

var clientKeepAlive = flag.Bool("reload.client-keepalive", true, "TestReloadsUnderKeepAliveLoad: false adds keepalive_timeout 0 to the server block (a connection per request)")

var reloadResend = flag.Bool("reload.resend", true, "TestReloadsUnderKeepAliveLoad: false leaves out the clients' remedy, so a request that lost the kept-alive race fails the test (the failure as seen before)")

var reloadConfig = flag.String("reload.config", "docs", "what TestReloadsUnderKeepAliveLoad runs: docs (docs/gateways.md's nginx example) or old (the example before issue 21's reload test)")

// oldHTTP and oldDirectives are docs/gateways.md's nginx example as it was
// before TestReloadsUnderKeepAliveLoad, kept to measure what changed.
const oldHTTP = `include /etc/nginx/heft/*.conf;
server {
    listen 8080;
    location / {
        proxy_pass http://qwen;
        proxy_buffering off;
        proxy_read_timeout 300s;
        proxy_next_upstream error timeout;
        proxy_next_upstream_tries 3;
        proxy_connect_timeout 2s;
        add_header X-Heft-Backend $upstream_addr always;
    }
}`

var oldDirectives = []string{"least_conn"}

// docsNginx reads the nginx example of docs/gateways.md: the http block's
// lines and the directives of its [[nginx]] table, so that the test runs
// what the docs tell operators to run.
func docsNginx(t *testing.T) (httpBody string, directives []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(data), "\n## nginx")
	_, block, ok := strings.Cut(section, "```nginx\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("docs/gateways.md: no nginx block in the nginx section")
	}
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			lines = append(lines, l)
		}
	}
	for _, l := range strings.Split(section, "\n") {
		if list, ok := strings.CutPrefix(l, "directives = ["); ok {
			list, _, _ = strings.Cut(list, "]")
			for _, d := range strings.Split(list, ",") {
				directives = append(directives, strings.Trim(strings.TrimSpace(d), `"`))
			}
			return strings.Join(lines, "\n"), directives
		}
	}
	t.Fatal("docs/gateways.md: the nginx section's [[nginx]] table sets no directives")
	return "", nil
}

// engine is a stand-in LLM engine: it streams a few chunks for every POST,
// closes a kept-alive connection idle for idle (uvicorn, under vLLM and
// SGLang, does at 5 s), and can die: every connection closed at once.
type engine struct {
	srv  *http.Server
	addr string
}

func startEngine(t *testing.T, idle time.Duration) *engine {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{addr: ln.Addr().String()}
	e.srv = &http.Server{IdleTimeout: idle, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 5 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(2 * time.Millisecond) // a token's time, so that a death can cut a stream
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})}
	go func() { _ = e.srv.Serve(ln) }()
	t.Cleanup(func() { _ = e.srv.Close() })
	return e
}

// outcome is one request as its client saw it.
type outcome struct {
	start, end time.Time
	status     int
	backend    string // nginx's $upstream_addr: every server tried
	err        error
	reused     bool // sent on a kept-alive connection
	anyByte    bool // a byte of the answer arrived
	complete   bool // the stream ended with [DONE]
	retried    bool // sent again after losing the kept-alive race
}

// raceLost is the failure no nginx setting removes: a kept-alive
// connection that nginx closed (an old worker leaving after a reload)
// just as the client sent on it, before any byte of an answer. nginx read
// nothing of the request, so sending it again is safe.
func (o outcome) raceLost() bool { return o.err != nil && o.reused && !o.anyByte }

func send(client *http.Client, url string) outcome {
	o := outcome{start: time.Now()}
	defer func() { o.end = time.Now() }()
	trace := &httptrace.ClientTrace{
		GotConn:              func(i httptrace.GotConnInfo) { o.reused = i.Reused },
		GotFirstResponseByte: func() { o.anyByte = true },
	}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost, url,
		strings.NewReader(`{"model":"m","stream":true}`))
	resp, err := client.Do(req)
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	o.status, o.backend = resp.StatusCode, resp.Header.Get("X-Heft-Backend")
	body, err := io.ReadAll(resp.Body)
	o.err = err
	o.complete = resp.StatusCode == http.StatusOK && strings.HasSuffix(string(body), "data: [DONE]\n\n")
	return o
}

// sendRetrying is the client-side remedy docs/gateways.md gives: a request
// that lost the kept-alive race is sent once more, on a new connection.
func sendRetrying(client, fresh *http.Client, url string) outcome {
	o := send(client, url)
	if !o.raceLost() || !*reloadResend {
		return o
	}
	again := send(fresh, url)
	again.start, again.retried = o.start, true
	return again
}

// TestReloadsUnderKeepAliveLoad reproduces the nginx failures issues 21
// and 22 saw: clients that keep their connections alive send through a
// real nginx while heft-sync rewrites and reloads its upstream several
// times a second, the engines close idle kept-alive connections as
// uvicorn does, and one engine dies. With docs/gateways.md's example no
// request fails inside nginx. What is left is nginx's own: a client's
// race with a kept-alive connection that an old worker closes after a
// reload; those are counted apart, and sent again by the client.
func TestReloadsUnderKeepAliveLoad(t *testing.T) {
	gwtest.RequireBinary(t, "nginx")
	httpBody, directives := oldHTTP, oldDirectives
	if *reloadConfig == "docs" {
		httpBody, directives = docsNginx(t)
	}
	httpBody = strings.NewReplacer("include /etc/nginx/heft/*.conf;", "include {{upstream_file}};",
		"listen 8080;", "listen {{front}};\n    access_log {{dir}}/access.log heft;").Replace(httpBody)
	if !*clientKeepAlive {
		httpBody = strings.Replace(httpBody, "listen {{front}};", "listen {{front}};\n    keepalive_timeout 0;", 1)
	}
	httpBody = "log_format heft '$msec $status $request_time up=$upstream_addr up_status=$upstream_status';\n" + httpBody
	engines := []*engine{startEngine(t, 200*time.Millisecond), startEngine(t, 200*time.Millisecond), startEngine(t, 200*time.Millisecond)}
	ws := func(i int) []coord.Worker {
		out := make([]coord.Worker, len(engines))
		for k, e := range engines {
			out[k] = gwtest.Worker(model, e.addr, view.StateAdmitted, float64(1+(i+k)%3))
		}
		return out
	}
	first := fmt.Sprintf("upstream qwen { server %s; server %s; server %s; }\n", engines[0].addr, engines[1].addr, engines[2].addr)
	nx := gwtest.StartNginx(t, gwtest.NginxConf(httpBody), first)
	r := rig{nx: nx, reloads: filepath.Join(nx.Dir, "reloads")}
	n := r.target(t, directives...)

	// heft-sync's side: a new weight every 150 ms, each a rewrite and a
	// reload: far more often than a fleet's weights change.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := n.Apply(ctx, desired(ws(i)...)); err != nil && ctx.Err() == nil {
				t.Errorf("apply: %v", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(150 * time.Millisecond): // the next weight change
			}
		}
	})

	// The clients: 8 loops on one kept-alive transport, each pausing
	// between requests so that connections sit idle and are reused.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var outs []outcome
	var stop atomic.Bool
	for c := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 27))
			for !stop.Load() {
				o := sendRetrying(client, fresh, "http://"+nx.Front+"/v1/chat/completions")
				mu.Lock()
				outs = append(outs, o)
				mu.Unlock()
				time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond) // a client's pause, so connections sit idle
			}
		})
	}
	time.Sleep(4 * time.Second) // load and reloads before the engine dies
	dead := engines[0].addr
	_ = engines[0].srv.Close()
	died := time.Now()
	time.Sleep(5 * time.Second) // and after
	stop.Store(true)
	cancel()
	wg.Wait()

	reloads := reloadTimes(t, r.reloads)
	var retried, cut, failed, answeredBefore, sentAfter int
	var sinceReload []string
	for _, o := range outs {
		if o.retried {
			retried++
			sinceReload = append(sinceReload, sinceLast(reloads, o.start))
		}
		if o.start.Before(died) && strings.HasSuffix(o.backend, dead) {
			answeredBefore++
		}
		if o.start.After(died) {
			sentAfter++
		}
		switch {
		case o.complete:
		case o.status == http.StatusOK && strings.HasSuffix(o.backend, dead) && o.start.Before(died):
			cut++ // streaming from the engine when it died: no gateway can move a started answer
		default:
			failed++
			t.Logf("failed: sent %+.3f s from the death, status %d, tried %q, reused %v, any byte %v, retried %v: %v",
				o.start.Sub(died).Seconds(), o.status, o.backend, o.reused, o.anyByte, o.retried, o.err)
			if o.raceLost() {
				sinceReload = append(sinceReload, sinceLast(reloads, o.start))
			}
		}
	}
	t.Logf("%s config (client keep-alive %v, resend %v): %d requests, %d reloads; %d failed, %d lost the race with a kept-alive connection an old worker closed "+
		"and were sent again (each race sent this many ms after a reload began: %s), %d streams cut by the engine's death",
		*reloadConfig, *clientKeepAlive, *reloadResend, len(outs), len(reloads), failed, retried, strings.Join(sinceReload, ", "), cut)
	if data, err := os.ReadFile(filepath.Join(nx.Dir, "access.log")); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[1] != "200" {
				t.Logf("access.log: %s", line)
			}
		}
	}
	for _, line := range strings.Split(nx.Log(), "\n") {
		if strings.Contains(line, "[error]") && !strings.Contains(line, "connect() failed (111") {
			t.Logf("error.log: %s", line)
		}
	}
	if failed != 0 {
		t.Errorf("%d requests failed through nginx", failed)
	}
	if len(reloads) < 5 || answeredBefore == 0 || sentAfter == 0 {
		t.Errorf("the test saw too little: %d reloads, %d requests answered by the engine before it died, %d sent after", len(reloads), answeredBefore, sentAfter)
	}
}

// sinceLast is how long, in ms, after the last reload that began before
// at a request was sent.
func sinceLast(reloads []time.Time, at time.Time) string {
	i, _ := slices.BinarySearchFunc(reloads, at, func(a, b time.Time) int { return a.Compare(b) })
	if i == 0 {
		return "before any"
	}
	return fmt.Sprintf("%.0f", at.Sub(reloads[i-1]).Seconds()*1000)
}

// reloadTimes reads the times the reload command noted.
func reloadTimes(t *testing.T, path string) []time.Time {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for _, l := range strings.Fields(string(data)) {
		s, err := strconv.ParseFloat(l, 64)
		if err != nil {
			t.Fatalf("reload time %q: %v", l, err)
		}
		out = append(out, time.Unix(0, int64(s*1e9)))
	}
	return out
}

// A change nginx would not see (a worker's state in a comment, admitted to
// stale) is written, not reloaded: each reload closes kept-alive client
// connections. A weight change still reloads.
func TestCommentOnlyChangeSkipsReload(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	r := start(t, "upstream qwen { server 127.0.0.1:9; }\n")
	n := r.target(t)
	apply := func(ws ...coord.Worker) {
		t.Helper()
		if _, err := n.Apply(context.Background(), desired(ws...)); err != nil {
			t.Fatal(err)
		}
	}
	apply(gwtest.Worker(model, a.Addr, view.StateAdmitted, 2), gwtest.Worker(model, b.Addr, view.StateAdmitted, 1))
	before, _ := os.ReadFile(r.nx.Upstream)
	stale := gwtest.Worker(model, a.Addr, view.StateStale, 2)
	stale.Weight = new(2.0)
	apply(stale, gwtest.Worker(model, b.Addr, view.StateAdmitted, 1))
	after, _ := os.ReadFile(r.nx.Upstream)
	if string(before) == string(after) || !strings.Contains(string(after), view.StateStale) {
		t.Fatalf("the file did not note the state:\n%s", after)
	}
	if got := r.reloadCount(t); got != 1 {
		t.Errorf("%d reloads after a comment-only change, want 1 (the first apply's)", got)
	}
	apply(stale, gwtest.Worker(model, b.Addr, view.StateAdmitted, 2))
	if got := r.reloadCount(t); got != 2 {
		t.Errorf("%d reloads after a weight change, want 2", got)
	}
}

// A weight that wobbles within nginx.WeightDeadband of what nginx has is
// not reloaded for; one that moves further, or any other change, is.
func TestWeightDeadband(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	r := start(t, "upstream qwen { server 127.0.0.1:9; }\n")
	n := r.target(t)
	steps := []struct {
		wa      float64
		state   string
		reloads int
	}{
		{0.500, view.StateAdmitted, 1}, // weight=50 (b, at 1, is 100)
		{0.505, view.StateAdmitted, 1}, // +1 %, weight=51 if written: held
		{0.509, view.StateAdmitted, 1}, // +1.8 % from what nginx has: held
		{0.520, view.StateAdmitted, 2}, // +4 %: applied
		{0.521, view.StateHeld, 3},     // drained: applied at once
	}
	for i, s := range steps {
		wa := gwtest.Worker(model, a.Addr, s.state, s.wa)
		if _, err := n.Apply(context.Background(), desired(wa, gwtest.Worker(model, b.Addr, view.StateAdmitted, 1))); err != nil {
			t.Fatal(err)
		}
		if got := r.reloadCount(t); got != s.reloads {
			data, _ := os.ReadFile(r.nx.Upstream)
			t.Fatalf("step %d (weight %g, %s): %d reloads, want %d\n%s", i, s.wa, s.state, got, s.reloads, data)
		}
	}
}
