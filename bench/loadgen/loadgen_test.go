package loadgen

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"heft/shared/testutil"
	"heft/sim"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func startSim(t *testing.T, cfg sim.Config) *sim.Server {
	t.Helper()
	s, err := sim.Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func client(t *testing.T) *http.Client {
	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func TestSequentialAgainstSim(t *testing.T) {
	s := startSim(t, sim.Config{Model: "fast", SingleTPS: 2000, Batch16TPS: 8000})
	res, err := Run(context.Background(), Config{URL: s.URL(), Sequential: true, Requests: 6, Tokens: 128, Client: client(t)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Arrivals != 6 || res.Sent != 6 || res.Completed != 6 || res.Failed+res.Unfinished+res.Refused != 0 {
		t.Fatalf("%+v", res)
	}
	if res.OutputTokens != 6*128 {
		t.Fatalf("tokens %d, want exactly 6 × 128 (min_tokens and ignore_eos)", res.OutputTokens)
	}
	if b := res.Backends["fast"]; b == nil || b.Completed != 6 {
		t.Fatalf("backends %+v: without a header the chunks' model names the backend", res.Backends)
	}
	if res.TTFT.N != 6 || res.TTFT.P50 <= 0 || res.TTFT.P50 > res.Latency.P50 || res.Latency.P95 < res.Latency.P50 {
		t.Fatalf("ttft %+v latency %+v", res.TTFT, res.Latency)
	}
	if res.TokensPerSecond <= 0 || res.Elapsed <= 0 {
		t.Fatalf("%+v", res)
	}
}

// A labelled load marks its requests for heft-sim's meetings count:
// every request under its label, none meeting another's when alone.
func TestLabelMarksTheLoad(t *testing.T) {
	s := startSim(t, sim.Config{Model: "fast", SingleTPS: 2000, Batch16TPS: 8000})
	c := client(t)
	if _, err := Run(context.Background(), Config{URL: s.URL(), Sequential: true, Requests: 3, Tokens: 8, Client: c, Label: "haproxy"}); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), Config{URL: s.URL(), Sequential: true, Requests: 2, Tokens: 8, Client: c}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(s.URL() + sim.MeetingsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m sim.Meetings
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.Load["haproxy"]; got != (sim.LoadCount{Requests: 3}) || len(m.Load) != 1 || m.Other != 2 {
		t.Errorf("meetings %+v: want 3 labelled requests that met nothing, and the 2 unlabelled as another's", m)
	}
}

// Behind a proxy that names the backend in a header, the split is read
// from the header.
func TestSplitFromHeader(t *testing.T) {
	a := startSim(t, sim.Config{SingleTPS: 2000, Batch16TPS: 8000})
	b := startSim(t, sim.Config{SingleTPS: 2000, Batch16TPS: 8000})
	var n atomic.Int64
	targets := []string{a.URL(), a.URL(), b.URL()} // 2:1
	names := []string{"a", "a", "b"}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			i := int(n.Add(1)-1) % len(targets)
			u, _ := url.Parse(targets[i])
			r.SetURL(u)
			r.Out.Header.Set("X-Pick", names[i])
		},
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Set("X-Heft-Backend", resp.Request.Header.Get("X-Pick"))
			return nil
		},
		FlushInterval: -1,
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 5 * time.Second}
	ln := listen(t)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	res, err := Run(context.Background(), Config{URL: "http://" + ln.Addr().String(), Sequential: true, Requests: 9, Tokens: 16,
		KeepRequests: true, Client: client(t)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Backends["a"] == nil || res.Backends["a"].Requests != 6 || res.Backends["b"].Requests != 3 {
		t.Fatalf("split %+v, want a 6 and b 3", res.Backends)
	}
	// The records say the same, in order, each ending before the next
	// starts, and their outcomes add up to the counts. (Through Go's
	// ReverseProxy with a keep-alive client, a request is now and then cut
	// with no token: the proxy's inbound context ends mid-request. The
	// gateways of the routing benchmark show no such thing.)
	if len(res.Requests) != 9 {
		t.Fatalf("%d request records, want 9", len(res.Requests))
	}
	perBackend, completed := map[string]int{}, 0
	for i, r := range res.Requests {
		perBackend[r.Backend]++
		if r.Outcome == "completed" {
			completed++
			if r.Tokens != 16 {
				t.Errorf("record %d: %+v, want 16 tokens", i, r)
			}
		}
		if r.End.Before(r.Start) || (i > 0 && r.Start.Before(res.Requests[i-1].End)) {
			t.Errorf("record %d: %+v is out of order", i, r)
		}
	}
	if perBackend["a"] != 6 || perBackend["b"] != 3 || completed != res.Completed {
		t.Errorf("records split %v with %d completed, want a 6 and b 3 with %d completed", perBackend, completed, res.Completed)
	}
}

// Arrivals over the cap are refused and counted, and requests still open
// when the drain ends are counted as unfinished: nothing is dropped
// silently.
func TestRefusedAndUnfinished(t *testing.T) {
	slow := startSim(t, sim.Config{SingleTPS: 20, Batch16TPS: 40}) // 128 tokens alone take 6.4 s
	res, err := Run(context.Background(), Config{URL: slow.URL(), Rate: 100, Duration: 300 * time.Millisecond,
		MaxInFlight: 2, Drain: 200 * time.Millisecond, Seed: 7, KeepRequests: true, Client: client(t)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Arrivals < 10 || res.Sent != 2 || res.Refused != res.Arrivals-2 || res.Unfinished != 2 || res.Completed != 0 {
		t.Fatalf("%+v", res)
	}
	if res.Arrivals != res.Sent+res.Refused || res.Sent != res.Completed+res.Failed+res.Unfinished {
		t.Fatalf("counts do not add up: %+v", res)
	}
	if res.OutputTokens == 0 {
		t.Fatal("tokens of the unfinished streams were not counted")
	}
	if len(res.Requests) != 2 || res.Requests[0].Outcome != "unfinished" || res.Requests[1].Outcome != "unfinished" {
		t.Fatalf("records %+v, want two unfinished", res.Requests)
	}
}

// The same seed gives the same arrivals; Poisson arrivals average the
// rate.
func TestPoissonArrivals(t *testing.T) {
	s := startSim(t, sim.Config{SingleTPS: 4000, Batch16TPS: 16000})
	run := func() Result {
		res, err := Run(context.Background(), Config{URL: s.URL(), Rate: 200, Duration: 500 * time.Millisecond, Tokens: 4, Seed: 42, Client: client(t)})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	r1, r2 := run(), run()
	if r1.Arrivals != r2.Arrivals {
		t.Fatalf("seeded runs differ: %d vs %d arrivals", r1.Arrivals, r2.Arrivals)
	}
	if r1.Arrivals < 60 || r1.Arrivals > 140 {
		t.Fatalf("%d arrivals in 0.5 s at 200/s", r1.Arrivals)
	}
	if r1.Completed+r1.Failed+r1.Unfinished != r1.Sent || r1.Failed != 0 {
		t.Fatalf("%+v", r1)
	}
}

func TestFailuresAreClassified(t *testing.T) {
	s := startSim(t, sim.Config{SingleTPS: 2000, Batch16TPS: 8000, Faults: sim.Faults{FailEvery: 2}})
	res, err := Run(context.Background(), Config{URL: s.URL(), Sequential: true, Requests: 4, Tokens: 8, Client: client(t)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Completed != 2 || res.Failed != 2 || res.Errors["http_500"] != 2 {
		t.Fatalf("%+v", res)
	}
	cut := startSim(t, sim.Config{SingleTPS: 2000, Batch16TPS: 8000, Faults: sim.Faults{DropStreamAfter: 3}})
	res, _ = Run(context.Background(), Config{URL: cut.URL(), Sequential: true, Requests: 1, Tokens: 8, Client: client(t)})
	if res.Errors["cut"] != 1 || res.OutputTokens != 3 {
		t.Fatalf("%+v", res)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{{}, {URL: "http://x", Duration: time.Second}, {URL: "http://x", Rate: 1}} {
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("Run(%+v) took it", c)
		}
	}
}

func TestSummarize(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	s := Summarize(ds)
	if s.P50 != 50*time.Millisecond || s.P95 != 95*time.Millisecond || s.Max != 100*time.Millisecond || s.N != 100 {
		t.Fatalf("%+v", s)
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// LatencySince takes only completed requests sent at or after its time.
func TestLatencySince(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	req := func(startS, latS int, outcome string) Request {
		s := t0.Add(time.Duration(startS) * time.Second)
		return Request{Start: s, End: s.Add(time.Duration(latS) * time.Second), Outcome: outcome}
	}
	r := Result{Requests: []Request{
		req(0, 100, "completed"), // before the change: left out however slow
		req(10, 1, "completed"),  // at the change
		req(11, 2, "completed"),
		req(12, 3, "completed"),
		req(13, 50, "http_502"), // failed: not a latency
		req(14, 60, "unfinished"),
	}}
	got := r.LatencySince(t0.Add(10 * time.Second))
	if got.N != 3 || got.P50 != 2*time.Second || got.P95 != 3*time.Second || got.Max != 3*time.Second {
		t.Fatalf("%+v, want 3 requests, p50 2 s, p95 3 s", got)
	}
	if got := r.LatencySince(t0.Add(time.Hour)); got.N != 0 {
		t.Fatalf("%+v, want none", got)
	}
}
