package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"heft/bench/loadgen"
	"heft/sim"
)

// routingWorkers are area 9's fleet: one model, four workers of very
// different speeds, one of them data-parallel, and one that heft holds.
// Every rank runs at most 16 sequences, the probe's concurrency per rank,
// so a worker's true capacity is what it delivers with every rank full
// (Calibration.FullCapacity: S16 per rank, 1,800 tok/s for dp2) and the
// fleet's is their sum. The fast one is SGLang-flavoured, not
// vLLM: an agent beside a heft-sim process reads the sim's own command
// line as the engine's launch arguments, which name no max_num_seqs, so a
// vLLM-flavoured sim would be reported at vLLM's default of 256 running
// sequences; SGLang's /server_info says 16.
var routingWorkers = []Calibration{
	{Name: "fast", Flavor: sim.FlavorSGLang, SingleTPS: 150, Batch16TPS: 2000, MaxRunning: 16},
	{Name: "mid", Flavor: sim.FlavorSGLang, SingleTPS: 80, Batch16TPS: 900, MaxRunning: 16},
	{Name: "slow", Flavor: sim.FlavorLlamaCpp, SingleTPS: 60, Batch16TPS: 300, MaxRunning: 16},
	// Two data-parallel ranks with even pools: 16 running per rank, 32 in
	// all. A probe of 16 requests in all would see half of it.
	{Name: "dp2", Flavor: sim.FlavorSGLang, SingleTPS: 80, Batch16TPS: 900, DP: 2, MaxRunning: 16},
	// Uneven KV pools (the demo's gpu-d): heft holds it, so it must get
	// no request through a gateway heft drives.
	{Name: "uneven", Flavor: sim.FlavorSGLang, SingleTPS: 80, Batch16TPS: 900, DP: 2, KVTokens: []int64{24094, 2925}, MaxRunning: 16},
}

// Indexes into routingWorkers.
const (
	routeFast = 0
	routeDP   = 3
	routeHeld = 4
)

// routeServing are the workers every gateway may send to; the held one
// is only in heft's view.
var routeServing = routingWorkers[:routeHeld]

// Gateways.
const (
	gwHAProxy = "HAProxy"
	gwNginx   = "nginx"
)

// Where a policy's weights come from.
const (
	weightsNone   = "none"   // every server weight 1
	weightsHeft   = "heft"   // applied by heft-sync from the coordinator
	weightsOracle = "oracle" // the true capacities, written into the config
)

// policy is one way of routing: a backend (HAProxy) or an upstream
// (nginx) with its own frontend.
type policy struct {
	Gateway string
	Key     string // backend / upstream name
	Name    string // in the tables
	Balance string // HAProxy balance / nginx method: roundrobin, leastconn, first
	Weights string
	// Cap is each server's HAProxy maxconn (requests beyond it wait in
	// HAProxy's queue).
	Cap string
}

// Caps.
const (
	capNone   = ""
	capEngine = "engine" // what the engine runs at once, written in the config
	capHeft   = "heft"   // the coordinator's max_concurrency, applied by heft-sync (maxconn = true)
)

// String is how the tables name the policy.
func (p policy) String() string { return p.Gateway + " " + p.Name }

// routingPolicies are every policy of a full run, side by side.
var routingPolicies = []policy{
	{gwHAProxy, "rr", "roundrobin", "roundrobin", weightsNone, capNone},
	{gwHAProxy, "lc", "leastconn", "leastconn", weightsNone, capNone},
	{gwHAProxy, "lc_heft", "leastconn + heft", "leastconn", weightsHeft, capNone},
	{gwHAProxy, "lc_oracle", "leastconn + true capacities", "leastconn", weightsOracle, capNone},
	{gwHAProxy, "lc_heft_cap", "leastconn + heft + heft's maxconn", "leastconn", weightsHeft, capHeft},
	{gwHAProxy, "first_heft", "first + heft order + heft's maxconn", "first", weightsHeft, capHeft},
	{gwHAProxy, "first_heft_engine", "first + heft order + maxconn = engine's", "first", weightsHeft, capEngine},
	{gwNginx, "rr", "round robin", "roundrobin", weightsNone, capNone},
	{gwNginx, "lc", "least_conn", "leastconn", weightsNone, capNone},
	{gwNginx, "lc_heft", "least_conn + heft", "leastconn", weightsHeft, capNone},
	{gwNginx, "lc_oracle", "least_conn + true capacities", "leastconn", weightsOracle, capNone},
}

// routingPlan is what one run of the area does.
type routingPlan struct {
	Policies []policy
	Loads    []float64 // offered load as fractions of the fleet's true capacity
	Seeds    int       // arrival schedules per load; every policy gets the same ones
	Cell     time.Duration
	Drain    time.Duration // how long a cell's open requests may finish
	Quiet    int           // sequential requests per policy; 0 = no quiet case
	Checks   bool          // the offline and coordinator-kill checks
	Tokens   int           // output tokens per request
	// WeightMin is the coordinator's weight_min; 0 = its default.
	WeightMin float64
}

// routingPlanFor is the plan of a full or quick run.
func (e *env) routingPlanFor() routingPlan {
	p := routingPlan{Policies: routingPolicies, Loads: []float64{0.3, 0.6, 0.9}, Seeds: 2, Cell: 30 * time.Second,
		Drain: 20 * time.Second, Quiet: 20, Checks: true, Tokens: 128}
	if e.opts.Quick {
		p = routingPlan{Loads: []float64{0.6}, Seeds: 1, Cell: 3 * time.Second, Drain: 20 * time.Second, Quiet: 3,
			Checks: true, Tokens: e.tokens}
		for _, pol := range routingPolicies {
			if pol.Balance == "roundrobin" || pol.Key == "lc_heft" || pol.Key == "first_heft" {
				p.Policies = append(p.Policies, pol)
			}
		}
	}
	if e.opts.RoutingSeeds > 0 {
		p.Seeds = e.opts.RoutingSeeds
	}
	if e.opts.RoutingCell > 0 {
		p.Cell = e.opts.RoutingCell
	}
	if len(e.opts.RoutingLoads) > 0 {
		p.Loads = nil
		for _, l := range e.opts.RoutingLoads {
			p.Loads = append(p.Loads, float64(l)/100)
		}
	}
	p.WeightMin = e.opts.WeightMin
	return p
}

// estimate is a rough forecast of the plan's duration.
func (p routingPlan) estimate() time.Duration {
	cells := len(p.Policies) * len(p.Loads) * p.Seeds
	d := 45*time.Second + time.Duration(cells)*(p.Cell+8*time.Second)
	d += time.Duration(len(p.Policies)*p.Quiet) * 1500 * time.Millisecond
	if p.Checks {
		d += 30 * time.Second
	}
	return d
}

// routingCapacity is the fleet's true capacity in tok/s, held worker
// excluded.
func routingCapacity() float64 {
	total := 0.0
	for _, c := range routeServing {
		total += c.FullCapacity(16)
	}
	return total
}

// cell is one policy at one load with one seed (load 0: the quiet case).
type cell struct {
	Policy policy
	Load   float64
	Seed   int
	Res    loadgen.Result
	Split  []int // requests per worker, in routingWorkers order
	Other  int   // requests whose backend the bench did not recognise
	Err    error
}

// routingResult is everything one run of the area measured.
type routingResult struct {
	Plan     routingPlan
	Cells    []cell
	Weights  []float64 // heft's weights per worker (NaN where none)
	Caps     string    // heft's max_running and max_concurrency per worker
	Applied  []string  // the integer weights each gateway carries, for the notes
	HeldSeen float64   // requests the held sim counted over the cells
	// LoadSeen is how many load requests the sims counted under each
	// gateway's label (sim.LoadHeader) over the cells; MetProbe how
	// many of them shared their engine with a probe's request.
	LoadSeen, MetProbe map[string]int64
	Checks             *routingChecks
	Notes              []string
}

// routingRun starts the fleet, runs the plan's cells and checks, and
// stops everything. An error means the fleet could not be set up; a cell
// that failed carries its own error.
func (e *env) routingRun(ctx context.Context, plan routingPlan) (*routingResult, error) {
	f, err := e.startRoutingFleet(ctx, plan)
	if err != nil {
		return nil, err
	}
	defer f.stop()
	r := &routingResult{Plan: plan, Weights: f.heftWeights, Caps: f.caps, Applied: f.applied}
	heldBefore, err := f.heldRequests(ctx)
	if err != nil {
		return r, err
	}
	capacity := routingCapacity()
	total := len(plan.Loads)*plan.Seeds*len(plan.Policies) + len(plan.Policies)*min(plan.Quiet, 1)
	n := 0
	for seed := range plan.Seeds {
		for _, load := range plan.Loads {
			for _, p := range plan.Policies {
				if ctx.Err() != nil {
					return r, ctx.Err()
				}
				n++
				e.logf("routing: cell %d/%d: %s at %.0f %%, seed %d", n, total, p, 100*load, seed+1)
				r.Cells = append(r.Cells, f.runCell(ctx, p, load, seed, capacity, plan))
			}
		}
	}
	if plan.Quiet > 0 {
		for _, p := range plan.Policies {
			if ctx.Err() != nil {
				return r, ctx.Err()
			}
			n++
			e.logf("routing: cell %d/%d: %s, quiet (%d requests one at a time)", n, total, p, plan.Quiet)
			r.Cells = append(r.Cells, f.runCell(ctx, p, 0, 0, capacity, plan))
		}
	}
	heldAfter, err := f.heldRequests(ctx)
	if err != nil {
		return r, err
	}
	r.HeldSeen = heldAfter - heldBefore
	counts, err := f.loadCounts(ctx)
	if err != nil {
		return r, err
	}
	r.LoadSeen, r.MetProbe = counts.Seen, counts.Met
	if plan.Checks {
		e.logf("routing: offline and coordinator-kill checks")
		r.Checks = f.runChecks(ctx, capacity, plan)
	}
	return r, nil
}

// runCell offers one load through one policy's frontend.
func (f *routingFleet) runCell(ctx context.Context, p policy, load float64, seed int, capacity float64, plan routingPlan) cell {
	c := cell{Policy: p, Load: load, Seed: seed}
	if err := f.waitIdle(ctx); err != nil {
		c.Err = err
		return c
	}
	cfg := loadgen.Config{URL: f.frontURL(p), Model: benchModel, Tokens: plan.Tokens, Drain: plan.Drain,
		MaxInFlight: 1024, Seed: uint64(seed) + 1, Client: f.client, Label: p.Gateway}
	if load == 0 {
		cfg.Sequential, cfg.Requests = true, plan.Quiet
	} else {
		cfg.Rate = load * capacity / float64(plan.Tokens)
		cfg.Duration = plan.Cell
	}
	c.Res, c.Err = loadgen.Run(ctx, cfg)
	c.Split = make([]int, len(routingWorkers))
	for backend, b := range c.Res.Backends {
		if i := f.workerAt(backend); i >= 0 {
			c.Split[i] += b.Requests
		} else {
			c.Other += b.Requests
		}
	}
	return c
}

// workerAt names the worker behind a backend header (HAProxy "%si:%sp",
// nginx "$upstream_addr", which lists every address tried): -1 if none.
func (f *routingFleet) workerAt(backend string) int {
	parts := strings.Split(backend, ",")
	last := strings.TrimSpace(parts[len(parts)-1])
	for i, s := range f.sims {
		if u, err := url.Parse(s.url); err == nil && u.Host == last {
			return i
		}
	}
	return -1
}

// newLoadClient is the load generator's HTTP client: enough idle
// connections that a busy cell does not churn through ports.
func newLoadClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConns: 2048, MaxIdleConnsPerHost: 1024,
		IdleConnTimeout: 30 * time.Second, DisableCompression: true}}
}

// areaRouting is area 9.
func (e *env) areaRouting(ctx context.Context) *Section {
	plan := e.routingPlanFor()
	s := &Section{Title: "Routing by heft's weights",
		Intro: fmt.Sprintf("Real HAProxy and nginx from the system's packages in front of a heft-sim fleet of one model on loopback "+
			"(%s), each worker with its heft-agent, one heft-coordinator, and heft-sync keeping the gateways' weights in step. "+
			"Load from bench/loadgen: Poisson arrivals at %s of the fleet's true capacity (%s tok/s, the held worker excluded), "+
			"streamed chat, %d output tokens, %s of arrivals per cell then up to %s to finish, %d seed(s) shared by every policy; "+
			"the quiet case sends %d requests one at a time. Cells run one after another on the same fleet.",
			describeFleet(), describeLoads(plan.Loads), num(routingCapacity(), 0), plan.Tokens, plan.Cell, plan.Drain, plan.Seeds, plan.Quiet),
	}
	r, err := e.routingRun(ctx, plan)
	if r == nil {
		s.Err = err
		return s
	}
	r.render(s)
	if err != nil {
		s.Err = err
	}
	return s
}

func describeFleet() string {
	parts := make([]string, len(routingWorkers))
	for i, c := range routingWorkers {
		parts[i] = c.Name + " " + c.String()
		if i == routeHeld {
			parts[i] += ", uneven pools: held"
		}
	}
	return strings.Join(parts, "; ")
}

func describeLoads(loads []float64) string {
	parts := make([]string, len(loads))
	for i, l := range loads {
		parts[i] = num(100*l, 0) + " %"
	}
	return strings.Join(parts, ", ")
}
