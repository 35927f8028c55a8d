package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"heft/gateway/gwproc"
	"heft/gateway/scale"
	"heft/shared/view"
	"heft/sim"
)

// The weight ranges heft-sync scales into (HAProxy's runtime API takes
// 1–256; heft-sync writes nginx weights in 1–100); the oracle's weights
// are scaled the same way, so that only where the weights come from
// differs.
const (
	haproxyWeights = 256
	nginxWeights   = 100
)

// routeOfflineGrace is the coordinator's offline_grace in this area:
// short, so the offline check is quick. Its stale_weight_ttl is the same,
// so a worker whose agent died drains at the grace instead of staying
// routed at its last weight (stale, the default for cache_ttl): the
// offline check measures how fast a drain reaches the gateways.
const routeOfflineGrace = 2 * time.Second

// routeResync is heft-sync's resync in this area.
const routeResync = time.Second

// routingFleet is the running fleet of area 9 with its gateways.
type routingFleet struct {
	e        *env
	dir      string
	co       *coordinator
	sims     []*simProc // in routingWorkers order
	agents   []*child
	socket   string // HAProxy's admin socket
	nginxDir string
	nginxBin string
	// nginxMaster is nginx's master process (it runs with daemon off).
	nginxMaster int
	// nginxPolicies and nginxPorts are what nginx.conf was written from,
	// so it can be written again with other true capacities.
	nginxPolicies []policy
	nginxPorts    map[string]int
	// trueCaps replaces the serving workers' true capacities in the
	// oracle's weights (area 11 changes them mid-run, and appends the
	// joiner's once it joins); nil: FullCapacity.
	trueCaps []float64
	heftFile string            // the nginx upstream file heft-sync writes
	fronts   map[string]string // gateway + "/" + key → frontend base URL
	syncURL  string            // heft-sync's /metrics and /healthz
	procs    []*child          // everything, in start order
	late     []*child          // started while the fleet runs (area 11), stopped first
	// lateSims are the sims started while the fleet runs (area 11), and
	// stoppedMeetings what the sims stopped mid-run had counted (sim.MeetingsPath).
	lateSims        []*simProc
	stoppedMeetings []sim.Meetings
	client          *http.Client

	heftWeights []float64 // the coordinator's weights, in routingWorkers order
	caps        string    // what heft says each worker runs at once, for the notes
	applied     []string  // what each gateway carries, for the notes
}

func frontKey(p policy) string { return p.Gateway + "/" + p.Key }

func (f *routingFleet) frontURL(p policy) string { return f.fronts[frontKey(p)] }

func (f *routingFleet) stop() {
	stopAll(f.late)
	stopAll(f.procs)
	f.client.CloseIdleConnections()
	httpClient.CloseIdleConnections()
}

// startRoutingFleet starts the coordinator, the sims with their agents,
// waits until heft has admitted the serving workers and held the uneven
// one, then starts HAProxy, nginx and heft-sync and waits until heft-sync
// has applied heft's weights to every gateway.
func (e *env) startRoutingFleet(ctx context.Context, plan routingPlan) (_ *routingFleet, err error) {
	hx, err := gwproc.Find("haproxy")
	if err != nil {
		return nil, err
	}
	nx, err := gwproc.Find("nginx")
	if err != nil {
		return nil, err
	}
	syncBin, err := binPath(e.bin, "heft-sync")
	if err != nil {
		return nil, err
	}
	e.fleets++
	name := fmt.Sprintf("routing-%d", e.fleets)
	f := &routingFleet{e: e, dir: filepath.Join(e.work, name), fronts: map[string]string{}, client: newLoadClient()}
	defer func() {
		if err != nil {
			f.stop()
		}
	}()
	if err := os.MkdirAll(f.dir, 0o700); err != nil {
		return nil, err
	}
	e.logf("routing: starting the fleet (coordinator, %d heft-sims, their agents)", len(routingWorkers))
	// Probation off: the cells compare heft's earned weights, not the cap
	// of 1 a new worker gets for its first hour.
	coArgs := []string{fmt.Sprintf("offline_grace = %q", routeOfflineGrace),
		fmt.Sprintf("stale_weight_ttl = %q", routeOfflineGrace), `probation = "0s"`}
	if plan.WeightMin > 0 {
		coArgs = append(coArgs, fmt.Sprintf("weight_min = %v", plan.WeightMin))
	}
	f.co, err = e.startCoordinator(ctx, name+"-coordinator", coArgs...)
	if err != nil {
		return nil, err
	}
	f.procs = append(f.procs, f.co.child)
	for i, c := range routingWorkers {
		listen := "127.0.0.1:0"
		if i == routeFast {
			c.Slow = e.slowFast
			if e.fastListen != "" {
				listen = e.fastListen
			}
		}
		sp, err := e.startSimProcAt(f.dir, c.Name, c, 0, listen, nil)
		if err != nil {
			return nil, err
		}
		f.sims = append(f.sims, sp)
		f.procs = append(f.procs, sp.child)
	}
	for i, c := range routingWorkers {
		var env []string
		if i == routeFast && e.fastNVML != nil {
			if err := e.fastNVML.set(gpuState{pids: []int{f.sims[i].Pid()}, smMHz: standinMaxSM, tempC: 61}); err != nil {
				return nil, err
			}
			env = e.fastNVML.env()
		}
		ag, err := e.startAgent(f.dir, "route-"+c.Name, f.co, c.Flavor, f.sims[i], false, env...) // the routing cells use the decode weight
		if err != nil {
			return nil, err
		}
		f.agents = append(f.agents, ag)
		f.procs = append(f.procs, ag)
	}
	if err := f.waitAdmitted(ctx); err != nil {
		return nil, err
	}

	e.logf("routing: starting HAProxy, nginx and heft-sync")
	if err := f.startHAProxy(ctx, hx, plan.Policies); err != nil {
		return nil, err
	}
	if err := f.startNginx(ctx, nx, plan.Policies); err != nil {
		return nil, err
	}
	if err := f.startSync(ctx, syncBin, nx, plan.Policies); err != nil {
		return nil, err
	}
	f.applied, err = f.describeApplied(ctx, plan.Policies)
	return f, err
}

// waitAdmitted waits until the serving workers are admitted with a weight
// and the uneven one is held, then keeps the weights.
func (f *routingFleet) waitAdmitted(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		list, err := f.co.workers(wctx)
		if err == nil && f.settled(list) {
			f.caps = f.describeCaps(list)
			break
		}
		for _, p := range f.procs {
			if !p.Alive() {
				return fmt.Errorf("%s exited early%s", p.name, p.stderrTail())
			}
		}
		if wctx.Err() != nil {
			return fmt.Errorf("the routing fleet did not settle (3 admitted, 1 held) in time: %s", describeWorkers(list))
		}
		time.Sleep(100 * time.Millisecond)
	}
	w, err := f.co.weights(ctx, benchModel)
	if err != nil {
		return err
	}
	f.heftWeights = make([]float64, len(routingWorkers))
	for i, s := range f.sims {
		f.heftWeights[i] = math.NaN()
		for _, x := range w.Workers {
			if samePort(x.URL, s.url) {
				f.heftWeights[i] = x.Weight
			}
		}
	}
	return nil
}

// describeCaps says what the coordinator lists as each worker's
// max_running (and where the agent read it) and max_concurrency.
func (f *routingFleet) describeCaps(list []view.Worker) string {
	val := func(p *int) string {
		if p == nil {
			return "null"
		}
		return strconv.Itoa(*p)
	}
	var parts []string
	for i, s := range f.sims {
		for _, w := range list {
			if samePort(w.URL, s.url) {
				parts = append(parts, fmt.Sprintf("%s max_running %s (%s), max_concurrency %s", routingWorkers[i].Name,
					val(w.MaxRunning), w.MaxRunningSource, val(w.MaxConcurrency)))
			}
		}
	}
	return strings.Join(parts, "; ")
}

// settled: every serving worker admitted with a weight, the held one held.
func (f *routingFleet) settled(list []view.Worker) bool {
	for i, s := range f.sims {
		want := view.StateAdmitted
		if i == routeHeld {
			want = view.StateHeld
		}
		ok := false
		for _, w := range list {
			if samePort(w.URL, s.url) && w.State == want && (want == view.StateHeld || w.Weight != nil) {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// oracleWeights are the true capacities of the serving workers scaled to
// a gateway's range.
func oracleWeights(hi int) []int {
	caps := make([]float64, len(routeServing))
	for i, c := range routeServing {
		caps[i] = c.FullCapacity(16)
	}
	ints, _ := scale.Ints(caps, hi)
	return ints
}

// oracleWeights are oracleWeights, or the fleet's trueCaps scaled.
func (f *routingFleet) oracleWeights(hi int) []int {
	if f.trueCaps == nil {
		return oracleWeights(hi)
	}
	ints, _ := scale.Ints(f.trueCaps, hi)
	return ints
}

// maxConnOf is what a worker's engine runs at once: its running sequences
// per rank times its ranks.
func maxConnOf(c Calibration) int { return c.MaxRunning * c.ranks() }

func (f *routingFleet) simAddr(i int) string { return strings.TrimPrefix(f.sims[i].url, "http://") }

// haproxyConfig is HAProxy's whole configuration: one frontend and one
// backend per policy.
func (f *routingFleet) haproxyConfig(policies []policy, ports map[string]int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
    stats socket %s mode 600 level admin
    maxconn 8192
defaults
    mode http
    option http-no-delay
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    timeout queue 300s
    maxconn 8192
`, f.socket)
	oracle := f.oracleWeights(haproxyWeights)
	for _, p := range policies {
		if p.Gateway != gwHAProxy {
			continue
		}
		fmt.Fprintf(&b, "frontend fe_%s\n    bind 127.0.0.1:%d\n    default_backend %s\n", p.Key, ports[frontKey(p)], p.Key)
		fmt.Fprintf(&b, "backend %s\n    balance %s\n    http-response set-header X-Heft-Backend %%si:%%sp\n", p.Key, p.Balance)
		if p.Weights == weightsHeft {
			// heft-sync puts workers into these slots, and with capHeft sets
			// each one's maxconn. A template gives every slot the same
			// maxconn: 16 per rank of a one-rank worker (the DP worker's
			// own maxconn of 32 is only heft's to set).
			maxconn := ""
			if p.Cap == capEngine {
				maxconn = fmt.Sprintf(" maxconn %d", maxConnOf(routeServing[0]))
			}
			fmt.Fprintf(&b, "    server-template heft 1-%d 127.0.0.1:9 disabled%s\n", len(routingWorkers), maxconn)
			continue
		}
		for i, c := range routeServing {
			fmt.Fprintf(&b, "    server %s %s", c.Name, f.simAddr(i))
			if p.Weights == weightsOracle {
				fmt.Fprintf(&b, " weight %d", oracle[i])
			}
			if p.Cap == capEngine {
				fmt.Fprintf(&b, " maxconn %d", maxConnOf(c))
			}
			b.WriteString("\n")
		}
		if p.Weights == weightsOracle && f.e.joinListen != "" {
			// Area 11's joiner, enabled with its true capacity when it joins.
			fmt.Fprintf(&b, "    server %s %s weight 1 disabled\n", joiner.Name, f.e.joinListen)
		}
	}
	return b.String()
}

func (f *routingFleet) startHAProxy(ctx context.Context, bin string, policies []policy) error {
	dir := filepath.Join(f.dir, "haproxy")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f.socket = filepath.Join(dir, "admin.sock")
	ports, err := f.frontPorts(policies, gwHAProxy)
	if err != nil {
		return err
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(f.haproxyConfig(policies, ports)), 0o600); err != nil {
		return err
	}
	if err := gwproc.CheckHAProxy(ctx, bin, cfg); err != nil {
		return err
	}
	ch, err := startChild(dir, "haproxy", bin, gwproc.HAProxyArgs(cfg), childIO{})
	if err != nil {
		return err
	}
	f.procs = append(f.procs, ch)
	return waitListening(ctx, ch, append([]string{"unix:" + f.socket}, listenAddrs(ports)...))
}

// nginxHTTP is the body of nginx's http block: one upstream and one
// server per policy; heft's upstream is the file heft-sync writes.
func (f *routingFleet) nginxHTTP(policies []policy, ports map[string]int) string {
	var b strings.Builder
	b.WriteString(`    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_buffering off;
    proxy_read_timeout 300s;
    proxy_next_upstream error timeout http_502 http_503 non_idempotent;
    proxy_next_upstream_tries 3;
    proxy_next_upstream_timeout 10s;
`)
	oracle := f.oracleWeights(nginxWeights)
	for _, p := range policies {
		if p.Gateway != gwNginx {
			continue
		}
		if p.Weights == weightsHeft {
			fmt.Fprintf(&b, "    include %s;\n", f.heftFile)
		} else {
			fmt.Fprintf(&b, "    upstream %s {\n", p.Key)
			if p.Balance == "leastconn" {
				b.WriteString("        least_conn;\n")
			}
			for i := range routeServing {
				fmt.Fprintf(&b, "        server %s", f.simAddr(i))
				if p.Weights == weightsOracle {
					fmt.Fprintf(&b, " weight=%d", oracle[i])
				}
				b.WriteString(";\n")
			}
			if p.Weights == weightsOracle && len(oracle) > len(routeServing) {
				fmt.Fprintf(&b, "        server %s weight=%d;\n", f.e.joinListen, oracle[len(routeServing)])
			}
			b.WriteString("        keepalive 32;\n    }\n")
		}
		fmt.Fprintf(&b, "    server {\n        listen 127.0.0.1:%d;\n        location / {\n            proxy_pass http://%s;\n"+
			"            add_header X-Heft-Backend $upstream_addr always;\n        }\n    }\n", ports[frontKey(p)], p.Key)
	}
	return b.String()
}

func (f *routingFleet) startNginx(ctx context.Context, bin string, policies []policy) error {
	f.nginxDir = filepath.Join(f.dir, "nginx")
	if err := os.MkdirAll(filepath.Join(f.nginxDir, "tmp"), 0o700); err != nil {
		return err
	}
	ports, err := f.frontPorts(policies, gwNginx)
	if err != nil {
		return err
	}
	f.heftFile = filepath.Join(f.nginxDir, "heft-upstream.conf")
	// nginx must start with a valid upstream; heft-sync replaces it.
	for _, p := range policies {
		if p.Gateway == gwNginx && p.Weights == weightsHeft {
			if err := os.WriteFile(f.heftFile, fmt.Appendf(nil, "upstream %s { server 127.0.0.1:9 down; }\n", p.Key), 0o600); err != nil {
				return err
			}
		}
	}
	f.nginxBin, f.nginxPolicies, f.nginxPorts = bin, policies, ports
	conf := filepath.Join(f.nginxDir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(gwproc.NginxConf(f.nginxDir, f.nginxHTTP(policies, ports))), 0o600); err != nil {
		return err
	}
	ch, err := startChild(f.nginxDir, "nginx", bin, gwproc.NginxArgs(f.nginxDir, conf), childIO{})
	if err != nil {
		return err
	}
	f.procs = append(f.procs, ch)
	f.nginxMaster = ch.Pid()
	return waitListening(ctx, ch, listenAddrs(ports))
}

// frontPorts gives every policy of a gateway a free port and notes its URL.
func (f *routingFleet) frontPorts(policies []policy, gateway string) (map[string]int, error) {
	ports := map[string]int{}
	for _, p := range policies {
		if p.Gateway != gateway {
			continue
		}
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[frontKey(p)] = port
		f.fronts[frontKey(p)] = "http://127.0.0.1:" + strconv.Itoa(port)
	}
	return ports, nil
}

func listenAddrs(ports map[string]int) []string {
	var out []string
	for _, p := range ports {
		out = append(out, "tcp:127.0.0.1:"+strconv.Itoa(p))
	}
	slices.Sort(out)
	return out
}

// waitListening waits until every "tcp:ADDR" or "unix:PATH" accepts a
// connection, or the process exits.
func waitListening(ctx context.Context, ch *child, addrs []string) error {
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range addrs {
		network, addr, _ := strings.Cut(a, ":")
		for {
			c, err := net.DialTimeout(network, addr, time.Second)
			if err == nil {
				c.Close()
				break
			}
			if !ch.Alive() || time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("%s does not listen on %s: %w%s", ch.name, addr, err, ch.stderrTail())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// startSync starts heft-sync with one target per heft-driven policy and
// waits until it has applied heft's state to each.
func (f *routingFleet) startSync(ctx context.Context, bin, nginxBin string, policies []policy) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	f.syncURL = "http://" + addr
	var b strings.Builder
	fmt.Fprintf(&b, "listen = %q\nresync = %q\n\n[coordinator]\nurl = %q\n", addr, routeResync.String(), f.co.api)
	for _, p := range policies {
		if p.Weights != weightsHeft {
			continue
		}
		switch p.Gateway {
		case gwHAProxy:
			fmt.Fprintf(&b, "\n[[haproxy]]\nmodel = %q\nsocket = %q\nbackend = %q\nslots = \"heft\"\n", benchModel, f.socket, p.Key)
			if p.Balance == "first" {
				b.WriteString("order = \"weight\"\n")
			}
			if p.Cap == capHeft {
				b.WriteString("maxconn = true\n")
			}
		case gwNginx:
			conf := filepath.Join(f.nginxDir, "nginx.conf")
			fmt.Fprintf(&b, "\n[[nginx]]\nmodel = %q\nfile = %q\nupstream = %q\ndirectives = %s\ncheck = %s\nreload = %s\n",
				benchModel, f.heftFile, p.Key, tomlList([]string{"least_conn", "keepalive 32"}),
				tomlList(gwproc.NginxCheck(nginxBin, f.nginxDir, conf)), tomlList(gwproc.NginxReload(nginxBin, f.nginxDir, conf)))
		}
	}
	dir := filepath.Join(f.dir, "sync")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cfg := filepath.Join(dir, "sync.toml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		return err
	}
	ch, err := startChild(dir, "heft-sync", bin, []string{"--config", cfg}, childIO{})
	if err != nil {
		return err
	}
	f.procs = append(f.procs, ch)
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := f.syncHealth(ctx)
		if err == nil && st.Status == "ok" && !slices.ContainsFunc(st.Targets, func(t syncTarget) bool { return !t.Applied }) {
			return f.waitNginxServes(ctx, policies)
		}
		if !ch.Alive() || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("heft-sync did not apply heft's weights to every gateway (%+v, %v)%s", st, err, ch.stderrTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitNginxServes waits until nginx answers through heft's upstream and the
// workers that serve the placeholder (every server down) are gone. The
// reload heft-sync ran returns when nginx has the signal, before its new
// workers replace the old ones, and an old worker accepts connections until
// it has handled its own signal: one answer through heft's upstream does not
// mean the next request gets one. Each wait was added after a request sent
// then was answered 502, "no live upstreams", in area 11.
func (f *routingFleet) waitNginxServes(ctx context.Context, policies []policy) error {
	if err := f.waitNginxAnswers(ctx, policies); err != nil {
		return err
	}
	return gwproc.WaitNginxOneGeneration(ctx, f.nginxMaster, 30*time.Second)
}

func (f *routingFleet) waitNginxAnswers(ctx context.Context, policies []policy) error {
	for _, p := range policies {
		if p.Gateway != gwNginx || p.Weights != weightsHeft {
			continue
		}
		url := f.fronts[frontKey(p)] + "/health"
		deadline := time.Now().Add(30 * time.Second)
		for {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return err
			}
			resp, err := httpClient.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("nginx did not serve heft's upstream %s within 30 s (%v)", p.Key, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

func tomlList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = strconv.Quote(x)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// syncStatus is the part of heft-sync's /healthz the bench reads.
type syncStatus struct {
	Status      string       `json:"status"`
	Coordinator bool         `json:"coordinator_connected"`
	Targets     []syncTarget `json:"targets"`
}

type syncTarget struct {
	Name    string `json:"name"`
	Healthy bool   `json:"healthy"`
	Applied bool   `json:"applied"`
}

func (f *routingFleet) syncHealth(ctx context.Context) (syncStatus, error) {
	var st syncStatus
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.syncURL+"/healthz", nil)
	if err != nil {
		return st, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// scrape reads a Prometheus text endpoint with the real parser.
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation) // one per scrape: it keeps state
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	// Each family's samples summed over their labels: what the bench needs.
	out := map[string]float64{}
	for name, fam := range fams {
		for _, m := range fam.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				out[name] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[name] += m.GetGauge().GetValue()
			case m.GetUntyped() != nil:
				out[name] += m.GetUntyped().GetValue()
			}
		}
	}
	return out, nil
}

// busyFamilies are the running and queued requests of the flavours the
// routing fleet uses whose gauges are live; SGLang's lag (simBusy).
var busyFamilies = []string{
	"vllm:num_requests_running", "vllm:num_requests_waiting",
	"llamacpp:requests_processing", "llamacpp:requests_deferred",
}

// waitIdle waits until no sim runs or queues a request, so that a cell
// starts on an empty fleet.
func (f *routingFleet) waitIdle(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		busy := 0.0
		var err error
		for _, s := range f.sims {
			var n float64
			if n, err = simBusy(ctx, s.url); err != nil {
				break
			}
			busy += n
		}
		if err == nil && busy == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.Join(fmt.Errorf("the fleet did not go idle (%g requests still running or queued)", busy), err, ctx.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// simBusy is how many requests a sim runs or queues: an SGLang sim's
// /v1/loads, which reads its ranks as they are (its /metrics gauges are
// written every 40 decode steps and, idle, every 30 s), else /metrics.
func simBusy(ctx context.Context, url string) (float64, error) {
	var loads struct {
		Loads []struct {
			Running float64 `json:"num_running_reqs"`
			Waiting float64 `json:"num_waiting_reqs"`
		} `json:"loads"`
	}
	busy := 0.0
	if _, err := getJSON(ctx, url, "/v1/loads", &loads); err == nil {
		for _, l := range loads.Loads {
			busy += l.Running + l.Waiting
		}
		return busy, nil
	}
	m, err := scrape(ctx, url+"/metrics")
	for _, name := range busyFamilies {
		busy += m[name]
	}
	return busy, err
}

// heldRequests is how many requests the held worker's engine has
// processed, by its own counter.
func (f *routingFleet) heldRequests(ctx context.Context) (float64, error) {
	m, err := scrape(ctx, f.sims[routeHeld].url+"/metrics")
	if err != nil {
		return 0, err
	}
	n, ok := m["sglang:num_requests_total"]
	if !ok {
		return 0, errors.New("the held sim's metrics lack sglang:num_requests_total")
	}
	return n, nil
}

// loadCounts is what the fleet's sims counted of the load (sim.MeetingsPath),
// per load label: requests served, and those that shared their engine with
// a request of heft's probes; Other is how many such probe requests the
// sims served.
type loadCounts struct {
	Seen, Met map[string]int64
	Other     int64
}

// loadCounts reads every sim of the fleet, those started mid-run included,
// and adds what the sims stopped mid-run had counted.
func (f *routingFleet) loadCounts(ctx context.Context) (loadCounts, error) {
	all := slices.Clone(f.stoppedMeetings)
	for _, sp := range append(slices.Clone(f.sims), f.lateSims...) {
		m, err := simMeetings(ctx, sp.url)
		if err != nil {
			return loadCounts{}, err
		}
		all = append(all, m)
	}
	out := loadCounts{Seen: map[string]int64{}, Met: map[string]int64{}}
	for _, m := range all {
		out.Other += m.Other
		for label, c := range m.Load {
			out.Seen[label] += c.Requests
			out.Met[label] += c.MetOther
		}
	}
	return out, nil
}

// simMeetings reads one heft-sim's meetings count.
func simMeetings(ctx context.Context, url string) (sim.Meetings, error) {
	var m sim.Meetings
	_, err := getJSON(ctx, url, sim.MeetingsPath, &m)
	return m, err
}
