package reliability

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"heft/agent"
	agentconfig "heft/agent/config"
	"heft/bench/loadgen"
	"heft/coordinator/config"
	"heft/gateway/app"
	syncconfig "heft/gateway/config"
	"heft/gateway/gwtest"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/sim"
)

// chaosLong runs the chaos test at the full length (a minute of
// load per fault, a 2-minute network cut), as `make bench` does.
var (
	chaosLong = flag.Bool("chaos.long", false, "run TestChaos at full length (about 15 minutes)")
	chaosOut  = flag.String("chaos.out", "", "write TestChaos's table to this file, tab-separated (make bench's area 10)")
)

// chaosHAProxy is the backend of heft's examples: slots with the
// gateway's own health check of the engine (its answer given "timeout
// check", not only "inter": TestChaosHAProxyWaitsForASlowHealthRoute),
// retries that go to another server when a connection fails, and a
// server-state-file a reload starts from.
const chaosHAProxy = `global
    stats socket {{socket}} level admin expose-fd listeners
    server-state-file {{state}}
defaults
    mode http
    option http-no-delay
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    retries 3
    retry-on conn-failure empty-response
    option redispatch 1
    load-server-state-from-file global
frontend fe
    bind {{front}}
    default_backend qwen
backend qwen
    balance leastconn
    http-response set-header X-Heft-Backend %si:%sp
    option httpchk GET /health
    timeout check 5s
    default-server check inter 1s fall 2 rise 2
    server-template heft 1-4 127.0.0.1:9 disabled
`

// chaosNginx is the location of docs/gateways.md's example: a request
// whose connection failed before any answer goes to the next server; a
// started answer is never sent again.
const chaosNginx = `    include {{upstream_file}};
    server {
        listen {{front}};
        location / {
            proxy_pass http://qwen;
            proxy_buffering off;
            add_header X-Heft-Backend $upstream_addr always;
            proxy_read_timeout 60s;
            proxy_connect_timeout 2s;
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
            proxy_next_upstream_tries 3;
            proxy_next_upstream_timeout 10s;
        }
    }`

// chaosAgent is one heft-agent (agent.Run) that can be killed and started
// again.
type chaosAgent struct {
	t      *testing.T
	cfg    agentconfig.Config
	reload chan struct{} // SIGHUP
	cancel context.CancelFunc
	done   chan struct{}
}

func (a *chaosAgent) start() {
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel, a.done = cancel, make(chan struct{})
	go func() {
		defer close(a.done)
		if err := agent.Run(ctx, a.cfg, hclog.NewNullLogger(), agent.WithGPUs(noGPUs{}), agent.WithReload(a.reload)); err != nil {
			a.t.Errorf("agent.Run: %v", err)
		}
	}()
}

func (a *chaosAgent) stop() {
	if a.cancel != nil {
		a.cancel()
		<-a.done
		a.cancel = nil
	}
}

// chaosSync is heft-sync (app.Run) that can be stopped and started again.
type chaosSync struct {
	t      *testing.T
	cfg    syncconfig.Config
	cancel context.CancelFunc
	done   chan error
}

func (s *chaosSync) start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan error, 1)
	go func() { s.done <- app.Run(ctx, s.cfg, quietLogger(s.t)) }()
}

func (s *chaosSync) stop() {
	if s.cancel != nil {
		s.cancel()
		if err := <-s.done; err != nil {
			s.t.Errorf("heft-sync: %v", err)
		}
		s.cancel = nil
	}
}

// chaosRig is a whole heft deployment on loopback: heft-sims, their
// agents (reaching the coordinator through a proxy that can drop
// traffic), a coordinator, heft-sync, and real HAProxy and nginx in front
// of the sims.
type chaosRig struct {
	t      *testing.T
	co     *coord
	coDir  string // the coordinator's state dir
	tokens string // the coordinator's agent_token_file
	oldTok string // the agent token in use
	proxy  *faultProxy
	agents []*chaosAgent
	sims   []*sim.Server // sims[i] is agents[i]'s engine
	sync   *chaosSync
	hx     *gwtest.HAProxy
	nx     *gwtest.Nginx
	state  string // HAProxy's server-state-file
}

// chaosSims are three engines of unequal speed.
var chaosSims = []sim.Config{
	{Flavor: sim.FlavorVLLM, SingleTPS: 1500, Batch16TPS: 15000},
	{Flavor: sim.FlavorVLLM, SingleTPS: 1000, Batch16TPS: 10000},
	{Flavor: sim.FlavorVLLM, SingleTPS: 600, Batch16TPS: 6000},
}

func newChaosRig(t *testing.T) *chaosRig {
	r := &chaosRig{t: t, coDir: t.TempDir(), tokens: filepath.Join(t.TempDir(), "agent.token"), oldTok: agentToken}
	writeTokenFile(t, r.tokens, agentToken)
	r.co = startCoord(t, r.coDir, "127.0.0.1:0", quietLogger(t), r.coordConfig)
	r.proxy = newFaultProxy(t, r.co.addr)
	for i, sc := range chaosSims {
		sc.LogPath = filepath.Join(t.TempDir(), "vllm.log")
		s := simOn(t, sc, "127.0.0.1:0")
		r.sims = append(r.sims, s)
		cfg := agentconfig.Default()
		cfg.Coordinator.URL = "ws://" + r.proxy.addr() + "/api/v1/agent"
		cfg.Coordinator.TokenFile = filepath.Join(t.TempDir(), "agent.token")
		writeTokenFile(t, cfg.Coordinator.TokenFile, agentToken)
		cfg.Node.Name = fmt.Sprintf("gpu-%d", i)
		cfg.Engines = []agentconfig.Engine{{Kind: "vllm", URL: s.URL(), Log: sc.LogPath}}
		cfg.StateDir = t.TempDir()
		cfg.PollInterval = 100 * time.Millisecond
		a := &chaosAgent{t: t, cfg: cfg, reload: make(chan struct{}, 1)}
		a.start()
		t.Cleanup(a.stop)
		r.agents = append(r.agents, a)
	}
	r.waitAdmitted("the first measurements")

	r.state = filepath.Join(t.TempDir(), "haproxy.state")
	r.hx = gwtest.StartHAProxy(t, strings.ReplaceAll(chaosHAProxy, "{{state}}", r.state))
	r.hx.Stop()
	r.hx.MasterWorker = true
	r.hx.Start()
	// The placeholder of docs/gateways.md: a server nginx serves before
	// heft-sync's first change would be kept for keep_unlisted.
	r.nx = gwtest.StartNginx(t, gwtest.NginxConf(chaosNginx), "upstream qwen { server 127.0.0.1:9 down; }\n")
	q := func(xs []string) string { return strings.ReplaceAll(fmt.Sprintf("%q", xs), "\" \"", "\", \"") }
	toml := fmt.Sprintf("listen = \"127.0.0.1:0\"\nresync = \"1s\"\n[coordinator]\nurl = %q\n"+
		"[[haproxy]]\nmodel = %q\nsocket = %q\nbackend = \"qwen\"\n"+
		"[[nginx]]\nmodel = %q\nfile = %q\nupstream = \"qwen\"\ndirectives = [\"least_conn\"]\ncheck = %s\nreload = %s\n",
		"http://"+r.co.addr, testModel, r.hx.Socket, testModel, r.nx.Upstream, q(r.nx.Check()), q(r.nx.Reload()))
	path := filepath.Join(t.TempDir(), "heft-sync.toml")
	if err := os.WriteFile(path, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := syncconfig.Load([]string{"--config", path}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	r.sync = &chaosSync{t: t, cfg: cfg}
	r.sync.start()
	t.Cleanup(r.sync.stop)
	r.waitRouted()
	return r
}

// coordConfig: the agent token from a file, so it can be rotated;
// agents count as gone after 2 s, so that every fault that takes them away
// lasts well past it. A sim's stream, read by an agent slowed by -race on
// a loaded machine, can arrive in bursts faster than the plausibility
// limit: that check is not what this test is about.
func (r *chaosRig) coordConfig(cfg *config.Config) {
	cfg.AgentToken, cfg.AgentTokenFile = "", r.tokens
	cfg.Fleet.OfflineGrace = 2 * time.Second
	cfg.Fleet.MaxStreamTPS = 1e6
}

// restartCoord stops the coordinator and starts it again on dir, at the
// same address.
func (r *chaosRig) restartCoord(dir string) {
	r.co.stop()
	r.coDir = dir
	r.co = startCoord(r.t, dir, r.co.addr, quietLogger(r.t), r.coordConfig)
}

// rotate rotates the agent token by docs/install.md's steps, with a
// coordinator restart in the middle: the new token beside the old one
// and reload; restart; the new token in every agent's token_file and
// SIGHUP; the old token removed and reload.
func (r *chaosRig) rotate() {
	newTok := config.NewToken()
	writeTokenFile(r.t, r.tokens, r.oldTok, newTok)
	if err := r.co.Reload(); err != nil {
		r.t.Fatalf("reload: %v", err)
	}
	r.restartCoord(r.coDir)
	for _, a := range r.agents {
		writeTokenFile(r.t, a.cfg.Coordinator.TokenFile, newTok)
		a.reload <- struct{}{}
	}
	writeTokenFile(r.t, r.tokens, newTok)
	if err := r.co.Reload(); err != nil {
		r.t.Fatalf("reload: %v", err)
	}
	r.oldTok = newTok
}

// waitAdmitted waits until the coordinator admits every sim.
func (r *chaosRig) waitAdmitted(what string) {
	r.t.Helper()
	// Generous: three probes at once on a loaded 2-core machine, under -race.
	testutil.Eventually(r.t, what, 3*time.Minute, func() bool {
		ws, err := r.co.api().workers(context.Background())
		if err != nil {
			return false
		}
		n := 0
		for _, w := range ws {
			if w.State == view.StateAdmitted {
				n++
			}
		}
		return n == len(chaosSims)
	})
}

// waitRouted waits until both gateways send requests to every sim.
func (r *chaosRig) waitRouted() {
	r.t.Helper()
	testutil.Eventually(r.t, "HAProxy to serve every sim", 30*time.Second, func() bool {
		up := 0
		for _, row := range r.hx.Stat(r.t) {
			if row["pxname"] == "qwen" && row["svname"] != "BACKEND" && row["status"] == "UP" {
				up++
			}
		}
		return up == len(chaosSims)
	})
	testutil.Eventually(r.t, "nginx to serve every sim", 30*time.Second, func() bool {
		data, _ := os.ReadFile(r.nx.Upstream)
		return strings.Count(string(data), " weight=") == len(chaosSims)
	})
}

// chaosFault is one disturbance: do runs at a quarter of the load, undo
// after it (bringing the deployment back to full health).
type chaosFault struct {
	name, note string
	do, undo   func(r *chaosRig, d time.Duration)
}

// chaosResult is one fault's load through one gateway.
type chaosResult struct {
	fault, gateway, note string
	res                  loadgen.Result
	// probeTokens is what the engines generated during the phase beyond
	// the routed load through both gateways: the agents' probe bursts,
	// which land on engines serving the load.
	probeTokens float64
	// probes is how many probe requests the coordinator sent from the
	// phase's start until every worker was admitted again (a coordinator
	// started in the phase: since its start).
	probes float64
}

func TestChaos(t *testing.T) {
	gwtest.RequireBinary(t, "haproxy")
	gwtest.RequireBinary(t, "nginx")
	t.Parallel() // mostly waiting on its load: it overlaps the other waiting tests; it judges failed requests, not speed
	load, cut, reloads := 6*time.Second, 5*time.Second, 10
	if *chaosLong {
		load, cut = 60*time.Second, 2*time.Minute
	}
	r := newChaosRig(t)
	faults := []chaosFault{
		{name: "undisturbed"},
		{name: "every agent killed", note: "agents gone past offline_grace (2 s)",
			do: func(r *chaosRig, _ time.Duration) {
				for _, a := range r.agents {
					a.stop()
				}
			},
			undo: func(r *chaosRig, _ time.Duration) {
				for _, a := range r.agents {
					a.start()
				}
			}},
		{name: "coordinator killed, restarted empty", note: "a new state dir; the agents enrol and hand over the measurements they hold",
			do:   func(r *chaosRig, _ time.Duration) { r.restartCoord(r.t.TempDir()) },
			undo: func(r *chaosRig, _ time.Duration) { r.waitAdmitted("the agents measured again by the new coordinator") }},
		{name: "agent token rotated", note: "the documented steps, a coordinator restart in the middle",
			do: func(r *chaosRig, _ time.Duration) { r.rotate() }},
		{name: "heft-sync restarted",
			do: func(r *chaosRig, _ time.Duration) { r.sync.stop(); r.sync.start() }},
		{name: fmt.Sprintf("HAProxy reloaded %d times", reloads), note: "with a server-state-file",
			do: func(r *chaosRig, d time.Duration) {
				for range reloads {
					r.hx.Reload(r.state)
					time.Sleep(d / 2 / time.Duration(reloads)) // spread the reloads over half the load
				}
			}},
		{name: "agent-coordinator network cut", note: fmt.Sprintf("every byte held for %s", cut),
			do: func(r *chaosRig, _ time.Duration) {
				r.proxy.freeze()
				time.Sleep(cut) // the length of the cut is the fault
				r.proxy.restore()
			}},
		// The same undisturbed load again, last: how far p95 moves with
		// nothing done, on this machine at this hour.
		{name: "undisturbed, again", note: "nothing done: the spread of p95 without a fault"},
	}
	var results []chaosResult
	for _, f := range faults {
		d := load
		if f.name == "agent-coordinator network cut" && cut > load/2 {
			d = cut * 2
		}
		co, before := r.co, r.probeRequests()
		res := r.underLoad(f, d)
		if f.undo != nil {
			f.undo(r, d)
		}
		r.waitAdmitted("every sim admitted after " + f.name)
		r.waitRouted()
		n := r.probeRequests()
		if r.co == co {
			n -= before
		}
		for i := range res {
			res[i].probes = n
		}
		results = append(results, res...)
	}
	table := chaosTable(results)
	t.Log("\n" + table)
	if *chaosOut != "" {
		if err := os.WriteFile(*chaosOut, []byte(chaosTSV(results)), 0o644); err != nil {
			t.Error(err)
		}
	}
	for _, c := range results {
		if c.res.Failed != 0 || c.res.Unfinished != 0 {
			t.Errorf("%s through %s: %d failed, %d unfinished of %d (%v)", c.fault, c.gateway, c.res.Failed, c.res.Unfinished, c.res.Sent, c.res.Errors)
		}
	}
}

// underLoad runs Poisson load through both gateways for d while the fault
// happens, starting at a quarter of it.
func (r *chaosRig) underLoad(f chaosFault, d time.Duration) []chaosResult {
	fronts := map[string]string{"haproxy": r.hx.Front, "nginx": r.nx.Front}
	var mu sync.Mutex
	var out []chaosResult
	var wg sync.WaitGroup
	tokensBefore := r.engineTokens()
	for _, gw := range []string{"haproxy", "nginx"} {
		wg.Go(func() {
			// A client of the phase's own, its idle connections dropped
			// well before nginx's keepalive_timeout (75 s) would close
			// them under a request (http.DefaultClient keeps them 90 s).
			client := &http.Client{Transport: &http.Transport{IdleConnTimeout: 30 * time.Second}}
			defer client.CloseIdleConnections()
			res, err := loadgen.Run(context.Background(), loadgen.Config{URL: "http://" + fronts[gw], Model: testModel,
				Rate: 6, Duration: d, Tokens: 32, Drain: 30 * time.Second, Seed: 21, Client: client,
				// A request sent on a kept-alive connection that an old nginx
				// worker closed at a reload goes again, as docs/gateways.md
				// tells clients to: counted as resent, not failed.
				ResendClosed: true})
			if err != nil {
				r.t.Errorf("load through %s: %v", gw, err)
			}
			mu.Lock()
			out = append(out, chaosResult{fault: f.name, gateway: gw, note: f.note, res: res})
			mu.Unlock()
		})
	}
	if f.do != nil {
		time.Sleep(d / 4) // the fault comes once the load runs
		f.do(r, d)
	}
	wg.Wait()
	beyond := r.engineTokens() - tokensBefore
	for _, c := range out {
		beyond -= float64(c.res.OutputTokens)
	}
	for i := range out {
		out[i].probeTokens = beyond
	}
	return out
}

// engineTokens sums the tokens every sim has generated
// (vllm:generation_tokens_total, read with the Prometheus text parser).
func (r *chaosRig) engineTokens() float64 {
	var sum float64
	for _, s := range r.sims {
		resp, err := http.Get(s.URL() + "/metrics")
		if err != nil {
			r.t.Errorf("the tokens of %s: %v", s.URL(), err)
			continue
		}
		parser := expfmt.NewTextParser(model.UTF8Validation) // one per scrape: it keeps state
		fams, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			r.t.Errorf("the metrics of %s: %v", s.URL(), err)
			continue
		}
		for _, m := range fams["vllm:generation_tokens_total"].GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// probeRequests is how many probe requests the coordinator has sent
// since it started (heft_probe_requests_total, every reason).
func (r *chaosRig) probeRequests() float64 {
	resp, err := http.Get("http://" + r.co.addr + "/metrics")
	if err != nil {
		r.t.Errorf("the coordinator's metrics: %v", err)
		return 0
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		r.t.Errorf("the coordinator's metrics: %v", err)
		return 0
	}
	var sum float64
	for _, m := range fams["heft_probe_requests_total"].GetMetric() {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// chaosTSV is chaosTable's rows, tab-separated, without the header.
func chaosTSV(results []chaosResult) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(chaosRows(results, "\t")), "\n")[1:] {
		b.WriteString(line + "\n")
	}
	return b.String()
}

// chaosTable prints each fault's requests, failures and p95 against the
// undisturbed run's, per gateway.
func chaosTable(results []chaosResult) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprint(w, chaosRows(results, "\t"))
	w.Flush()
	return b.String()
}

// chaosRows is the table's header and rows, cells joined by sep.
func chaosRows(results []chaosResult, sep string) string {
	base := map[string]time.Duration{}
	for _, c := range results {
		if c.fault == "undisturbed" {
			base[c.gateway] = c.res.Latency.P95
		}
	}
	var b strings.Builder
	row := func(cells ...any) {
		for i, c := range cells {
			if i > 0 {
				b.WriteString(sep)
			}
			fmt.Fprint(&b, c)
		}
		b.WriteString("\n")
	}
	row("fault", "gateway", "requests", "failed", "resent", "unfinished", "p50", "p95", "p95 vs undisturbed", "probes", "probe tokens", "note")
	for _, gw := range []string{"haproxy", "nginx"} {
		for _, c := range results {
			if c.gateway != gw {
				continue
			}
			vs := "—"
			if bp := base[gw]; bp > 0 && c.fault != "undisturbed" {
				vs = fmt.Sprintf("%+.1f %%", 100*(float64(c.res.Latency.P95)/float64(bp)-1))
			}
			row(c.fault, gw, c.res.Sent, c.res.Failed, c.res.Resent, c.res.Unfinished,
				c.res.Latency.P50.Round(time.Millisecond), c.res.Latency.P95.Round(time.Millisecond), vs, fmt.Sprintf("%.0f", c.probes), fmt.Sprintf("%.0f", c.probeTokens), c.note)
		}
	}
	return b.String()
}
