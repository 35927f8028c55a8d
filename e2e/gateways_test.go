package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"

	"heft/coordinator/config"
	"heft/gateway/app"
	"heft/gateway/gwtest"
	"heft/gateway/render"
	"heft/gateway/scale"
	"heft/gateway/target"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/sim"
)

// The gateways' configurations, as the README's how-to gives them, with
// the server each request went to in X-Heft-Backend.
const (
	gwHAProxy = `global
    stats socket {{socket}} mode 600 level admin
defaults
    mode http
    option http-no-delay
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    retries 3
    retry-on conn-failure empty-response
    option redispatch 1
frontend llm
    bind {{front}}
    default_backend qwen
backend qwen
    balance roundrobin
    http-response set-header X-Heft-Backend %si:%sp
    option httpchk GET /health
    timeout check 5s
    default-server check inter 1s fall 3 rise 2
    server-template heft 1-6 127.0.0.1:9 disabled
`
	gwNginx = `    include {{upstream_file}};
    server {
        listen {{front}};
        location / {
            proxy_pass http://qwen;
            proxy_buffering off;
            add_header X-Heft-Backend $upstream_addr always;
        }
    }`
	gwHeader = "X-Heft-Backend"
	// offlineGrace and staleTTL are short so that the offline step is
	// quick: a worker whose agent left is stale (still routed) from the
	// grace to staleTTL, then offline.
	offlineGrace = 3 * time.Second
	staleTTL     = 12 * time.Second
)

// forwarder is a TCP forwarder on loopback in front of an engine: the
// address an agent advertises while it dials the engine itself. It counts
// the connections it carries.
type forwarder struct {
	addr  string
	conns atomic.Int64
}

func startForwarder(t *testing.T, to string) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			f.conns.Add(1)
			wg.Go(func() {
				defer in.Close()
				out, err := net.Dial("tcp", to)
				if err != nil {
					return
				}
				defer out.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
				go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
				<-done
			})
		}
	})
	return f
}

// heftSync runs heft-sync (its app package, as the binary does) on a
// configuration file.
type heftSync struct {
	listen string
	cancel context.CancelFunc
	done   chan int
	out    *testutil.SyncBuffer
}

func startHeftSync(t *testing.T, coordURL string, hx *gwtest.HAProxy, nx *gwtest.Nginx) *heftSync {
	t.Helper()
	q := func(xs []string) string {
		var out []string
		for _, x := range xs {
			out = append(out, strconv.Quote(x))
		}
		return "[" + strings.Join(out, ", ") + "]"
	}
	hs := &heftSync{listen: fmt.Sprintf("127.0.0.1:%d", gwtest.FreePort(t)), done: make(chan int, 1), out: &testutil.SyncBuffer{}}
	text := fmt.Sprintf(`listen = %q
resync = "250ms"
[coordinator]
url = %q
[[haproxy]]
model = %q
socket = %q
backend = "qwen"
maxconn = true
[[nginx]]
model = %q
file = %q
upstream = "qwen"
check = %s
reload = %s
`, hs.listen, coordURL, model, hx.Socket, model, nx.Upstream, q(nx.Check()), q(nx.Reload()))
	path := filepath.Join(t.TempDir(), "sync.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hs.cancel = cancel
	go func() {
		hs.done <- app.Main(ctx, []string{"--config", path, "--log-level", "debug"}, func(string) string { return "" }, hs.out, hs.out)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-hs.done; code != 0 {
			t.Errorf("heft-sync exited %d:\n%s", code, hs.out.String())
		}
	})
	gwtest.WaitHTTP(t, "http://"+hs.listen+"/healthz")
	return hs
}

// metric reads one family of heft-sync's /metrics, summed over the
// series whose labels include match.
func (hs *heftSync) metric(t *testing.T, name string, match map[string]string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + hs.listen + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	defer http.DefaultClient.CloseIdleConnections()
	parser := expfmt.NewTextParser(prommodel.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse heft-sync's /metrics: %v", err)
	}
	sum := 0.0
	for _, m := range mfs[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range match {
			ok = ok && labels[k] == v
		}
		switch {
		case !ok:
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		}
	}
	return sum
}

// wantSplit is how many of sum(weights) sequential requests each serving
// worker's address should get through a gateway whose weighted round robin
// takes integer weights in 1..hi: exactly its integer weight, once per
// round.
func wantSplit(ws []view.Worker, hi int) (map[string]int, int) {
	var fs []float64
	var addrs []string
	for _, w := range ws {
		if w.Model == model && w.State == view.StateAdmitted && w.Weight != nil {
			fs = append(fs, *w.Weight)
			addrs = append(addrs, w.Address)
		}
	}
	ints, _ := scale.Ints(fs, hi)
	out, n := map[string]int{}, 0
	for i, a := range addrs {
		out[a] = ints[i]
		n += ints[i]
	}
	return out, n
}

// TestGatewaysFollowTheFleet runs heft's whole loop into real gateways:
// heft-sims, their agents and the coordinator measure the fleet, heft-sync
// writes the weights into a real HAProxy (runtime API) and a real nginx
// (file and reload), and real requests through each gateway split as the
// weights say. The held worker gets none, the address an agent advertises
// is what the gateways dial, a worker whose agent goes away keeps getting
// requests while stale and stops after stale_weight_ttl, and a coordinator
// that dies changes no gateway.
func TestGatewaysFollowTheFleet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := startCoordinatorWith(t, filepath.Join(dir, "state"), "127.0.0.1:0", func(cfg *config.Config) {
		cfg.Fleet.OfflineGrace, cfg.Fleet.StaleWeightTTL = offlineGrace, staleTTL
	})

	// Three workers of one model at three speeds; the slow one's agent
	// advertises a forwarder's address; and an SGLang worker whose second
	// rank has an eighth of the first's pool (held).
	logs := map[string]string{}
	for _, n := range []string{"fast", "mid", "slow", "uneven"} {
		logs[n] = filepath.Join(dir, n+".log")
	}
	fast := startSim(t, sim.Config{Flavor: "vllm", Model: model, SingleTPS: 200, Batch16TPS: 1600, MaxRunning: 16, LogPath: logs["fast"]}, "127.0.0.1:0")
	mid := startSim(t, sim.Config{Flavor: "vllm", Model: model, SingleTPS: 120, Batch16TPS: 1000, MaxRunning: 16, LogPath: logs["mid"]}, "127.0.0.1:0")
	slow := startSim(t, sim.Config{Flavor: "vllm", Model: model, SingleTPS: 80, Batch16TPS: 600, MaxRunning: 16, LogPath: logs["slow"]}, "127.0.0.1:0")
	uneven := startSim(t, sim.Config{Flavor: "sglang", Model: model, SingleTPS: 200, Batch16TPS: 1600, DP: 2,
		KVTokens: []int64{24094, 2925}, LogPath: logs["uneven"]}, "127.0.0.1:0")
	fwd := startForwarder(t, strings.TrimPrefix(slow.URL(), "http://"))

	fastAgent := startAgent(t, c, "gpu-fast", "vllm", fast.URL(), logs["fast"])
	startAgent(t, c, "gpu-mid", "vllm", mid.URL(), logs["mid"])
	runAgentConfig(t, fmt.Sprintf("[coordinator]\nurl = %q\ntoken = %q\n[node]\nname = \"gpu-slow\"\n[[engine]]\nkind = \"vllm\"\nurl = %q\nlog = %q\nadvertise_url = %q\n",
		"ws://"+c.addr+"/api/v1/agent", agentToken, slow.URL(), logs["slow"], "http://"+fwd.addr))
	startAgent(t, c, "gpu-uneven", "sglang", uneven.URL(), logs["uneven"])
	ws := c.waitFor(t, "all four workers measured", measuredWithin, settled("gpu-fast", "gpu-mid", "gpu-slow", "gpu-uneven"))

	addrOf := func(s *sim.Server) string { return strings.TrimPrefix(s.URL(), "http://") }
	sw, _ := byNode(ws, "gpu-slow")
	uw, _ := byNode(ws, "gpu-uneven")
	if sw.Address != fwd.addr || sw.URL != slow.URL() || sw.AdvertiseSource != "config" {
		t.Fatalf("slow worker: address %q url %q (%s), want the advertised %s", sw.Address, sw.URL, sw.AdvertiseSource, fwd.addr)
	}
	if uw.State != view.StateHeld {
		t.Fatalf("uneven worker is %s, want held", uw.State)
	}
	for _, w := range ws {
		if w.Node != "gpu-uneven" && (w.MaxRunning == nil || *w.MaxRunning != 16 || w.MaxConcurrency == nil || *w.MaxConcurrency < 16) {
			t.Errorf("%s: max_running %v, max_concurrency %v; want 16 and at least 16", w.Node, w.MaxRunning, w.MaxConcurrency)
		}
	}

	hx := gwtest.StartHAProxy(t, gwHAProxy)
	// nginx needs a valid upstream to start; heft-sync replaces it.
	nx := gwtest.StartNginx(t, gwtest.NginxConf(gwNginx), "upstream qwen { server 127.0.0.1:9 down; }\n")
	hs := startHeftSync(t, c.url(), hx, nx)
	haproxyURL, nginxURL := "http://"+hx.Front+"/v1/models", "http://"+nx.Front+"/v1/models"

	// splitsAs waits until HAProxy carries exactly the weights in ws and a
	// round of requests through each gateway goes to the serving workers
	// as those weights say, on some round within two minutes: through nginx
	// within one request each, through HAProxy within two. Exact counts
	// held on an idle machine. Under test-under-load a round of roundrobin
	// is exact only from the cycle's start (one request), a request
	// redispatched on a loaded machine moves one more, and a health check
	// that times out takes a server out for a moment (HAProxy's doing, not
	// heft's; the checks wait 5 s here). The weights themselves are judged
	// exactly, from HAProxy's own account.
	splitsAs := func(t *testing.T, what string, ws []view.Worker) (map[string]int, map[string]int) {
		t.Helper()
		var hxGot, nxGot map[string]int
		hxWant, hxN := wantSplit(ws, render.HAProxyMaxWeight)
		nxWant, nxN := wantSplit(ws, render.NginxMaxWeight)
		testutil.Eventually(t, what, 2*time.Minute, func() bool {
			if w := haproxyWeights(t, hx); !maps.Equal(w, hxWant) {
				t.Logf("HAProxy weights %v, want %v\n%s", w, hxWant, haproxyServers(t, hx))
				return false
			}
			hxGot = gwtest.SplitBy(t, haproxyURL, hxN, gwHeader)
			nxGot = gwtest.SplitBy(t, nginxURL, nxN, gwHeader)
			if within(hxGot, hxWant, 2) && within(nxGot, nxWant, 1) {
				return true
			}
			t.Logf("HAProxy split %v, want %v; nginx split %v, want %v", hxGot, hxWant, nxGot, nxWant)
			return false
		})
		return hxGot, nxGot
	}

	t.Run("real requests split by heft's weights", func(t *testing.T) {
		hxGot, nxGot := splitsAs(t, "both gateways to route by heft's weights", ws)
		t.Logf("HAProxy: %v; nginx: %v", hxGot, nxGot)
		// The split is judged against heft's own weights (splitsAs), not the
		// sims' calibrations: on a loaded machine the fast sim, which costs the
		// most CPU, can measure below the mid one, and its weight follows.
		for _, got := range []map[string]int{hxGot, nxGot} {
			for _, w := range ws {
				if view.Serving(w.State) && w.Weight != nil && *w.Weight > 0 && got[w.Address] == 0 {
					t.Errorf("split %v: serving worker %s (weight %.3f) got no request", got, w.Node, *w.Weight)
				}
			}
		}
	})
	t.Run("the held worker gets none", func(t *testing.T) {
		for _, got := range []map[string]int{gwtest.SplitBy(t, haproxyURL, 50, gwHeader), gwtest.SplitBy(t, nginxURL, 50, gwHeader)} {
			if got[addrOf(uneven)] != 0 || got[uw.Address] != 0 {
				t.Errorf("the held worker got requests: %v", got)
			}
		}
	})
	t.Run("gateways dial the advertised address", func(t *testing.T) {
		before := fwd.conns.Load()
		hxGot := gwtest.SplitBy(t, haproxyURL, 50, gwHeader)
		nxGot := gwtest.SplitBy(t, nginxURL, 50, gwHeader)
		if hxGot[fwd.addr] == 0 || nxGot[fwd.addr] == 0 || hxGot[addrOf(slow)] != 0 || nxGot[addrOf(slow)] != 0 {
			t.Errorf("the slow worker is reached at %s (advertised) / %s (its URL): HAProxy %v, nginx %v", fwd.addr, addrOf(slow), hxGot, nxGot)
		}
		if fwd.conns.Load() == before {
			t.Error("no connection went through the advertised address")
		}
	})
	t.Run("caps reach HAProxy as maxconn", func(t *testing.T) {
		cur := c.workers(t)
		want := map[string]string{}
		for _, w := range cur {
			if w.State == view.StateAdmitted && w.MaxConcurrency != nil {
				want[w.Address] = strconv.Itoa(*w.MaxConcurrency)
			}
		}
		if len(want) != 3 {
			t.Fatalf("max_concurrency of the admitted workers: %v, want three", want)
		}
		testutil.Eventually(t, "maxconn = max_concurrency", 30*time.Second, func() bool {
			got := map[string]string{}
			for _, row := range hx.Stat(t) {
				if row["pxname"] == "qwen" && row["status"] != "MAINT" && row["svname"] != "BACKEND" && row["svname"] != "FRONTEND" {
					got[row["addr"]] = row["slim"]
				}
			}
			return fmt.Sprint(got) == fmt.Sprint(want)
		})
	})

	t.Run("a worker whose agent goes away is stale, then stops getting requests after stale_weight_ttl", func(t *testing.T) {
		fw, _ := byNode(ws, "gpu-fast")
		// Requests in a loop through both gateways, each with the time it
		// was sent and the worker that answered it.
		var mu sync.Mutex
		lastToFast := map[string]time.Time{}
		ctx, stop := context.WithCancel(context.Background())
		var load sync.WaitGroup
		client := &http.Client{Timeout: 5 * time.Second}
		for name, url := range map[string]string{"haproxy": haproxyURL, "nginx": nginxURL} {
			load.Go(func() {
				for ctx.Err() == nil {
					sent := time.Now()
					resp, err := client.Get(url)
					if err != nil {
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.Header.Get(gwHeader) == fw.Address {
						mu.Lock()
						lastToFast[name] = sent
						mu.Unlock()
					}
				}
			})
		}
		// A failure below must not leave this load running into the next
		// subtests, whose rounds it would disturb.
		defer func() { stop(); load.Wait(); client.CloseIdleConnections() }()
		t0 := time.Now()
		fastAgent.stop(t)
		// The agent being gone says nothing of its engine: stale, and
		// still sent requests through both gateways.
		c.waitFor(t, "the fast worker stale", 30*time.Second, func(ws []view.Worker) bool {
			for _, w := range ws {
				if w.Node == "gpu-fast" {
					return w.State == view.StateStale && w.Weight != nil
				}
			}
			return false
		})
		stale := time.Now()
		testutil.Eventually(t, "requests to the stale worker through both gateways", staleTTL, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return lastToFast["haproxy"].After(stale) && lastToFast["nginx"].After(stale)
		})
		offline := c.waitFor(t, "the fast worker offline", 40*time.Second, func(ws []view.Worker) bool {
			for _, w := range ws {
				if w.Node == "gpu-fast" {
					return w.State == view.StateOffline
				}
			}
			return false
		})
		// Wait until neither gateway sends it anything, then a moment more.
		testutil.Eventually(t, "no request to the offline worker", time.Minute, func() bool {
			a := gwtest.SplitBy(t, haproxyURL, 20, gwHeader)
			b := gwtest.SplitBy(t, nginxURL, 20, gwHeader)
			return a[fw.Address] == 0 && b[fw.Address] == 0 && a[gwtest.NoAnswer] == 0 && b[gwtest.NoAnswer] == 0
		})
		stop()
		load.Wait()
		client.CloseIdleConnections()
		mu.Lock()
		defer mu.Unlock()
		for _, gw := range []string{"haproxy", "nginx"} {
			// A figure, not a limit: how soon after the TTL the gateways
			// stop is the fleet's tick, the event stream and nginx's
			// reload on this machine's clock. make bench (area 9) times
			// the same path, an agent killed and its worker drained at
			// the gateways, against its target on a quiet machine.
			t.Logf("%s: last request sent to the fast worker %.2f s after its agent stopped (stale_weight_ttl %s)",
				gw, lastToFast[gw].Sub(t0).Seconds(), staleTTL)
		}
		ws = offline
	})

	t.Run("a coordinator that dies changes no gateway", func(t *testing.T) {
		ws = c.workers(t)
		splitsAs(t, "the gateways on the fleet without the fast worker", ws)
		before := haproxyServers(t, hx)
		file, err := os.ReadFile(nx.Upstream)
		if err != nil {
			t.Fatal(err)
		}
		failed := map[string]float64{}
		for _, r := range target.Reasons {
			failed[r] = hs.metric(t, "heft_sync_apply_failures_total", map[string]string{"reason": r})
		}
		c.stop()
		testutil.Eventually(t, "heft-sync to lose the coordinator", 20*time.Second, func() bool {
			return hs.metric(t, "heft_sync_coordinator_connected", nil) == 0
		})
		applied := hs.metric(t, "heft_sync_applies_total", nil)
		testutil.Eventually(t, "three more resyncs of each target", 20*time.Second, func() bool {
			return hs.metric(t, "heft_sync_applies_total", nil) >= applied+6
		})
		// HAProxy's own account of its servers, not a split of requests:
		// roundrobin's counts over one cycle of the weights are exact only
		// from the cycle's start, and a request redispatched on a loaded
		// machine moves one more.
		if got := haproxyServers(t, hx); got != before {
			t.Errorf("HAProxy with the coordinator gone:\n%s\nwas\n%s", got, before)
		}
		// And requests still split by those weights. A health check that
		// times out on a starved machine (test-under-load saw a 503 and a
		// skewed split) takes a server out for a moment: HAProxy's doing,
		// not heft's, so a later cycle may show it.
		hxWant, hxN := wantSplit(ws, render.HAProxyMaxWeight)
		testutil.Eventually(t, "HAProxy with the coordinator gone to split by the weights it had, within two requests each", 2*time.Minute, func() bool {
			got := gwtest.SplitBy(t, haproxyURL, hxN, gwHeader)
			if !within(got, hxWant, 2) {
				t.Logf("split %v, want %v", got, hxWant)
				return false
			}
			return true
		})
		if again, _ := os.ReadFile(nx.Upstream); string(again) != string(file) {
			t.Errorf("nginx's upstream file changed with the coordinator gone:\n%s\nwas\n%s", again, file)
		}
		// Counted from the coordinator's stop, by reason. A gateway's socket
		// that timed out on a starved machine (unreachable) is the gateway's
		// moment, and it kept its state (above); any other failure is
		// heft-sync trying to change a gateway with the coordinator gone.
		for _, r := range target.Reasons {
			switch n := hs.metric(t, "heft_sync_apply_failures_total", map[string]string{"reason": r}) - failed[r]; {
			case n == 0:
			case r == target.ReasonUnreachable:
				t.Logf("%v applies found a gateway unreachable while the coordinator was gone", n)
			default:
				t.Errorf("%v apply failures (%s) while the coordinator was gone; heft-sync's log:\n%s", n, r, hs.out.String())
			}
		}
	})
}

// within says whether a split of requests reached the same addresses as
// want, each within slack requests of its count there.
func within(got, want map[string]int, slack int) bool {
	if len(got) != len(want) {
		return false
	}
	for addr, n := range want {
		if d := got[addr] - n; d < -slack || d > slack {
			return false
		}
	}
	return true
}

// haproxyWeights is the weight of each server of backend qwen in service,
// by address, as HAProxy's runtime API lists it. In service: no admin
// state flag but CMAINT (0x04, "disabled" in the config, which the
// template's slots carry from the start and heft-sync's "state ready"
// does not clear).
func haproxyWeights(t *testing.T, hx *gwtest.HAProxy) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, row := range strings.Split(haproxyServers(t, hx), "\n") {
		f := map[string]string{}
		for _, kv := range strings.Fields(row) {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		state, err := strconv.Atoi(f["srv_admin_state"])
		if err != nil {
			t.Fatalf("show servers state qwen: admin state %q: %v", f["srv_admin_state"], err)
		}
		if state&^0x04 != 0 {
			continue
		}
		w, err := strconv.Atoi(f["srv_uweight"])
		if err != nil {
			t.Fatalf("show servers state qwen: weight %q: %v", f["srv_uweight"], err)
		}
		out[net.JoinHostPort(f["srv_addr"], f["srv_port"])] = w
	}
	return out
}

// haproxyServers is each server of backend qwen as HAProxy's runtime API
// lists it (address, port, admin state, weight), sorted: what heft-sync
// sets, without what health checks and timers change on their own.
func haproxyServers(t *testing.T, hx *gwtest.HAProxy) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(hx.Run("show servers state qwen")), "\n")
	if len(lines) < 2 {
		t.Fatalf("show servers state qwen: %q", lines)
	}
	col := map[string]int{}
	for i, name := range strings.Fields(strings.TrimPrefix(lines[1], "#")) {
		col[name] = i
	}
	keep := []string{"srv_name", "srv_addr", "srv_port", "srv_admin_state", "srv_uweight"}
	var out []string
	for _, line := range lines[2:] {
		f := strings.Fields(line)
		var row []string
		for _, k := range keep {
			i, ok := col[k]
			if !ok || i >= len(f) {
				t.Fatalf("show servers state qwen has no %s in %q", k, line)
			}
			row = append(row, k+"="+f[i])
		}
		out = append(out, strings.Join(row, " "))
	}
	if len(out) == 0 {
		t.Fatalf("show servers state qwen lists no server: %q", lines)
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}
