package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/bench/swarm"
	"heft/coordinator/config"
	"heft/coordinator/fleet"
	"heft/shared/wire"
)

// Scale parameters.
const (
	swarmModels       = 10              // the swarm's engines are spread over this many models
	snapshotEvery     = 5 * time.Second // each simulated agent's heartbeat
	visibilitySamples = 200
	visibilityGapMS   = 20
	recomputeSamples  = 20
	mb                = 1e6
	gib               = 1 << 30
)

// scaleResult is one swarm size's numbers.
type scaleResult struct {
	agents                 int
	connected, admitted    float64 // seconds from the swarm's start
	rssEnd, hwm            float64 // bytes
	cpu                    float64 // % of one core over the steady window
	swarmCPU, swarmRSS     float64
	visP50, visP99, visMax float64 // ms
	visN, visTimeouts      int
	workersMS, weightsMS   Summary
	workersBytes           int
	weightsN               int
	recomputeMS            Summary
	dropped, reconnects    int64
	dropReasons            string // the coordinator's heft_agent_disconnects_total, non-zero reasons
	err                    error
}

func (e *env) agentCounts() []int {
	switch {
	case len(e.opts.Agents) > 0:
		return e.opts.Agents
	case e.opts.Quick:
		return []int{50}
	}
	return []int{1000, 5000, 10000}
}

func (e *env) areaScale(ctx context.Context) *Section {
	counts := e.agentCounts()
	window := 15 * time.Second
	samples, workerGets, weightGets := visibilitySamples, 5, 20
	if e.opts.Quick {
		window, samples, workerGets, weightGets = 2*time.Second, 20, 2, 5
	}
	s := &Section{
		Title: "Coordinator scale",
		Intro: fmt.Sprintf("A swarm process (bench/cmd/swarm) opens N agent websockets to a fresh heft-coordinator on loopback. "+
			"Each agent says hello, reports one ready engine (%d models in all) in a snapshot every %s and answers its probe "+
			"request with a measurement. After every worker is admitted: coordinator CPU over %s of heartbeats, snapshot → API "+
			"visibility over %d samples (a stamped snapshot, then GET /api/v1/workers/{id} every 1 ms until it shows), API "+
			"latency, and RSS from /proc. Weight recompute is timed in-process on a fleet of the same shape. The swarm shares "+
			"the machine's cores with the coordinator.", swarmModels, snapshotEvery, window, samples),
	}
	cols := []string{"metric"}
	for _, n := range counts {
		cols = append(cols, num(float64(n), 0)+" agents")
	}
	largest := counts[len(counts)-1]
	cols = append(cols, "target at "+num(float64(largest), 0), "verdict")
	s.Table = Table{Columns: cols}

	var results []scaleResult
	for _, n := range counts {
		e.logf("coordinator scale: %d agents", n)
		r := e.scaleRun(ctx, n, window, samples, workerGets, weightGets)
		e.logf("coordinator scale: %d agents: weight recompute in-process", n)
		var err error
		if r.recomputeMS, err = recomputeTime(n); err != nil {
			s.Notes = append(s.Notes, fmt.Sprintf("%d agents: weight recompute: %v", n, err))
		}
		if r.err != nil {
			s.Notes = append(s.Notes, fmt.Sprintf("%d agents: %v", n, r.err))
		}
		if r.dropReasons != "" {
			s.Notes = append(s.Notes, fmt.Sprintf("%d agents: the coordinator closed agent connections (its "+
				"heft_agent_disconnects_total by reason): %s. The swarm reconnects as a real agent does.", n, r.dropReasons))
		}
		results = append(results, r)
		if ctx.Err() != nil {
			s.Err = ctx.Err()
			break
		}
	}
	last := results[len(results)-1]
	row := func(metric string, cell func(r scaleResult) string, target, verdict string) {
		cells := []string{metric}
		for _, r := range results {
			cells = append(cells, cell(r))
		}
		for len(cells) < len(cols)-2 {
			cells = append(cells, "n/a")
		}
		s.Table.Add(append(cells, target, verdict)...)
	}
	known := func(x float64) bool { return !math.IsNaN(x) }
	one := func(x, limit float64, prec int, unit string) string {
		if !known(x) {
			return "miss: not measured"
		}
		return atMost(Summarize([]float64{x}), limit, prec, unit)
	}
	row("coordinator RSS after the run, MB", func(r scaleResult) string { return num(r.rssEnd/mb, 0) }, "", Info)
	row("coordinator peak RSS (VmHWM), MB", func(r scaleResult) string { return num(r.hwm/mb, 0) },
		"< 1 GiB ("+num(gib/mb, 0)+" MB)", one(last.hwm/mb, gib/mb, 0, " MB"))
	row("coordinator CPU while agents heartbeat, % of a core", func(r scaleResult) string { return num(r.cpu, 1) }, "", Info)
	row("all agents said hello, s", func(r scaleResult) string { return num(r.connected, 1) }, "", Info)
	row("all workers admitted, s", func(r scaleResult) string { return num(r.admitted, 1) }, "", Info)
	row("snapshot → visible, p50 ms", func(r scaleResult) string { return num(r.visP50, 1) }, "", Info)
	row("snapshot → visible, p99 ms", func(r scaleResult) string { return num(r.visP99, 1) }, "< 100 ms", one(last.visP99, 100, 1, " ms"))
	row("snapshot → visible, max ms (samples, timeouts)", func(r scaleResult) string {
		if r.visN == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%s (%d, %d)", num(r.visMax, 1), r.visN, r.visTimeouts)
	}, "", Info)
	row("GET /api/v1/workers, ms", func(r scaleResult) string { return r.workersMS.Format(1) }, "", Info)
	row("GET /api/v1/workers body, MB", func(r scaleResult) string {
		if r.workersBytes == 0 {
			return "n/a"
		}
		return num(float64(r.workersBytes)/mb, 1)
	}, "", Info)
	row("GET /api/v1/models/{m}/weights, ms (workers in m)", func(r scaleResult) string {
		if !r.weightsMS.Known() {
			return "n/a"
		}
		return fmt.Sprintf("%s (%d)", r.weightsMS.Format(1), r.weightsN)
	}, "", Info)
	row("weight recompute, all workers, ms (in-process)", func(r scaleResult) string { return r.recomputeMS.Format(2) },
		"< 10 ms", atMost(last.recomputeMS, 10, 2, " ms"))
	row("swarm CPU % of a core / RSS MB (load generator)", func(r scaleResult) string {
		if !known(r.swarmRSS) {
			return "n/a"
		}
		return fmt.Sprintf("%s / %s", num(r.swarmCPU, 1), num(r.swarmRSS/mb, 0))
	}, "", Info)
	row("connections dropped by the coordinator (swarm reconnected)", func(r scaleResult) string {
		return fmt.Sprintf("%d (%d)", r.dropped, r.reconnects)
	}, "0", func() string {
		switch {
		case last.err != nil:
			return "miss: run incomplete"
		case last.dropped == 0:
			return Pass
		}
		return fmt.Sprintf("miss: %d dropped", last.dropped)
	}())
	return s
}

// swarmEvent is one line of the swarm's stdout.
type swarmEvent struct {
	Event     string      `json:"event"`
	Seconds   float64     `json:"seconds"`
	Message   string      `json:"message"`
	SamplesMS []float64   `json:"samples_ms"`
	Timeouts  int         `json:"timeouts"`
	Stats     swarm.Stats `json:"stats"`
}

// expect reads swarm events until one of kind arrives.
func expect(ctx context.Context, c *child, kind string, timeout time.Duration) (swarmEvent, error) {
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return swarmEvent{}, fmt.Errorf("swarm: no %q event within %s", kind, timeout)
		}
		line, err := c.Line(ctx, left)
		if err != nil {
			return swarmEvent{}, err
		}
		var ev swarmEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			return swarmEvent{}, fmt.Errorf("swarm printed %q: %w", line, err)
		}
		switch ev.Event {
		case kind:
			return ev, nil
		case "error":
			return ev, fmt.Errorf("swarm: %s", ev.Message)
		}
	}
}

func (e *env) scaleRun(ctx context.Context, n int, window time.Duration, samples, workerGets, weightGets int) (r scaleResult) {
	nan := math.NaN()
	r = scaleResult{agents: n, connected: nan, admitted: nan, rssEnd: nan, hwm: nan, cpu: nan, swarmCPU: nan, swarmRSS: nan,
		visP50: nan, visP99: nan, visMax: nan}
	rctx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	name := fmt.Sprintf("scale-%d", n)
	co, err := e.startCoordinator(rctx, name)
	if err != nil {
		r.err = err
		return r
	}
	procs := []*child{co.child}
	defer func() { stopAll(procs) }()
	swarmBin, err := binPath(e.bin, "swarm")
	if err != nil {
		r.err = err
		return r
	}
	sw, err := startChild(e.work+"/"+name, "swarm", swarmBin, []string{"--url", co.ws, "--api", co.api, "--token", agentToken,
		"--agents", strconv.Itoa(n), "--models", strconv.Itoa(swarmModels), "--snapshot-every", snapshotEvery.String()},
		childIO{Stdin: true, Lines: true})
	if err != nil {
		r.err = err
		return r
	}
	procs = append(procs, sw)
	start := time.Now()
	fail := func(err error) scaleResult {
		r.err = err
		r.dropReasons = disconnectReasons(ctx, co)
		if st, perr := readProc(co.Pid()); perr == nil {
			r.rssEnd, r.hwm = float64(st.RSS), float64(st.HWM)
		}
		return r
	}
	ev, err := expect(rctx, sw, "connected", 5*time.Minute)
	if err != nil {
		return fail(err)
	}
	r.connected = ev.Seconds
	if ev, err = expect(rctx, sw, "measured", 5*time.Minute); err != nil {
		return fail(err)
	}
	r.dropped, r.reconnects = ev.Stats.Dropped, ev.Stats.Reconnects
	// Every worker admitted with a weight, as a gateway would see it.
	models := make([]string, min(swarmModels, n))
	for i := range models {
		models[i] = fmt.Sprintf("bench-model-%02d", i)
	}
	for {
		total := 0
		for _, m := range models {
			if w, err := co.weights(rctx, m); err == nil {
				total += len(w.Workers)
			}
		}
		if total == n {
			break
		}
		if rctx.Err() != nil || time.Since(start) > 6*time.Minute {
			return fail(fmt.Errorf("only %d of %d workers admitted", total, n))
		}
		time.Sleep(250 * time.Millisecond)
	}
	r.admitted = time.Since(start).Seconds()

	// Steady state: only heartbeats.
	cs, err := startSampler(co.Pid(), time.Second)
	if err != nil {
		return fail(err)
	}
	ss, err := startSampler(sw.Pid(), time.Second)
	if err != nil {
		cs.Stop()
		return fail(err)
	}
	select {
	case <-rctx.Done():
	case <-time.After(window):
	}
	cu, _ := cs.Stop()
	su, _ := ss.Stop()
	r.cpu, r.swarmCPU, r.swarmRSS = cu.CPUPercent, su.CPUPercent, su.RSS.Max

	if err := sw.Send(fmt.Sprintf("visibility %d %d", samples, visibilityGapMS)); err != nil {
		return fail(err)
	}
	ev, err = expect(rctx, sw, "visibility", 5*time.Minute)
	if err != nil {
		return fail(err)
	}
	r.visN, r.visTimeouts = len(ev.SamplesMS), ev.Timeouts
	r.visP50, r.visP99 = Percentile(ev.SamplesMS, 50), Percentile(ev.SamplesMS, 99)
	r.visMax = Percentile(ev.SamplesMS, 100)

	var wms, gms []float64
	for range workerGets {
		t0 := time.Now()
		size, err := getJSON(rctx, co.api, "/api/v1/workers", nil)
		if err != nil {
			return fail(err)
		}
		wms = append(wms, float64(time.Since(t0).Microseconds())/1000)
		r.workersBytes = size
	}
	r.workersMS = Summarize(wms)
	for range weightGets {
		t0 := time.Now()
		w, err := co.weights(rctx, models[0])
		if err != nil {
			return fail(err)
		}
		gms = append(gms, float64(time.Since(t0).Microseconds())/1000)
		r.weightsN = len(w.Workers)
	}
	r.weightsMS = Summarize(gms)

	if err := sw.Send("stats"); err == nil {
		if ev, err := expect(rctx, sw, "stats", 30*time.Second); err == nil {
			r.dropped, r.reconnects = ev.Stats.Dropped, ev.Stats.Reconnects
		}
	}
	if st, err := readProc(co.Pid()); err == nil {
		r.rssEnd, r.hwm = float64(st.RSS), float64(st.HWM)
	}
	r.dropReasons = disconnectReasons(rctx, co)
	_ = sw.Send("quit")
	return r
}

// disconnectReasons reads why the coordinator closed agent connections,
// from its own metrics: "ping_timeout 2982, ..." or "".
func disconnectReasons(ctx context.Context, co *coordinator) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, co.api+"/metrics", nil)
	if err != nil {
		return ""
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var parts []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	const prefix = `heft_agent_disconnects_total{reason="`
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		reason, value, ok := strings.Cut(rest, `"} `)
		if v, err := strconv.ParseFloat(value, 64); ok && err == nil && v > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", reason, num(v, 0)))
		}
	}
	return strings.Join(parts, ", ")
}

// nopStore keeps nothing: the recompute timing is of the fleet's logic.
type nopStore struct{}

func (nopStore) Load() (fleet.State, error)                  { return fleet.State{}, nil }
func (nopStore) SavePin(string, float64) error               { return nil }
func (nopStore) DeletePin(string) error                      { return nil }
func (nopStore) SavePrefillPin(string, float64) error        { return nil }
func (nopStore) DeletePrefillPin(string) error               { return nil }
func (nopStore) SaveDecision(string, string) error           { return nil }
func (nopStore) DeleteDecision(string) error                 { return nil }
func (nopStore) SaveMeasurement(wire.Measurement, int) error { return nil }
func (nopStore) SaveWorker(fleet.WorkerRecord) error         { return nil }
func (nopStore) DeleteWorker(string) error                   { return nil }
func (nopStore) DeleteMeasurements(string) error             { return nil }

// recomputeTime builds an in-process fleet of n admitted workers, with
// the settings heft-coordinator derives from its default configuration,
// shaped like the swarm's (same snapshots, same measurements, through the same
// Connect, Snapshot and ProbeResult calls the server makes) and times
// RecomputeWeights: median of recomputeSamples calls, in ms.
func recomputeTime(n int) (Summary, error) {
	f, err := fleet.New(config.Default().Fleet, nopStore{}, nil, hclog.NewNullLogger())
	if err != nil {
		return Summary{}, err
	}
	msgs := swarm.Messages(n, swarmModels)
	for i, m := range msgs {
		f.Connect(m.Hello.Node, uint64(i+1), m.Hello)
		for _, a := range f.Snapshot(m.Hello.Node, m.Snapshot) {
			if req, ok := a.Message.(*wire.ProbeRequest); ok {
				res := m.Result(req)
				if _, err := f.ProbeResult(m.Hello.Node, res); err != nil {
					return Summary{}, err
				}
			}
		}
	}
	admitted := 0
	for _, model := range f.Models() {
		if w, ok := f.Weights(model); ok {
			admitted += len(w.Workers)
		}
	}
	if admitted != n {
		return Summary{}, fmt.Errorf("in-process fleet admitted %d of %d workers", admitted, n)
	}
	runtime.GC() // time the recompute, not the garbage of building the fleet
	var ms []float64
	for range recomputeSamples {
		t0 := time.Now()
		f.RecomputeWeights()
		ms = append(ms, float64(time.Since(t0).Nanoseconds())/1e6)
	}
	return Summarize(ms), nil
}
